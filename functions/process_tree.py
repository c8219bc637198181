"""Processes a sidecar started, from ``/proc`` (Linux): to notice a backend stub that died while
Triton lives on. Standard library only; elsewhere nothing is found and nothing is watched."""

from __future__ import annotations

import os


def _stat(pid: int) -> tuple[str, int] | None:
    """State and parent of a process, from ``/proc`` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def _parents() -> dict[int, int]:
    """Every process's parent, from one scan of ``/proc`` (empty where there is none)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    parents = {}
    for entry in entries:
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                parents[int(entry)] = stat[1]
    return parents


def children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (empty where there is no ``/proc``)."""
    return {child for child, parent in _parents().items() if parent == pid}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: children, theirs, and so on, from one scan."""
    below: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        below.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in below.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (not gone, not a zombie)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def first_gone(pids: set[int], parent: int) -> int | None:
    for pid in pids:
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X") or stat[1] != parent:
            return pid
    return None
