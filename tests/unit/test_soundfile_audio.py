"""soundfile (libsndfile) writes whole WAV and FLAC files and reads WAV, FLAC and Ogg clips; PyAV keeps
mp3, aac, opus and the streams."""

import io

import numpy as np
import pytest
import soundfile

from tts_core.audio.encoding import StreamEncoder, encode, int16
from tts_core.voices.cloning import read_clip, soundfile_clip

RATE = 22050


def speech_like(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    audio = 0.6 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
    audio[:3] = [1.0, -1.0, 1.5]  # full scale, and past it (clipped)
    return audio.astype(np.float32)


@pytest.mark.parametrize("format_name", ["wav", "flac"])
def test_wav_and_flac_decode_back_to_the_same_samples(format_name):
    audio = speech_like(1.0)
    data = encode(audio, RATE, format_name)
    decoded, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and decoded.shape == audio.shape
    assert np.abs(decoded - np.clip(audio, -1, 1)).max() <= 1 / 32768  # 16-bit quantization
    assert np.array_equal(soundfile.read(io.BytesIO(data), dtype="int16")[0], int16(audio))


def test_a_wav_file_is_a_plain_header_and_the_samples_its_stream_and_pcm_carry():
    audio = speech_like(0.5)
    whole = encode(audio, RATE, "wav")
    assert len(whole) == 44 + 2 * audio.size  # no encoder tag (FFmpeg wrote a LIST chunk naming itself)
    stream = StreamEncoder("wav", RATE)
    streamed = stream.encode(audio) + stream.finish()
    assert whole[44:] == streamed[44:] == encode(audio, RATE, "pcm", RATE)


@pytest.mark.parametrize("format_name", ["wav", "mp3", "opus", "aac", "flac", "pcm"])
def test_no_samples_encode_as_a_file_of_no_audio(format_name):
    """(Each codec is flushed once: flushed twice, every format raised EOFError, a 500 for the caller.)"""
    data = encode(np.zeros(0, np.float32), RATE, format_name)
    if format_name == "wav":
        assert soundfile.read(io.BytesIO(data))[0].size == 0  # a file, of no samples


def test_a_wav_file_at_another_rate_is_resampled():
    data = encode(speech_like(1.0), RATE, "wav", 16000)
    info = soundfile.info(io.BytesIO(data))
    assert (info.samplerate, info.frames) == (16000, pytest.approx(16000, abs=2))


def test_a_flac_clip_is_read_through_soundfile_and_an_mp3_one_through_pyav():
    audio = speech_like(4.0)
    flac = encode(audio, RATE, "flac")
    clip = soundfile_clip(flac)
    assert clip is not None and clip.sample_rate == RATE
    assert np.array_equal(clip.audio, int16(audio) / np.float32(32768))  # libsndfile's samples, unresampled
    assert read_clip(flac).audio.size == audio.size
    mp3 = encode(audio, RATE, "mp3")
    assert soundfile_clip(mp3) is None and read_clip(mp3).duration_s == pytest.approx(4.0, abs=0.1)


def test_a_stereo_clip_is_mixed_down():
    left = speech_like(4.0)
    buffer = io.BytesIO()
    soundfile.write(buffer, np.stack([left, np.zeros_like(left)], axis=1), RATE, format="OGG", subtype="VORBIS")
    clip = soundfile_clip(buffer.getvalue())
    assert clip is not None and clip.audio.ndim == 1 and clip.duration_s == pytest.approx(4.0, abs=0.01)
