"""A Kokoro model with random weights, saved as the folder the `kokoro` engine loads (what the released
hexgrad/Kokoro-82M holds): config.json, kokoro-v1_0.pth and voices/NAME.pt.

The config is the released one (bench/kokoro_config.json: its layers, sizes and phoneme vocabulary), 82 M
parameters; --tiny shrinks the text side (a 2-layer ALBERT of width 32, one layer of LSTMs) and the vocoder's
residual blocks (one kernel size of three). The decoder's widths are fixed in the kokoro package (1024 and 512
channels), so a tiny model still has 59 M parameters and makes audio about half as fast again as the full one.

Random durations would give each phoneme about 25 frames (0.6 s): the duration head's bias is set so that
a phoneme lasts about 3 frames (75 ms), as in real speech, which keeps the audio of a text about as long as
the released model's. The voice packs are random too, one [510, 1, 256] tensor each, as the released packs
are shaped (a style per phoneme count). The audio is noise of the right length: enough to measure speed,
memory and batching, nothing to listen to.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from tts_core.engines.kokoro import kmodel

CONFIG = Path(__file__).with_name("kokoro_config.json")
WEIGHTS = "kokoro-v1_0.pth"  # the released file's name
VOICES = ("af_heart", "af_bella", "am_adam", "bf_emma", "ff_siwis")  # one of each kind: US, UK, French
TINY = dict(n_layer=1,
            plbert=dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=512,
                        num_hidden_layers=2, dropout=0.1),
            istftnet=dict(upsample_kernel_sizes=[20, 12], upsample_rates=[10, 6], gen_istft_hop_size=5,
                          gen_istft_n_fft=20, resblock_dilation_sizes=[[1, 3, 5]], resblock_kernel_sizes=[3],
                          upsample_initial_channel=512))
FRAMES_PER_PHONEME = 3.0


def save_random_kokoro(folder: Path, tiny: bool = False, seed: int = 0, voices: tuple[str, ...] = VOICES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(CONFIG.read_text(encoding="utf-8"))
    config.update(TINY if tiny else {})
    (folder / "config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    torch.manual_seed(seed)
    model = _random(folder)
    projection = model.predictor.duration_proj.linear_layer
    with torch.no_grad():  # sigmoid(bias) x max_dur outputs: about FRAMES_PER_PHONEME frames
        projection.weight.mul_(0.1)
        projection.bias.fill_(-math.log(config["max_dur"] / FRAMES_PER_PHONEME - 1))
    torch.save({name: getattr(model, name).state_dict()
                for name in ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")}, folder / WEIGHTS)
    (folder / "voices").mkdir(exist_ok=True)
    for index, voice in enumerate(voices):
        generator = torch.Generator().manual_seed(seed * 1000 + index)
        torch.save(torch.randn(510, 1, 256, generator=generator) * 0.3, folder / "voices" / f"{voice}.pt")
    return folder


def _random(folder: Path) -> torch.nn.Module:
    """KModel reads its weights from a file: an empty one's state, saved and read back, builds it at random."""
    empty = folder / WEIGHTS
    torch.save({}, empty)
    return kmodel("hexgrad/Kokoro-82M", folder / "config.json", empty)
