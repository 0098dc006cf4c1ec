"""mixer and the tokenizer alone, alternating in one process: a ratio that machine drift
does not swamp.

    python benchmarks/paired.py [--workers 0|2] [--backend hf|fastokens] [--rounds 12]
                                [--phase 60] [--workdir DIR]

`peers.py` runs each loader in its own process, one after another; on a shared 2-core
machine the tokenizer's own rate moves by a third between minutes, so one run's ratio says
little. Here one process builds mixer's loader (the corpus and recipe of `peers.py`, rank 0
of 2) and, round after round, takes `--phase` batches from it and then has the tokenizer
alone encode as many tokens (64-document calls, EOS appended) of the very texts mixer
encodes (recorded from a second loader of the same stream before the clock starts).
Before a phase ends, mixer's background work is let finish (its encoding threads; with
workers, until their CPU stops growing), so work done ahead counts in mixer's time. Each
side's time and CPU (per thread: the loader's main thread, its encoding threads, the
tokenizer's pool, DataLoader workers) are summed over the rounds; the ratio is mixer's
tokens/s over the bound's. mixer starts after 20 batches (its start-up is `peers.py`'s
first-batch column). `--backend fastokens` has mixer encode with fastokens (same stream);
the bound stays the `tokenizers` tokenizer alone.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import build  # noqa: E402
from peer_loaders import TOKENIZE_CHUNK, encoder  # noqa: E402
from peers import mixer_recipe  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
WARMUP_BATCHES = 20


def thread_cpu() -> collections.Counter:
    """CPU seconds of this process's threads, by role."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        name = names.get(int(tid))
        role = (
            "main"
            if int(tid) == os.getpid()
            else "tokenizer pool"
            if name is None
            else re.sub(r"_\d+$", "", name)
        )
        out[role] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def children_cpu() -> float:
    """CPU seconds of this process's children (DataLoader workers)."""
    total = 0
    for pid in Path(f"/proc/self/task/{os.getpid()}/children").read_text().split():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def let_mixer_finish(workers: int, limit_s: float = 10.0) -> float:
    """Wait for mixer's background work and return when it ended (`time.perf_counter()`):
    the encoding threads (all of them free), or with workers the last moment their CPU grew
    (polled every 30 ms, for at most `limit_s`)."""
    if workers:
        last, busy_until = children_cpu(), time.perf_counter()
        deadline = busy_until + limit_s
        while time.perf_counter() < deadline:
            time.sleep(0.03)
            now = children_cpu()
            if now - last < 0.01:
                return busy_until
            last, busy_until = now, time.perf_counter()
        return busy_until
    from mixer.tokenize.encoding import encoding_pool

    pool = encoding_pool()
    threads = pool.threads
    barrier = threading.Barrier(threads + 1)
    for _ in range(threads):
        pool.submit(barrier.wait)
    barrier.wait()
    return time.perf_counter()


def mixer_texts(recipe: dict, batches: int) -> list[str]:
    """The texts mixer's tokenizer is given while a loader like the measured one (rank 0 of 2,
    num_workers 0: the same stream) yields `batches` batches, in the order they were given.
    The tokenizer's CPU per token moves by several percent with the documents (the other
    rank's files, or a mix estimated from characters, shifted the ratio by 2-7 %), so the
    bound encodes exactly mixer's documents."""
    import mixer
    from mixer.tokenize.tokenizer import Encoder

    given: list[list[str]] = []
    original = Encoder.__call__

    def recording(self: Encoder, texts: list[str]) -> Any:
        given.append(list(texts))
        return original(self, texts)

    Encoder.__call__ = recording  # type: ignore[method-assign]
    try:
        loader = mixer.build_loader(recipe, rank=0, world_size=2, num_workers=0)
        for _ in zip(range(batches), loader):
            pass
        loader.close()
    finally:
        Encoder.__call__ = original  # type: ignore[method-assign]
    texts = [text for call in given for text in call]
    if not texts:
        raise SystemExit("mixer encoded no text")
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--backend", default="hf", help="mixer's tokenizer_backend")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--phase", type=int, default=60, help="mixer batches per round")
    parser.add_argument("--mb", type=float, default=210, help="corpus size, MB of text")
    parser.add_argument("--vocab", type=int, default=32768, help="BPE vocabulary size")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mixer-peers"))
    args = parser.parse_args()

    corpus = build(args.workdir, args.mb, args.vocab)
    import mixer

    recipe = mixer_recipe(corpus, None, args.backend)
    loader = mixer.build_loader(recipe, rank=0, world_size=2, num_workers=args.workers)
    batches = iter(loader)
    # Workers fork at the first batch: the parent must not have encoded before then, or the
    # tokenizer library turns the workers' thread pools off (its fork guard).
    for _ in range(WARMUP_BATCHES):
        next(batches)
    texts = mixer_texts(recipe, WARMUP_BATCHES + args.rounds * args.phase)
    encode = encoder(corpus)
    let_mixer_finish(0)  # the recording loader's encoding threads
    let_mixer_finish(args.workers)

    sides = {side: [0, 0.0, collections.Counter()] for side in ("mixer", "tokenizer alone")}
    rows, at = [], 0
    for round_ in range(args.rounds):
        before, workers_before, start = thread_cpu(), children_cpu(), time.perf_counter()
        got = 0
        for _ in range(args.phase):
            batch = next(batches)
            got += int((batch["source_ids"] >= 0).sum())  # not padding
        mixer_s = let_mixer_finish(args.workers) - start
        cpu = thread_cpu() - before
        cpu["workers"] += children_cpu() - workers_before
        sides["mixer"][0] += got
        sides["mixer"][1] += mixer_s
        sides["mixer"][2] += cpu

        before, start, done = thread_cpu(), time.perf_counter(), 0
        while done < got:  # a small corpus's texts come round again
            done += sum(map(len, encode(texts[at : at + TOKENIZE_CHUNK])))
            at = at + TOKENIZE_CHUNK if at + TOKENIZE_CHUNK < len(texts) else 0
        bound_s = time.perf_counter() - start
        sides["tokenizer alone"][0] += done
        sides["tokenizer alone"][1] += bound_s
        sides["tokenizer alone"][2] += thread_cpu() - before
        ratio = (got / mixer_s) / (done / bound_s)
        rows.append(
            f"| {round_ + 1} | {got / mixer_s:,.0f} | {done / bound_s:,.0f} | {ratio:.3f} |"
        )
    loader.close()

    print(
        f"mixer num_workers={args.workers}, tokenizer_backend {args.backend}, {args.rounds} "
        f"rounds of {args.phase} batches\n"
    )
    print("| round | mixer tokens/s | tokenizer alone | ratio |\n|---|---|---|---|")
    print("\n".join(rows))
    rate = {side: tokens / seconds for side, (tokens, seconds, _) in sides.items()}
    print(
        f"\n**all rounds: mixer {rate['mixer']:,.0f}, tokenizer alone "
        f"{rate['tokenizer alone']:,.0f} tokens/s, ratio "
        f"{rate['mixer'] / rate['tokenizer alone']:.3f}**\n"
    )
    print("| side | cores busy | CPU µs a token, by thread |\n|---|---|---|")
    for side, (tokens, seconds, cpu) in sides.items():
        parts = ", ".join(
            f"{role} {value / tokens * 1e6:.3f}" for role, value in cpu.most_common() if value > 0
        )
        print(
            f"| {side} | {sum(cpu.values()) / seconds:.2f} | "
            f"{sum(cpu.values()) / tokens * 1e6:.3f} ({parts}) |"
        )


if __name__ == "__main__":
    main()
