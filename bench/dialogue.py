"""A dialogue against the same turns sent one by one, side by side in one run: `python -m bench.dialogue [--quick]
[--docs]`.

One real server (a process on 127.0.0.1) serves two engines: the bundled Piper voice (en_US-joe-medium, one-shot)
and a tiny random-weight Pocket TTS (autoregressive, stepped), built once into ~/.cache/chorus and loaded from the
registry by the server itself, as any model folder is. A 20-turn script of three speakers (turns of 10 to 250
characters, a podcast's give and take) is made into one recording three ways on each engine, round after round,
each round in another order:
  dialogue    the script as one request to POST /v1/audio/dialogue (its turns queued at once, in the shared queue);
  sequential  the same turns one by one to POST /v1/audio/speech, each sent when the last is answered (what a
              client does to make the same recording);
  concurrent  the same turns all at once to POST /v1/audio/speech (a client that fans out and joins them itself);
and first audio: the dialogue streamed, against its first turn alone streamed through the speech API (each
stream read to its end, the server drained before each). Every answer is raw PCM (24 kHz).

Audio seconds a second count speech only (the dialogue's recording less the pauses between its turns), so that the
three ways are compared on the same work; the recording's length must be the turns' plus the pauses (`lengths`).
Ratios, each the median over rounds of the rounds' own ratios:
  dialogue_vs_sequential  the dialogue's audio a second over the turns sent one by one;
  dialogue_vs_concurrent  the dialogue's over the turns sent all at once;
  first_audio_vs_turn     the streamed dialogue's first audio over its first turn's alone (1.0: no cost).
Degrade mode, the cache and admission by predicted wait are off (as in every benchmark); one caller sends it all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import yaml

from bench.harness import BUNDLED_VOICE, OPERATOR, built_model, machine, scrape, server_delta
from bench.server import ROOT, start_server
from bench.ttfa import drained
from tts_core.request.dialogue import SAME_SPEAKER_PAUSE_S, SPEAKER_CHANGE_PAUSE_S

PCM_BYTES_PER_S = 2 * 24000  # OpenAI's pcm: 24 kHz, 16-bit mono
SCRIPT = [
    ("Ann", "Welcome back to Slow Kitchen. Today we are talking about bread, and I have two guests who bake "
            "for a living."),
    ("Bob", "Thanks for having me."),
    ("Cy", "Happy to be here, Ann."),
    ("Ann", "Bob, you opened your bakery eight years ago. What made you start?"),
    ("Bob", "Honestly, it was an accident. I lost my office job, I had a sourdough starter on the counter, and "
            "the neighbours kept asking for loaves. By the spring I was baking forty a day in a flat."),
    ("Ann", "Forty loaves in a flat?"),
    ("Bob", "Two ovens, no sleep."),
    ("Cy", "That is how most of us begin. Nobody plans a bakery; the bakery happens to you."),
    ("Ann", "Cy, you teach now. What is the first thing your students get wrong?"),
    ("Cy", "They rush the dough. They follow the clock on the recipe instead of looking at the dough itself. "
           "A cold kitchen can double the time it needs, and no recipe knows your kitchen."),
    ("Bob", "I tell people to buy a thermometer before they buy a fancy mixer."),
    ("Ann", "A thermometer. Not a scale?"),
    ("Bob", "Both, but the thermometer first. Temperature is the quiet ingredient."),
    ("Cy", "And water. People forget how much the water matters. Soft water, hard water, it all changes the "
           "crumb."),
    ("Ann", "Let us talk about flour for a minute. Is the expensive stuff worth it?"),
    ("Cy", "Sometimes. A good local flour has more flavour, but it is less predictable."),
    ("Bob", "We mix two. One for strength, one for taste."),
    ("Ann", "Before we finish, one tip each for someone baking their first loaf this weekend."),
    ("Bob", "Make the same bread five times before you change anything."),
    ("Cy", "Write down what you did, every time. Your notes will teach you more than any book, including mine."),
]
# quick: a smoke run, one round of the script's shortest stretch where all 3 speak (turns 2 to 4, 108 characters)
PLANS = {"full": {"rounds": 5, "first_turn": 0, "turns": 20, "calibration_sizes": "1,2,4,8,16"},
         "quick": {"rounds": 1, "first_turn": 1, "turns": 3, "calibration_sizes": "1,2"}}
POCKET_SPEAKERS = {"Ann": "pocket-ann", "Bob": "pocket-bob", "Cy": "pocket-cy"}
ENGINES = {"piper": dict.fromkeys(("Ann", "Bob", "Cy"), BUNDLED_VOICE),  # the one bundled voice, for everyone
           "pocket-tiny": POCKET_SPEAKERS}
WAYS = ("dialogue", "sequential", "concurrent", "first_audio")
LENGTH_TOLERANCE = 0.03  # the recording against its turns': Piper draws its phonemes' lengths anew every time


def plan_turns(plan: dict) -> list[tuple[str, str]]:
    """The turns of SCRIPT a plan makes its recording of."""
    return SCRIPT[plan["first_turn"]:plan["first_turn"] + plan["turns"]]


def pauses_s(turns: list[tuple[str, str]]) -> float:
    """The pauses the dialogue puts between its turns (tts_core.request.dialogue's rule)."""
    return sum(SAME_SPEAKER_PAUSE_S if before[0] == after[0] else SPEAKER_CHANGE_PAUSE_S
               for before, after in zip(turns, turns[1:]))


# --- the tiny Pocket TTS ------------------------------------------------------------------------------------

def pocket_registry(folder: Path) -> Path:
    """The tiny random-weight Pocket TTS (built once and kept: bench/harness.py's built_model), a voice prompt per
    speaker in folder, and the registry file in folder that names them (the server loads it as any model folder).
    Random weights never end speech: each text's length is the model's own budget for it (`fixed_length`)."""
    from safetensors.numpy import load_file, save_file

    from tts_core.engines.pocket_tts import PROMPT_KEY

    with ThreadPoolExecutor(max_workers=1) as builder:  # torch on a thread that ends (bench/harness.py, EngineAlone)
        model = builder.submit(built_model, "pocket-tiny").result()
    shipped = load_file(str(model / "voices" / "default.safetensors"))[PROMPT_KEY]
    entries = {}
    for seed, voice in enumerate(POCKET_SPEAKERS.values()):
        prompt = shipped if seed == 0 else np.random.default_rng(seed).standard_normal(shipped.shape).astype(
            shipped.dtype)  # another speaker: other latents of the same shape
        path = folder / f"{voice}.safetensors"
        save_file({PROMPT_KEY: prompt}, str(path))
        entries[voice] = {"engine": "pocket_tts", "model": str(model), "prompt": str(path), "fixed_length": True,
                          "pinned": True}
    registry = folder / "voices.yaml"
    registry.write_text(yaml.safe_dump({"voices": entries}, sort_keys=False))
    return registry


# --- the three ways, and first audio ---------------------------------------------------------------------------

def _post(client: httpx.Client, path: str, body: dict) -> tuple[float, float, float]:
    """(seconds to the first audio bytes, seconds to the last, audio seconds) of one streamed or whole answer."""
    started, first, received = time.perf_counter(), None, 0
    with client.stream("POST", path, json={**body, "response_format": "pcm"}) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
        for chunk in response.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - started
            received += len(chunk)
    return first or 0.0, time.perf_counter() - started, received / PCM_BYTES_PER_S


def _turn(client: httpx.Client, voice: str, text: str, stream: bool = False) -> tuple[float, float, float]:
    return _post(client, "/v1/audio/speech", {"model": "tts-1", "voice": voice, "input": text, "stream": stream})


def _dialogue(client: httpx.Client, turns: list[tuple[str, str]], voices: dict, stream: bool = False
              ) -> tuple[float, float, float]:
    script = [{"speaker": speaker, "text": text} for speaker, text in turns]
    return _post(client, "/v1/audio/dialogue", {"script": script, "voices": voices, "stream": stream})


def measure_way(client: httpx.Client, way: str, turns: list[tuple[str, str]], voices: dict) -> dict:
    """One way's wall time and audio (speech only: a dialogue's pauses between turns left out), with the batches the
    server ran for it."""
    drained(client)
    if way == "first_audio":
        dialogue_first, dialogue_wall, recording = _dialogue(client, turns, voices, stream=True)
        drained(client)
        turn_first, turn_wall, _ = _turn(client, voices[turns[0][0]], turns[0][1], stream=True)
        return {"dialogue_ms": round(1000 * dialogue_first, 1), "first_turn_ms": round(1000 * turn_first, 1),
                "dialogue_stream_wall_s": round(dialogue_wall, 3), "dialogue_stream_recording_s": round(recording, 3),
                "first_turn_stream_wall_s": round(turn_wall, 3)}
    before = scrape(str(client.base_url))
    started = time.perf_counter()
    if way == "dialogue":
        answers = [_dialogue(client, turns, voices)]
    elif way == "sequential":
        answers = [_turn(client, voices[speaker], text) for speaker, text in turns]
    else:
        with ThreadPoolExecutor(len(turns)) as pool:
            answers = list(pool.map(lambda turn: _turn(client, voices[turn[0]], turn[1]), turns))
    wall = time.perf_counter() - started
    batches = server_delta(before, scrape(str(client.base_url)))
    row = {"wall_s": round(wall, 3), "server": {key: batches[key] for key in ("batches", "items_per_batch")}}
    if way == "dialogue":
        return {**row, "recording_s": round(answers[0][2], 3), "audio_s": round(answers[0][2] - pauses_s(turns), 3)}
    return {**row, "audio_s": round(sum(audio for _, _, audio in answers), 3),
            "turns_s": [round(audio, 3) for _, _, audio in answers]}


def measure_engine(base_url: str, turns: list[tuple[str, str]], voices: dict, rounds: int) -> list[dict]:
    """Every way once a round, in an order rotated each round (so that the machine's drift touches them alike)."""
    made = []
    with httpx.Client(base_url=base_url, timeout=600, limits=httpx.Limits(max_connections=len(turns) + 2)) as client:
        for voice in dict.fromkeys(voices.values()):  # warm up: each voice's first request, and a short dialogue
            _turn(client, voice, "Warm up.")
        _dialogue(client, turns[:2], voices)
        for number in range(rounds):
            order = WAYS[number % len(WAYS):] + WAYS[:number % len(WAYS)]
            made.append({way: measure_way(client, way, turns, voices) for way in order})
            print(f"  round {number + 1}: " + ", ".join(
                f"{way} {row['wall_s']} s" for way, row in made[-1].items() if "wall_s" in row)
                + f"; first audio: dialogue {made[-1]['first_audio']['dialogue_ms']} ms, first turn "
                  f"{made[-1]['first_audio']['first_turn_ms']} ms", flush=True)
    return made


# --- the summary ---------------------------------------------------------------------------------------------

def _median(values: list[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)


def summary(made: list[dict], turns: list[tuple[str, str]]) -> dict:
    """Medians over the rounds, the ratios (medians of the rounds' own, with their range), and the recording's length
    against its turns' (each round's dialogue against the same round's turns sent one by one)."""
    ways = {}
    for way in ("dialogue", "sequential", "concurrent"):
        rows = [round_[way] for round_ in made]
        ways[way] = {"wall_s": _median([row["wall_s"] for row in rows]),
                     "audio_s": _median([row["audio_s"] for row in rows]),
                     "audio_s_per_s": _median([row["audio_s"] / row["wall_s"] for row in rows]),
                     "items_per_batch": _median([row["server"]["items_per_batch"] or 0.0 for row in rows], 2)}
    rate = {way: [round_[way]["audio_s"] / round_[way]["wall_s"] for round_ in made] for way in ways}
    firsts = [round_["first_audio"] for round_ in made]
    by_round = {"dialogue_vs_sequential": [d / s for d, s in zip(rate["dialogue"], rate["sequential"])],
                "dialogue_vs_concurrent": [d / c for d, c in zip(rate["dialogue"], rate["concurrent"])],
                "first_audio_vs_turn": [row["dialogue_ms"] / row["first_turn_ms"] for row in firsts]}
    pauses = round(pauses_s(turns), 3)
    lengths = [{"recording_s": round_["dialogue"]["recording_s"], "turns_s": round_["sequential"]["audio_s"],
                "pauses_s": pauses,
                "difference_s": round(round_["dialogue"]["recording_s"] - round_["sequential"]["audio_s"] - pauses, 3),
                "streamed_recording_s": round_["first_audio"]["dialogue_stream_recording_s"]} for round_ in made]
    return {"ways": ways, "ratios": {name: _median(values) for name, values in by_round.items()},
            "ranges": {name: [round(min(values), 3), round(max(values), 3)] for name, values in by_round.items()},
            "first_audio": {"dialogue_ms": _median([row["dialogue_ms"] for row in firsts], 1),
                            "first_turn_ms": _median([row["first_turn_ms"] for row in firsts], 1),
                            "dialogue_stream_wall_s": _median([row["dialogue_stream_wall_s"] for row in firsts])},
            "lengths": lengths,
            "lengths_agree": all(abs(row["difference_s"]) <= LENGTH_TOLERANCE * row["recording_s"] for row in lengths)}


# --- the run -------------------------------------------------------------------------------------------------

def run(quick: bool, out: Path, conditions: str = "") -> dict:
    """Measure every engine on one server, and write dialogue.json under out (`conditions`: what else the machine
    was doing, said on the page)."""
    plan_name = "quick" if quick else "full"
    plan, turns = PLANS[plan_name], plan_turns(PLANS[plan_name])
    started, stamp = time.perf_counter(), datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    results = {"plan": plan_name, "settings": plan, "machine": machine(), "started_at": stamp,
               "script": {"turns": len(turns), "speakers": len({speaker for speaker, _ in turns}),
                          "characters": sum(len(text) for _, text in turns),
                          "turn_characters": [len(text) for _, text in turns]},
               "length_tolerance": LENGTH_TOLERANCE, "load_average": {"start": os.getloadavg()},
               "conditions": conditions, "engines": {}}
    with tempfile.TemporaryDirectory(prefix="chorus-dialogue-bench-") as folder:
        print("the tiny random-weight Pocket TTS ...", flush=True)
        registry = pocket_registry(Path(folder))
        print("starting the server (the bundled Piper voice and the tiny Pocket TTS) ...", flush=True)
        # one torch thread: a tiny model's millisecond steps stall with two threads on two busy cores
        server = start_server(Path(folder) / "data", voices_file=str(registry), operator_defaults=json.dumps(OPERATOR),
                              max_queue="4096", calibration_sizes=plan["calibration_sizes"], torch_threads="1")
        try:
            for engine, voices in ENGINES.items():
                print(f"{engine}: {len(turns)} turns, {plan['rounds']} round(s) ...", flush=True)
                made = measure_engine(server.base_url, turns, voices, plan["rounds"])
                results["engines"][engine] = {"voices": voices, "rounds": made, **summary(made, turns)}
        finally:
            server.stop()
    results["load_average"]["end"] = os.getloadavg()  # (the machine's: others' work counts too)
    results["total_s"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dialogue.json").write_text(json.dumps(results, indent=2))
    return results


def print_results(results: dict) -> None:
    script = results["script"]
    print(f"\ndialogue: {script['turns']} turns of {script['speakers']} speakers ({script['characters']} characters), "
          f"{results['settings']['rounds']} round(s), medians; audio-s/s counts speech (not the pauses)")
    for engine, row in results["engines"].items():
        print(f"  {engine}:")
        for way, figures in row["ways"].items():
            print(f"    {way:11s} {figures['wall_s']:8.2f} s   {figures['audio_s']:8.2f} audio-s   "
                  f"{figures['audio_s_per_s']:7.2f} audio-s/s")
        first = row["first_audio"]
        print(f"    first audio: the dialogue streamed {first['dialogue_ms']} ms, its first turn alone "
              f"{first['first_turn_ms']} ms")
        for name, ratio in row["ratios"].items():
            print(f"    {name:24s} {ratio:7.3f}   range {row['ranges'][name]}")
        length = row["lengths"][0]
        print(f"    recording {length['recording_s']} s = turns {length['turns_s']} s + pauses {length['pauses_s']} s "
              f"{length['difference_s']:+} s ({'agree' if row['lengths_agree'] else 'DISAGREE'} within "
              f"{100 * results['length_tolerance']:.0f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 short turns, one round (a smoke run)")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "dialogue",
                        help="folder for dialogue.json (default artifacts/dialogue)")
    parser.add_argument("--docs", action="store_true", help="regenerate docs/benchmarks-dialogue.md")
    parser.add_argument("--conditions", default="", help="what else the machine was doing, for the page")
    args = parser.parse_args()
    results = run(args.quick, args.out, args.conditions)
    print_results(results)
    if args.docs:
        from bench.dialogue_report import write_docs

        write_docs(results, ROOT / "docs", " ".join(["python -m bench.dialogue", *(["--quick"] if args.quick else [])]))
    print(f"\nwrote {args.out / 'dialogue.json'} in {results['total_s']} s")


if __name__ == "__main__":
    main()
