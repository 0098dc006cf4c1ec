"""Encoding text on the tokenizer: how documents are cut into calls (the one chunk rule) and
the per-process threads that run calls ahead of the packers."""

from __future__ import annotations

import os

from mixer.core.resources import ByteBudget, PerProcess
from mixer.core.rotating import RotatingPool

# One tokenizer call takes at most TOKENIZE_DOCS documents and, for text, stops once its text
# reaches a budget that starts at TOKENIZE_BYTES (a window's first rows wait for one small
# call) and doubles with each following call up to TOKENIZE_BYTES_AHEAD: small calls cost the
# tokenizer more per token (measured by benchmarks/paired.py).
TOKENIZE_DOCS = 64
TOKENIZE_BYTES = 32 << 10
TOKENIZE_BYTES_AHEAD = 128 << 10


def chunk_full(docs: int, text_bytes: int, budget: int) -> bool:
    """Whether a tokenizer call holding `docs` documents of `text_bytes` bytes of text is
    complete under `budget` (the chunk rule)."""
    return docs >= TOKENIZE_DOCS or text_bytes >= budget


def next_budget(budget: int) -> int:
    """The text budget of the call after one of `budget` (it doubles, up to the cap)."""
    return min(2 * budget, TOKENIZE_BYTES_AHEAD)


# Text chunks a stream keeps queued ahead of the one it packs, so that `ENCODING_THREADS`
# calls find work; a chunk nobody has started when its packer needs it is encoded by the
# packer's thread, so a deep queue never delays it, and every chunk queued is tokens encoded
# before they are needed (measured by benchmarks/paired.py).
TEXT_CHUNKS_AHEAD = 1
# Text that all the streams of a process together may keep queued ahead (counted in characters,
# as the chunk rule counts its "bytes"): one chunk per
# (lane, source) stream would grow with lanes x sources (100 sources x 8 lanes, 800 chunks of
# up to 128 KB of text and then their tokens). Past it a stream's next chunk is encoded when
# it is needed, cut where it would have been cut ahead (unless `ENCODED_HELD` is short, which
# also cuts it smaller): the same tokens.
TEXT_AHEAD_BYTES = 4 << 20
TEXT_AHEAD = ByteBudget(TEXT_AHEAD_BYTES)
# Text whose tokens the streams of a process hold encoded, not yet packed (the chunk each
# stream packs from; counted in characters): a chunk of 32-128 KB per stream would also grow
# with lanes x sources, and a stream of one source among 100 may pack one document of it in a
# thousand batches. Past it a stream's next chunk (queued ahead or needed now) is cut to what
# room is left (down to `CHUNK_MIN_BYTES`, at least one document): smaller calls, the same
# tokens (a document's ids do not depend on its call; which chunk a tokenizer error would
# surface in does, with the streams of the process).
# 8 MB: 48-64 streams (8 lanes x 6-8 sources) still cut their chunks as without it (at 4 MB
# they made twice the calls); 400 streams (100 sources) hold 5-6 MB without it.
ENCODED_HELD_BYTES = 8 << 20
ENCODED_HELD = ByteBudget(ENCODED_HELD_BYTES)
# ... but not below this much text (or one document): each call costs Python's bookkeeping and,
# with fastokens, a hand-over to the encoding thread; at 100 sources calls of one document
# made mixer 10 % slower than calls of 16 KB, which held 0.5 MB more.
CHUNK_MIN_BYTES = 16 << 10
# Concurrent text-encoding calls per process: a document is the unit the tokenizer's threads
# share out, so fewer calls at once leave a core idle part of the time.
ENCODING_THREADS = 4
# In a DataLoader worker (several share the cores): calls in flight would contend for the
# worker's share of the tokenizer's pool, and each holds its own working memory.
WORKER_ENCODING_THREADS = 1
# Encoding threads of a process that encodes with fastokens (`use_fastokens_encoding_threads`).
FASTOKENS_ENCODING_THREADS = 1
_encoding_threads = ENCODING_THREADS


# The TOKENIZERS_PARALLELISM values with which `tokenizers` runs every call on its calling
# thread (its own list; compared lower-cased).
_PARALLELISM_OFF = ("", "off", "false", "f", "no", "n", "0")
# fastokens' own pool size, read when it first encodes in a process (see backends.py).
FASTOKENS_THREADS = "FASTOKENS_BPE_THREADS"


def tokenizer_thread_budget() -> int:
    """Threads the Rust tokenizer may use in this process, as its thread pool (rayon) reads
    them: `RAYON_NUM_THREADS` when it is a positive number, else the CPUs this process may
    run on (rayon's default, also for 0 or a value it cannot parse)."""
    try:
        threads = int(os.environ.get("RAYON_NUM_THREADS", ""))
    except ValueError:
        threads = 0
    return threads if threads > 0 else max(1, len(os.sched_getaffinity(0)))


def use_worker_encoding_threads(num_workers: int, budget: int) -> None:
    """Called in each of `num_workers` DataLoader workers: encode with
    `WORKER_ENCODING_THREADS` there, and give the tokenizer's own thread pool this worker's
    share of the parent's `budget` (at least one thread).

    Each worker would otherwise start a pool as large as the whole budget, and the pools'
    threads contend for the cores (measured by benchmarks/paired.py --workers 2). The share takes
    effect because the pool starts at the worker's first encoding call; where the parent had
    already encoded before forking, `tokenizers` runs each call on its calling thread instead
    (its fork guard), also no more threads than the encoding threads. With
    `TOKENIZERS_PARALLELISM` off there is no pool to share and nothing is set.
    """
    global _encoding_threads
    _encoding_threads = WORKER_ENCODING_THREADS
    rayon = bool(os.environ.get("RAYON_NUM_THREADS"))  # (the parent's, as forked)
    setting = os.environ.get("TOKENIZERS_PARALLELISM")
    if setting is None or setting.lower() not in _PARALLELISM_OFF:
        os.environ["RAYON_NUM_THREADS"] = str(max(1, budget // max(1, num_workers)))
    # fastokens' pool: the worker's share of the parent's FASTOKENS_BPE_THREADS, else of the
    # budget where RAYON_NUM_THREADS sets one, else 1 (as `set_fastokens_threads`); read at
    # the worker's first fastokens call (where the parent had already encoded with fastokens,
    # the worker's calls run on its calling thread, as with `tokenizers`).
    fast = _positive(os.environ.get(FASTOKENS_THREADS)) or (budget if rayon else 1)
    os.environ[FASTOKENS_THREADS] = str(max(1, fast // max(1, num_workers)))


def _positive(value: str | None) -> int:
    try:
        return max(0, int(value or ""))
    except ValueError:
        return 0


# Text (characters) a thread that calls fastokens encodes before it is replaced:
# fastokens keeps a cache of the words each calling thread has seen, which grows with the
# text (+63 MB over this benchmark corpus's 210 MB, ~100 MB a thread at most), and nothing
# but the thread's exit clears it. Every 16 MB of text bounds it near +25 MB a thread, at
# ~10 % of fastokens' speed (it refills the cache) (measured by benchmarks/memory.py).
FASTOKENS_THREAD_TEXT = 16 << 20
_rotate_after: int | None = None  # FASTOKENS_THREAD_TEXT once this process uses fastokens

_pools: PerProcess[RotatingPool] = PerProcess()  # by thread count


def _pool(threads: int) -> RotatingPool:
    pool = _pools.get(threads, lambda: RotatingPool(threads, "mixer-tokenize"))
    pool.limit = _rotate_after
    return pool


def encoding_thread() -> RotatingPool:
    """One background thread per process that builds documents (image recipes) and fills
    the token cache while Python reads and packs; one thread keeps those calls in order."""
    return _pool(1)


def needed_thread() -> RotatingPool | None:
    """Where a chunk needed now is encoded when no encoding thread has started it: where
    the encoding thread is replaced (fastokens), that thread, before the chunks queued ahead
    (each thread that calls fastokens keeps a cache, see `FASTOKENS_THREAD_TEXT`: the packing
    thread would keep one that is never cleared, a thread of its own a second one); None (the
    packing thread itself) otherwise."""
    return None if _rotate_after is None else encoding_pool()


def use_fastokens_encoding_threads() -> None:
    """This process encodes with fastokens: from now on one encoding thread (or fewer, as
    set), replaced every `FASTOKENS_THREAD_TEXT` of text, and chunks needed at once go to it
    too (`needed_thread`). One thread encodes with it several times faster than the main
    thread reads and packs, and each thread that calls fastokens keeps working memory of its
    own that grows with the text it has seen: 4 threads held ~30 MB more than 1 over 3,000
    batches of the benchmark corpus, and were no faster (measured by benchmarks/memory.py
    and benchmarks/paired.py --backend fastokens)."""
    global _encoding_threads, _rotate_after
    _encoding_threads = min(_encoding_threads, FASTOKENS_ENCODING_THREADS)
    # Also where fastokens has a pool of its own (`FASTOKENS_BPE_THREADS` above 1), whose
    # threads keep their caches whatever mixer does: the calling thread keeps one too, and a
    # worker forked after its parent's pool started runs every call on its calling thread.
    _rotate_after = FASTOKENS_THREAD_TEXT


def encoding_pool() -> RotatingPool:
    """`ENCODING_THREADS` background threads per process (`WORKER_ENCODING_THREADS` in a
    DataLoader worker, `FASTOKENS_ENCODING_THREADS` with fastokens) that encode text chunks
    ahead of the packers.

    The Rust tokenizer releases the GIL and shares one call's documents out over its own
    thread pool; several calls at once keep its threads busy while Python reads and packs.
    The tokens are the same whichever thread computes them.
    """
    return _pool(_encoding_threads)
