"""Which word of a text each unit (phoneme or character) of its model input speaks: what engines that
time words (Engine.tokenize_words) build their word ids from. Pure functions.

Units are grouped at white space; a group holding a spoken unit (not punctuation alone) is a spoken
word. Most texts say as many as they have words (29 of 32 ordinary English sentences through Piper's
espeak), and map one to one. Otherwise each word is said alone (`alone`): how many groups it makes
there maps the groups when those add up (a camel-case word espeak splits in two, a pronunciation
whose IPA or respelling has spaces, a dash said as nothing); failing that (espeak merged words, as
in "Wait... what?"), the spoken units are shared out in order by how many each word makes alone,
which is exact when words sound as they do in context and off by a unit or so when they do not.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence

import numpy as np


def spoken(unit: str) -> bool:
    """Part of a word: not white space, not punctuation alone."""
    return not unit.isspace() and not all(unicodedata.category(char).startswith("P") for char in unit)


def _spoken_groups(units: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Which units are spoken, and for each spoken one its word: the rank of its group among the
    groups (units between white space) that hold a spoken unit."""
    mask = np.array([spoken(unit) for unit in units], dtype=bool)
    groups = np.cumsum([unit.isspace() for unit in units], dtype=np.int64)[mask]
    return mask, np.unique(groups, return_inverse=True)[1].reshape(-1)


def _count(ranks: np.ndarray) -> int:
    return int(ranks.max()) + 1 if ranks.size else 0


def share_out(weights: Sequence[float], units: int) -> np.ndarray:
    """The word index of each of `units` units in order: the words take consecutive runs of them in
    proportion to their weights, each at least one (when there are as many units as words)."""
    weights = np.asarray(weights, dtype=np.float64)
    if not weights.sum():
        weights = np.ones_like(weights)
    steps = np.arange(len(weights))
    starts = np.round(units * (np.cumsum(weights) - weights) / weights.sum())
    starts = np.maximum.accumulate(starts - steps) + steps  # at least one unit after the word before
    starts = np.minimum(starts, units - len(weights) + steps)  # and leave one for each word after
    return np.searchsorted(starts, np.arange(units), side="right") - 1


def _by_groups(units: Sequence[str], mask: np.ndarray, ranks: np.ndarray, per_word: np.ndarray
               ) -> np.ndarray | None:
    """Labels giving each word its next per_word groups; a word with none takes the units between the
    groups around it (a dash's pause). None when the counts do not add up or a word would get nothing."""
    groups = _count(ranks)
    if per_word.sum() != groups:
        return None
    labels = np.full(len(units), -1, dtype=np.int64)
    labels[mask] = np.repeat(np.arange(len(per_word)), per_word)[ranks]
    at = np.flatnonzero(mask)
    new = np.diff(ranks, prepend=-1, append=groups) != 0
    firsts, lasts = at[new[:-1]], at[new[1:]]  # each group's first and last spoken unit
    places = np.cumsum(per_word) - per_word  # the group each word starts at
    silent = per_word == 0
    for place in np.unique(places[silent]):
        words = np.flatnonzero(silent & (places == place))
        gap = np.arange(lasts[place - 1] + 1 if place else 0, firsts[place] if place < groups else len(units))
        if len(gap) < len(words):
            return None
        labels[gap] = words[share_out(np.ones(len(words)), len(gap))]
    return labels


def unit_words(units: Sequence[str], text_words: Sequence[str], alone: Callable[[str], Sequence[str]]
               ) -> np.ndarray:
    """The index in text_words of the word each unit speaks, -1 for white space and punctuation
    between words; `alone(word)` is the units of a word said alone (only asked when the groups and
    the words differ in number). Every word gets at least one unit when there are enough."""
    mask, ranks = _spoken_groups(units)
    said = [] if _count(ranks) == len(text_words) else [_spoken_groups(alone(word)) for word in text_words]
    per_word = np.array([_count(said_ranks) for _, said_ranks in said] if said else [1] * len(text_words))
    labels = _by_groups(units, mask, ranks, per_word.astype(np.int64))
    if labels is None:  # the words' groups do not add up: share out their units
        labels = np.full(len(units), -1, dtype=np.int64)
        labels[mask] = share_out([int(said_mask.sum()) for said_mask, _ in said], int(mask.sum()))
    last, after = -1, 0
    for index in np.flatnonzero(labels >= 0):  # inside a word (an apostrophe, a split word's space): the word's
        if labels[index] == last:
            labels[after:index] = last
        last, after = labels[index], index + 1
    return labels
