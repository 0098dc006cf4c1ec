"""Audio clips to Qwen2-Audio's inputs, against transformers as the oracle: decoding (PyAV, 16 kHz
mono), Whisper log-mel features (WhisperFeatureExtractor's numpy path), mask frames and the
`<|AUDIO|>` count of Qwen2AudioProcessor, long clips, and bad clips as `bad_audio` errors."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from audio_data import (
    declare_flac_samples,
    encode,
    encode_wav,
    pcm_waveform,
    speech,
    tone,
)

from mixer.audio.decode import decode_clip
from mixer.audio.features import audio_tokens, feature_frames, log_mel
from mixer.audio.handle import AudioProcessing
from mixer.config.audio import AudioSettings
from mixer.core.errors import DataError
from mixer.core.records import EncodedAudio

RATE = 16000


@pytest.fixture(scope="module")
def extractor():
    """WhisperFeatureExtractor(feature_size=128) on its numpy path (as without torch)."""
    import transformers.models.whisper.feature_extraction_whisper as whisper

    patch = pytest.MonkeyPatch()
    patch.setattr(whisper, "is_torch_available", lambda: False)
    yield whisper.WhisperFeatureExtractor(feature_size=128)
    patch.undo()


def oracle(extractor, wave: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(input_features, mask frames, <|AUDIO|> tokens) as Qwen2AudioProcessor makes them."""
    out = extractor(
        wave,
        sampling_rate=RATE,
        return_attention_mask=True,
        padding="max_length",
        return_tensors="np",
    )
    frames = int(out["attention_mask"].sum())
    return out["input_features"][0], frames, (((frames - 1) // 2 + 1) - 2) // 2 + 1


def clip(data: bytes, suffix: str) -> EncodedAudio:
    return EncodedAudio(data, f"s000001.{suffix}", 512)


def decoded(data: bytes, suffix: str, **settings) -> np.ndarray:
    processing = AudioProcessing(AudioSettings(layout="qwen2_audio", **settings))
    return processing.samples(clip(data, suffix), "speech", "shard.tar")[0]


def native_then_resampled(data: bytes) -> np.ndarray:
    """The clip decoded by PyAV at its own rate, averaged to mono and resampled to 16 kHz by
    FFT (band-limited), to the length FFmpeg's resampler gives: the oracle's waveform."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate
        to_float = av.AudioResampler(format="fltp", layout=stream.layout, rate=rate)
        frames = [g for f in container.decode(stream) for g in to_float.resample(f)]
        planes = np.concatenate([f.to_ndarray().astype(np.float64) for f in frames], axis=1)
    x = planes.mean(axis=0)
    n = -(-len(x) * RATE // rate)
    spectrum = np.fft.rfft(x)[: n // 2 + 1]
    return (np.fft.irfft(spectrum, n) * n / len(x)).astype(np.float32)


def test_16k_mono_files_give_the_extractors_features_exactly(extractor):
    """WAV and FLAC at 16 kHz (a tone, espeak-ng speech): the samples are the file's 16-bit
    levels / 32768 exactly, and the features, mask and token count those of
    WhisperFeatureExtractor and Qwen2AudioProcessor on that waveform (≤ 1e-5)."""
    voice, _ = speech("the loader packs speech with text", seed=1)
    for wave, suffix in ((tone(1.7), "wav"), (voice, "flac"), (tone(0.02, freq=900), "wav")):
        samples = decoded(encode(wave, RATE, suffix), suffix)
        assert np.array_equal(samples, pcm_waveform(wave)), suffix
        want, frames, tokens = oracle(extractor, pcm_waveform(wave))
        got = log_mel(samples)
        assert got.shape == (128, 3000) and got.dtype == np.float32
        assert np.abs(got - want).max() <= 1e-5, suffix
        assert feature_frames(len(samples)) == frames
        assert audio_tokens(frames) == tokens


@pytest.mark.parametrize(
    ("suffix", "rate"), [("flac", 22050), ("mp3", 44100), ("ogg", 22050), ("opus", 48000)]
)
def test_resampled_clips_have_the_processors_mask_and_tokens(extractor, suffix, rate):
    """Clips at other rates (espeak-ng's 22.05 kHz speech; tones; Ogg Vorbis in stereo) are
    resampled to 16 kHz mono: mask frames and <|AUDIO|> tokens equal the processor's on an
    independently resampled waveform, the features over the clip's frames within a mean
    difference of 0.01."""
    if suffix == "flac":
        wave, rate = speech("a clip at twenty two kilohertz", seed=2)
    else:
        wave = tone(1.3, rate, freq=500.0)
    data = encode(wave, rate, suffix)
    samples = decoded(data, suffix)
    reference = native_then_resampled(data)
    assert len(samples) == len(reference)
    want, frames, tokens = oracle(extractor, reference)
    assert feature_frames(len(samples)) == frames and audio_tokens(frames) == tokens
    got = log_mel(samples)
    assert float(np.abs(got[:, :frames] - want[:, :frames]).mean()) <= 0.01  # the clip's frames


def test_clips_over_30_seconds_are_cut_as_the_processor_cuts_them_or_refused(extractor):
    wave = tone(31.5, freq=250.0)
    data = encode_wav(wave, RATE)
    samples = decoded(data, "wav")
    assert len(samples) == 30 * RATE
    want, frames, tokens = oracle(extractor, pcm_waveform(wave))  # the extractor truncates
    assert np.abs(log_mel(samples) - want).max() <= 1e-5
    assert (feature_frames(len(samples)), audio_tokens(frames)) == (frames, tokens) == (3000, 750)
    with pytest.raises(DataError, match="longer than 30 s") as err:
        decoded(data, "wav", long_clips="refuse")
    assert err.value.reason == "bad_audio"


def _truncated_flac() -> bytes:
    data = encode(tone(2.0), RATE, "flac")
    return data[: len(data) // 2]


def _zero_length_wav() -> bytes:
    return encode_wav(np.zeros(0, dtype=np.float32), RATE)


def _three_hours() -> bytes:
    return declare_flac_samples(encode(tone(0.5), RATE, "flac"), 3 * 3600 * RATE)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_truncated_flac, "undecodable audio"),
        (_zero_length_wav, "no audio samples"),
        (lambda: b"", "empty audio"),
        (lambda: b"RIFF\x00\x00\x00\x00WAVEjunk" * 4, "not a readable audio file"),
        (_three_hours, r"10800\.0 s .*max_source_seconds"),
    ],
    ids=["truncated_flac", "zero_length_wav", "zero_bytes", "garbage", "three_hours"],
)
def test_bad_clips_are_bad_audio_naming_their_member(make, message):
    with pytest.raises(DataError, match=message) as err:
        decoded(make(), "flac")
    assert err.value.reason == "bad_audio"
    assert err.value.source == "speech" and err.value.file == "shard.tar"
    assert err.value.location == "member s000001.flac at byte offset 512"


def test_a_long_clip_is_decoded_only_as_far_as_it_is_used():
    """With a limit, decoding stops there (a 3-hour clip under a larger max_source_seconds
    costs its first 30 s)."""
    data = encode(tone(3.0), RATE, "flac")
    samples, longer = decode_clip(
        clip(data, "flac"), source="s", file="f", max_source_seconds=10.0, limit=RATE
    )
    assert len(samples) == RATE and longer
