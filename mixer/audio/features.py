"""Whisper log-mel features of a clip, as transformers' `WhisperFeatureExtractor` computes them.

The values are those of the extractor's numpy path (`feature_size=128`, called as
`Qwen2AudioProcessor` calls it: padded with zeros to 30 s, truncated past it): a periodic
Hann window of 400 samples every 160, the waveform reflect-padded by 200 at both ends, an
rFFT per frame in float64 stored as complex64 (as the extractor's `spectrogram` stores it),
the power through a Slaney-normalized 128-filter mel bank over 0-8 kHz, floored at 1e-10,
log10, the last frame dropped, floored at the clip's maximum minus 8, and (x + 4) / 4 in
float32. Here the frames go through one batched rFFT instead of a Python loop over frames.

`feature_frames` is the clip's frames in `feature_attention_mask` (one per 160 samples
begun, at most 3000) and `audio_tokens` the `<|AUDIO|>` tokens the processor writes for it.
"""

from __future__ import annotations

import numpy as np

from mixer.config.audio import (
    CHUNK_SAMPLES,
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_MELS,
    SAMPLING_RATE,
)


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - 15.0))
    return freq


def mel_filters(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SAMPLING_RATE) -> np.ndarray:
    """The (n_fft/2 + 1, n_mels) float64 triangular filters, Slaney-normalized, 0 to 8 kHz."""
    bins = n_fft // 2 + 1
    mel_edges = np.linspace(
        _hertz_to_mel(np.array([0.0]))[0], _hertz_to_mel(np.array([8000.0]))[0], n_mels + 2
    )
    edges = _mel_to_hertz(mel_edges)
    fft_freqs = np.linspace(0, rate // 2, bins)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    return filters * (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[None, :]


def _hann(length: int) -> np.ndarray:
    return np.hanning(length + 1)[:-1]  # periodic


_FILTERS_T = np.ascontiguousarray(mel_filters().T)  # (n_mels, bins)
_WINDOW = _hann(N_FFT)


def feature_frames(samples: int) -> int:
    """Frames of a clip of `samples` (16 kHz) in its `feature_attention_mask`."""
    return min(-(-samples // HOP_LENGTH), N_FRAMES)


def audio_tokens(frames: int) -> int:
    """`<|AUDIO|>` tokens of a clip of `frames` mask frames (Qwen2AudioProcessor's count: the
    encoder's two convolutions and its pooling, each halving)."""
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


_SILENCE = np.log10(np.float64(1e-10)).astype(np.float32)  # a frame of zeros, floored


def log_mel(samples: np.ndarray) -> np.ndarray:
    """The (128, 3000) float32 `input_features` of a clip's 16 kHz mono samples (its first
    30 s; shorter clips padded with zeros). Frames that see only the zero padding are the
    floor's value without being computed: a short clip costs what its length does."""
    wave = np.zeros(CHUNK_SAMPLES, dtype=np.float32)
    n = min(len(samples), CHUNK_SAMPLES)
    wave[:n] = samples[:n]
    padded = np.pad(wave, N_FFT // 2, mode="reflect").astype(np.float64)
    count = 1 + (len(padded) - N_FFT) // HOP_LENGTH  # 3001
    # Frame i sees wave[160 i - 200 : 160 i + 200] (and the end's reflection, near 30 s).
    heard = count if n >= CHUNK_SAMPLES - N_FFT else min(count, -(-(n + N_FFT // 2) // HOP_LENGTH))
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(heard, N_FFT), strides=(padded.strides[0] * HOP_LENGTH, padded.strides[0])
    )
    spectrum = np.fft.rfft(frames * _WINDOW, axis=1).astype(np.complex64)
    power = np.abs(spectrum, dtype=np.float64) ** 2  # (frames, bins)
    mel = np.maximum(1e-10, _FILTERS_T @ power.T)  # (n_mels, frames)
    spec = np.full((N_MELS, count - 1), _SILENCE, dtype=np.float32)
    spec[:, : min(heard, count - 1)] = np.log10(mel).astype(np.float32)[:, : count - 1]
    spec = np.maximum(spec, spec.max() - np.float32(8.0))
    return (spec + np.float32(4.0)) / np.float32(4.0)
