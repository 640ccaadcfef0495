"""The Ray Serve ingress's view of its engine replicas' load (deploy/replica_load.py), from the rows they report
to the shared database: a deployment reads as its least pressed live replica with the queues added up, the view
lapses when the reports stop being read, the reports carry what the view reads, and the ingress's status, degrade
mode and admission read it as they read an engine loop in one process."""

import asyncio
from functools import partial

import pytest

from admin.cluster import GONE_AFTER_S, ReplicaReporter
from deploy.replica_load import DeploymentLoad, RemoteLoads
from storage import Storage, sqlite_url
from tests.fakes import FakeEngine
from tts_core.config import Settings
from tts_core.engines import ModelSpec
from tts_core.errors import Degraded
from tts_core.monitor import Monitor
from tts_core.ops.metrics import Metrics
from tts_core.request.ask import Ask
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.queue import WaitTarget
from tts_core.service import SpeechService


def figures(queue_length: int = 0, wait_s: float = 0.0, limit_s: float = 10.0, running: int = 0,
            degraded: bool = False) -> dict:
    return {"queue_length": queue_length, "running": running, "queue_wait_s": wait_s, "queue_wait_limit_s": limit_s,
            "degraded": degraded, "load_score": 0.0}


def row(replica: str, seen_s_ago: float = 0.5, **figured) -> dict:
    return {"id": replica, "seen_s_ago": seen_s_ago, "figures": figures(**figured)}


def test_a_deployment_reads_as_its_least_pressed_replica_with_its_queues_added_up():
    load = DeploymentLoad((figures(30, 6.0, 10.0, 2, True), figures(10, 1.5, 2.0, 1)))  # 60% and 75% of their limits
    assert load.queue_length == 40 and load.running_count() == 3
    assert load.predicted_wait() == 1.5  # where a new sentence would wait least
    assert load.pressure(WaitTarget(10.0, 2.0)) == (6.0, 10.0)  # the smaller share of its limit
    assert load.status().to_json() == {"queue_length": 40, "queue_wait_s": 1.5, "ready": True, "running": 3,
                                       "replicas": 2, "degraded_replicas": 1}


def test_the_view_holds_the_live_engine_replicas_of_its_models_until_the_reports_stop_being_read():
    now = [100.0]
    view = RemoteLoads(["joe", "pocket"], clock=lambda: now[0])
    assert view.loads() == {}
    view.refresh([row("joe/a", queue_length=4, wait_s=1.0), row("joe/b", queue_length=2, wait_s=0.5),
                  row("joe/gone", seen_s_ago=GONE_AFTER_S + 1, queue_length=50, wait_s=9.0),
                  row("ingress/x", queue_length=7), row("other/a", queue_length=7),
                  {"id": "pocket/old", "seen_s_ago": 0.1, "figures": {"queue_length": 3}}])  # an older version's
    assert set(view.loads()) == {"joe"}
    assert view.loads()["joe"].queue_length == 6 and view.loads()["joe"].predicted_wait() == 0.5
    now[0] += GONE_AFTER_S
    assert view.loads()["joe"].queue_length == 6  # read a while ago, still current
    now[0] += 0.1
    assert view.loads() == {}  # not read for longer (the database is out of reach): no view
    view.refresh([row("joe/a", queue_length=1)])
    assert view.loads()["joe"].queue_length == 1


def test_a_replicas_report_carries_what_the_view_reads_and_is_handed_on(tmp_path):
    storage = Storage(sqlite_url(tmp_path / "chorus.db"))
    storage.migrate()
    engine = FakeEngine()
    service = SpeechService(Settings(voice_aliases={}, model_aliases={}), [engine], Metrics())
    reporter = ReplicaReporter(storage, service, f"{engine.name}/r1")
    view = RemoteLoads([engine.name])
    reporter.on_rows.append(view.refresh)
    reporter.report()
    assert view.loads()[engine.name].pressure(WaitTarget()) == service.queue_pressure()
    assert view.loads()[engine.name].status().replicas == 1


def test_the_ray_ingress_status_degrade_mode_and_admission_read_its_engine_replicas_load():
    pytest.importorskip("ray.serve")
    from deploy.ray_serve import RemoteScheduler, _loaded_elsewhere

    engine = FakeEngine()
    spec = ModelSpec(engine.name, engine.voices(), partial(_loaded_elsewhere, engine.name), pinned=False)
    service = SpeechService(Settings(voice_aliases={}, model_aliases={}), [spec], Metrics(),
                            make_scheduler=partial(RemoteScheduler, engines={engine.name: None}))
    service.degrade.configure(OperatorSettings(queue_wait_target_s=2.0, exit_hold_s=0))
    monitor = Monitor(service)
    long_text = "A sentence of some length is here. " * 12  # over degrade mode's cap of 300 characters
    try:
        service.scheduler.remote_loads.refresh([row(f"{engine.name}/a", queue_length=30, wait_s=2.5, limit_s=2.0),
                                                row(f"{engine.name}/b", queue_length=20, wait_s=3.0, limit_s=2.0)])
        status = service.status()
        assert status["queue_length"] == 50 and status["queue_wait_s"] == 2.5
        assert status["engines"][engine.name]["loaded"] and status["engines"][engine.name]["replicas"] == 2
        monitor.tick()
        assert service.degrade.state.active and service.degrade.state.score == 1.0
        with pytest.raises(Degraded):
            asyncio.run(service._admit(Ask(long_text, "fake-voice")))

        service.scheduler.remote_loads.refresh([row(f"{engine.name}/a"), row(f"{engine.name}/b")])  # drained
        monitor.tick()
        assert service.status()["queue_length"] == 0 and not service.degrade.state.active
        asyncio.run(service._admit(Ask(long_text, "fake-voice")))
    finally:
        service.stop()

