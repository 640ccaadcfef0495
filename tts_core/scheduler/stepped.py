"""The stepped strategy: continuous batching of an autoregressive engine (Pocket TTS, VibeVoice).

Each turn of its engine loop, on the one thread that owns the engine: running requests whose caller has
gone are stopped; the policy picks which queued requests join, and their prompts are prefilled
together; every running request makes one frame; each request's new frames are taken every
STREAM_PIECE_S of audio (a stream) or FILE_PIECE_S (a whole file), and when it finishes, and its
codec stage (tts_core.scheduler.codec_stage) decodes them and hands them out (a stream plays them as
they come); a finished request leaves the steps at once, and its future resolves with its whole audio
after its last piece. So a request joins at the next step and nobody waits for the longest member of a
batch. Where the engine `decodes_apart` (Pocket TTS) and TTS_CODEC_STAGE puts it there (by default on CUDA),
the stage is a codec thread beside the steps, which puts a stream's first piece first; else, and for a whole
batch run on one thread (`synthesize_whole`), it decodes at once on this thread, as follows.

First audio first. The codec does not batch on a CPU and costs about as much per frame as a step,
so decoding is half the work of a turn; while a stream's first sentence waits for its first piece,
the others' pieces wait, and while a request is queued to join (a place is free, and the policy has
not declined it) only first pieces are decoded, so that it is prefilled at once; a request
DEFER_CAP pieces behind is decoded whoever waits, so that nobody starves. The price: a running
stream's piece comes up to DEFER_CAP pieces later when a new stream starts; a listener that has audio
buffered hears nothing of it, one whose stream is made slower than real time hears its gap later.
A deferred piece is decoded at a later turn, longer (which costs less per frame). So a stream that
starts while the others run gets its first audio sooner, and as much audio is served a second as
without the deferral (measured in docs/batching.md#first-audio-first).

vLLM v1's split at a smaller scale: the policy plans (pure), the engine steps, this strategy delivers.

The same code runs a whole batch at once (`synthesize_whole`, a stepped engine's only whole-batch run: its
warm-up and memory measure, the benchmark's ceiling and the request-level peers, which run a batch to its last
member as one `generate(batch)` call does): one driving loop for every use of a stepped engine.

A running item's future stays pending (not "running") until it resolves: a caller that goes
cancels it, which stops the item at the next step, and an item the engine had no memory for can
go back to the queue as it was.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..engines.base import FILE_PIECE_S, STREAM_PIECE_S
from ..engines.contract import EngineInput, EngineOutput, Stepped
from ..errors import ChorusError, ClientGone, SynthesisError
from ..ops.metrics import Metrics
from .codec_stage import BusyMeter, CodecStage
from .engine_loop import CALIBRATION_TEXT, Serving, stopped_error
from .faults import FaultCounts, turn_failed
from .queue import RequestQueue
from .records import QueuedItem
from .step_policy import FillPolicy, StepPolicy, StepView

log = logging.getLogger(__name__)

CALIBRATION_STEPS = 3  # steps timed per calibration point
DEFER_CAP = 2  # pieces: a request this far behind in decoding is decoded even while a stream starts


@dataclass
class Progress:
    """What the loop keeps of one running request."""

    item: QueuedItem
    running_with: int  # requests running once it had joined
    decode_every: int  # frames
    frames: int = 1  # frames made (its first comes with the prefill)
    taken: int = 0  # frames made when its frames were last taken for decoding
    engine_s: float = 0.0  # its share of the engine's time: the queue's wait predictions learn from it
    streaming: bool = False  # its pieces are handed out as they are made
    opens: bool = False  # the first sentence of a stream: its listener has nothing to play until its first piece
    # Written by the codec stage (tts_core.scheduler.codec_stage), once the engine's thread has handed a piece over:
    pieces: list[np.ndarray] = field(default_factory=list)
    decode_s: float = 0.0  # its pieces' decoding
    error: ChorusError | None = None  # a piece failed to decode: it ends with this

    @property
    def starting(self) -> bool:
        """A stream's first sentence, none of whose frames were taken yet."""
        return self.opens and not self.taken

    @property
    def behind(self) -> int:
        """Frames made and not yet taken."""
        return self.frames - self.taken

    @property
    def overdue(self) -> bool:
        """So far behind that it is decoded whoever waits."""
        return self.behind >= DEFER_CAP * self.decode_every


@dataclass(frozen=True)
class SteppedStatus:
    """A stepped model's step policy (its own description), the requests running, its steps a second and frames a
    step (over the last seconds), and its codec stage: on a thread of its own or not, the stages' busy shares, the
    pieces waiting, the codec jobs that failed."""

    policy: dict
    running: int
    steps_per_s: float
    frames_per_step: float
    codec_thread: bool
    engine_busy_share: float
    codec_busy_share: float
    codec_waiting: int
    codec_jobs: FaultCounts
    step: dict = field(default_factory=dict)  # how the step runs: eager or compiled, why, the compile time

    def to_json(self) -> dict:
        return {"policy": self.policy, "running": self.running, "steps_per_s": self.steps_per_s,
                "frames_per_step": self.frames_per_step, "codec_thread": self.codec_thread,
                "engine_busy_share": self.engine_busy_share, "codec_busy_share": self.codec_busy_share,
                "codec_waiting": self.codec_waiting, **self.codec_jobs.to_json("codec_job"), **self.step}


class SteppedStrategy:
    hands_out_pieces = True
    engine: Stepped

    def __init__(self, serving: Serving, policy: StepPolicy, calibration_sizes: Sequence[int] = (1, 2, 4, 8, 16),
                 cpu_cache_mb: int | None = 1024, codec_thread: bool = True):
        """codec_thread: an engine that `decodes_apart` decodes on a thread of its own (False: all on the
        calling thread, as one whole batch runs)."""
        self.serving, self.policy = serving, policy
        self.engine, self.queue, self.metrics = serving.engine, serving.queue, serving.metrics
        self.clock = serving.clock
        staged = codec_thread and self.engine.decodes_apart
        self.codec = CodecStage(self.engine.name, self.clock, staged, max_waiting=max(1, policy.max_running))
        self.policy.cost.pipelined = staged
        self.engine_busy = BusyMeter(self.clock)  # prefills and steps
        self.calibration_sizes = [s for s in calibration_sizes if 1 <= s <= policy.max_running]
        # the cache's budget where no device memory says otherwise (None: none, as for one whole batch)
        self.cpu_cache_bytes = None if cpu_cache_mb is None else cpu_cache_mb * 2**20
        self._progress: dict[int, Progress] = {}  # by the running input's id
        self._joining: list[QueuedItem] = []  # taken from the queue, being admitted: not yet in _progress
        self._declined = False  # the policy left queued candidates out at this turn

    # --- what the loop asks --------------------------------------------------------------------------

    def idle(self) -> bool:
        return not len(self.queue) and not self.engine.running() and self.codec.idle()

    def running_count(self) -> int | None:
        return len(self.engine.running())

    def status(self) -> SteppedStatus:
        rate = self.metrics.step_rate(self.engine.name)
        return SteppedStatus(self.policy.describe(), len(self.engine.running()), rate["steps_per_s"],
                             rate["frames_per_step"], self.codec.threaded, self.engine_busy.share(),
                             self.codec.busy.share(), self.codec.waiting(), self.codec.faults.counts(),
                             getattr(self.engine, "step_status", dict)())

    def cost_model(self) -> dict:
        """Seconds a step, its size the requests running."""
        model = self.policy.cost.steps if self.policy.learns else None
        return {"policy": self.policy.name, "unit": "step", "max_size": self.policy.max_running, "model": model}

    # --- warm-up ----------------------------------------------------------------------------------

    def warm_up(self) -> list[Callable[[], None]]:
        """One untimed run and the wait predictions' seed; returns the sweep: the step cost at each calibration
        size, at a short and a long context (run while nothing is queued or running)."""
        voice = self.engine.voices()[0].name
        tokens = np.concatenate(self.engine.tokenize(CALIBRATION_TEXT, voice))

        def inputs(count: int, length: int) -> list[EngineInput]:
            return [EngineInput(tokens[:length], voice) for _ in range(count)]

        def whole(batch: Sequence[EngineInput]) -> list[EngineOutput]:
            return synthesize_whole(self.engine, batch)

        whole(inputs(1, 4))  # cold: first runs set up kernels and caches
        started = self.clock.timer()
        outputs = whole(sample := inputs(1, 12))
        self.serving.item_cost.add(1, 12, self.clock.timer() - started)
        self.serving.learn_audio_rate(sample, outputs)
        self.engine.measure_memory(tokens[:12], whole)
        return [lambda size=size, length=length: self._calibrate(inputs(size, length))
                for length in (4, min(len(tokens), 32)) for size in self.calibration_sizes]

    def _calibrate(self, inputs: list[EngineInput]) -> None:
        engine, cost = self.engine, self.policy.cost
        started = self.clock.timer()
        engine.admit(inputs)
        cost.observe_prefill(sum(engine.context_length(item.id) for item in inputs), self.clock.timer() - started)
        best, longest = math.inf, 0
        for _ in range(CALIBRATION_STEPS):
            longest = max(map(engine.context_length, engine.running()))
            started = self.clock.timer()
            engine.step()
            best = min(best, self.clock.timer() - started)  # others' work on the cores only ever adds time
        cost.observe_step(len(inputs), longest, best, calibration=True)
        started = self.clock.timer()
        for item in inputs:
            engine.take_audio(item.id, final=True)
            engine.release(item.id)
        cost.observe_decode(len(inputs) * (CALIBRATION_STEPS + 1), self.clock.timer() - started)

    # --- one turn of the loop -------------------------------------------------------------------

    def step(self) -> None:
        try:
            self._turn()
        except Exception as error:  # a bug: whatever ran ends with a clear error, and the engine is left empty
            self._end_all(turn_failed(self.engine.name, error))
            raise

    def _turn(self) -> None:
        self._stop_abandoned()
        running = self.engine.running()
        room = self.policy.max_running - len(running)
        candidates, queued = self._queued_views(self.queue.next_candidates(room) if room > 0 else [])
        self.metrics.queue_length.labels(self.engine.name).set(len(self.queue))
        self.metrics.running_requests.labels(self.engine.name).set(len(running))
        if not running and not candidates:
            self._tell_queue()
            self.serving.wait_for_work()
            return
        self._declined = False
        if candidates:
            now = self.clock.now()
            plan = self.policy.plan(self._running_views(), queued, now, self._memory_tokens())
            self._declined = len(plan.take) < len(candidates)
            if plan.take:
                self._admit([candidates[index] for index in plan.take])
            elif not running:
                self.queue.wait_until(now + plan.wait_s)
                return
        if self.engine.running():
            self._step()
        self._tell_queue()

    def _running_views(self) -> list[StepView]:
        engine = self.engine
        return [StepView(engine.context_length(item.input.id), engine.context_tokens(item.input), item.deadline,
                         item.enqueued_at) for item in self._running_items()]

    def _queued_views(self, candidates: Sequence[QueuedItem]) -> tuple[list[QueuedItem], list[StepView]]:
        """The candidates the engine can run, and their views. One it cannot (its voice was deleted while it
        waited) fails alone, with the engine's reason: the others go on."""
        kept, views = [], []
        for item in candidates:
            try:
                views.append(StepView(item.length, self.engine.context_tokens(item.input), item.deadline,
                                      item.enqueued_at))
            except Exception as error:
                self.queue.take([item], 0.0)
                self._close(item, error if isinstance(error, ChorusError) else turn_failed(self.engine.name, error))
            else:
                kept.append(item)
        return kept, views

    def _running_items(self) -> list[QueuedItem]:
        """The queued items of the running inputs, in the order they joined (an item runs under its input's id)."""
        return [self._progress[item_id].item for item_id in self.engine.running() if item_id in self._progress]

    def _memory_tokens(self) -> int | None:
        """Context positions the cache may still grow by: device memory where the engine has some to
        manage, else the configured CPU budget less what the running requests will hold."""
        device = self.serving.memory.tokens()
        if device is not None or not self.engine.kv_bytes_per_token or self.cpu_cache_bytes is None:
            return device
        held = sum(self.engine.context_tokens(item.input) for item in self._running_items())
        return max(0, int(self.cpu_cache_bytes / self.engine.kv_bytes_per_token) - held)

    def _tell_queue(self) -> None:
        """When a place frees up, for the queue's wait predictions: at the next step while there is room
        (and how many queued requests join then: all the free places, unless the policy declined one),
        else when the running request nearest its end is done."""
        running = self.engine.running()
        room = self.policy.max_running - len(running)
        if room > 0:
            self.queue.expect_free_in(0.0, 0 if self._declined else room)
            return
        longest = max(map(self.engine.context_length, running))
        left = min(self.engine.frames_needed(self._progress[item_id].item.input) - self._progress[item_id].frames
                   for item_id in running)
        self.queue.expect_free_in(max(0, left) * self.policy.cost.frame_s(len(running), longest))

    # --- joining, stepping, leaving ----------------------------------------------------------------

    def _admit(self, joining: list[QueuedItem]) -> None:
        self.queue.take(joining, 0.0)
        live = [item for item in joining if not _gone(item)]
        self.queue.done(len(joining) - len(live))
        self.metrics.dropped.labels("cancelled").inc(len(joining) - len(live))
        if not live:
            return
        now, running_with = self.clock.now(), len(self.engine.running()) + len(live)
        started = self.clock.timer()
        self._joining = live
        try:
            finished = self.engine.admit([item.input for item in live])
        except self.engine.out_of_memory_errors:
            self._joining = []
            self._out_of_memory(live)
            return
        except Exception as error:
            self._joining = []
            failure = error if isinstance(error, ChorusError) else SynthesisError.in_engine(self.engine.name, error)
            for item in live:
                self._end(item, failure, running=False)
            return
        seconds = self.clock.timer() - started
        self.engine_busy.add(seconds)
        self.serving.worked = True
        self.policy.cost.observe_prefill(sum(self.engine.context_length(item.input.id) for item in live), seconds)
        for item in live:
            item.queue_s = now - item.enqueued_at
            piece_s = STREAM_PIECE_S if item.pieces is not None else FILE_PIECE_S
            streaming = item.pieces is not None
            self._progress[item.input.id] = Progress(item, running_with,
                                                     max(1, math.ceil(piece_s * self.engine.frame_rate)),
                                                     engine_s=seconds / len(live), streaming=streaming,
                                                     opens=streaming and item.due_s == 0)
        self._joining = []
        self._finish(finished)

    def _step(self) -> None:
        running = self.engine.running()
        longest = max(map(self.engine.context_length, running))
        started = self.clock.timer()
        try:
            finished = self.engine.step()
        except self.engine.out_of_memory_errors:
            self._out_of_memory([self._progress[running[-1]].item])
            return
        except Exception as error:  # the newest member is the likeliest cause: it alone fails
            log.warning("%s: a step failed; stopping the newest request", self.engine.name, exc_info=error)
            self._end(self._progress[running[-1]].item, SynthesisError.in_engine(self.engine.name, error))
            return
        seconds = self.clock.timer() - started
        self.engine_busy.add(seconds)
        self.policy.cost.observe_step(len(running), longest, seconds)
        self.metrics.step_finished(self.engine.name, len(running), longest, seconds, self.policy.max_running)
        for item_id in running:
            progress = self._progress[item_id]
            progress.frames += 1
            progress.engine_s += seconds / len(running)
        due = [item_id for item_id in running if item_id not in finished
               and self._progress[item_id].behind >= self._progress[item_id].decode_every]
        for item_id in due if self.codec.threaded else self._first_audio_first(due):
            self._take([item_id], final=False)
        self._finish(finished)

    def _first_audio_first(self, due: list[int]) -> Iterator[int]:
        """The due pieces to decode at this turn, when they are decoded on the engine's thread (see the module's
        docstring; a codec stage puts first pieces first on its own): first pieces first, then
        the furthest behind, while no stream waits for its first piece and no request waits to join
        (asked before each piece), and those DEFER_CAP pieces behind."""
        progress = self._progress
        starting = any(progress[item_id].starting for item_id in self.engine.running())
        for item_id in sorted(due, key=lambda item_id: (not progress[item_id].starting, -progress[item_id].behind)):
            if progress[item_id].starting or progress[item_id].overdue or not (starting or self._joiner_waits()):
                yield item_id

    def _joiner_waits(self) -> bool:
        """A request was queued since the policy last declined one, and a place is free."""
        return not self._declined and len(self.queue) > 0 and len(self.engine.running()) < self.policy.max_running

    def _take(self, item_ids: list[int], final: bool) -> None:
        """The items' new frames go to the codec stage, to be decoded and handed out there."""
        for item_id in item_ids:
            progress = self._progress[item_id]
            started = self.clock.timer()
            frames = self.engine.take_frames(item_id, final)
            progress.engine_s += self.clock.timer() - started
            first = progress.starting
            progress.taken = progress.frames
            if frames is not None:
                self.codec.submit(lambda progress=progress, frames=frames: self._decode(progress, frames), first)

    def _decode(self, progress: Progress, frames: object) -> None:
        """On the codec stage: a piece's audio, handed out to a stream."""
        if progress.error or _gone(progress.item):
            return
        started = self.clock.timer()
        try:
            audio = self.engine.decode(frames)
        except Exception as error:
            log.warning("%s: decoding a piece failed", self.engine.name, exc_info=error)
            progress.error = SynthesisError.in_engine(self.engine.name, error)
            return
        seconds = self.clock.timer() - started
        progress.decode_s += seconds
        if not audio.size:
            return
        progress.pieces.append(audio)
        self.policy.cost.observe_decode(max(1, round(audio.size / self.engine.sample_rate * self.engine.frame_rate)),
                                        seconds)
        if progress.streaming:
            progress.item.pieces.push(audio)

    def _finish(self, finished: list[int]) -> None:
        self._take(finished, final=True)
        for item_id in finished:
            self.engine.release(item_id)
        running = set(self.engine.running())
        for item_id in [item_id for item_id in self._progress if item_id not in running]:
            self.codec.submit(lambda progress=self._progress.pop(item_id): self._deliver(progress))

    def _deliver(self, progress: Progress) -> None:
        """On the codec stage, after the item's last piece."""
        item = progress.item
        if progress.error:
            self._close(item, progress.error)
            return
        try:
            output = EngineOutput(np.concatenate(progress.pieces) if progress.pieces else np.zeros(0, np.float32))
            # its time as the queue's predictions count it: the stages overlap, one after the other on one thread
            engine_s = (max if self.codec.threaded else sum)((progress.engine_s, progress.decode_s))
            self.serving.item_cost.add(1, item.length, engine_s)
            self.serving.learn_audio_rate([item.input], [output])
        except Exception as error:  # a bug: it ends with a clear error, never unanswered
            self.codec.faults.failed(error)
            self._close(item, turn_failed(self.engine.name, error))
            return
        item.batch_s, item.batch_size = engine_s, progress.running_with  # before a reader sees the end
        if item.pieces is not None:
            item.pieces.end()
        self.queue.done(1)
        item.resolve(output)

    def _end(self, item: QueuedItem, error: ChorusError, running: bool = True) -> None:
        """The item stops without its audio: released at once, and (after its pieces handed over before) counted
        and its caller told."""
        if running:
            self.engine.release(item.input.id)
        self._progress.pop(item.input.id, None)
        self.codec.submit(lambda: self._close(item, error))

    def _close(self, item: QueuedItem, error: ChorusError) -> None:
        if not isinstance(error, ClientGone):
            self.metrics.item_errors.labels(self.engine.name).inc()
        if item.pieces is not None:
            item.pieces.end(error)
        self.queue.done(1)
        item.resolve(error)

    def stopped(self) -> None:
        try:
            self._end_all(stopped_error(self.engine.name))
        finally:  # whatever failed above, the codec thread ends (after what was handed to it)
            self.codec.close()

    def _end_all(self, error: ChorusError) -> None:
        """Every running or joining request ends with `error`, after the pieces handed over before, and the engine
        runs nothing after: what it runs that this strategy never knew of (another's) is released too."""
        ending = [progress.item for progress in self._progress.values()]
        ending += [item for item in self._joining if item.input.id not in self._progress]
        self._progress.clear()
        self._joining = []
        for item in ending:
            self.codec.submit(lambda item=item: self._close(item, error))
        for item_id in self.engine.running():
            self.engine.release(item_id)

    def _stop_abandoned(self) -> None:
        for item in [item for item in self._running_items() if _gone(item)]:
            self.metrics.dropped.labels("cancelled").inc()
            self._end(item, ClientGone("the caller has gone"))

    def _out_of_memory(self, items: list[QueuedItem]) -> None:
        """Put the newest requests back in the queue with a lower memory budget, rather than failing
        everyone; a request that does not fit even alone fails alone."""
        tokens = sum(self.engine.context_tokens(item.input) for item in items)
        log.warning("%s ran out of memory with %d requests joining or newest", self.engine.name, len(items))
        self.metrics.out_of_memory.labels(self.engine.name).inc()
        self.serving.memory.out_of_memory(tokens)
        running = self.engine.running()
        for item in items:
            item_id = item.input.id
            if item_id in running:
                self.engine.release(item_id)
            progress = self._progress.pop(item_id, None)
            if (progress and progress.taken) or (not running and len(items) == 1):
                self._end(item, SynthesisError("synthesis failed: the request does not fit in device memory"),
                          running=False)
            else:
                self.queue.put_back(item)
        self.engine.release_memory()


def _gone(item: QueuedItem) -> bool:
    """Its caller has gone, or it has its answer (expired in the queue since it was a candidate)."""
    return item.abandoned or item.future.done()


def synthesize_whole(engine: Stepped, batch: Sequence[EngineInput],
                     stopping: Callable[[], bool] = lambda: False) -> list[EngineOutput]:
    """Each input's whole audio, made by the stepped strategy on the calling thread (a stepped engine has no
    `synthesize` of its own): every input joins as soon as a place is free and its audio is taken every FILE_PIECE_S,
    as a served whole file's is. Each runs under an id of its own (an input given twice runs twice). Once all have
    ended, the first that failed raises its error. `stopping()` is asked before each step: once true (the loop
    running the batch was stopped), those not done end with a 503 model_stopped, and the engine runs none of them
    after (no two loops ever drive one engine). A step that raises leaves the engine running none of them either."""
    runs = [QueuedItem(EngineInput(item.tokens, item.voice, item.speed, item.instructions), key=None,
                       deadline=math.inf) for item in batch]
    if not runs:
        return []
    queue = RequestQueue(max_size=len(runs))
    strategy = SteppedStrategy(Serving(engine, queue, Metrics()), FillPolicy(engine.max_running), cpu_cache_mb=None,
                               codec_thread=False)
    queue.put_many(runs)
    while not all(run.future.done() for run in runs):
        if stopping():
            for run in queue.close():
                run.resolve(stopped_error(engine.name))
            strategy.stopped()
            break
        strategy.step()
    return [run.future.result() for run in runs]

