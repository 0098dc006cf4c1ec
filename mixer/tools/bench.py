"""The bench harness: iterate a recipe's batches and measure throughput, latency, memory and
shares (`mixer bench` and `benchmarks/`)."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

from mixer.tools.bench_profile import cpu_s_per_batch, workers_needed


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its finished children, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def run_bench(
    recipe: Any,
    *,
    batches: int,
    num_workers: int,
    progress: bool,
    metrics_out: str | None = None,
    metrics_every: int = 1,
    step_time: float | None = None,
) -> dict[str, Any]:
    """Iterate `batches` batches and measure throughput, latency, memory, shares and the
    loader's profile (`stages`, `wait`, `bottleneck`, `cpu_s_per_batch`).

    With `metrics_out`, append one JSON line of `loader.metrics()` every `metrics_every`
    batches (and after the last): the log `mixer report` draws. With `step_time`, consume
    like a trainer whose step takes that many seconds (sleep after each batch) and add
    `step_time_s` and `workers_needed` (see `tools/bench_profile.py`).
    """
    from tqdm import tqdm

    from mixer.runtime.loader import build_loader
    from mixer.tools.metrics_log import MetricsWriter

    names = [s.name for s in recipe.sources]
    counts = dict.fromkeys(names, 0)
    start = time.perf_counter()
    loader = build_loader(recipe, num_workers=num_workers)
    first = None
    got = images = videos = frames = 0
    temporal = recipe.images.temporal_patch_size if recipe.images is not None else 1
    log = MetricsWriter(metrics_out, recipe, every=metrics_every) if metrics_out else None
    with loader, tqdm(total=batches, disable=not progress, unit="batch", file=sys.stderr) as bar:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            ids = batch["source_ids"].flatten()
            if "pixel_values" in batch:  # one grid row per image (qwen2_vl), else one crop
                images += len(batch.get("image_grid_thw", batch["pixel_values"]))
            if "video_grid_thw" in batch:  # sampled frames: t temporal patches per video
                videos += len(batch["video_grid_thw"])
                frames += int(batch["video_grid_thw"][:, 0].sum()) * temporal
            for i, name in enumerate(names):
                counts[name] += int((ids == i).sum())
            got += 1
            bar.update(1)
            if log is not None:
                log.step(got, loader.metrics)
            if got >= batches:
                break
            if step_time:
                time.sleep(step_time)
        metrics = loader.metrics()
        if log is not None:
            log.close(got, metrics)
    elapsed = time.perf_counter() - start
    total = sum(counts.values())
    backend = loader.backend.describe() if loader.backend is not None else None
    cpu_s = cpu_s_per_batch(metrics)
    result = {
        "batches": got,
        "num_workers": num_workers,
        "tokens": total,
        "tokenizer_backend": backend,
        "seconds": elapsed,
        "tokens_per_s": total / elapsed if elapsed else 0.0,
        "time_to_first_batch_s": first,
        "peak_rss_mb": peak_rss_mb(),
        "share": {n: (counts[n] / total if total else 0.0) for n in names},
        "weight": _mean_targets(recipe, got),
        "skipped": metrics["skipped"],
        "stages": metrics["stages"],
        "wait": metrics["wait"],
        "bottleneck": metrics["bottleneck"],
        "cpu_s_per_batch": cpu_s,
    }
    if step_time is not None:
        result.update(
            step_time_s=step_time,
            workers_needed=workers_needed(cpu_s, step_time, recipe.lanes),
        )
    if recipe.images is not None:
        result.update(
            images=images,
            images_per_s=images / elapsed if elapsed else 0.0,
            oversize=metrics.get("oversize", {}),
        )
    if recipe.images is not None and recipe.images.video is not None:
        result.update(
            videos=videos, frames=frames, frames_per_s=frames / elapsed if elapsed else 0.0
        )
    return result


def _mean_targets(recipe: Any, batches: int) -> dict[str, float]:
    """Each source's target weight averaged over the run's batches (its schedule, if any)."""
    if recipe.schedule is None or batches <= 0:
        return dict(zip(recipe.names, recipe.weights))
    step = recipe.batch_size * recipe.seq_len
    rows = [recipe.weights_at(g * step) for g in range(batches)]
    return {n: sum(r[i] for r in rows) / batches for i, n in enumerate(recipe.names)}
