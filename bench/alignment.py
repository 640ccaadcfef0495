"""Word timings found in the audio against a voice's own: `python -m bench.alignment [--quick] [--out DIR]`.

The bundled Piper voice times its words natively (its phoneme durations). Here it speaks SENTENCES (46, written for
this benchmark and not tuned on: the aligner's settings were chosen on bench/recognition.py's sentences), each
read by the text front end as the server reads it; the same words are then timed in its audio as a voice that does
not time them has them timed (tts_core.audio.word_timing): aligned (pocketsphinx's forced alignment) and estimated
(syllables over the voiced frames). Printed side by side, for each way: the median and p90 absolute difference of
the words' starts from the native ones (bars for `aligned`: median <= 60 ms, p90 <= 120 ms), and its cost in CPU
seconds (of the timing thread) per second of audio. `--quick` speaks the first 6 sentences.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tts_core.audio.word_timing import ALIGNED, ESTIMATED, WordTimer, estimate
from tts_core.engines.base import word_spans
from tts_core.engines.contract import EngineInput
from tts_core.engines.piper import PiperEngine, bundled_voice_path
from tts_core.text.chunks import words as text_words
from tts_core.text.frontend import normalize_text

BARS = {"median_ms": 60.0, "p90_ms": 120.0}  # for the aligned starts
QUICK_SENTENCES = 6

SENTENCES = [
    "Good morning, everyone; the bus is running late again.",
    "Could you pass the salt, please?",
    "I can't believe it's already December.",
    "The museum opens at nine thirty on weekdays.",
    "She whispered something, then laughed quietly.",
    "Turn left at the second traffic light.",
    "Our flight was delayed by almost three hours.",
    "Why don't we meet at the coffee shop instead?",
    "He painted the fence bright yellow last summer.",
    "The recipe calls for two eggs and a cup of flour.",
    "Wait, did you hear that noise outside?",
    "Most birds fly south when the weather turns cold.",
    "My grandmother tells wonderful stories about the war.",
    "The printer on the third floor is out of paper.",
    "Honestly, I think the second option is better.",
    "They've moved into a small apartment near the harbor.",
    "Please remember to water the plants while I'm away.",
    "The final score was four to one.",
    "A gentle breeze carried the smell of fresh bread.",
    "Do not open the door until the light turns green.",
    "We spent the afternoon building sandcastles on the beach.",
    "Is this seat taken, or may I sit here?",
    "The engineer explained the problem in simple terms.",
    "Thunder rumbled over the hills all night long.",
    "I'd rather walk than wait for another taxi.",
    "The library will be closed for repairs next month.",
    "Careful! The floor is still wet.",
    "Nobody expected the quiet student to win the contest.",
    "Let's order pizza and watch a movie tonight.",
    "The old clock in the hallway stopped at midnight.",
    "Every morning he runs five kilometers before breakfast.",
    "Excuse me, where is the nearest pharmacy?",
    "The kids built a fort out of blankets and chairs.",
    "Our neighbors are planting tomatoes in their backyard.",
    "It took twenty minutes to find a parking space.",
    "Frankly, the ending of that film surprised me.",
    "Keep the receipt in case you need to return it.",
    "The river froze completely during the long winter.",
    "We should probably leave before the traffic gets worse.",
    "The concert was loud, crowded, and absolutely fantastic.",
    "Add a pinch of pepper and stir for one minute.",
    "My phone battery dies by the middle of the afternoon.",
    "The teacher asked us to read chapter seven by Friday.",
    "Somewhere in the distance, a dog kept barking.",
    "Thank you for waiting; your table is ready now.",
    "Bright stars filled the sky above the quiet village.",
]


def _spoken(sentence: str) -> str:
    return normalize_text(sentence, "en").text


def native_and_audio(engine: PiperEngine, sentence: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The spoken words of a sentence, their native start times (s) and the voice's audio of it."""
    text = _spoken(sentence)
    voice = engine.voices()[0].name
    [(tokens, word_ids)] = engine.tokenize_words(text, voice)
    [output] = engine.synthesize([EngineInput(tokens, voice, 1.0)])
    spans = word_spans(word_ids, output.token_samples)
    return text_words(text), np.array([spans[word][0] / engine.sample_rate for word in sorted(spans)]), output.audio


def _figures(differences: list[float], cpu_s: float, audio_s: float) -> dict:
    absolute = np.abs(np.array(differences))
    return {"words": int(absolute.size), "median_ms": round(1000 * float(np.median(absolute)), 1),
            "p90_ms": round(1000 * float(np.percentile(absolute, 90)), 1),
            "cpu_s_per_audio_s": round(cpu_s / audio_s, 4)}


def run(quick: bool, out: Path | None = None) -> dict:
    """Measure; write alignment.json under out (if given)."""
    sentences = SENTENCES[:QUICK_SENTENCES] if quick else SENTENCES
    print(f"alignment: {len(sentences)} sentences of the bundled Piper voice, native vs found word starts ...",
          flush=True)
    engine, timer = PiperEngine(bundled_voice_path()), WordTimer()
    timer.way_for("en")  # (the first decoder is made here: a load, not an alignment)
    differences = {ALIGNED: [], ESTIMATED: []}
    cpu = dict.fromkeys(differences, 0.0)
    audio_s, fell_back = 0.0, 0
    for sentence in sentences:
        words, native, audio = native_and_audio(engine, sentence)
        audio_s += audio.size / engine.sample_rate
        timing = timer.time_words(words, audio, engine.sample_rate, "en")
        fell_back += timing.way != ALIGNED
        started = time.thread_time()
        estimated = estimate(words, audio, engine.sample_rate)
        cpu[ESTIMATED] += time.thread_time() - started
        cpu[ALIGNED] += timing.cpu_s
        for way, spans in ((ALIGNED, timing.spans), (ESTIMATED, estimated)):
            differences[way] += list(np.array([start for start, _ in spans]) - native)
    results = {"plan": "quick" if quick else "full", "sentences": len(sentences), "audio_s": round(audio_s, 2),
               "fell_back": fell_back, **{way: _figures(differences[way], cpu[way], audio_s) for way in differences}}
    results["within_bars"] = all(results[ALIGNED][name] <= bar for name, bar in BARS.items())
    _print(results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "alignment.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _print(results: dict) -> None:
    print(f"{'':10} {'words':>6} {'median ms':>10} {'p90 ms':>8} {'CPU s / audio s':>16}")
    for way in (ALIGNED, ESTIMATED):
        row = results[way]
        print(f"{way:10} {row['words']:>6} {row['median_ms']:>10} {row['p90_ms']:>8} {row['cpu_s_per_audio_s']:>16}")
    print(f"bars (aligned): median <= {BARS['median_ms']:g} ms, p90 <= {BARS['p90_ms']:g} ms: "
          f"{'met' if results['within_bars'] else 'NOT met'}; {results['audio_s']} s of audio, "
          f"{results['fell_back']} sentence(s) fell back to estimated")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_SENTENCES} sentences only")
    parser.add_argument("--out", type=Path, help="write alignment.json here")
    args = parser.parse_args()
    run(args.quick, args.out)


if __name__ == "__main__":
    main()
