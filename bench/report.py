"""Reports of a benchmark run: an HTML page of plotly charts, and docs/benchmarks.md with its chart.

Everything here is generated from results.json; nothing in docs/benchmarks.md is hand-edited.
"""

from __future__ import annotations

import logging
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench.gpu_report import PAGE as GPU_PAGE

PAGES = {"one-shot": "benchmarks.md", "stepped": "benchmarks-autoregressive.md"}  # one page per engine shape
LOWER_IS_BETTER = {"short_p95_vs_sequential", "short_p95_vs_static", "idle_ms_over_raw",
                   "first_audio_p95_vs_idle_p50"}
MEANING = {
    "one-shot": ("On a CPU a padded batch costs about as much as its items one by one, so batching cannot raise "
                 "throughput; the adaptive policy measures that and runs one item at a time, and its gains are in "
                 "order (short requests before long ones, streams' later pieces when they are due) rather than in "
                 "speed. Fixed-size and timeout batchers pay padding and waiting on such a machine. On a GPU, where "
                 "a batch costs little more than one item, the same policy grows batches as far as the gain lasts."),
    "stepped": ("An autoregressive model makes speech one frame per step, and a step of many requests costs little "
                "more than a step of one (it is dominated by reading the weights), on a CPU too. Chorus runs it "
                "with continuous batching: a request joins at the next step and leaves when it is done. The "
                "request-level peers batch as one `generate(batch)` call does: a batch starts only when the last "
                "one has finished, and its members' audio comes out together, so a short request waits for the "
                "longest of its batch and a new one for the whole batch before it. The ceiling is the engine "
                "alone running all the texts at once with the same continuous stepping, with no server, HTTP or "
                "encoding; the codec's decoding of every frame is in both. It runs those texts once, so it ends "
                "with the longest few running with nobody beside them; a served closed loop that keeps every "
                "place full for longer can pass it a little."),
}


def _pair(streams: dict, prefix: str) -> str:
    """p50 / p95 of a streams summary's first-audio figures (n/a in results from before they were kept)."""
    return f"{streams.get(prefix + '_p50_ms', 'n/a')} / {streams.get(prefix + '_p95_ms', 'n/a')}"


def _shape(results: dict) -> str:
    return "stepped" if results.get("engine_shape", "").startswith("stepped") else "one-shot"


def _other_page_line(results: dict, docs: Path) -> str:
    other = PAGES["one-shot" if _shape(results) == "stepped" else "stepped"]
    what = "The one-shot voice (Piper)" if _shape(results) == "stepped" else "An autoregressive voice (Pocket TTS)"
    if (docs / other).exists():
        return f"{what}, measured the same way: [{other}]({other})."
    return f"{what} is measured with `python -m bench --voice pocket-random --docs` into {other} (not run yet)."

log = logging.getLogger(__name__)

COLOURS = {"sequential": "#7f7f7f", "static": "#1f77b4", "window": "#2ca02c", "chorus": "#d62728",
           "ray-serve": "#9467bd"}


def _throughput_vs_load(results: dict) -> go.Figure:
    figure = make_subplots(rows=1, cols=2, subplot_titles=("Completed vs offered load (mixed)",
                                                           "p95 latency vs offered load (mixed)"))
    for name, peer in results["peers"].items():
        offered = [row["offered_per_s"] for row in peer["open"]]
        colour = {"color": COLOURS.get(name)}
        figure.add_trace(go.Scatter(x=offered, y=[row["completed_per_s"] for row in peer["open"]], name=name,
                                    mode="lines+markers", line=colour, legendgroup=name), 1, 1)
        figure.add_trace(go.Scatter(x=offered, y=[row["p95_ms"] for row in peer["open"]], name=name,
                                    mode="lines+markers", line=colour, legendgroup=name, showlegend=False), 1, 2)
    ceiling = results["engine"]["ceiling"]["mixed"]["requests_per_s"]
    figure.add_hline(y=ceiling, line_dash="dot", annotation_text="engine ceiling", row=1, col=1)
    figure.update_xaxes(title_text="offered requests/s")
    figure.update_yaxes(title_text="requests/s completed while offered", row=1, col=1)
    figure.update_yaxes(title_text="ms", type="log", row=1, col=2)
    figure.update_layout(height=420, width=1100, margin={"t": 50})
    return figure


def _latency(results: dict) -> go.Figure:
    figure = go.Figure()
    for name, peer in results["peers"].items():
        row = peer["closed"]["mixed"]
        figure.add_trace(go.Bar(name=name, x=["p50", "p95", "p99", "short p95"], marker_color=COLOURS.get(name),
                                y=[row["p50_ms"], row["p95_ms"], row["p99_ms"], row["short_p95_ms"]]))
    figure.update_layout(title="Latency at saturation (closed loop, mixed)", yaxis_title="ms", barmode="group",
                         height=400, width=1100)
    return figure


def _batch_sizes(results: dict) -> go.Figure:
    figure = go.Figure()
    for name, peer in results["peers"].items():
        distribution = peer["closed"]["mixed"]["server"]["batch_size_distribution"]
        figure.add_trace(go.Bar(name=name, x=[f"<= {bound}" for bound in distribution],
                                y=list(distribution.values()), marker_color=COLOURS.get(name)))
    figure.update_layout(title="Batch sizes (closed loop, mixed)", xaxis_title="items per batch",
                         yaxis_title="batches", barmode="group", height=400, width=1100)
    return figure


def write_html(results: dict, path: Path) -> None:
    if "mixed" not in next(iter(results["peers"].values()), {}).get("closed", {}):
        return
    figures = [_throughput_vs_load(results), _latency(results), _batch_sizes(results)]
    parts = [figure.to_html(full_html=False, include_plotlyjs=index == 0) for index, figure in enumerate(figures)]
    path.write_text("<html><head><meta charset='utf-8'><title>Chorus benchmark</title></head><body>"
                    f"<h1>Chorus benchmark ({results['plan']}, {results['started_at']} UTC)</h1>"
                    + "".join(parts) + "</body></html>", encoding="utf-8")


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _table(results: dict) -> list[str]:
    lines = ["| peer | workload | req/s | audio s/s | p50 ms | p95 ms | p99 ms | short p95 ms | items/batch "
             "| padding | errors |", "|" + " --- |" * 11]
    for name, peer in results["peers"].items():
        for workload, row in peer["closed"].items():
            server = row["server"]
            lines.append(f"| {name} | {workload} | {row['requests_per_s']:.2f} | {row['audio_s_per_s']:.2f} | "
                         f"{row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['short_p95_ms']} | "
                         f"{server['items_per_batch'] or 'n/a'} | {_percent(server['padding_waste'])} | "
                         f"{sum(row['errors'].values())} |")
    for workload, row in results["engine"]["ceiling"].items():
        lines.append(f"| engine ceiling | {workload} | {row['requests_per_s']:.2f} | {row['audio_s_per_s']:.2f} | "
                     f"| | | | {row['batch_size']} (offline, sorted) | | |")
    return lines


def _losses(results: dict) -> list[str]:
    """Every comparison in which a peer did better than Chorus, stated plainly. Mixed throughput
    is compared by the median of the rounds; the other workloads ran once."""
    peers, losses = results["peers"], []
    for workload, chorus in peers["chorus"]["closed"].items():
        for name, peer in peers.items():
            other = peer["closed"].get(workload)
            if name == "chorus" or other is None:
                continue
            if workload == "mixed":
                ratio = results["ratios"].get(f"chorus_vs_{name}")
                if ratio is not None and ratio < 1:
                    low, high = results["ratio_ranges"][f"chorus_vs_{name}"]
                    losses.append(f"- mixed: Chorus served {ratio:.2f}x {name}'s audio-s/s (median of "
                                  f"{len(peer['mixed_rounds'])} rounds, {low:.2f}-{high:.2f}).")
            elif other["audio_s_per_s"] > chorus["audio_s_per_s"]:
                ratio = chorus["audio_s_per_s"] / other["audio_s_per_s"]
                losses.append(f"- {workload}: {name} served {other['audio_s_per_s']:.2f} audio-s/s, Chorus "
                              f"{chorus['audio_s_per_s']:.2f} ({ratio:.2f}x).")
            ours, theirs = ((peers["chorus"]["mixed_all_rounds"], peer["mixed_all_rounds"]) if workload == "mixed"
                            else (chorus, other))
            if theirs["short_p95_ms"] and ours["short_p95_ms"] and theirs["short_p95_ms"] < ours["short_p95_ms"]:
                losses.append(f"- {workload}: short-request p95 was {theirs['short_p95_ms']} ms with {name}, "
                              f"{ours['short_p95_ms']} ms with Chorus.")
    overhead, allowed = peers["chorus"]["idle_overhead_ms"], results["targets"].get("idle_ms_over_raw")
    if allowed is not None and overhead > allowed:
        losses.append(f"- idle: one request took {overhead} ms longer through the server than with the engine "
                      f"alone (median over {results['settings']['idle_requests']} texts, each run both ways).")
    return losses or ["- none in this run."]


def _rounds(results: dict) -> list[str]:
    control = results["control_rounds"]
    lines = ["| peer | " + " | ".join(f"round {index + 1}" for index in range(len(control))) + " |",
             "|" + " --- |" * (len(control) + 1)]
    for name, values in [*((name, peer["mixed_rounds"]) for name, peer in results["peers"].items()),
                         ("sequential again (A/A control)", control),
                         ("engine ceiling (no server)", results["ceiling_rounds"])]:
        lines.append(f"| {name} | " + " | ".join(f"{value:.2f}" for value in values) + " |")
    return lines


def _noise(results: dict) -> str:
    spread = results["ratio_ranges"].get("control_vs_sequential")
    if not spread:
        return ""
    low, high = spread
    band = max(1 - low, high - 1)
    control = ("a second sequential server, configured exactly like the first" if results["settings"].get(
        "own_control", True) else "the sequential server itself, run again")
    return (f"In this run {control} (the A/A control), "
            f"served {low:.2f}x to {high:.2f}x the first one's audio-s/s in the same rounds: differences of "
            f"up to {100 * band:.0f}% between peers are within this machine's noise, not effects of a policy.")


def _range(results: dict, name: str) -> str:
    spread = results["ratio_ranges"].get(name)
    return f"{spread[0]}-{spread[1]}" if spread else ""


def _gpu_line(docs: Path) -> str:
    if (docs / GPU_PAGE).exists():
        return f"The GPU check's figures (the engine and the batcher on a GPU): [{GPU_PAGE}]({GPU_PAGE})."
    return ("No GPU has run the GPU check (`bash bench/gpu_check.sh`) for these pages yet; its figures will be "
            f"in {GPU_PAGE} once one has.")


def write_docs(results: dict, docs: Path, command: str) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    page = PAGES[_shape(results)]
    chart = docs / page.replace(".md", ".png")
    try:
        _throughput_vs_load(results).write_image(str(chart), scale=1)
        chart_line = f"![Completed requests and p95 latency against offered load]({chart.name})"
    except Exception as error:  # kaleido needs a Chromium; without one the page goes out without the chart
        log.warning("chart not exported (%s)", error)
        chart_line = f"(chart not exported on this machine: {type(error).__name__})"
    gpu = results["machine"]["gpu"]
    lines = [
        "# Benchmarks" + (": an autoregressive voice" if _shape(results) == "stepped" else ""),
        "",
        "Generated by `" + command + " --docs` from its own results; regenerate it, do not edit the figures.",
        "",
        f"- run: {results['started_at']} UTC, plan `{results['plan']}`, {results['total_s']} s",
        f"- machine: {results['machine']['cpus']} CPUs, {results['machine']['platform']}, Python "
        f"{results['machine']['python']}, GPU: {gpu or 'none'}",
        f"- voice: `{results['voice']}`; every peer is the same server and engine, only the batch policy and "
        "queue order differ; degrade mode and the cache are off",
        f"- load: closed loop of {results['settings']['clients']} clients for {results['settings']['closed_s']} s "
        f"per workload; open loop (Poisson) at {', '.join(str(rate) for rate in results['offered_rates'])} "
        f"requests/s for {results['settings']['open_s']} s each; {results['settings']['streams']} concurrent "
        f"streams of the {results['settings']['stream_workload']} mix",
        f"- Ray Serve: {results['ray_serve']}",
        "",
        "## Saturation (closed loop)",
        "",
        *_table(results),
        "",
        chart_line,
        "",
        f"## Mixed workload, {len(results['control_rounds'])} rounds (audio-s/s)",
        "",
        "The throughput targets compare this workload; each round runs every peer and the engine ceiling "
        "once, in a rotated order, and each ratio below is the median of the rounds' own ratios.",
        "",
        *_rounds(results),
        "",
        "Short requests (at most 50 characters) of the mixed workload, over all rounds: "
        + "; ".join(f"{name} p95 {peer['mixed_all_rounds']['short_p95_ms']} ms "
                    f"({peer['mixed_all_rounds']['short_requests']} requests)"
                    for name, peer in results["peers"].items())
        + ".",
        "",
        "## Streams and idle latency",
        "",
        f"Idle: {results['settings']['idle_requests']} short texts, one at a time, each sent to the engine "
        "alone and then to every server; the overhead is the median of (server - engine) on the same text.",
        "",
        f"First audio of {results['settings']['streams']} streams in a closed loop: all requests; those that "
        "start while the others run; the opening ones (each client's first request: they start at the same "
        "instant, and the last of them waits for all their prefills).",
        "",
        "| peer | first audio p50 / p95 ms | starting while others run, p50 / p95 ms | opening, p95 ms | "
        "first audio p50 ms, one stream at idle | idle request p50 ms | idle overhead ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {name} | {_pair(peer['streams'], 'first_audio')} | {_pair(peer['streams'], 'first_audio_running')} | "
          f"{peer['streams'].get('first_audio_opening_p95_ms', 'n/a')} | "
          f"{peer.get('idle_first_audio_p50_ms', 'n/a')} | {peer['idle_p50_ms']} | {peer['idle_overhead_ms']} |"
          for name, peer in results["peers"].items()],
        f"| engine alone | | | | | {results['engine']['idle_p50_ms']} | |",
        "",
        f"## Targets ({results['target_set']})",
        "",
        "| target | measured | range over the rounds | wanted | |",
        "| --- | --- | --- | --- | --- |",
        *[f"| {name} | {results['ratios'].get(name)} | {_range(results, name)} | "
          f"{'<=' if name in LOWER_IS_BETTER else '>='} "
          f"{target} | {results['verdicts'][name]} |" for name, target in results["targets"].items()],
        f"| control_vs_sequential (A/A) | {results['ratios'].get('control_vs_sequential')} | "
        f"{_range(results, 'control_vs_sequential')} | 1.0 | |",
        *([f"| copies_alone_vs_one (the engine alone, {results['engine']['copies']['best']} copies) | "
           f"{results['ratios']['copies_alone_vs_one']} | | (no target) | |"]
          if "copies_alone_vs_one" in results["ratios"] else []),
        "",
        "## What the numbers mean",
        "",
        "Throughput ratios compare audio seconds served per second on the mixed workload at saturation. "
        "The ceiling is the engine alone on the same texts, sorted by length and run in the best batch size "
        "found, with no server, queue, HTTP or encoding.",
        "",
        MEANING[_shape(results)],
        "",
        _gpu_line(docs),
        "",
        _other_page_line(results, docs),
        "",
        "All peers' servers are up together and each scenario runs on every peer in turn, so slow drift "
        "of the machine touches them alike. On a small machine the load generator still shares the cores "
        "with the server. " + _noise(results),
        "",
        "Where Chorus lost in this run (the short, long and realistic workloads ran once each, so a loss "
        "there smaller than the A/A band above is noise):",
        "",
        *_losses(results),
        "",
    ]
    (docs / page).write_text("\n".join(lines), encoding="utf-8")
