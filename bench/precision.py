"""Lower precision on a CPU: the bundled Piper voice at full precision and at int8 (degrade mode's lower precision),
side by side in one run: `python -m bench --precision [--quick]`; `python -m bench` (and its --quick) runs it too.

The engine alone, in this process, with the server's onnxruntime settings, speaks the 20 sentences of
bench/recognition.py one at a time (batch size 1, as the adaptive policy runs them on a CPU), switching precision
(PiperEngine.set_low_precision) before every sentence: each sentence is spoken at both levels in a row, the level
that goes first alternating, so that both see the machine alike. Each level's speed is its audio seconds over its
synthesis seconds. The voice's sampling noise is off (noise_scale and noise_w 0: the same speed, 3% less audio),
so that a sentence is said the same way every time and the word error rates (pocketsphinx's, the mean over the
sentences) differ by precision alone (with the noise on, their difference was -0.02 in one run and 0.09 in the
next). Ratios:
- int8_vs_full: int8's audio a second over full precision's, the median of the rounds' own ratios (target >= 1.3);
- wer_int8_minus_full: int8's word error rate less full precision's (target <= 0.05).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.recognition import SENTENCES, Recogniser
from tts_core.engines.contract import EngineInput
from tts_core.engines.piper import PiperEngine, bundled_voice_path

# quick: a smoke run (tests/integration/test_bench.py), a quarter of the sentences
PLANS = {"full": {"rounds": 3, "sentences": len(SENTENCES)}, "quick": {"rounds": 1, "sentences": 5}}
LEVELS = {"full": False, "int8": True}  # each level's set_low_precision
TARGETS = {"int8_vs_full": (">=", 1.3), "wer_int8_minus_full": ("<=", 0.05)}


def run(quick: bool, out: Path | None = None) -> dict:
    """Measure, and write precision.json under out (if given)."""
    plan = PLANS["quick" if quick else "full"]
    sentences = SENTENCES[:plan["sentences"]]
    print(f"precision: the bundled voice at each level, {len(sentences)} sentences, {plan['rounds']} round(s) ...",
          flush=True)
    engine = PiperEngine(bundled_voice_path(), noise_scale=0.0, noise_w=0.0)
    recogniser = Recogniser()
    items = [EngineInput(engine.tokenize(text, engine.name)[0], engine.name) for text in sentences]
    for low in LEVELS.values():  # the first run of a session allocates its arena
        engine.set_low_precision(low)
        engine.synthesize(items[:1])
    rounds = {level: [] for level in LEVELS}  # audio-s/s of each level in each round
    errors = {level: [] for level in LEVELS}
    for number in range(plan["rounds"]):
        seconds, audio = dict.fromkeys(LEVELS, 0.0), dict.fromkeys(LEVELS, 0.0)
        for index, (text, item) in enumerate(zip(sentences, items)):
            for level in list(LEVELS)[:: 1 if (number + index) % 2 == 0 else -1]:
                engine.set_low_precision(LEVELS[level])
                started = time.perf_counter()
                [output] = engine.synthesize([item])
                seconds[level] += time.perf_counter() - started
                audio[level] += output.audio.size / engine.sample_rate
                if number == 0:  # (later rounds say it again, sample for sample)
                    errors[level].append(recogniser.error_rate(text, output.audio, engine.sample_rate))
        for level in LEVELS:
            rounds[level].append(round(audio[level] / seconds[level], 2))
    levels = {level: {"audio_s_per_s": round(statistics.median(rounds[level]), 2), "rounds": rounds[level],
                      "word_error_rate": round(float(np.mean(errors[level])), 3)} for level in LEVELS}
    speed = [low / full for low, full in zip(rounds["int8"], rounds["full"])]
    ratios = {"int8_vs_full": round(statistics.median(speed), 3),
              "wer_int8_minus_full": round(levels["int8"]["word_error_rate"] - levels["full"]["word_error_rate"], 3)}
    verdicts = {name: "met" if (ratios[name] >= bound if sense == ">=" else ratios[name] <= bound) else "MISSED"
                for name, (sense, bound) in TARGETS.items()}
    results = {"plan": plan, "voice": engine.name, "sentences": len(sentences), "levels": levels, "ratios": ratios,
               "int8_vs_full_range": [round(min(speed), 3), round(max(speed), 3)], "targets": TARGETS,
               "verdicts": verdicts}
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "precision.json").write_text(json.dumps(results, indent=2))
    return results


def print_results(results: dict) -> None:
    print(f"\nprecision ({results['voice']}, {results['sentences']} sentences one at a time, "
          f"{results['plan']['rounds']} round(s)):")
    print(f"  {'level':8s} {'audio s/s':>9s} {'word error rate':>15s}   audio s/s by round")
    for level, row in results["levels"].items():
        print(f"  {level:8s} {row['audio_s_per_s']:9.2f} {row['word_error_rate']:15.3f}   {row['rounds']}")
    spread = {"int8_vs_full": results["int8_vs_full_range"]}
    for name, ratio in results["ratios"].items():
        sense, bound = results["targets"][name]
        print(f"  {name:22s} measured {ratio:8.3f} {str(spread.get(name, '')):16s} target {sense} {bound}  "
              f"{results['verdicts'][name]}")
