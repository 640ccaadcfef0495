"""docs/benchmarks-gpu.md from a GPU check's JSON: `python -m bench.gpu_report DIR/gpu_check.json`.

The GPU check runs where a GPU is lent and brings back only its JSON; this page is generated from
that file, never edited by hand. Markdown only, so it needs nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.server import ROOT

PAGE = "benchmarks-gpu.md"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *["| " + " | ".join(_or_na(cell) for cell in row) + " |" for row in rows]]


def _or_na(value) -> str:
    return "n/a" if value is None else str(value)


def _sweep_table(rows: list[dict]) -> list[str]:
    header = ["batch size", "ms per batch", "audio-s/s", "real tokens/s", "padded tokens", "peak MB",
              "bytes per padded token"]
    return _table(header, [[row["batch_size"], f"{1000 * row['seconds_per_batch']:.1f}", row["audio_s_per_s"],
                            row["real_tokens_per_s"], row["padded_tokens"], row.get("peak_memory_mb"),
                            row.get("bytes_per_padded_token")] for row in rows])


def _outcome(row: dict) -> str:
    return f"FAILED: {row['why']}" if row.get("failed") else "finished"


def _targets(part: dict) -> list[str]:
    """Each figure with its target (a GPU's, from issue #43) and verdict; figures without one after them."""
    targets, values = part["targets"], part["ratios"]
    rows = [[name, values.get(name), f"{sense} {bound}", part["verdicts"][name]]
            for name, (sense, bound) in targets.items()]
    rows += [[name, value, "", ""] for name, value in values.items() if name not in targets]
    return _table(["figure", "measured", "wanted (GPU)", "verdict"], rows)


def _not_run(part: dict) -> list[str] | None:
    """A part that did not run, or raised: what the page says instead of its figures."""
    if "skipped" in part:
        return [f"Skipped: {part['skipped']}.", ""]
    if part.get("failed"):
        return [f"**FAILED**: {part['why']}.", ""]
    return None


def _skipped_runs(part: dict) -> list[str]:
    runs = part.get("skipped_runs", [])
    return [*[f"- {row['policy']} skipped: {row['skipped']}" for row in runs], *[""] * bool(runs)]


def _vits_section(part: dict, plan: dict) -> list[str]:
    lines = ["## VITS", ""]
    if (instead := _not_run(part)) is not None:
        return lines + instead
    model, low = part["model"], part["low_precision"]
    lines += [f"Random-weight VITS, {model['config']}, {model['parameters_m']} M parameters, {model['sample_rate']} "
              f"Hz; {plan['sentences']} sentences of the mixed workload (20-200 characters).", "",
              "### The engine alone: length-sorted batches", "", *_sweep_table(part["sweep"]), "",
              f"The engine's own rate is the best of these: {part['ceiling_audio_s_per_s']} audio-s/s.", "",
              "### Lower precision (degrade mode's)", ""]
    if not low["offered"]:
        lines += [f"Not measured: {low['why']}.", ""]
    else:
        rows = [[row["batch_size"], "FAILED: " + row["error"] if "error" in row else "ran", row.get("audio_s_per_s"),
                 row.get("vs_full")] for row in low["sweep"]]
        lines += [f"Weights after the sweep: {', '.join(low['dtypes_after'])}.", "",
                  *_table(["batch size", "outcome", "audio-s/s", "vs full precision"], rows), ""]
    rows = [[row["policy"], row["audio_s_per_s"], row["requests_per_s"], row["p50_ms"], row["p95_ms"],
             row["avg_batch_size"], f"{row['requests']} of {row['sent']}", row["errors"], row["out_of_memory"],
             row["stop_s"], _outcome(row)] for row in part["served"]]
    lines += [f"### Served through the batcher ({plan['clients']} concurrent clients, {plan['served_s']} s per policy)",
              "", "The same sentences through the real queue, policy and batcher thread, in process (no HTTP), each "
              "policy on an engine of its own; static is batches of 8 with a 500 ms timeout.", "",
              *_table(["policy", "audio-s/s", "requests/s", "p50 ms", "p95 ms", "avg batch", "answered",
                       "errors", "out of memory", "stop s", "outcome"], rows), "", *_skipped_runs(part),
              *_targets(part), ""]
    return lines


def _step_table(rows: list[dict]) -> list[str]:
    cells = [[row["running"], "skipped: " + row["skipped"], None, None, None] if "skipped" in row else
             [row["running"], row["wall_ms"], row["busy_ms"] if row["busy_ms"] is not None else row["busy"],
              row["busy_share"], row.get("wall_vs_busy")] for row in rows]
    return _table(["running", "wall ms a step", "device busy ms", "busy share", "wall / busy"], cells)


def _stepped_section(kind: str, part: dict) -> list[str]:
    """One autoregressive model: its steps, lower precision, served per policy, the ceiling, the targets."""
    lines = [f"### {kind}", ""]
    if (instead := _not_run(part)) is not None:
        return lines + instead
    model, plan, low = part["model"], part["plan"], part["low_precision"]
    lines += [f"Random-weight {model['config']}: {model['parameters_m']} M parameters at {model['dtype']}, "
              f"{model['frame_rate']} frames/s, up to {model['max_running']} running; {plan['clients']} callers of "
              f"{plan['workload']} texts, {plan['served_s']} s per policy; this part took {part['seconds']} s.", "",
              "Steps of the engine alone (a step's device busy time is the profiler's kernel time; on a CPU it is "
              "not measured):", "", *_step_table(part["step_times"]), "",
              "Lower precision: " + (f"not measured ({low['why']})" if not low["offered"] or low.get("failed")
                                     else f"{low['low_vs_full']}x full precision's ceiling") + ".", ""]
    rows = [[row["policy"], row["audio_s_per_s"], row["frames_per_step"], row["steps"],
             f"{row['requests_done']} of {row['sent']}", row["delivered_audio_s_per_s"], row["p50_ms"], row["p95_ms"],
             row["out_of_memory"], row["stop_s"], _outcome(row)] for row in part["served"]]
    ceiling = part["ceiling"]
    return lines + [*_table(["policy", "audio-s/s", "frames per step", "steps", "answered", "delivered audio-s/s",
                             "p50 ms", "p95 ms", "out of memory", "stop s", "outcome"], rows), "",
                    *_skipped_runs(part),
                    f"Engine ceiling (synthesize_whole of {ceiling['requests']} texts at once): "
                    f"{ceiling['audio_s_per_s']} audio-s/s, {ceiling['frames_per_step']} frames per step.", "",
                    *_targets(part), ""]


def _kokoro_section(part: dict) -> list[str]:
    """Chorus serving Kokoro over HTTP against Kokoro-FastAPI (bench/kokoro.py)."""
    lines = ["## Kokoro against Kokoro-FastAPI", ""]
    if (instead := _not_run(part)) is not None:
        return lines + instead
    plan = part["plan"]
    lines += [f"{part['clients']} clients of the mixed texts, {plan['rounds']} rounds of {plan['round_s']} s each "
              f"server, random weights at the {'tiny' if plan['tiny'] else 'released'} size"
              + ("" if part["peer"] else "; Kokoro-FastAPI was left out (KOKORO_FASTAPI_DIR not set)") + ".", ""]
    served = part["served"]
    rows = [[name, rounds, served.get(name, {}).get("short_p95_ms"), served.get(name, {}).get("errors", "")]
            for name, rounds in part["rounds"].items()]
    lines += _table(["server", "audio-s/s by round", "short p95 ms", "errors"], rows) + [""]
    rows = [[name, value, " ".join(map(str, part["targets"].get(name, ("", "")))), part["verdicts"].get(name, "")]
            for name, value in part["ratios"].items()]
    return [*lines, *_table(["ratio", "measured", "wanted", "verdict"], rows), ""]


def _head(result: dict) -> list[str]:
    """Where it ran, the verdict (failures first), and each part's time against its share."""
    where = f"{result['gpu']} ({result['gpu_memory_gb']} GiB)" if result.get("gpu") else result["device"]
    lines = ["# Benchmarks on a GPU", "",
             "Generated by `python -m bench.gpu_report` from the JSON of `bash bench/gpu_check.sh"
             + ("" if result["plan_name"] == "full" else f" --device cpu --{result['plan_name']}")
             + "`; regenerate it, do not edit the figures.", "",
             f"- device: {where}; torch {result['torch']}, Python {result['python']}; the check took "
             f"{result['total_s']} s of its {result['budget_s']:.0f} s",
             "- random weights: the audio is noise of a speech-like length, enough to time and size batches"]
    if result["device"] != "cuda":
        lines.append("- not a GPU: the targets are a GPU's (issue #43), so this run's verdicts say nothing of them")
    lines += [""]
    if result["failed"]:
        lines += ["**FAILED**:", "", *[f"- {line}" for line in result["failures"]], ""]
    else:
        lines += ["Every run finished at least half its callers' requests, and every part that ran ran whole.", ""]
    rows = [[name, f"{part['share_s']:.0f}", f"{part['by_s']:.0f}", part["seconds"], "; ".join(part["skipped"])]
            for name, part in result["parts"].items()]
    return lines + ["## Time", "", "Each part's share of the check's time (a part may use what those before it "
                    "left: it must end by the second given); what did not fit was skipped.", "",
                    *_table(["part", "share s", "by s", "took s", "skipped"], rows), ""]


def render(result: dict) -> str:
    lines = [*_head(result), *_vits_section(result["vits"], result["plan"]),
             "## Autoregressive models through the stepped batcher", "",
             "Continuous batching (adaptive: requests join and leave between steps; Pocket TTS's codec a stage of "
             "its own, and inline) against request-level batches (sequential; static: batches of 8, 500 ms, audio "
             "held until the batch is done), each run on an engine of its own. audio-s/s is the audio the engine "
             "made per second of the run (every step's frames), so work in flight when the run ends counts too; "
             "answered and delivered audio are what callers got in the run. A run that finished fewer than half "
             "its callers' requests (those answered, and those unanswered after over twice the slowest answer) "
             "is marked FAILED.", ""]
    for kind, part in result["stepped"].items():
        lines += _stepped_section(kind, part)
    return "\n".join([*lines, *_kokoro_section(result["kokoro"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, help="gpu_check.json written by bench/gpu_check.sh")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="folder to write benchmarks-gpu.md to")
    args = parser.parse_args()
    try:
        text = render(json.loads(args.result.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as error:  # unreadable, not JSON, or not a GPU check's JSON
        parser.error(f"{args.result} is not a readable gpu_check.json ({type(error).__name__}: {error})")
    args.docs.mkdir(parents=True, exist_ok=True)
    page = args.docs / PAGE
    page.write_text(text)
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
