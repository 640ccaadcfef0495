"""Pocket TTS's codec (`PocketTTSAudioTokenizerModel`) as a stream, and voice prompts from audio.

transformers decodes latents in one piece only: its decoder convolutions keep no state between calls,
and chunks decoded alone break at every boundary. `StreamingDecoder` gives each convolution of the
decoder the state a stream needs, so a request's frames decode piece by piece into exactly the audio
one whole decode gives (within float rounding):
- a causal Conv1d (all of the decoder's have stride 1) keeps its last `kernel - 1` (dilated) input
  samples and puts them before the next chunk instead of zero padding;
- a causal ConvTranspose1d keeps the `kernel - stride` output samples it trims on the right (less the
  bias, which the next chunk's outputs already carry) and adds them to the next chunk's first samples;
- the decoder transformer (sliding window) keeps its key/value cache (`decoder_past_key_values`).
Every piece is then frames x frame_size samples: nothing is held back, so the end needs no flush.
"""

from __future__ import annotations

import io
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer import (
    PocketTTSAudioTokenizerConv1d,
    PocketTTSAudioTokenizerConvTranspose1d,
)


class DecoderState:
    """One stream's state (batch first in every tensor): the convolutions' carried samples, the
    decoder transformer's cache."""

    def __init__(self, decoder_config) -> None:
        self.carried: dict[nn.Module, torch.Tensor] = {}
        self.cache = DynamicCache(config=decoder_config)


def _streaming_conv(self, hidden_states: torch.Tensor, padding_cache=None) -> torch.Tensor:
    state: DecoderState | None = self.stream_state
    if state is None:
        return self.plain_forward(hidden_states, padding_cache)
    width = int(self.padding_total)
    before = state.carried.get(self)
    if before is None:  # the stream's start: the zeros a whole decode pads with
        before = hidden_states.new_zeros(*hidden_states.shape[:2], width)
    joined = torch.cat([before, hidden_states], dim=-1)
    state.carried[self] = joined[..., joined.shape[-1] - width:]
    return self.conv(joined)


def _streaming_conv_transpose(self, hidden_states: torch.Tensor) -> torch.Tensor:
    state: DecoderState | None = self.stream_state
    if state is None:
        return self.plain_forward(hidden_states)
    out = self.conv(hidden_states)
    overlap = self.padding_right  # causal: everything past the input's span is trimmed on the right
    body, tail = out[..., : out.shape[-1] - overlap], out[..., out.shape[-1] - overlap:]
    before = state.carried.get(self)
    if before is not None:
        body = torch.cat([body[..., :overlap] + before, body[..., overlap:]], dim=-1)
    bias = 0 if self.conv.bias is None else self.conv.bias[None, :, None]
    state.carried[self] = tail - bias
    return body


class StreamingDecoder:
    """Decodes a stream's latents piece by piece (`decode(latents, state)`), exactly as one whole decode.
    Wraps the codec's decoder convolutions once; outside `decode` they behave as before."""

    def __init__(self, codec) -> None:
        self.codec = codec
        self._layers: list[nn.Module] = []
        for module in codec.decoder.modules():
            if isinstance(module, PocketTTSAudioTokenizerConv1d):
                if int(module.stride) != 1 or not module.causal:
                    raise ValueError("the streaming decoder needs causal, stride-1 convolutions")
                streaming = _streaming_conv
            elif isinstance(module, PocketTTSAudioTokenizerConvTranspose1d):
                if not module.causal or module.padding_left != 0:
                    raise ValueError("the streaming decoder needs causal transposed convolutions")
                streaming = _streaming_conv_transpose
            else:
                continue
            module.plain_forward = module.forward
            module.forward = types.MethodType(streaming, module)
            module.stream_state = None
            self._layers.append(module)

    def new_state(self) -> DecoderState:
        return DecoderState(self.codec.decoder.config)

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """latents (batch, frames, latent_dim) in the codec's space -> audio (batch, frames * frame_size)."""
        for module in self._layers:
            module.stream_state = state
        try:
            out = self.codec.decode(latents, decoder_past_key_values=state.cache)
        finally:
            for module in self._layers:
                module.stream_state = None
        return out.audio_values[:, 0]


# --- voice prompts from audio ----------------------------------------------------------------------


def _resampled(frames, sample_rate: int) -> np.ndarray:
    """PyAV audio frames (any layout and rate) -> float32 mono at sample_rate. (PyAV is imported where it is
    used: the engines load without it, as on a bare GPU machine, when no audio needs converting.)"""
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
    pieces = [out.to_ndarray().reshape(-1) for frame in frames for out in resampler.resample(frame)]
    pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)


def resample(audio: np.ndarray, sample_rate: int, target_rate: int) -> np.ndarray:
    """float32 mono at another rate (PyAV, imported here: see _resampled)."""
    from ..audio.playable import resample as resampled

    return resampled(audio, sample_rate, target_rate)


def read_clip(path: Path, sample_rate: int) -> np.ndarray:
    """An audio file (wav, flac, ogg, mp3, ...) as float32 mono at sample_rate."""
    import av

    with av.open(io.BytesIO(Path(path).read_bytes())) as container:
        return _resampled(container.decode(audio=0), sample_rate)


@torch.inference_mode()
def encode_voice(codec, feature_extractor, audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """A voice clip -> its voice prompt, the codec latents (frames, latent_dim) as float32. The feature
    extractor ends the clip on a short pause, as the model's voices were made."""
    audio = resample(audio, sample_rate, feature_extractor.sampling_rate)
    if not audio.size:
        raise ValueError("the voice clip is empty")
    features = feature_extractor(audio, sampling_rate=feature_extractor.sampling_rate)
    encoded = codec.encode(features["input_values"].to(codec.device, codec.dtype),
                           features["padding_mask"].to(codec.device))
    latents = encoded.latents[0][encoded.latents_mask[0].bool()]
    return latents.float().cpu().numpy()
