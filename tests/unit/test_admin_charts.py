"""The Admin tab's charts and words, without a browser: axes that start at 0 and say their units, p50 visible
over p95, no toolbar, the cost model with its measured batches, and the load score explained part by part."""

import json
from types import SimpleNamespace

from admin.charts import CHARTS, absent, cost_figure, plot_data, replica_charts, series_figure
from admin.state import load_markdown
from tests.fakes import FakeEngine
from tts_core.controls import ServiceControls
from tts_core.ops.metrics import Metrics
from tts_core.request.operating import OperatorSettings
from tts_core.scheduler.engine_loop import EngineLoop, Serving
from tts_core.scheduler.one_shot import OneShotStrategy
from tts_core.scheduler.policy import AdaptivePolicy, BatchPolicy, make_policy
from tts_core.scheduler.queue import RequestQueue


def cost_models(policy: BatchPolicy) -> dict:
    """The cost models the dashboard shows of a service with one model's loop (not started) under this policy."""
    served = Serving(FakeEngine(), RequestQueue(8), Metrics())
    service = SimpleNamespace(loops={"piper": EngineLoop(served, OneShotStrategy(served, policy))})
    return ServiceControls(service).cost_models()


def flat_points(count: int = 5) -> list[dict]:
    """An idle server's series: every value the same (7,945 ms latencies, no cache hits, no jobs)."""
    return [{"t": 1_700_000_000 + second, "batch_size": 1.0, "queue_length": 0, "throughput_audio_s": 0.0,
             "p50_ms": 7945.0, "p95_ms": 7945.0, "first_audio_p50_ms": None, "first_audio_p95_ms": None,
             "cache_hit_rate": 0.0, "jobs_queued": 0, "jobs_oldest_s": None, "gpu_used_fraction": None,
             "gpu_utilization_pct": None, "running_requests": None, "steps_per_s": None, "frames_per_step": None,
             "engine_busy_share": None, "codec_busy_share": None}
            for second in range(count)]


def test_flat_series_get_axes_from_zero_with_units():
    figures = {chart.title: series_figure(flat_points(), chart).to_dict()["layout"] for chart in CHARTS}
    assert figures["Cache hit rate"]["yaxis"]["range"] == [0, 1.0]
    assert figures["Job backlog"]["yaxis"]["range"] == [0, 1.0] and figures["Queue length"]["yaxis"]["range"] == [0, 1]
    assert figures["Latency"]["yaxis"]["range"][0] == 0 and 7945 < figures["Latency"]["yaxis"]["range"][1] < 10_000
    assert all(layout["yaxis"]["title"]["text"] for layout in figures.values())
    assert figures["Job backlog"]["yaxis2"]["title"]["text"] == "s waiting"


def test_charts_of_what_is_not_here_are_one_line_instead():
    """No GPU, no autoregressive engine: those three charts are not drawn, and say why in a line; every other
    chart is drawn, flat or not (a queue that stays at 0 is a measurement)."""
    reasons = {chart.title: absent(flat_points(), chart) for chart in CHARTS}
    assert reasons.pop("GPU") == "no GPU (NVML not available)"
    assert reasons.pop("Autoregressive engines") == "no autoregressive engine loaded"
    assert reasons.pop("Autoregressive stages: busy share") == "no autoregressive engine loaded"
    assert set(reasons.values()) == {None}
    with_gpu = [{**point, "gpu_used_fraction": 0.5} for point in flat_points()]
    assert absent(with_gpu, next(chart for chart in CHARTS if chart.title == "GPU")) is None
    assert absent([], replica_charts([])[0]) == "no replica has reported"


def test_every_setting_has_a_label_in_words_with_its_unit_and_a_line_of_help():
    """The Admin tab's form labels each setting with its field's title, and its description as help."""
    fields = OperatorSettings.model_fields
    assert all(info.title and "_" not in info.title and info.description for info in fields.values()), fields
    assert fields["exit_hold_s"].title == "Hold before leaving (s)"
    assert fields["cache_max_mb"].title == "Audio cache size (MB)"
    assert fields["cap_text_chars"].title.endswith("(characters)")


def test_p50_is_drawn_over_p95_and_no_toolbar():
    latency = next(chart for chart in CHARTS if chart.title == "Latency")
    figure = series_figure(flat_points(), latency)
    under, over = figure.data
    assert (under.name, over.name) == ("p95", "p50") and under.line.width > over.line.width
    shown = json.loads(plot_data(figure).plot)
    assert shown["config"]["displayModeBar"] is False
    assert shown["layout"]["paper_bgcolor"] == "rgba(0,0,0,0)"  # the page's light or dark background shows


def test_the_cost_model_chart_shows_the_fit_and_the_measured_batches():
    policy = AdaptivePolicy(max_batch_size=8, max_batch_tokens=10_000)
    for size in (1, 2, 4):
        policy.observe(size, size * 24, 0.05 + 0.002 * size * 24, calibration=True)
    policy.observe(1, 40, 0.09, real_tokens=40)
    policy.observe(1, 40, 0.09, real_tokens=40)
    models = cost_models(policy)
    assert models["piper"]["fitted"] and len(models["piper"]["observations"]) == 5
    figure = cost_figure(models)
    traces = {trace.name: trace for trace in figure.data}
    assert list(traces["measured: served batches"].x) == [1, 1]
    assert list(traces["measured: calibration batches"].x) == [1, 2, 4]
    line = traces["predicted: one batch of n"]
    assert list(line.x) == list(range(1, 9)) and line.y[0] == policy.cost_model.predict(1, 40)
    assert "40 tokens" in figure.layout.xaxis.title.text  # the served batches' length, not the sweep's
    # the legend is under the axes (below 0 on the plot's scale), so it covers none of the points
    assert figure.layout.legend.y < 0 and figure.layout.legend.yanchor == "top"
    highest = max(max(trace.y) for trace in figure.data)
    assert highest < figure.layout.yaxis.range[1] <= 1.2 * highest  # no headroom kept for a legend inside


def test_a_policy_without_a_cost_model_says_so():
    figure = cost_figure(cost_models(make_policy("static", 8, 10_000)))
    assert "static" in figure.layout.annotations[0].text and not figure.data


def test_the_load_score_is_explained_part_by_part():
    degrade = {"score": 0.79, "parts": {"queue_wait": 0.0, "device_memory": 0.79}}
    gpu = {"free_mb": 30_000.0, "total_mb": 143_000.0, "used_fraction": 0.79, "utilization_pct": 0}
    text = load_markdown(degrade, OperatorSettings(), gpu)
    first, second = text.splitlines()[1:]
    assert first.startswith("- **GPU memory 0.79** (sets the score)") and "every process" in first
    assert second.startswith("- **queue wait 0.00**:") and "0.0 s" in second and "10 s target" in second
    assert "starts at 0.85" in text
    overloaded = load_markdown({"score": 0.75, "parts": {"queue_wait": 0.75}, "queue_wait_limit_s": 2.0},
                               OperatorSettings(), None)
    assert "1.5 s" in overloaded and "2 s target, “Longest queue wait in an overload (s)” in Settings" in overloaded


def test_a_line_per_replica():
    points = [{"t": 1.0, "load:a:1": 0.2, "queue:a:1": 3, "load:b:2": 0.5, "queue:b:2": 0},
              {"t": 2.0, "load:a:1": 0.3, "queue:a:1": 1}]  # b stopped reporting
    load, queue = replica_charts(points)
    assert [series.label for series in load.series] == ["a:1", "b:2"] and load.fraction
    figure = series_figure(points, queue)
    assert [trace.name for trace in figure.data] == ["a:1", "b:2"] and list(figure.data[1].y) == [0, None]
    assert replica_charts([])[0].series == ()
