"""The Admin tab's charts: the live series and the batch policy's cost model, as plotly figures that read in
light and dark mode alike, on axes that start at 0 and say their units, without plotly's toolbar."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime

import plotly.graph_objects as go
import plotly.io
from gradio.components.plot import PlotData

# Neutral greys on a transparent background: the page's own (light or dark) shows through, and the text
# keeps about 4.5:1 contrast against white and against Gradio's dark background alike.
TEXT, GRID = "#767676", "rgba(128, 128, 128, 0.25)"
COLORS = ["#3b82f6", "#f97316", "#10b981", "#a855f7", "#ef4444"]
COST_TITLE = "Batch cost model"
PLURAL = {"batch": "batches", "step": "steps"}
CONFIG = {"displayModeBar": False, "displaylogo": False}  # Gradio passes a figure's "config" to plotly


@dataclass(frozen=True)
class Series:
    key: str  # in each point of the stats' series
    label: str
    scale: float = 1.0  # plotted value = stored value * scale
    right: bool = False  # on the right-hand axis (another unit)
    under: bool = False  # drawn wide and pale, so a line drawn after it stays visible where they meet


@dataclass(frozen=True)
class Chart:
    title: str
    series: tuple[Series, ...]
    unit: str  # the left axis' title
    fraction: bool = False  # a share: the axis is 0 to 100%, whatever the values
    right_unit: str = ""
    absent: str = ""  # why there is no data, where there may be none (no GPU here): one line instead of the chart


CHARTS = (
    Chart("Batch size", (Series("batch_size", "average batch size"),), "items per batch"),
    Chart("Queue length", (Series("queue_length", "queued items"),), "items (text pieces)"),
    Chart("Throughput", (Series("throughput_audio_s", "audio made"),), "audio s per s"),
    Chart("Latency", (Series("p95_ms", "p95", under=True), Series("p50_ms", "p50")), "ms"),
    Chart("Streams: time to first audio", (Series("first_audio_p95_ms", "p95", under=True),
                                           Series("first_audio_p50_ms", "p50")), "ms"),
    Chart("Cache hit rate", (Series("cache_hit_rate", "hit rate"),), "share of lookups", fraction=True),
    Chart("Job backlog", (Series("jobs_queued", "queued jobs"), Series("jobs_oldest_s", "oldest waiting", right=True)),
          "jobs", right_unit="s waiting"),
    Chart("GPU", (Series("gpu_used_fraction", "memory used"), Series("gpu_utilization_pct", "busy", scale=0.01)),
          "share", fraction=True, absent="no GPU (NVML not available)"),
    Chart("Autoregressive engines", (Series("running_requests", "requests running"),
                                     Series("frames_per_step", "frames per step"),
                                     Series("steps_per_s", "steps per second", right=True)),
          "requests, frames", right_unit="steps per s", absent="no autoregressive engine loaded"),
    Chart("Autoregressive stages: busy share", (Series("engine_busy_share", "steps (engine thread)"),
                                                Series("codec_busy_share", "codec")),
          "share of the last 10 s", fraction=True, absent="no autoregressive engine loaded"),
)


def replica_charts(points: list[dict]) -> tuple[Chart, Chart]:
    """A line per replica that reported in the points (several replicas on one database)."""
    replicas = sorted({key.split(":", 1)[1] for point in points for key in point if key.startswith("load:")})
    return (Chart("Load score by replica", tuple(Series(f"load:{name}", name) for name in replicas), "load score",
                  fraction=True, absent="no replica has reported"),
            Chart("Queue length by replica", tuple(Series(f"queue:{name}", name) for name in replicas),
                  "items (text pieces)", absent="no replica has reported"))


def absent(points: list[dict], chart: Chart) -> str | None:
    """Why the chart is not drawn: a chart of what may not exist here (a GPU, an engine, replicas) with no value."""
    if not chart.absent or any(point.get(series.key) is not None for point in points for series in chart.series):
        return None
    return chart.absent


def plot_data(figure: go.Figure) -> PlotData:
    """The figure as gr.Plot shows it, with our plotly config (no toolbar) alongside."""
    return PlotData(type="plotly", plot=plotly.io.to_json({**figure.to_dict(), "config": CONFIG}, validate=False))


def _axis(title: str, top: float, **more) -> dict:
    return {"title": {"text": title}, "range": [0, top], "fixedrange": True, "gridcolor": GRID, "zeroline": False,
            **more}


def _top(values: list[float]) -> float:
    """A count's axis: from 0 to a little over the largest value (1 when all are 0)."""
    return 1.15 * max(values, default=0) or 1.0


def _figure(title: str, height: int) -> go.Figure:
    """An empty figure in the tab's style: no zooming or dragging (a phone's finger scrolls the page instead)."""
    return go.Figure(layout={
        "title": {"text": title, "font": {"size": 15}}, "height": height, "template": "none", "font": {"color": TEXT},
        "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)", "colorway": COLORS, "dragmode": False,
        "margin": {"l": 55, "r": 15, "t": 40, "b": 40}, "legend": {"orientation": "h", "x": 0, "y": -0.18}})


def series_figure(points: list[dict], chart: Chart) -> go.Figure:
    figure = _figure(chart.title, 250)
    times = [datetime.fromtimestamp(point["t"]) for point in points]
    values = {False: [], True: []}  # left axis, right axis
    for series in chart.series:
        ys = [None if point.get(series.key) is None else point[series.key] * series.scale for point in points]
        values[series.right].extend(y for y in ys if y is not None)
        figure.add_trace(go.Scatter(x=times, y=ys, name=series.label, mode="lines", yaxis="y2" if series.right else "y",
                                    line={"width": 6 if series.under else 2}, opacity=0.45 if series.under else 1))
    figure.update_layout(xaxis={"fixedrange": True, "gridcolor": GRID, "tickformat": "%H:%M:%S"},
                         yaxis=_axis(chart.unit, 1.0, tickformat=".0%") if chart.fraction
                         else _axis(chart.unit, _top(values[False])),
                         showlegend=len(chart.series) > 1)
    if chart.right_unit:
        figure.update_layout(yaxis2=_axis(chart.right_unit, _top(values[True]), overlaying="y", side="right",
                                          showgrid=False),
                             margin={"r": 55})
    return figure


def typical_length(observations: list[dict]) -> float:
    """Tokens an item (a stepped engine: the longest context) in the batches served lately: the median over
    the model's recent window, or over the calibration sweep before any batch was served."""
    served = [row for row in observations if not row["calibration"]] or observations
    return statistics.median(row["padded_tokens"] / row["size"] for row in served) if served else 0.0


def cost_figure(models: dict[str, dict]) -> go.Figure:
    """Predicted seconds against batch size at the typical length: one batch of n items (line) and the same n
    items one at a time (dotted), with the measured batches the model is fitted on (points; hollow: the
    calibration sweep). The adaptive batcher takes a batch only where the line is clearly under the dots."""
    # the legend under the axes, where it covers no point whatever the measurements (a phone wraps it)
    figure = _figure(COST_TITLE, 360)
    figure.update_layout(legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.28, "yanchor": "top"},
                         margin={"b": 120})
    fitted = {name: model for name, model in models.items() if model["fitted"]}
    top_size, top_s, lengths = 1, 0.0, []
    for index, (name, model) in enumerate(fitted.items()):
        color, other = COLORS[2 * index % len(COLORS)], COLORS[(2 * index + 1) % len(COLORS)]
        who = f"{name}: " if len(fitted) > 1 else ""
        (fixed, per_item, per_token), rows = model["coefficients"], model["observations"]
        length = typical_length(rows)
        lengths.append(f"{length:.0f}")
        sizes = list(range(1, model["max_size"] + 1))
        batch = [fixed + per_item * n + per_token * n * length for n in sizes]
        alone = [n * batch[0] for n in sizes]
        figure.add_trace(go.Scatter(x=sizes, y=batch, name=f"{who}predicted: one {model['unit']} of n",
                                    mode="lines", line={"color": color, "width": 3}))
        figure.add_trace(go.Scatter(x=sizes, y=alone, name=f"{who}predicted: n, one at a time", mode="lines",
                                    line={"color": other, "width": 2, "dash": "dot"}))
        for calibration in (True, False):
            chosen = [row for row in rows if row["calibration"] is calibration]
            figure.add_trace(go.Scatter(
                x=[row["size"] for row in chosen], y=[row["seconds"] for row in chosen], mode="markers",
                name=f"{who}measured: {'calibration' if calibration else 'served'} {PLURAL[model['unit']]}",
                customdata=[row["padded_tokens"] / row["size"] for row in chosen],
                hovertemplate="%{x} × %{customdata:.0f} tokens: %{y:.3f} s<extra></extra>",
                marker={"color": color, "size": 8, "symbol": "circle-open" if calibration else "circle"}))
        top_size = max(top_size, model["max_size"])
        top_s = max([top_s, batch[-1], alone[-1], *(row["seconds"] for row in rows)])
    units = {model["unit"] for model in fitted.values()} or {"batch"}
    size_title = "requests running" if units == {"step"} else "batch size (items)"
    figure.update_layout(
        xaxis={**_axis(f"{size_title}, each {' / '.join(lengths) or '?'} tokens long", top_size),
               "range": [0.5, top_size + 0.5]},
        yaxis=_axis(f"seconds per {' or '.join(sorted(units))}", _top([top_s])))
    if not fitted:
        figure.add_annotation(text=_no_model(models), showarrow=False, font={"size": 15})
        figure.update_xaxes(visible=False)
        figure.update_yaxes(visible=False)
    return figure


def _no_model(models: dict[str, dict]) -> str:
    if not models:
        return "no model loaded"
    if all(model["coefficients"] is None for model in models.values()):
        policies = ", ".join(sorted({model["policy"] for model in models.values()}))
        return f"the batch policy ({policies}) sizes batches without a cost model"
    return "not fitted yet: it needs 3 measured batches"
