"""The targets' states for one snapshot, taken lazily from the gateway's live state."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import NamedTuple

from gateway_plugin.policy.snapshot import TargetState


class Counts(NamedTuple):
    """What the gateway itself counts in flight (APISIX sees each answer go by): ``in_flight``
    per target and ``local``; ``starting``: per target, those sent there cold."""

    in_flight: Mapping[str, int]
    starting: Mapping[str, int]


class TargetStates(Mapping[str, TargetState]):
    """Per-target states for one snapshot, each taken once, on first read, at the snapshot's time.

    Most requests never reach target selection (a calm cluster keeps them local), so states are
    not gathered for them; a state once read does not change for the rest of the decision.
    """

    def __init__(self, names: Collection[str], take: Callable[[str], TargetState]) -> None:
        self._names, self._take = names, take
        self._taken: dict[str, TargetState] = {}

    def __getitem__(self, name: str) -> TargetState:
        taken = self._taken.get(name)
        if taken is None:
            if name not in self._names:
                raise KeyError(name)
            taken = self._taken[name] = self._take(name)
        return taken

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
