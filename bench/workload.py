"""Deterministic benchmark texts, generated from a seed (no corpus needed)."""

from __future__ import annotations

import random

WORDS = ("the a of and to in river stone window garden music paper yellow morning quiet letter "
         "table orange silver market winter bridge candle forest pocket simple travel under "
         "between quickly little bright evening people city water light over after before").split()

MIXES = {"short": (20, 50), "mixed": (20, 200), "long": (150, 300)}
REALISTIC = [  # (share, min chars, max chars): mostly short and medium texts, a few long paragraphs
    (0.35, 20, 50), (0.40, 50, 200), (0.20, 150, 300), (0.05, 1000, 1400)]
WORKLOADS = [*MIXES, "realistic"]


def sentence(rng: random.Random, min_chars: int, max_chars: int) -> str:
    target = rng.randint(min_chars, max_chars)
    words: list[str] = []
    while sum(len(word) + 1 for word in words) < target - 1:
        words.append(rng.choice(WORDS))
    text = " ".join(words)[: max_chars - 1].rstrip()
    return text[0].upper() + text[1:] + "."


def paragraph(rng: random.Random, min_chars: int, max_chars: int) -> str:
    """Sentences of 40 to 200 characters until the text is min_chars to max_chars long."""
    target = rng.randint(min_chars, max_chars)
    parts: list[str] = []
    while sum(len(part) + 1 for part in parts) < target - 40:
        parts.append(sentence(rng, 40, min(200, max(40, target - sum(len(part) + 1 for part in parts)))))
    return " ".join(parts)


def texts(mix: str, count: int, seed: int = 0) -> list[str]:
    """count texts of a workload: one of MIXES (single sentences) or "realistic" (a blend with
    some 1,000+ character paragraphs), the same for the same seed."""
    rng = random.Random(f"{mix}-{seed}")
    if mix == "realistic":
        shares = [share for share, _, _ in REALISTIC]
        picks = rng.choices(REALISTIC, weights=shares, k=count)
        return [paragraph(rng, low, high) if low >= 300 else sentence(rng, low, high) for _, low, high in picks]
    low, high = MIXES[mix]
    return [sentence(rng, low, high) for _ in range(count)]
