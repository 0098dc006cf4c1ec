"""Audio throughput: a qwen2_audio recipe's clips/s and tokens/s, and log-mel features per core
against transformers' WhisperFeatureExtractor.

    python benchmarks/audio.py [--batches 40] [--workers 0 2] [--repeat 3]

1. **Loader throughput.** `recipes/audio_demo.yaml` with its audio source alone (generated
   FLAC, WAV, MP3, Vorbis and Opus clips of 0.6-2.5 s; every batch full of clips), iterated
   through `mixer.build_loader(recipe, num_workers=N)` for `--batches` batches after the
   first: clips/s, `<|AUDIO|>` tokens/s and sequence tokens/s (real tokens) over wall time,
   each worker count in a fresh process.
2. **Features per core.** Each bundled clip decoded to 16 kHz mono once; then the
   (128, 3000) `input_features` of every clip by `mixer.audio.features.log_mel` and by
   `WhisperFeatureExtractor(feature_size=128)` on its numpy path (as `Qwen2AudioProcessor`
   calls it: padded to 30 s), clips per CPU second of this process, best of `--repeat`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import yaml
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import mixer  # noqa: E402
from mixer.audio.features import log_mel  # noqa: E402
from mixer.audio.handle import AudioProcessing  # noqa: E402
from mixer.config.audio import AudioSettings  # noqa: E402
from mixer.core.records import EncodedAudio  # noqa: E402

RECIPE = ROOT / "recipes" / "audio_demo.yaml"
SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".opus")


def loader_row(workers: int, batches: int) -> dict[str, float]:
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["tokenizer"] = str(RECIPE.parent / recipe["tokenizer"])
    recipe["sources"] = [
        {**s, "path": str(RECIPE.parent / s["path"])}
        for s in recipe["sources"]
        if s["name"] == "sounds"
    ]
    audio_id = Tokenizer.from_file(recipe["tokenizer"]).token_to_id("<|AUDIO|>")
    loader = mixer.build_loader(recipe, num_workers=workers)
    clips = audio = tokens = 0
    with loader:
        it = iter(loader)
        next(it)  # (start-up: workers, first decodes)
        start = time.perf_counter()
        for _ in range(batches):
            batch = next(it)
            clips += int(batch["input_features"].shape[0])
            audio += int((batch["input_ids"] == audio_id).sum())
            tokens += int((batch["source_ids"] >= 0).sum())
        wall = time.perf_counter() - start
    return {"wall": wall, "clips": clips, "audio": audio, "tokens": tokens}


def bundled_waves() -> list[np.ndarray]:
    processing = AudioProcessing(AudioSettings(layout="qwen2_audio"))
    waves = []
    for shard in sorted((ROOT / "data" / "sample" / "audio").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(SUFFIXES):
                    data = tar.extractfile(member).read()  # type: ignore[union-attr]
                    clip = EncodedAudio(data, member.name, member.offset_data)
                    waves.append(processing.samples(clip, "bench", shard.name)[0])
    return waves


def features_per_cpu_second(waves: list[np.ndarray], repeat: int) -> tuple[float, float]:
    import transformers.models.whisper.feature_extraction_whisper as whisper

    whisper.is_torch_available = lambda: False  # its numpy path
    extractor = whisper.WhisperFeatureExtractor(feature_size=128)

    def theirs(wave: np.ndarray) -> np.ndarray:
        return extractor(wave, sampling_rate=16000, padding="max_length", return_tensors="np")[
            "input_features"
        ][0]

    best = {"mixer": 0.0, "transformers": 0.0}
    for _ in range(repeat):
        for name, fn in (("mixer", log_mel), ("transformers", theirs)):
            cpu = time.process_time()
            for wave in waves:
                fn(wave)
            best[name] = max(best[name], len(waves) / (time.process_time() - cpu))
    return best["mixer"], best["transformers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only is not None:  # (one loader in a fresh process: see main's loop)
        print(json.dumps(loader_row(args.only, args.batches)))
        return
    print(f"loader: {RECIPE.name}, audio source only, {args.batches} batches after the first")
    print(f"{'workers':>7}  {'clips/s':>8}  {'AUDIO tok/s':>11}  {'tokens/s':>9}  {'clips':>6}")
    for workers in args.workers:
        # each worker count in its own process: DataLoader workers fork, and a process
        # that already ran a loader holds its threads
        cmd = [sys.executable, __file__, "--only", str(workers), "--batches", str(args.batches)]
        r = json.loads(
            subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
        )
        print(
            f"{workers:>7}  {r['clips'] / r['wall']:>8.1f}  {r['audio'] / r['wall']:>11.0f}  "
            f"{r['tokens'] / r['wall']:>9.0f}  {r['clips']:>6}"
        )
    waves = bundled_waves()
    ours, theirs = features_per_cpu_second(waves, args.repeat)
    print(f"\ninput_features of {len(waves)} bundled clips (decoded once), clips per CPU second:")
    print(f"{'mixer log_mel':>28}  {ours:>8.1f}")
    print(f"{'WhisperFeatureExtractor (np)':>28}  {theirs:>8.1f}")
    print(f"{'ratio':>28}  {ours / theirs:>8.2f}x")


if __name__ == "__main__":
    main()
