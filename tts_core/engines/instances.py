"""Several copies of one model in one engine (TTS_ENGINE_INSTANCES), each with its share of the CPU's cores.

On a CPU a padded batch does not pay, and one copy of a small model leaves cores idle between its threads'
bursts (Triton's answer is several instances of a model). A batch given to an engine with copies is split
between them, longest items first to the copy with least work, and the parts run at once, each copy on a
thread of its own (the first on the engine's thread): so a batch of two costs about what one item does, and the
batch policy, which sizes batches by their measured cost, chooses how many copies work. An engine may also keep a
copy with all the cores' threads for a batch that does not split (one item), so that a lone request, as on a lightly
loaded server, is made as fast as with one copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from .contract import EngineInput

Copy = TypeVar("Copy")
Output = TypeVar("Output")


def cpu_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def copy_counts(threads: int) -> tuple[int, ...]:
    """The counts of copies an engine with this many threads can run: 1, 2, 4, ... up to them."""
    return tuple(2**k for k in range(threads.bit_length()))


def threads_per_copy(threads: int, copies: int) -> int:
    """Each copy's share of the threads (at least one)."""
    return max(1, threads // copies)


def split(batch: Sequence[EngineInput], parts: int) -> list[list[int]]:
    """The batch's indices in at most `parts` parts of about equal work (tokens), none empty."""
    shares: list[list[int]] = [[] for _ in range(min(parts, len(batch)))]
    loads = [0] * len(shares)
    for index in sorted(range(len(batch)), key=lambda index: -batch[index].length):
        least = loads.index(min(loads))
        shares[least].append(index)
        loads[least] += batch[index].length
    return shares


class Instances(Generic[Copy]):
    """The copies of a model, and the threads their parts of a batch run on."""

    def __init__(self, copies: Sequence[Copy], alone: Copy | None = None):
        """alone: the copy a batch of one item runs on (default: the first)."""
        self.copies, self.alone = list(copies), alone if alone is not None else copies[0]
        self._threads = ThreadPoolExecutor(len(self.copies) - 1, thread_name_prefix="engine-copy") \
            if len(self.copies) > 1 else None

    def __len__(self) -> int:
        return len(self.copies)

    def run(self, batch: Sequence[EngineInput],
            synthesize: Callable[[Copy, list[EngineInput]], list[Output]]) -> list[Output]:
        """synthesize(copy, part) for each copy's part of the batch, at once; the outputs in the batch's order."""
        parts = split(batch, len(self.copies))
        if len(parts) == 1:
            return synthesize(self.alone if len(batch) == 1 else self.copies[0], list(batch))
        others = [self._threads.submit(synthesize, copy, [batch[index] for index in part])
                  for copy, part in zip(self.copies[1:], parts[1:])]
        try:
            made = [synthesize(self.copies[0], [batch[index] for index in parts[0]])]
        finally:
            wait(others)  # every part ends before the batch does, failed or not: no copy runs on beside the next
        made += [future.result() for future in others]
        outputs: list = [None] * len(batch)
        for part, part_outputs in zip(parts, made):
            for index, output in zip(part, part_outputs, strict=True):
                outputs[index] = output
        return outputs

    def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
