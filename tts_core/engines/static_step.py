"""A stepped engine's step as one function over static state, run eager or compiled per running-set bucket.

The state a step reads and writes lives in tensors of fixed shapes (`StepState`: one row per cache row, the
rows beyond the running ones padding, marked done), so a step's shapes repeat: the running set is padded to
a bucket (1, 2, 4, ... up to the model's most running), the cache's attended length is its capacity (a power
of two that moves only when a longer request joins), and the noise is drawn before the step. The engine's
`_step_body(count, noise)` is that function; `StepRunner` runs it eager, or compiled with
`torch.compile(fullgraph=True, dynamic=False)` per (bucket, capacity) (`mode="reduce-overhead"` on CUDA:
CUDA graphs), each compiled graph checked against the eager step from the same state and noise before it
serves (`check`); a graph that fails to compile or to match is dropped, and the model runs eager, saying why.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

STEP_MODES = ("auto", "eager", "compiled")
CHECK_STEPS = 3  # steps the self-check runs from one state
CHECK_TOLERANCE = 1e-4  # the most a compiled frame may differ from the eager one (absolute, normalised latents)


def buckets(most: int) -> list[int]:
    """The running-set sizes a step is padded to: powers of two up to `most`, and `most` itself."""
    sizes, size = [], 1
    while size < most:
        sizes.append(size)
        size *= 2
    return [*sizes, most]


def bucket_of(count: int, sizes: list[int]) -> int:
    return next(size for size in sizes if size >= count)


class StepState:
    """Named tensors, one row per cache row (`rows`), each shaped (rows, *tail): what a row carries from step
    to step. `move` copies a row into another (a release compacts the rows); `reset` makes rows padding."""

    def __init__(self, rows: int, device: str, specs: dict[str, tuple[tuple[int, ...], torch.dtype, float]]):
        self.rows, self.device, self._specs = rows, device, dict(specs)
        self.tensors = {name: torch.full((rows, *tail), fill, dtype=dtype, device=device)
                        for name, (tail, dtype, fill) in specs.items()}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def grow(self, name: str, tail: tuple[int, ...], rows_in_use: int) -> None:
        """A bigger tail for one tensor (the frames buffer as the cache grows), keeping the rows in use."""
        _, dtype, fill = self._specs[name]
        new = torch.full((self.rows, *tail), fill, dtype=dtype, device=self.device)
        old = self.tensors[name]
        kept = min(old.shape[1], new.shape[1])
        new[:rows_in_use, :kept] = old[:rows_in_use, :kept]
        self.tensors[name], self._specs[name] = new, (tail, dtype, fill)

    def move(self, source: int, target: int) -> None:
        for tensor in self.tensors.values():
            tensor[target] = tensor[source]

    def reset(self, rows: slice) -> None:
        for name, tensor in self.tensors.items():
            tensor[rows] = self._specs[name][2]


def compile_step(body: Callable, device: str, backend: str = "inductor") -> Callable:
    """The step compiled whole: one graph per (bucket, shapes), no graph breaks; CUDA graphs on CUDA (inductor).
    `backend="aot_eager"` traces the same graph without generating code (seconds, not a minute: the tests)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # a graph per bucket
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 1024)
    mode = "reduce-overhead" if device == "cuda" and backend == "inductor" else None
    return torch.compile(body, fullgraph=True, dynamic=False, backend=backend, mode=mode)


@dataclass
class StepRunner:
    """Runs an engine's step body for a bucket: eager, or its compiled graph once that graph passed its check.

    `check(run_a, run_b)` -> the largest frame difference between two ways of stepping from the same state
    (the engine snapshots and restores its state around each). `mode` is what was asked; `running` what runs."""

    body: Callable  # (count, noise) -> the step's outputs, frames first
    device: str
    mode: str = "eager"
    backend: str = "inductor"  # torch.compile's
    compiled: dict[tuple, Callable] = field(default_factory=dict)  # (bucket, capacity) -> its checked graph
    compile_s: dict[str, float] = field(default_factory=dict)  # by "bucket@capacity"
    reason: str = ""  # why it runs eager, where compiled was asked
    ran: Counter = field(default_factory=Counter)  # steps run, "compiled" or "eager"
    _compiled_body: Callable | None = None

    def __post_init__(self):
        if self.mode not in STEP_MODES:
            raise ValueError(f"step_mode is one of {', '.join(STEP_MODES)}, not {self.mode!r}")
        if self.mode == "auto":  # on the CPU compiling takes minutes at load (docs/batching.md)
            self.mode = "compiled" if self.device == "cuda" else "eager"
            self.reason = "" if self.mode == "compiled" else "auto on the CPU: eager (compiling takes minutes)"

    @property
    def running(self) -> str:
        return "compiled" if self.compiled else "eager"

    def prepare(self, key: tuple, check: Callable[[Callable, Callable], float]) -> bool:
        """Compile the step for this key and check it against eager; True when the graph now serves."""
        if self.mode != "compiled" or key in self.compiled:
            return key in self.compiled
        label = "@".join(map(str, key))
        started = time.perf_counter()
        try:
            if self._compiled_body is None:
                self._compiled_body = compile_step(self.body, self.device, self.backend)
            difference = check(self.body, self._compiled_body)
        except Exception as error:  # any compile failure: the model runs eager, saying why
            return self._fall_back(f"compiling the step for {label} failed: {type(error).__name__}: {error}")
        self.compile_s[label] = round(time.perf_counter() - started, 2)
        if not difference <= CHECK_TOLERANCE:  # (NaN too)
            return self._fall_back(f"the compiled step for {label} differs from eager by {difference:.3g} "
                                   f"(tolerance {CHECK_TOLERANCE:g})")
        self.compiled[key] = self._compiled_body
        log.info("step compiled for bucket %s in %.1f s (self-check: %.2g)", label, self.compile_s[label], difference)
        return True

    def _fall_back(self, why: str) -> bool:
        log.warning("%s: the model steps eager", why)
        self.mode, self.reason, self._compiled_body = "eager", why, None
        self.compiled.clear()
        return False

    def run(self, key: tuple, count: int, noise: torch.Tensor):
        step = self.compiled.get(key)
        self.ran["eager" if step is None else "compiled"] += 1
        return (step or self.body)(count, noise)

    def describe(self) -> dict:
        return {"step_mode": self.running, "step_compile_s": dict(self.compile_s),
                "step_compile_total_s": round(sum(self.compile_s.values()), 2), "step_mode_reason": self.reason,
                "steps_compiled": self.ran["compiled"], "steps_eager": self.ran["eager"]}
