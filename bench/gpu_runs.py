"""What every measured run of the GPU check shares (bench/gpu_check.py, bench/gpu_stepped.py): the time budget
its parts share, the closed loop of callers, the verdict on a run that finished too few of its callers' requests,
a loop stopped until its threads have ended, and the targets' verdicts.

A run's loop is stopped and its threads waited for before the next run's engine is loaded, so that no two loops
ever drive one engine, and no loop left running competes with the next run for the device; how long that took
(and any thread still running when the wait gave up) is in the run's row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from tts_core.scheduler.engine_loop import EngineLoop
from tts_core.scheduler.records import QueuedItem

LOOP_END_WAIT_S = 120.0  # a stopped loop's threads are waited for this long (a whole-batch run ends first)


class Budget:
    """The check's parts share `total_s`, each given its own share in the order they run: a part may go on to
    the moment the shares so far add up to (so a part that ends early leaves its time to the next), and one
    whose time is gone is skipped, its reason kept. `now` is the clock the budget reads (a fake one in tests)."""

    def __init__(self, shares: dict[str, float], now: Callable[[], float] = time.perf_counter):
        self.shares, self.now = shares, now
        self.started = now()
        self.total_s = sum(shares.values())

    def spent(self) -> float:
        return self.now() - self.started

    def deadline(self, part: str) -> float:
        """Seconds from the check's start by which `part` must end."""
        names = list(self.shares)
        return sum(self.shares[name] for name in names[: names.index(part) + 1])

    def left(self, part: str) -> float:
        return self.deadline(part) - self.spent()

    def refuses(self, part: str, needs_s: float) -> str | None:
        """Why something of `part` needing `needs_s` may not start now (None: it may)."""
        left = self.left(part)
        if needs_s <= left:
            return None
        return (f"not started: it needs about {needs_s:.0f} s and {max(0.0, left):.0f} s of the part's time were "
                f"left ({self.spent():.0f} s of the check's {self.total_s:.0f} s spent)")


def runs_in_budget(budget: Budget, part: str, served_s: float, overhead_s: float, runs: list,
                   run: Callable[[Any], dict], label: Callable[[Any], str], line: Callable[[dict], str]
                   ) -> tuple[list[dict], list[dict]]:
    """Each of a part's served runs while the part's time holds (a run needs `served_s` plus the most a run has
    taken beyond it so far, `overhead_s` at first): (rows, those skipped with why)."""
    rows, skipped = [], []
    for each in runs:
        why = budget.refuses(part, served_s + overhead_s)
        if why:
            skipped.append({"policy": label(each), "skipped": why})
            print(f"  {label(each)}: {why}", flush=True)
            continue
        row = run(each)
        overhead_s = max(overhead_s, row["run_s"] - served_s)
        rows.append(row)
        print(f"  {line(row)}  stop {row['stop_s']} s" + (f"  FAILED: {row['why']}" if row["failed"] else ""),
              flush=True)
    return rows, skipped


@dataclass
class Tally:
    """What the callers of one run got."""

    sent: int = 0
    latencies: list[float] = field(default_factory=list)  # of the requests answered with audio
    audio_s: float = 0.0  # the audio they got
    errors: int = 0  # requests answered with an error
    unanswered: list[float] = field(default_factory=list)  # seconds each request had waited when its caller gave up
    started: float = 0.0  # time.perf_counter() at the first request
    elapsed: float = 0.0  # seconds from the first request to the last caller's end


def closed_loop(loop: EngineLoop, make_item: Callable[[int], QueuedItem], clients: int, seconds: float,
                drain_s: float, sample_rate: int) -> Tally:
    """`clients` callers, each sending its next request (make_item(position)) when its last is answered, for
    `seconds`; a request sent then is waited for until drain_s past the end, then given up (cancelled: the loop
    drops it)."""
    tally, lock = Tally(started=time.perf_counter()), threading.Lock()
    stop_at = tally.started + seconds

    def client(index: int) -> None:
        position = index
        while time.perf_counter() < stop_at:
            item = make_item(position)
            position += clients
            sent = time.perf_counter()
            with lock:
                tally.sent += 1
            loop.submit([item])
            try:
                output = item.future.result(timeout=max(0.0, stop_at + drain_s - sent))
            except (FutureTimeout, CancelledError):
                item.future.cancel()  # the caller goes
                with lock:
                    tally.unanswered.append(time.perf_counter() - sent)
                return
            except Exception:  # a failed request (out of memory, say): counted, and the caller goes on
                with lock:
                    tally.errors += 1
                continue
            with lock:
                tally.latencies.append(time.perf_counter() - sent)
                tally.audio_s += output.audio.size / sample_rate

    threads = [threading.Thread(target=client, args=(index,), name=f"caller-{index}") for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally.elapsed = time.perf_counter() - tally.started
    return tally


def fate(tally: Tally) -> dict:
    """`failed` where the run finished fewer than half its callers' requests: those answered, and those still
    unanswered when their caller gave up after waiting over twice the slowest answer (every one, where none was
    answered). A request cut by the run's end after a usual wait is not counted against the policy: a closed
    loop always leaves one of each caller's in flight."""
    slowest = max(tally.latencies, default=0.0)
    overdue = [waited for waited in tally.unanswered if waited > 2 * slowest]
    done = len(tally.latencies)
    asked = done + tally.errors + len(overdue)
    if asked and 2 * done >= asked:
        return {"failed": False}
    return {"failed": True, "why": f"finished {done} of the {asked} requests its callers sent ({tally.errors} "
                                   f"failed, {len(overdue)} unanswered after over twice the slowest answer's "
                                   f"{slowest:.1f} s; {tally.sent} sent in all)"}


def latency_ms(tally: Tally) -> dict:
    done = sorted(tally.latencies)
    return {"p50_ms": round(1000 * done[int(0.5 * (len(done) - 1))], 1) if done else None,
            "p95_ms": round(1000 * done[int(0.95 * (len(done) - 1))], 1) if done else None}


def loop_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The threads started since `before` was taken (a loop's engine thread, its codec stage's)."""
    return [thread for thread in threading.enumerate() if thread not in before]


def stop_and_wait(loop: EngineLoop, threads: list[threading.Thread], wait_s: float = LOOP_END_WAIT_S) -> dict:
    """Stop the loop and wait for its threads to end (up to wait_s): how long that took, and what still ran
    when the wait gave up (the next run's engine is its own, but that thread would compete for the device)."""
    started = time.perf_counter()
    loop.stop(timeout=wait_s)
    for thread in threads:
        thread.join(max(0.0, started + wait_s - time.perf_counter()))
    row = {"stop_s": round(time.perf_counter() - started, 2)}
    left = [thread.name for thread in threads if thread.is_alive()]
    if left:
        row["threads_left"] = left
        print(f"  (the loop's threads {left} still ran {wait_s:.0f} s after its stop)", flush=True)
    elif row["stop_s"] > 1.0:
        print(f"  (waited {row['stop_s']} s for the stopped loop's threads to end)", flush=True)
    return row


def verdicts(values: dict, targets: dict) -> dict:
    """Each target's verdict: "met", "missed", or "not measured" (no value)."""
    def met(value, sense: str, bound) -> bool:
        return value <= bound if sense == "<=" else value == bound if sense == "==" else value >= bound

    return {name: "not measured" if values.get(name) is None else "met" if met(values[name], sense, bound)
            else "missed" for name, (sense, bound) in targets.items()}


def print_figures(part: dict) -> None:
    """A part's figures, each with its GPU target and verdict where it has one."""
    for name, value in part["ratios"].items():
        sense, bound = part["targets"].get(name, ("", ""))
        print(f"  {name:26s} {value}" + (f"  (GPU target {sense} {bound}: {part['verdicts'][name]})" if sense else ""),
              flush=True)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def failures(name: str, part: dict) -> list[str]:
    """What failed in one part of the check, a line each: the part itself (it raised), a served run that finished
    too few of its callers' requests, a lower precision whose batch failed."""
    if part.get("failed"):
        return [f"{name}: {part['why']}"]
    served = part.get("served") if isinstance(part.get("served"), list) else []  # (Kokoro's are by server)
    lines = [f"{name} {row['policy']}: {row['why']}" for row in served if row.get("failed")]
    if part.get("low_precision", {}).get("failed"):
        lines.append(f"{name} lower precision: {part['low_precision']['why']}")
    return lines


def skips(part: dict) -> list[str]:
    """What of one part did not run, and why: the part, or its runs."""
    if "skipped" in part:
        return [part["skipped"]]
    return [f"{row['policy']}: {row['skipped']}" for row in part.get("skipped_runs", [])]


def summary(result: dict, budget: Budget) -> dict:
    """The check's top lines: each part's time against its share and what it skipped; every failure."""
    parts = {"vits": result["vits"], **result["stepped"], "kokoro": result["kokoro"]}
    found = [line for name, part in parts.items() for line in failures(name, part)]
    return {"budget_s": budget.total_s, "total_s": round(budget.spent(), 1),
            "parts": {name: {"share_s": budget.shares[name], "by_s": budget.deadline(name), "seconds": part["seconds"],
                             "skipped": skips(part)} for name, part in parts.items()},
            "failed": bool(found), "failures": found}
