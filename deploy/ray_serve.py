"""Chorus on Ray Serve: each model's engine a deployment of its own (its replicas spread over GPUs and
machines, scaled on their queues), and the API, UI and admin one ingress deployment that calls them
through deployment handles.

    serve run deploy/serve.yaml

- `EngineReplica` serves one model, loaded when the replica starts, with Chorus's own queue and batcher
  (a SpeechService of that model alone): a passage's pieces are queued there exactly as in one process,
  and their audio streams back to the ingress as events. Each replica runs degrade mode's monitor on its own
  queue (under the stored operator settings, followed each second) and reports its figures to the shared
  database every second like any Chorus replica, so the Admin tab's cluster view shows every one.
- `ChorusIngress` is the whole app (app.create_app) with `RemoteScheduler` placing each passage on its
  model's engine deployment instead of a local batcher. Admission, degrade mode, the cache, rate limits,
  jobs, the UI and the admin tab are unchanged: the engines' load they read (queue length, predicted wait)
  is what the engine replicas last reported (deploy/replica_load.py). Cloning a voice needs the engine in
  the same process and is refused here (400 model_cannot_clone); voices cloned through a replica on the
  same database are listed by the ingress and spoken by the engine replicas, which follow the stored
  voices each second.
- `scale_on_queue` is the engines' autoscaling policy: replicas enough that each has about
  `target_ongoing_requests` pieces queued or running in Chorus's own queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import replace
from enum import StrEnum
from functools import partial
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.config import AutoscalingContext
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from admin.cluster import ReplicaReporter
from app import create_app
from clones import VoiceClones, stored_clones
from deploy.replica_load import DeploymentLoad, RemoteLoads
from storage import Storage, StorageError
from tts_core.audio.word_timing import SaidWords, WordTimer
from tts_core.config import Settings
from tts_core.engines import EngineUnavailable
from tts_core.engines.contract import AudioPieces, EngineOutput
from tts_core.errors import ChorusError, ErrorCode, Overloaded, SynthesisError
from tts_core.monitor import Monitor
from tts_core.ops.metrics import Metrics
from tts_core.request.access import Caller
from tts_core.request.dispatch import Scheduler, pieces_of
from tts_core.request.operating import OperatorSettings
from tts_core.request.script import Passage
from tts_core.scheduler.pool import ModelPool
from tts_core.scheduler.queue import WaitTarget
from tts_core.scheduler.records import QueuedItem
from tts_core.service import SpeechService
from tts_core.voices.registry import model_specs

log = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0
# Chorus's queue decides what waits and what is refused (503 with Retry-After): Ray's own limit on
# requests in flight must never be what refuses first.
MAX_ONGOING_REQUESTS = 4096
# What the ingress needs of each piece queued on an engine replica (its engine input among them), besides its output
DESCRIBED = ("input", "key", "priority", "tier", "caller", "due_s", "sample_rate", "pause_s", "passage", "word_ids")
STAMPS = ("queue_s", "batch_s", "batch_size")  # set on a piece as it runs


class Event(StrEnum):
    """What an engine replica's `speak` streams back to the ingress: each event is (kind, ...)."""

    QUEUED = "queued"  # (QUEUED, descriptions, played_s): the passage's pieces are queued there
    REFUSED = "refused"  # (REFUSED, error): none of it was queued
    AUDIO = "audio"  # (AUDIO, n, audio): piece n's audio, or a part of it (a stream of a stepped engine)
    DONE = "done"  # (DONE, n, stamps): piece n has ended, with its timings
    FAILED = "failed"  # (FAILED, n, error): piece n failed, and the call ends


def engine_deployment_name(model: str) -> str:
    return f"engine-{model}"


# --- the engine side ------------------------------------------------------------------------------


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0})
class EngineReplica:
    """One model, its queue and its engine loop. `speak` queues one passage and streams back its `Event`s, in order:
    QUEUED or REFUSED; then for each piece AUDIO (several for a stream of a stepped engine), then DONE or FAILED."""

    def __init__(self, model: str):
        settings = Settings()
        specs = [spec for spec in model_specs(settings) if spec.name == model]
        if not specs:
            raise EngineUnavailable(f"model {model!r} is not configured here (TTS_VOICES_FILE, TTS_VOICES_DIR)")
        self.storage = Storage(settings.database)
        self.service = SpeechService(settings, [replace(specs[0], pinned=True)], Metrics(),
                                     clones=stored_clones(self.storage, settings.data_dir, [model]))
        self.clones = VoiceClones(self.storage, self.service)  # the stored cloned voices, followed each second
        self.service.start()
        self.service.wait_ready()
        replica = f"{model}/{serve.get_replica_context().replica_id.unique_id}"
        self.reporter = ReplicaReporter(self.storage, self.service, replica)
        self._start_monitor()
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="replica-report", daemon=True).start()
        log.info("engine replica %s serves %s", replica, model)

    def _report(self) -> None:
        """Each second: this replica's figures, and the cloned voices made or deleted through any replica."""
        while not self._stop.wait(REPORT_EVERY_S):
            try:
                self._follow_settings()
                self.reporter.report()
                self.clones.refresh()
            except StorageError:  # the report says it once per outage
                pass
            except Exception:  # a bug must not end the reports
                log.exception("replica report failed")

    def _start_monitor(self) -> None:
        """Degrade mode here as in one process: the load score from this replica's queue, under the operator
        settings stored through any replica (followed each second), an engine with a lower precision lowered
        while it is degraded. Its state is in this replica's reports, which the ingress reads."""
        self._follow_settings()
        self.monitor = Monitor(self.service)
        self.monitor.start()

    def _follow_settings(self) -> None:
        """The stored operator settings (degrade mode's thresholds, the wait targets), the ingress's too."""
        stored, defaults = self.storage.settings.read(), self.service.settings.operator_defaults
        settings, _ = OperatorSettings.from_stored(stored, defaults)
        if settings != self.service.degrade.settings:  # (the ingress logs the values it ignores)
            self.service.degrade.configure(settings)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's autoscaler reads these (scale_on_queue): the pieces queued or running here."""
        return {"pending_pieces": float(self.service.status()["pending_requests"])}

    async def speak(self, passage: Passage, index: int, first: bool, caller: Caller | None, streaming: bool,
                    target: WaitTarget, played_s: float, words: bool):
        try:
            items, played_s = await self.service.scheduler.submit_passage(
                passage, index, first, caller, streaming, target, played_s, words)
        except ChorusError as error:
            yield (Event.REFUSED, error)
            return
        now = time.monotonic()
        try:  # from here on, however the call ends (the ingress cancels it: its caller went), nothing is left queued
            yield (Event.QUEUED, [{**{name: getattr(item, name) for name in DESCRIBED},
                               "deadline_in_s": item.deadline - now, "streamed": item.pieces is not None,
                               "said": item.said and (item.said.first, item.said.words, item.said.language)}
                              for item in items], played_s)
            for number, item in enumerate(items):
                try:
                    async for output in pieces_of(item, self.service.settings.request_timeout_s):
                        yield (Event.AUDIO, number, output)
                except ChorusError as error:
                    yield (Event.FAILED, number, error)
                    return
                yield (Event.DONE, number, {name: getattr(item, name) for name in STAMPS})
        finally:
            for item in items:
                item.abandon()

    def __del__(self):  # (also after an __init__ that failed part way)
        if stop := getattr(self, "_stop", None):
            stop.set()
        if monitor := getattr(self, "monitor", None):
            monitor.stop()
        if service := getattr(self, "service", None):
            service.stop()
        if storage := getattr(self, "storage", None):
            storage.engine.dispose()


# --- the ingress side -----------------------------------------------------------------------------


class RemoteScheduler(Scheduler):
    """Each passage queued on its model's engine deployment; the pieces here stand for the ones queued
    there, resolved as their audio arrives. A piece given up here (its caller went, its deadline passed)
    cancels the call, which takes the passage's pieces out of the engine replica's queue."""

    def __init__(self, settings: Settings, pool: ModelPool, metrics: Metrics, engines: dict[str, DeploymentHandle]):
        super().__init__(settings, pool, metrics)
        self.engines = engines
        self.remote_loads = RemoteLoads(engines)  # refreshed by the ingress's reads of the replicas' reports
        self._deliveries: set[asyncio.Task] = set()  # held until done (the loop keeps only weak references)

    async def submit_passage(self, passage: Passage, index: int, first: bool, caller: Caller | None,
                             streaming: bool, target: WaitTarget, played_s: float, words: bool
                             ) -> tuple[list[QueuedItem], float]:
        events = self.engines[passage.model].options(stream=True).speak.remote(
            passage, index, first, caller, streaming, target, played_s, words)
        patience_s = min(target.usual_s, self.timeout_s(caller))
        try:  # an engine replica answers at once (queued or refused), unless none is up to answer
            kind, *answer = await asyncio.wait_for(events.__anext__(), patience_s)
        except TimeoutError:
            events.cancel()
            raise Overloaded(f"no replica of model {passage.model} answered within {patience_s:.0f} s; retry",
                             patience_s, ErrorCode.ENGINE_UNAVAILABLE) from None
        except BaseException as error:  # the replica died before it answered, or the caller went
            events.cancel()
            if isinstance(error, Exception):
                raise _lost(error) from error
            raise
        if kind == Event.REFUSED:
            raise answer[0]
        descriptions, played_s = answer
        items = [_standing_in(description, self.word_timer) for description in descriptions]
        loop = asyncio.get_running_loop()

        def given_up(future) -> None:  # called where it was cancelled: maybe a thread of its own
            if future.cancelled():
                loop.call_soon_threadsafe(events.cancel)

        for item in items:
            item.future.add_done_callback(given_up)
        task = asyncio.create_task(_deliver(events, items))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)
        return items, played_s

    def loads(self) -> dict[str, DeploymentLoad]:
        """Each model's load as its engine replicas report it (deploy.replica_load.DeploymentLoad)."""
        return self.remote_loads.loads()


def _standing_in(description: dict, word_timer: WordTimer) -> QueuedItem:
    """The ingress's piece for an engine replica's: its words, where the engine does not time them, are timed here
    (where the answer is assembled)."""
    described = {name: description[name] for name in DESCRIBED}
    said = description.get("said")
    return QueuedItem(**described, deadline=time.monotonic() + description["deadline_in_s"],
                      pieces=AudioPieces() if description["streamed"] else None,
                      said=SaidWords(*said, word_timer) if said else None)


async def _deliver(events: DeploymentResponseGenerator, items: list[QueuedItem]) -> None:
    """The engine replica's events onto the pieces standing in for its own. However it ends, every piece
    ends (its audio, or why not) and the call is cancelled unless it ran to its end."""
    outputs: list[list[EngineOutput]] = [[] for _ in items]
    failure: ChorusError = _lost(EOFError("the call ended early"))  # for pieces its events never ended
    try:
        async for kind, number, value in events:
            item = items[number]
            if kind == Event.AUDIO:
                outputs[number].append(value)
                if item.pieces is not None:
                    item.pieces.push(value.audio)
            elif kind == Event.DONE:
                for name, stamp in value.items():
                    setattr(item, name, stamp)
                if item.pieces is not None:
                    item.pieces.end()
                item.resolve(_whole(outputs[number]))
            else:
                raise value
    except BaseException as error:  # failed, given up here (Ray's RequestCancelledError), or the replica is gone
        failure = error if isinstance(error, ChorusError) else _lost(error)
        events.cancel()
        if isinstance(error, asyncio.CancelledError):
            raise
    finally:
        for item in items:
            if item.pieces is not None:
                item.pieces.end(failure)
            item.resolve(failure)


def _whole(outputs: list[EngineOutput]) -> EngineOutput:
    """A piece's output from the outputs it arrived in: one whole (with its word timings, if any), or a stream's."""
    if len(outputs) == 1:
        return outputs[0]
    return EngineOutput(np.concatenate([output.audio for output in outputs]) if outputs else np.zeros(0, np.float32))


def _lost(error: BaseException) -> SynthesisError:
    return SynthesisError(f"the engine replica serving this request failed ({type(error).__name__}); retry")


@serve.deployment(max_ongoing_requests=MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0})
@serve.ingress()
class ChorusIngress:
    def __init__(self, engines: dict[str, DeploymentHandle]):
        self.engines = engines

    def __serve_build_asgi_app__(self):
        """The app, its models listed (from their specs, never loaded here) and spoken by the engines."""
        # its own name in the cluster view, whatever TTS_REPLICA_ID the deployment's environment has
        settings = Settings(replica_id=f"ingress/{serve.get_replica_context().replica_id.unique_id}")
        specs = [replace(spec, pinned=False, load=partial(_loaded_elsewhere, spec.name))
                 for spec in model_specs(settings)]
        app = create_app(settings, specs, partial(RemoteScheduler, engines=self.engines))
        # A clip is encoded by its model's engine, which is not here. Voices cloned through a replica (python
        # app.py) on the same database are listed here and spoken by the engine replicas.
        app.state.service.cloner.refusal = ("the Ray Serve ingress cannot clone voices (its engines run in their "
                                            "own deployments); clone through python app.py on the same database")
        # the engines' load (status, degrade mode) from every replica's report, as the cluster view reads them
        app.state.replicas.on_rows.append(app.state.service.scheduler.remote_loads.refresh)
        return app


def _loaded_elsewhere(model: str):
    raise EngineUnavailable(f"model {model!r} runs on its engine deployment, not in the ingress")


# --- the application ------------------------------------------------------------------------------


class EngineOptions(BaseModel):
    """serve.yaml's `args`: how every model's engine deployment runs (a deployment of serve.yaml's own
    `deployments:` list, by its name `engine-<model>`, overrides these for one model)."""

    num_gpus: float = Field(0, ge=0)  # per replica: 1 is a GPU each, 0.5 two replicas per GPU
    num_cpus: float = Field(1, ge=0)
    replicas: int | None = Field(None, ge=1)  # a fixed number; unset: autoscaled between the two below
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_pieces: float = Field(8, gt=0)  # pieces queued or running per replica that the autoscaler aims at


def scale_on_queue(ctx: AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """Replicas enough for each to have target_ongoing_requests (EngineOptions.target_pieces) pieces queued or
    running in its own queue, as the replicas report (record_autoscaling_stats). Ray applies the bounds and
    the up- and down-scaling delays."""
    pending = sum((ctx.aggregated_metrics or {}).get("pending_pieces", {}).values())
    return math.ceil(pending / ctx.config.get_target_ongoing_requests()), {}


def build(args: dict[str, Any]):
    """The application `serve run deploy/serve.yaml` deploys: an engine deployment per configured model
    (TTS_ variables, as in one process) and the ingress."""
    options = EngineOptions(**args)
    scaling: dict[str, Any] = (
        {"num_replicas": options.replicas} if options.replicas else
        {"autoscaling_config": {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                                "target_ongoing_requests": options.target_pieces,
                                "policy": {"policy_function": "deploy.ray_serve:scale_on_queue"}}})
    engines = {spec.name: EngineReplica.options(
        name=engine_deployment_name(spec.name),
        ray_actor_options={"num_gpus": options.num_gpus, "num_cpus": options.num_cpus}, **scaling).bind(spec.name)
        for spec in model_specs(Settings())}
    return ChorusIngress.bind(engines)
