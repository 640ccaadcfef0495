"""The Admin tab's state text: degrade mode, the load score with each of its parts in words, precision, storage."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.in_flight import BreakerState
from tts_core.scheduler.upstream import UpstreamStatus


def _queue_wait(value: float, settings: OperatorSettings, gpu: dict | None, limit_s: float) -> str:
    target = limit_s or settings.queue_wait_target_s
    wait = f"{target:g} s or more" if value >= 1 else f"{value * target:.1f} s"
    fields = OperatorSettings.model_fields  # a setting as the Settings tab labels it
    which = (f"“{fields['queue_wait_target_s'].title}” in Settings" if target == settings.queue_wait_target_s else
             f"“{fields['overload_wait_target_s'].title}” in Settings, in force while work comes in faster than "
             "the engine does it")
    return (f"a new caller's sentence would wait {wait} before its synthesis starts (predicted from the work queued "
            f"ahead of it and the engine's measured speed), over the {target:g} s target, {which}")


def _device_memory(value: float, settings: OperatorSettings, gpu: dict | None, limit_s: float) -> str:
    amount = ""
    if gpu and gpu.get("total_mb"):
        amount = f", {(gpu['total_mb'] - gpu['free_mb']) / 1024:.1f} of {gpu['total_mb'] / 1024:.1f} GiB"
    return (f"{value:.0%} of the GPU's memory is in use{amount}, by every process on it (models' weights and "
            "the memory their framework keeps cached count too): near 1, a bigger batch may not fit")


PARTS = {"queue_wait": ("queue wait", _queue_wait), "device_memory": ("GPU memory", _device_memory)}


def load_markdown(degrade: dict, settings: OperatorSettings, gpu: dict | None) -> str:
    """The score, what moves degrade mode, and each part with what it measures; the part that sets the score
    first and marked."""
    parts = sorted(degrade["parts"].items(), key=lambda part: -part[1])
    lines = [f"**Load score {degrade['score']:.2f}**, the largest of its parts, each 0 (idle) to 1 (full): degrade "
             f"mode starts at {settings.enter_threshold:g} and ends once the score has stayed at or below "
             f"{settings.exit_threshold:g} for {settings.exit_hold_s:g} s."]
    for index, (name, value) in enumerate(parts):
        label, words = PARTS.get(name, (name.replace("_", " "), lambda *_: ""))
        mark = " (sets the score)" if index == 0 and value > 0 else ""
        lines.append(f"- **{label} {value:.2f}**{mark}: "
                     f"{words(value, settings, gpu, degrade.get('queue_wait_limit_s', 0.0))}")
    return "\n".join(lines)


def _replica(row: dict) -> str:
    name = f"`{row['id']}`" + (" (this one)" if row["self"] else "")
    if row["gone"]:
        return f"{name} gone (last seen {row['seen_s_ago']:.0f} s ago)"
    figures = row["figures"]
    return (f"{name} queue {figures['queue_length']}, running {figures['running']}, load {figures['load_score']:.2f}"
            + (", **degraded**" if figures["degraded"] else ""))


def _upstream(name: str, upstream: UpstreamStatus) -> str:
    breaker = upstream.breaker
    state = breaker.state if breaker.state == BreakerState.CLOSED else \
        f"**{breaker.state}** (next try in {breaker.retry_after_s:.0f} s)"
    errors = ", ".join(f"{count} {kind}" for kind, count in sorted(upstream.errors.items())) or "none"
    return (f"`{name}` at {upstream.url}: {upstream.in_flight} in flight of a learned {upstream.limit} (at most "
            f"{upstream.most}), {upstream.latency_s:.2f} s a request, breaker {state}; errors: {errors}")


def upstream_policies(status: dict) -> dict[str, UpstreamStatus]:
    """The loaded upstream models' figures (requests in flight, the learned limit, the breaker), by model, from the
    status as JSON (the stats may come from another replica)."""
    return {name: upstream for name, model in status["engines"].items()
            if (upstream := UpstreamStatus.from_json(model)) is not None}


def _database(url: str) -> str:
    """A SQLite database as its file's full path: `sqlite:///data/chorus.db` is data/chorus.db beside where the
    server runs, but reads like /data."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"`{url}`"
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        return f"SQLite file `{Path(parsed.database).resolve()}`"
    return f"`{url}`"


def state_markdown(stats: dict, settings: OperatorSettings) -> str:
    degrade, storage = stats["degrade"], stats["storage"]
    mode = "**DEGRADED**" if degrade["active"] else "normal"
    actions = ", ".join(degrade["actions"]) or "none"
    precision = ", ".join(f"{engine}: {mode_}" for engine, mode_ in stats["precision"].items()) or "full"
    gpu = stats["gpu"]
    device = "none" if gpu is None else (f"{gpu['free_mb']:.0f} of {gpu['total_mb']:.0f} MiB free, "
                                         f"{gpu['utilization_pct']}% busy")
    lines = [f"**Mode:** {mode}; actions: {actions}", load_markdown(degrade, settings, gpu),
             f"**Precision:** {precision} · **GPU:** {device}",
             f"**Storage:** {_database(storage['database'])}"]
    if faults := [f"`{name}` {model['turn_failures']} (last: {model['last_turn_failure']})"
                  for name, model in stats["status"]["engines"].items() if model.get("turn_failures")]:
        lines.append("**Failed engine turns** (each ended only the requests it ran; the log has the first of each "
                     "kind): " + "; ".join(faults))
    if upstreams := upstream_policies(stats["status"]):
        lines.append("**Upstreams:** " + "; ".join(_upstream(name, upstream) for name, upstream in upstreams.items()))
    if len(stats["replicas"]) > 1:  # a deployment of several: each as it last reported
        lines.append("**Replicas:** " + "; ".join(_replica(row) for row in stats["replicas"]))
    errors = [error for error in (storage["settings_error"], storage["request_log_error"]) if error]
    if errors:
        lines.append("**Storage error:** " + "; ".join(errors) + " — serving with the last known settings")
    if storage["ignored_settings"]:
        lines.append("**Stored settings ignored (out of bounds, defaults apply):** "
                     + "; ".join(storage["ignored_settings"].values()))
    store = storage["rate_limit_store"]
    if store["state"] != "closed":
        since = datetime.fromtimestamp(store["since"]).strftime("%H:%M:%S")
        lines.append(f"**Rate-limit store {store['state']} since {since}:** {store['error']} — serving without "
                     "rate limits")
    elif storage["rate_limit_error"]:
        lines.append(f"**Rate-limit store error:** {storage['rate_limit_error']} — serving without rate limits")
    return "\n\n".join(lines)
