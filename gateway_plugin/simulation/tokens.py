"""Prompt and output lengths of LLM requests, from a published serving trace: the Azure LLM
inference trace 2023 (Patel et al., "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024; github.com/Azure/AzurePublicDataset, CC-BY 4.0). Its conversation service
(19,366 requests: prompts of median 1,020 tokens and mean 1,155, outputs of median 129 and mean
211) and its coding service (8,819: prompts 1,469 and 2,048, outputs 13 and 28) are kept as their
empirical quantiles, every 5 %, 99 % and 99.9 %; lengths are drawn from them by linear interpolation,
prompt and output independently (the trace's joint distribution is not kept)."""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass

# The quantile each length below is at.
LEVELS = (*(i / 20 for i in range(20)), 0.99, 0.999, 1.0)


@dataclass(frozen=True)
class TokenLengths:
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    mean_prompt: float  # the trace's own means, which the draws approach
    mean_output: float

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """(prompt tokens, output tokens) of one request."""
        return _at(self.prompt, rng.random()), max(1, _at(self.output, rng.random()))


def _lengths(text: str) -> tuple[int, ...]:
    """One length per level of ``LEVELS``."""
    lengths = tuple(int(n) for n in text.split())
    if len(lengths) != len(LEVELS):
        raise ValueError(f"{len(lengths)} lengths for {len(LEVELS)} levels")
    return lengths


def _at(lengths: tuple[int, ...], u: float) -> int:
    i = min(bisect_right(LEVELS, u), len(LEVELS) - 1)
    low, high = LEVELS[i - 1], LEVELS[i]
    share = (u - low) / (high - low)
    return round(lengths[i - 1] + share * (lengths[i] - lengths[i - 1]))


TRACES = {
    "azure-conversation": TokenLengths(
        prompt=_lengths(
            "2 181 207 372 387 396 403 414 703 984 1020 1045 1071 1097 1130 1189 1315 1876 2734 4083 "
            "4142 6212 14050"
        ),
        output=_lengths(
            "7 41 54 67 77 85 91 96 103 113 129 151 177 217 384 395 400 411 424 451 601 954 1000"
        ),
        mean_prompt=1154.7,
        mean_output=211.1,
    ),
    "azure-code": TokenLengths(
        prompt=_lengths(
            "3 75 147 232 386 578 770 938 1075 1261 1469 1690 1909 2164 2433 2745 3192 3919 5186 7302 "
            "7436 7437 7437"
        ),
        output=_lengths("6 6 7 7 8 9 9 10 11 12 13 14 16 18 20 24 29 39 55 90 252 824 1899"),
        mean_prompt=2047.8,
        mean_output=27.9,
    ),
}
