"""Kokoro-82M (hexgrad/Kokoro-82M) through the kokoro package's KModel, in padded batches.

A model is a folder (or a hub id in the local cache) as released: config.json, the weights (*.pth) and its voice
packs, voices/NAME.pt (a style per phoneme count, [510, 1, 256]). A voice's name says its language and gender
(`af_heart`: American English, female); a mix of voices (`af_bella+af_sky`, weighted `af_bella(2)+af_sky(1)`, as
Kokoro-FastAPI writes them) speaks with the weighted mean of their packs.

Phonemes come from espeak-ng through misaki's espeak module (the mapping the model's author keeps from espeak's
IPA to the model's phoneme set), for the languages espeak reads with what installs from PyPI: English (US, UK),
Spanish, French, Hindi, Italian and Brazilian Portuguese. misaki's own English reader needs spaCy's
en_core_web_sm, which is not on PyPI and which misaki downloads when first used; Japanese needs a dictionary
download too, and Mandarin misaki[zh]. Those voices are refused at start-up (docs/voices.md#kokoro).

KModel makes one item at a time. Here a batch runs through its modules at once: the text side with the masks
and packed LSTMs it was trained with, the frame side (prosody and the vocoder) with the padded frames zeroed
before every convolution, instance norms over each item's own frames, the frame LSTM packed, and the vocoder's
harmonic source and inverse STFT per item (each seeded from its own phonemes), so an item's audio is the same in
a batch as alone. The predicted durations (frames of 600 samples) time the words.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..text.chunks import words
from ..text.pronunciation import as_text
from .alignment import unit_words
from .base import EngineUnavailable, OneShotEngine, Voice, VoiceSpec, peak_normalize, voice_mix
from .contract import Capabilities, EngineInput, EngineOutput
from .instances import Instances, copy_counts, threads_per_copy
from .torch_support import DeviceMemory, loading_model, model_folder, resolve_device

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
FRAME_SAMPLES = 600  # audio samples per predicted duration frame (the vocoder's upsampling x its STFT hop)
MAX_PHONEMES = 510  # a pack's styles, and the model's context (512) less its two boundary ids
# a voice name's first letter: its language (what Chorus calls it, and espeak's name for it)
LANGUAGES = {"a": ("en-US", "en-us"), "b": ("en-GB", "en-gb"), "e": ("es", "es"), "f": ("fr-FR", "fr-fr"),
             "h": ("hi", "hi"), "i": ("it", "it"), "p": ("pt-BR", "pt-br")}
NOT_OFFLINE = {"j": "Japanese", "z": "Mandarin Chinese"}
GENDERS = {"f": "female", "m": "male"}
CONFIG_FILES = ["config.json", "*.pth", "voices/*.pt"]


def _language_letter(language: str) -> str | None:
    """The letter of a language Kokoro speaks offline: "en-US", "en_us" and "en" are a; "fr" is f."""
    wanted = language.replace("_", "-").lower()
    for letter, (name, espeak) in LANGUAGES.items():
        if wanted in (name.lower(), espeak, name.split("-")[0].lower()):
            return letter
    return None


def _named_as_released(pack: str) -> bool:
    """A pack named as the released ones are: a language letter, a gender letter, "_", a name (`af_heart`)."""
    return pack[2:3] == "_"


def voice_language(name: str, language: str | None) -> str:
    """A voice's language letter: the registry's language, else its pack's name (`af_heart`: a). Raises
    EngineUnavailable for one Chorus cannot phonemize offline."""
    if language is not None:
        letter = _language_letter(language)
        if letter is None:
            raise EngineUnavailable(f"kokoro voice {name!r}: Chorus reads {language!r} for Kokoro with no phonemizer "
                                    f"it can install offline; it reads {', '.join(n for n, _ in LANGUAGES.values())}")
        return letter
    letter = name[:1].lower()
    if letter in NOT_OFFLINE:
        raise EngineUnavailable(f"kokoro voice {name!r} speaks {NOT_OFFLINE[letter]}, which Chorus cannot phonemize "
                                "offline (misaki's reader for it needs a download); it reads "
                                f"{', '.join(n for n, _ in LANGUAGES.values())} (docs/voices.md#kokoro)")
    if letter not in LANGUAGES:
        raise EngineUnavailable(f"kokoro voice {name!r}: its name does not say its language (af_, bm_, ff_, ...); "
                                "give it a `language` in the registry")
    return letter


def pack_names(source: str) -> list[str]:
    """The voice packs a model ships (voices/*.pt) named as released (`af_heart`) in a language Chorus reads: what a
    registry name with a star stands for. The others are left out, with a warning (one of them can still be named
    in the registry, with its `language`)."""
    with loading_model(source):
        folder = model_folder(source, CONFIG_FILES)
    names = sorted(path.stem for path in (folder / "voices").glob("*.pt"))
    readable = [name for name in names if _named_as_released(name) and name[0].lower() in LANGUAGES]
    for name in sorted(set(names) - set(readable)):
        why = f"it speaks {NOT_OFFLINE[name[0].lower()]}" if _named_as_released(name) and \
            name[0].lower() in NOT_OFFLINE else "its name does not say its language"
        log.warning("kokoro model %s: the voice pack %r is left out of %r: %s", source, name, "*", why)
    return readable


def _pack_files(folder: Path, specs: Sequence[VoiceSpec]) -> dict[str, Path]:
    """Voice name -> its pack: the registry's `prompt` (relative to the model folder), else voices/NAME.pt."""
    files = {spec.name: folder / (spec.prompt or f"voices/{spec.name}.pt") for spec in specs}
    for name, path in files.items():
        if not path.is_file():
            raise FileNotFoundError(f"voice {name!r}: no voice pack {path}")
    return files


def _voices(specs: Sequence[VoiceSpec], files: dict[str, Path]) -> list[Voice]:
    voices = []
    for spec in specs:
        pack = files[spec.name].stem
        language = LANGUAGES[voice_language(pack if spec.language is None else spec.name, spec.language)][0]
        voices.append(Voice(spec.name, "kokoro", language, SAMPLE_RATE, speed=spec.speed,
                            gender=GENDERS.get(pack[1].lower()) if _named_as_released(pack) else None))
    return voices


def describe_kokoro(source: str, specs: Sequence[VoiceSpec]) -> list[Voice]:
    """A model's voices from its config and packs alone (no weights loaded): this also checks, at start-up, that
    the model, its packs and their languages are there."""
    return _voices(specs, _model_files(source, specs)[2])


def _model_files(source: str, specs: Sequence[VoiceSpec]) -> tuple[Path, Path, dict[str, Path]]:
    """The model's folder, its weights and its voices' packs; EngineUnavailable naming what is missing."""
    if not specs:
        raise EngineUnavailable(f"kokoro model {source!r}: the registry names none of its voices (`NAME:` or `*:`)")
    with loading_model(source):
        folder = model_folder(source, CONFIG_FILES)
        json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab"]
        return folder, _weights(folder), _pack_files(folder, specs)


def _weights(folder: Path) -> Path:
    found = sorted(folder.glob("*.pth"))
    if len(found) != 1:
        raise FileNotFoundError(f"{folder} holds {len(found)} weight files (*.pth); a Kokoro model has one")
    return found[0]


def _phonemizer(letter: str) -> Callable[[str], str]:
    """espeak-ng, mapped to Kokoro's phonemes by misaki: its English reading (US or UK) for a and b (the one
    misaki falls back to for words its lexicon lacks), its general one for the others. Not reentrant: an engine
    has its own, used under its lock."""
    from misaki import espeak

    # phonemizer warns of "words count mismatch" when espeak joins or splits words: the phonemes are read whole
    logging.getLogger("phonemizer").setLevel(logging.ERROR)
    if letter in "ab":
        reader = espeak.EspeakFallback(british=letter == "b")
        return lambda text: reader(_Word(text))[0] or ""
    reader = espeak.EspeakG2P(language=LANGUAGES[letter][1])
    return lambda text: reader(text)[0] or ""


class _Word:
    """What misaki's English reader reads of a token: its text."""

    def __init__(self, text: str):
        self.text = text


class _Batch:
    """The batch being made, as the masks read it: each item's frames (None: one item alone) and its seed."""

    def __init__(self) -> None:
        self.frames: torch.Tensor | None = None
        self.total = 1
        self.seeds: list[int] = []

    def valid(self, steps: int) -> torch.Tensor:
        """Each item's length at a resolution of `steps` for the batch's `total` frames."""
        return torch.div(self.frames * steps + self.total - 1, self.total, rounding_mode="floor")

    def rows(self, steps: int) -> list[tuple[int, int]]:
        """(row, its length) of each item at a resolution of `steps`: the whole of it for one item alone."""
        return [(0, steps)] if self.frames is None else list(enumerate(self.valid(steps).tolist()))

    def keep(self, steps: int, like: torch.Tensor) -> torch.Tensor:
        """[items, 1, steps]: 1 at each item's own positions, 0 past its end."""
        positions = torch.arange(steps, device=like.device)
        return (positions[None, :] < self.valid(steps).to(like.device)[:, None]).to(like.dtype)[:, None, :]


def _zero_padding(batch: _Batch):
    def hook(_module: nn.Module, args: tuple) -> tuple | None:
        if batch.frames is None:
            return None
        return (args[0] * batch.keep(args[0].shape[-1], args[0]), *args[1:])

    return hook


class _ItemNorm(nn.Module):
    """An instance norm over each item's own frames."""

    def __init__(self, norm: nn.InstanceNorm1d, batch: _Batch):
        super().__init__()
        self.norm, self.batch = norm, batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch.frames is None:
            return self.norm(x)
        keep = self.batch.keep(x.shape[-1], x)
        count = keep.sum(-1, keepdim=True)
        mean = (x * keep).sum(-1, keepdim=True) / count
        variance = ((x - mean) ** 2 * keep).sum(-1, keepdim=True) / count
        normed = (x - mean) / torch.sqrt(variance + self.norm.eps)
        return normed * self.norm.weight[None, :, None] + self.norm.bias[None, :, None]


class _PackedLSTM(nn.Module):
    """A bidirectional LSTM over each item's own frames (padding would reach the backward direction first)."""

    def __init__(self, lstm: nn.LSTM, batch: _Batch):
        super().__init__()
        self.lstm, self.batch = lstm, batch

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        if self.batch.frames is None:
            return self.lstm(x)[0], None
        return _packed(self.lstm, x, self.batch.valid(x.shape[1])), None


def _packed(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    return pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])[0]


class _ItemSource(nn.Module):
    """The vocoder's harmonic source (kokoro's SourceModuleHnNSF with its SineGen: the same operations), made for
    each item alone, its random starting phases and noise drawn from a generator seeded from the item's phonemes:
    then an item sounds the same in any batch, the same text in the same voice always sounds the same, and the
    process's random state (other engines') is not touched."""

    def __init__(self, source: nn.Module, batch: _Batch):
        super().__init__()
        self.source, self.batch = source, batch

    def forward(self, f0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = []
        for row, length in self.batch.rows(f0.shape[1]):
            generator = torch.Generator(f0.device).manual_seed(self.batch.seeds[row])
            made = self._one(f0[row:row + 1, :length], generator)
            rows.append([nn.functional.pad(part, (0, 0, 0, f0.shape[1] - length)) for part in made])
        return tuple(torch.cat(parts) for parts in zip(*rows, strict=True))

    def _one(self, f0: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        sine = self.source.l_sin_gen
        harmonics = f0 * torch.arange(1, sine.harmonic_num + 2, device=f0.device, dtype=f0.dtype)
        radians = (harmonics / sine.sampling_rate) % 1
        start = torch.rand(1, sine.dim, device=f0.device, generator=generator)
        start[:, 0] = 0
        radians[:, 0, :] = radians[:, 0, :] + start
        radians = nn.functional.interpolate(radians.transpose(1, 2), scale_factor=1 / sine.upsample_scale,
                                            mode="linear").transpose(1, 2)
        phase = torch.cumsum(radians, dim=1) * 2 * torch.pi
        phase = nn.functional.interpolate(phase.transpose(1, 2) * sine.upsample_scale,
                                          scale_factor=sine.upsample_scale, mode="linear").transpose(1, 2)
        waves = torch.sin(phase) * sine.sine_amp
        voiced = (f0 > sine.voiced_threshold).to(f0.dtype)
        noise_amp = voiced * sine.noise_std + (1 - voiced) * sine.sine_amp / 3
        noise = noise_amp * torch.randn(waves.shape, device=f0.device, generator=generator)
        waves = waves * voiced + noise
        merged = self.source.l_tanh(self.source.l_linear(waves))
        return merged, torch.zeros_like(voiced), voiced  # (the generator reads only the first)


class _ItemSTFT(nn.Module):
    """The vocoder's STFT and inverse STFT for each item alone: both reach past an item's end (centred
    frames, overlap-add), where a padded item would read its padding."""

    def __init__(self, stft: nn.Module, batch: _Batch):
        super().__init__()
        self.stft, self.batch = stft, batch

    def transform(self, audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        made = [self.stft.transform(audio[row:row + 1, :length]) for row, length in self.batch.rows(audio.shape[-1])]
        frames = max(magnitude.shape[-1] for magnitude, _ in made)
        return tuple(torch.cat([nn.functional.pad(part[index], (0, frames - part[index].shape[-1])) for part in made])
                     for index in (0, 1))

    def inverse(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        made = [self.stft.inverse(magnitude[row:row + 1, :, :length], phase[row:row + 1, :, :length])
                for row, length in self.batch.rows(magnitude.shape[-1])]
        samples = max(audio.shape[-1] for audio in made)
        return torch.cat([nn.functional.pad(audio, (0, samples - audio.shape[-1])) for audio in made])


def _mask_frames(model: nn.Module, batch: _Batch) -> None:
    """The frame side of the model (prosody from the alignment on, and the vocoder) made batchable: see the
    module's docstring."""
    frame_side = [*model.predictor.F0, *model.predictor.N, model.predictor.F0_proj, model.predictor.N_proj,
                  model.decoder]
    for part in frame_side:
        for module in list(part.modules()):
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                module.register_forward_pre_hook(_zero_padding(batch))
            elif type(module).__name__ == "AdaIN1d":
                module.norm = _ItemNorm(module.norm, batch)
    model.predictor.shared = _PackedLSTM(model.predictor.shared, batch)
    generator = model.decoder.generator
    generator.m_source = _ItemSource(generator.m_source, batch)
    generator.stft = _ItemSTFT(generator.stft, batch)


@dataclass
class _Copy:
    """One copy of the model (tts_core.engines.instances), its frame side masked by the batch it is making."""

    model: nn.Module
    batch: _Batch

    @classmethod
    def of(cls, model: nn.Module, device: str) -> _Copy:
        batch = _Batch()
        model.to(device).eval()
        _mask_frames(model, batch)
        return cls(model, batch)


def kmodel(source: str, config: Path, weights: Path) -> nn.Module:
    """The kokoro package's KModel from these files, in eval mode (its import reads spaCy: a few seconds, so only
    when a Kokoro model loads). Its warnings (its LSTMs' dropout, torch's old weight_norm) are nothing to act on."""
    from kokoro import KModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        return KModel(repo_id=source, config=str(config), model=str(weights)).eval()


class KokoroEngine(DeviceMemory, OneShotEngine):
    capabilities = Capabilities(times_words=True, mixes_voices=True)

    def __init__(self, source: str, voices: Sequence[VoiceSpec], device: str = "auto", name: str | None = None):
        """source: a folder or a hub id (from the local cache when offline); voices: the registry's. It runs in
        fp32 whatever TTS_DTYPE says (its vocoder's STFT and instance norms)."""
        self.name = name or source.rstrip("/").rsplit("/", 1)[-1]
        self.device = resolve_device(device)
        folder, weights, files = _model_files(source, voices)
        self._voices = _voices(voices, files)
        with loading_model(source):
            self.model = kmodel(source, folder / "config.json", weights)
            self._packs = {name: torch.load(path, map_location="cpu", weights_only=True).reshape(MAX_PHONEMES, -1)
                           for name, path in files.items()}
        self._another_model = lambda: kmodel(source, folder / "config.json", weights)  # (for more instances)
        self._vocab: dict[str, int] = self.model.vocab
        self._letters = {voice.name: _language_letter(voice.language) for voice in self._voices}
        self._readers = {letter: _phonemizer(letter) for letter in set(self._letters.values())}
        self._reading = threading.Lock()  # (espeak is not reentrant: the text reader and a warm-up may both read)
        self._copies = Instances([_Copy.of(self.model, self.device)])
        self._torch_threads = torch.get_num_threads()  # the cores' threads (TTS_TORCH_THREADS), shared by the copies
        self.sample_rate = SAMPLE_RATE

    def voices(self) -> list[Voice]:
        return list(self._voices)

    # --- text -----------------------------------------------------------------------------------

    def _parts(self, voice: str) -> list[tuple[str, float]]:
        """A voice's packs and their weights: its own, or a mix's (a registry name is never read as a mix)."""
        return [(voice, 1.0)] if voice in self._packs else voice_mix(voice) or [(voice, 1.0)]

    def _phonemes(self, text: str, voice: str) -> str:
        """The text's phonemes, those the model has no id for left out (as KModel does)."""
        letter = self._letters[self._parts(voice)[0][0]]  # a mix speaks its first voice's language
        with self._reading:
            phonemes = self._readers[letter](as_text(text))
        return "".join(char for char in phonemes if char in self._vocab)

    def _pieces(self, phonemes: str) -> list[str]:
        """Pieces the model can read (at most MAX_PHONEMES), cut at word breaks."""
        pieces, rest = [], phonemes.strip()
        while len(rest) > MAX_PHONEMES:
            cut = rest.rfind(" ", 0, MAX_PHONEMES + 1)
            cut = cut if cut > 0 else MAX_PHONEMES
            pieces.append(rest[:cut])
            rest = rest[cut:].strip()
        return [*pieces, rest] if rest else pieces

    def _ids(self, piece: str) -> np.ndarray:
        return np.asarray([0, *(self._vocab[char] for char in piece), 0], dtype=np.int64)

    def tokenize(self, text: str, voice: str) -> list[np.ndarray]:
        return [self._ids(piece) for piece in self._pieces(self._phonemes(text, voice))]

    def tokenize_words(self, text: str, voice: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Phonemes map to words by tts_core.engines.alignment.unit_words (the phonemes between spaces are a word,
        punctuation is no word's); the boundary ids at each piece's ends are no word's."""
        pieces = self._pieces(self._phonemes(text, voice))
        units = [unit for piece in pieces for unit in [*piece, " "]]
        labels = iter(unit_words(units, words(text), lambda word: list(self._phonemes(word, voice))).tolist())
        tokenized = []
        for piece in pieces:
            owners = [-1, *(next(labels) for _ in piece), -1]
            next(labels)  # the break between pieces
            tokenized.append((self._ids(piece), np.asarray(owners, dtype=np.int64)))
        return tokenized

    # --- audio ----------------------------------------------------------------------------------

    def _style(self, voice: str, phonemes: int) -> torch.Tensor:
        """The voice's style for a text of this many phonemes: its pack's, or a mix's weighted mean."""
        row = min(max(phonemes - 1, 0), MAX_PHONEMES - 1)
        parts = self._parts(voice)
        total = sum(weight for _, weight in parts)
        return sum(self._packs[name][row] * (weight / total) for name, weight in parts)

    def synthesize(self, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        return self._copies.run(batch, self._synthesize)

    @torch.inference_mode()  # (on the copy's own thread: the mode is a thread's)
    def _synthesize(self, copy: _Copy, batch: Sequence[EngineInput]) -> list[EngineOutput]:
        audio, durations = self._forward(copy, batch)
        return [EngineOutput(peak_normalize(made), spans * FRAME_SAMPLES) for made, spans in zip(audio, durations,
                                                                                                   strict=True)]

    def instance_counts(self) -> tuple[int, ...]:
        """On a CPU, 1, 2, 4, ... up to its threads; on CUDA one (a batch pays there)."""
        return (1,) if self.device == "cuda" else copy_counts(self._torch_threads)

    def use_instances(self, count: int) -> None:
        if count not in self.instance_counts():
            raise ValueError(f"{self.name} runs one of {self.instance_counts()} copies of its model, not {count}")
        kept = self._copies.copies[:count]
        self._copies.close()
        made = [_Copy.of(self._another_model(), self.device) for _ in range(count - len(kept))]
        self._copies = Instances(kept + made)
        torch.set_num_threads(threads_per_copy(self._torch_threads, count))  # (torch's threads are the process's)

    @property
    def instances(self) -> int:
        return len(self._copies)

    def memory_bytes(self) -> int:
        return super().memory_bytes() * len(self._copies)

    def _forward(self, copy: _Copy, batch: Sequence[EngineInput]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """KModel.forward_with_tokens for a padded batch: each item's audio and its tokens' frames."""
        model, device = copy.model, self.device
        lengths = torch.tensor([item.length for item in batch])
        ids = torch.zeros((len(batch), int(lengths.max())), dtype=torch.long)
        for row, item in enumerate(batch):
            ids[row, : item.length] = torch.from_numpy(item.tokens)
        ids, lengths = ids.to(device), lengths.to(device)
        padding = torch.arange(ids.shape[1], device=device)[None, :] >= lengths[:, None]
        style = torch.stack([self._style(item.voice, item.length - 2) for item in batch]).to(device)
        speed = torch.tensor([item.speed for item in batch], device=device)

        encoded = model.bert_encoder(model.bert(ids, attention_mask=(~padding).int())).transpose(-1, -2)
        prosody_style = style[:, 128:]
        durations_in = model.predictor.text_encoder(encoded, prosody_style, lengths, padding)
        hidden = _packed(model.predictor.lstm, durations_in, lengths)
        duration = torch.sigmoid(model.predictor.duration_proj(hidden)).sum(dim=-1) / speed[:, None]
        frames_of = torch.round(duration).clamp(min=1).long() * (~padding)
        frames = frames_of.sum(dim=1)
        alignment = torch.zeros((len(batch), ids.shape[1], int(frames.max())), device=device)
        for row, length in enumerate(lengths.tolist()):
            tokens = torch.repeat_interleave(torch.arange(length, device=device), frames_of[row, :length])
            alignment[row, tokens, torch.arange(tokens.shape[0], device=device)] = 1

        copy.batch.frames = frames if len(batch) > 1 else None
        copy.batch.total = int(frames.max())
        copy.batch.seeds = [zlib.crc32(item.tokens.tobytes()) for item in batch]
        pitch, energy = model.predictor.F0Ntrain(durations_in.transpose(-1, -2) @ alignment, prosody_style)
        aligned_text = model.text_encoder(ids, lengths, padding) @ alignment
        audio = model.decoder(aligned_text, pitch, energy, style[:, :128]).squeeze(1).float().cpu().numpy()
        frames_of = frames_of.cpu().numpy()
        return ([audio[row, : int(frames[row]) * FRAME_SAMPLES] for row in range(len(batch))],
                [frames_of[row, : item.length] for row, item in enumerate(batch)])

