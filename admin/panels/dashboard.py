"""The dashboard panel: degrade state and the load score in words, the live charts (batch sizes and the cost
model that explains them first), the replicas' charts, and a line naming the charts not drawn."""

from __future__ import annotations

import gradio as gr

from access.control import AccessControl
from tts_core.controls import ServiceControls
from tts_core.monitor import Monitor

from ..charts import CHARTS, absent, cost_figure, plot_data, replica_charts, series_figure
from ..cluster import ReplicaReporter
from ..control import OperatorControl
from ..state import state_markdown
from ..stats import collect_stats

COST_MODEL_WORDS = (
    "**Batch cost model.** The batcher predicts each candidate batch's time with this model, fitted to the batches "
    "it has run (the points; hollow: the calibration sweep at start), and takes the size that makes the most tokens "
    "a second, but only a batch predicted to beat its items run one at a time (dotted) by a clear margin, and only "
    "while every member still meets its deadline. Where the two lines lie together (a CPU) batching does not pay "
    "and it runs one item at a time; where the solid line stays low (a GPU) it grows its batches.")


class Dashboard:
    def __init__(self, controls: ServiceControls, monitor: Monitor, control: OperatorControl, access: AccessControl,
                 replicas: ReplicaReporter | None):
        self.controls, self.monitor, self.control, self.access, self.replicas = (controls, monitor, control, access,
                                                                                 replicas)

    def render(self) -> None:
        self.state = gr.Markdown(elem_id="degrade-state")
        # Two charts a row, one where two would be narrower than min_width (a phone); first the batch sizes
        # and the cost model that explains them.
        with gr.Row():
            self.plots = [gr.Plot(show_label=False, min_width=320)]
            self.cost_plot = gr.Plot(show_label=False, min_width=320, elem_id="cost-model")
        gr.Markdown(COST_MODEL_WORDS)
        for row in range(1, len(CHARTS), 2):
            with gr.Row():
                self.plots.extend(gr.Plot(show_label=False, min_width=320) for _ in CHARTS[row: row + 2])
        with gr.Row():  # the deployment: a line per replica (one, on its own)
            self.replica_plots = [gr.Plot(show_label=False, min_width=320) for _ in range(2)]
        # a chart of hardware or engines that are not here is one line, not an empty chart
        self.absent_line = gr.Markdown(elem_id="absent-charts")

    @property
    def outputs(self) -> list:
        return [self.state, self.cost_plot, *self.plots, *self.replica_plots, self.absent_line]

    def updates(self) -> list:
        """The state, the cost model, each chart (hidden where it has nothing to draw) and the line saying why."""
        stats = collect_stats(self.controls, self.monitor, self.control, self.access, self.replicas)
        charts = [(chart, stats["series"]) for chart in CHARTS]
        charts += [(chart, stats["replica_series"]) for chart in replica_charts(stats["replica_series"])]
        missing = [(chart.title, why) for chart, points in charts if (why := absent(points, chart))]
        return [state_markdown(stats, self.control.settings), plot_data(cost_figure(stats["cost_models"])),
                *(gr.Plot(visible=False) if absent(points, chart)
                  else gr.Plot(plot_data(series_figure(points, chart)), visible=True) for chart, points in charts),
                gr.Markdown("Not drawn: " + "; ".join(f"**{title}**: {why}" for title, why in missing),
                            visible=bool(missing))]
