"""Deterministic benchmark texts, generated from a seed (no corpus needed)."""

from __future__ import annotations

import random

WORDS = ("the a of and to in river stone window garden music paper yellow morning quiet letter "
         "table orange silver market winter bridge candle forest pocket simple travel under "
         "between quickly little bright evening people city water light over after before").split()

MIXES = {"short": (20, 50), "mixed": (20, 200), "long": (150, 300)}


def sentence(rng: random.Random, min_chars: int, max_chars: int) -> str:
    target = rng.randint(min_chars, max_chars)
    words: list[str] = []
    while sum(len(word) + 1 for word in words) < target - 1:
        words.append(rng.choice(WORDS))
    text = " ".join(words)[: max_chars - 1].rstrip()
    return text[0].upper() + text[1:] + "."


def texts(mix: str, count: int, seed: int = 0) -> list[str]:
    low, high = MIXES[mix]
    rng = random.Random(f"{mix}-{seed}")
    return [sentence(rng, low, high) for _ in range(count)]
