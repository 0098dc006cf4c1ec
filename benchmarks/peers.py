"""mixer against the tokenizer bound and peer loaders, on benchmarks/corpus.py's real text.

    pip install -e '.[bench]'
    python benchmarks/peers.py [--mb 210] [--batches 800] [--workdir /tmp/mixer-peers]

Builds (or reuses) the corpus of benchmarks/corpus.py, then measures each loader in its own
fresh subprocess as rank 0 of 2: N batches of 8 x 2048 tokens; a second subprocess resumes at
N/2 from the first one's state and times its first batch. Rows:

    tokenizer alone   the bound: texts already in memory, encode_batch_fast in chunks of 64,
                      EOS appended, as many tokens as the loaders deliver
    fastokens alone   the same with fastokens (encode_batch_flat, cut into one array a text)
    generator         hand-written (benchmarks/peer_loaders.py); no state
    mixer             num_workers 0 and 2 (`tokenizer_backend: hf`); with a `token_cache`
                      recipe key, cold and warm
    mixer, fastokens  num_workers 0 and 2, `tokenizer_backend: fastokens`, no token cache; a
                      cold start verifies fastokens first (once: the verdict is cached, so
                      the resume column shows a warm start)
    HF datasets       streaming, interleave_datasets(probabilities), tokenize, pack
    torchdata.nodes   per-source tokenize + pack, MultiNodeWeightedSampler

Every child gets the same tokenizer thread count (RAYON_NUM_THREADS, `--threads`).
tokens/s counts non-padding tokens from the start of loader construction (after imports) to
the Nth batch; ratio = tokens/s / the tokenizer's. First-batch times start at construction too.
Peak memory is the child's ru_maxrss plus the largest of its finished children (DataLoader
workers). Token shares are realized shares per source over the N batches. The stream digest
is a CRC-32 chained over every batch's input_ids (int64; cheap, so the loop's own work stays
small against a warm cache's ~0.25 ms a batch); a last line says whether the fastokens rows'
streams equal the `tokenizers` rows' (same worker count). benchmarks/memory.py measures
memory as PSS.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import FIELDS, WEIGHTS, Corpus, build  # noqa: E402
from peer_loaders import PEERS, SOURCES, TOKENIZE_CHUNK, encoder, read_documents  # noqa: E402

# Imported before the clock starts (datasets imports torch lazily when it builds a dataset;
# `import mixer` imports neither torch nor a tokenizer library: its loader does, on first use,
# and with PYTHONDONTWRITEBYTECODE set, as on the project's dev machine, importing it
# compiles its modules: ~0.09 s that a first batch would count).
IMPORTS = {
    "mixer": ["mixer", "torch", "tokenizers", "fastokens", "mixer.runtime.loader"],
    "generator": ["tokenizers"],
    "hf": ["datasets", "torch"],
    "torchdata": ["torchdata.nodes"],
}
SEED, BATCH_SIZE, SEQ_LEN, LANES, RANK, WORLD = 1234, 8, 2048, 8, 0, 2


def has_token_cache() -> bool:
    from mixer.config.recipe import Recipe

    return "token_cache" in Recipe.model_fields


def has_backend_key() -> bool:
    from mixer.config.recipe import Recipe

    return "tokenizer_backend" in Recipe.model_fields


def mixer_recipe(corpus: Corpus, cache: str | None = None, backend: str = "hf") -> dict:
    recipe: dict[str, Any] = {
        "seed": SEED,
        "tokenizer": str(corpus.tokenizer),
        "seq_len": SEQ_LEN,
        "batch_size": BATCH_SIZE,
        "lanes": LANES,
        "sources": [
            {"name": s, "path": corpus.glob(s), "text_field": FIELDS[s], "weight": WEIGHTS[s]}
            for s in SOURCES
        ],
    }
    if cache is not None:
        recipe["token_cache"] = cache
    if has_backend_key():
        recipe["tokenizer_backend"] = backend
    return recipe


# -- children: one measurement each --------------------------------------------------------------
def _peak_rss_mb() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


class _MixerLoader:
    def __init__(
        self, corpus: Corpus, workers: int, cache: str | None, resume: Any, backend: str = "hf"
    ) -> None:
        import mixer

        self.loader = mixer.build_loader(
            mixer_recipe(corpus, cache, backend), rank=RANK, world_size=WORLD, num_workers=workers
        )
        if resume is not None:
            self.loader.load_state_dict(resume)

    def __iter__(self):
        for batch in self.loader:
            yield batch["input_ids"].numpy(), batch["source_ids"].numpy()

    def state(self) -> Any:
        return self.loader.state_dict()

    def close(self) -> None:
        self.loader.close()


def _make(kind: str, corpus: Corpus, opts: dict, resume: Any) -> Any:
    if kind == "mixer":
        return _MixerLoader(
            corpus, opts["workers"], opts.get("cache"), resume, opts.get("backend", "hf")
        )
    cls = PEERS[kind]
    args = {
        "rank": RANK,
        "world_size": WORLD,
        "seed": SEED,
        "batch_size": BATCH_SIZE,
        "seq_len": SEQ_LEN,
    }
    return cls(corpus, **args) if resume is None else cls(corpus, **args, resume=resume)


def run_loader(
    kind: str,
    corpus: Corpus,
    batches: int,
    opts: dict,
    state_out: str | None = None,
    resume_from: str | None = None,
) -> dict:
    """Iterate `batches` batches; save the state after half of them to `state_out`."""
    resume = pickle.loads(Path(resume_from).read_bytes()) if resume_from else None
    for module in IMPORTS[kind]:
        if importlib.util.find_spec(module) is not None:  # (fastokens: where it has wheels)
            importlib.import_module(module)
    start = time.perf_counter()
    loader = _make(kind, corpus, opts, resume)
    first, tokens = None, 0
    shares = np.zeros(len(SOURCES), dtype=np.int64)
    saved, after_save, first_digest = False, None, None
    # Every batch's ids make the stream compared: a CRC-32 chained over them (25 µs a batch
    # here; a blake2b of the 128 KB took 140 µs, a third of a warm-cache batch's time).
    stream = 0
    for step, (ids, src) in enumerate(loader, start=1):
        stream = zlib.crc32(np.ascontiguousarray(ids, dtype=np.int64), stream)
        if first is None:
            first = time.perf_counter() - start
            first_digest = _digest(ids)
        if step == batches // 2 + 1:
            after_save = _digest(ids)
        if ids.shape != (BATCH_SIZE, SEQ_LEN) or src.shape != ids.shape:
            raise RuntimeError(f"{kind}: batch of shape {ids.shape}, {src.shape}")
        counts = np.bincount(src.reshape(-1) + 1, minlength=len(SOURCES) + 1)  # -1: padding
        tokens += src.size - int(counts[0])
        shares += counts[1:]
        if state_out and step == batches // 2:
            state = loader.state()
            if state is not None:
                Path(state_out).write_bytes(pickle.dumps(state))  # torchdata's holds tensors
                saved = True
        if step == batches:
            break
    elapsed = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "first_batch_s": first,
        "saved": saved,
        "shares": shares.tolist(),
        "rss_mb": _peak_rss_mb(),
        "first_digest": first_digest,
        "after_save_digest": after_save,
        "stream_digest": f"{stream:08x}",
    }


def _digest(ids: np.ndarray) -> str:
    return hashlib.blake2b(
        np.ascontiguousarray(ids, dtype=np.int64).tobytes(), digest_size=8
    ).hexdigest()


def fastokens_encoder(corpus: Corpus) -> Any:
    """`encoder` with fastokens: one flat call per chunk, cut into one array a text, EOS
    appended."""
    import fastokens

    tok = fastokens.Tokenizer.from_file(str(corpus.tokenizer))
    eos = tok.token_to_id("<|endoftext|>")

    def encode(texts: list[str]) -> list[np.ndarray]:
        flat, offsets = tok.encode_batch_flat(texts, add_special_tokens=False)
        ids, at = np.frombuffer(flat, np.uint32), np.frombuffer(offsets, np.uint64).tolist()
        return [np.append(ids[at[i] : at[i + 1]], np.uint32(eos)) for i in range(len(texts))]

    return encode


def tokenizer_alone(corpus: Corpus, batches: int, backend: str = "hf") -> dict:
    """The bound: encode in-memory texts, mixed by weight, until the loaders' token count."""
    target = batches * BATCH_SIZE * SEQ_LEN
    rng = random.Random(SEED)
    docs = {s: read_documents(corpus, s, RANK, WORLD) for s in SOURCES}
    texts: list[str] = []
    size = 0
    while size < 6 * target and docs:  # ~4 bytes per token; read more than needed
        source = rng.choices(list(docs), [WEIGHTS[s] for s in docs])[0]
        text = next(docs[source], None)
        if text is None:
            del docs[source]
            continue
        texts.append(text)
        size += len(text)
    encode = fastokens_encoder(corpus) if backend == "fastokens" else encoder(corpus)
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), TOKENIZE_CHUNK):
        tokens += sum(len(ids) for ids in encode(texts[i : i + TOKENIZE_CHUNK]))
        if tokens >= target:
            break
    elapsed = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "first_batch_s": None,
        "saved": False,
        "shares": None,
        "rss_mb": _peak_rss_mb(),
    }


def _child_main(args: argparse.Namespace) -> None:
    corpus = Corpus(Path(args.corpus), 0)
    opts = json.loads(args.opts)
    if args.child == "tokenizer":
        out = tokenizer_alone(corpus, args.batches, opts.get("backend", "hf"))
    else:
        out = run_loader(args.child, corpus, args.batches, opts, args.state_out, args.resume_from)
    print(json.dumps(out))


# -- parent: run every row, print the table ------------------------------------------------------
def _spawn(kind: str, corpus: Corpus, batches: int, opts: dict, threads: int, **paths: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--corpus",
        str(corpus.folder),
        "--batches",
        str(batches),
        "--opts",
        json.dumps(opts),
    ]
    for key, value in paths.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"{kind} failed: {tail[0]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def fill_token_cache(corpus: Corpus, cache: str) -> None:
    """What `mixer cache` does: every split of every source in the cache (a run of 800
    batches reads only part of each split, so it leaves the cache mostly cold)."""
    import mixer
    from mixer.cache.fill import fill_cache
    from mixer.sources.manifest import list_sources

    recipe = mixer.load_recipe(mixer_recipe(corpus, cache))
    fill_cache(recipe, tables=list_sources(recipe), workers=2, progress=False)


def plan_rows(args: argparse.Namespace) -> list[tuple[str, str, dict, str | None]]:
    """(label, kind, options, why skipped) for each loader asked for."""
    missing = lambda module: None if importlib.util.find_spec(module) else f"{module} not installed"
    rows: list[tuple[str, str, dict, str | None]] = [
        ("tokenizer alone", "tokenizer", {}, None),
        ("fastokens alone", "tokenizer", {"backend": "fastokens"}, missing("fastokens")),
        ("hand-written generator", "generator", {}, None),
    ]
    cache = str(args.workdir / "token-cache")
    for workers in args.workers:
        rows.append(
            (
                f"mixer num_workers={workers}" + (", cache cold" if has_token_cache() else ""),
                "mixer",
                {"workers": workers, "cache": cache if has_token_cache() else None, "cold": True},
                None,
            )
        )
        rows.append(
            (
                f"mixer num_workers={workers}, cache warm",
                "mixer",
                {"workers": workers, "cache": cache, "fill": True},
                None if has_token_cache() else "no `token_cache` recipe key in this mixer",
            )
        )
    for workers in args.workers:
        no_key = None if has_backend_key() else "no `tokenizer_backend` recipe key in this mixer"
        rows.append(
            (
                f"mixer, fastokens backend, num_workers={workers}",
                "mixer",
                {"workers": workers, "backend": "fastokens"},
                missing("fastokens") or no_key,
            )
        )
    rows.append(("HF datasets streaming", "hf", {}, missing("datasets")))
    rows.append(("torchdata.nodes", "torchdata", {}, missing("torchdata")))
    wanted = set(args.loaders.split(",")) if args.loaders else None
    return [r for r in rows if wanted is None or r[1] in wanted or r[1] == "tokenizer"]


def _shares(counts: list[int] | None) -> str:
    if not counts or not sum(counts):
        return "–"
    total = sum(counts)
    return " / ".join(f"{s} {100 * c / total:.1f}" for s, c in zip(SOURCES, counts))


def measure(args: argparse.Namespace, corpus: Corpus, log: Any = print) -> list[dict]:
    """Run every row (each in fresh subprocesses) and return the table rows."""
    results = []
    bound = None
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, opts, skip in plan_rows(args):
            if skip:
                results.append({"loader": label, "note": f"skipped: {skip}"})
                continue
            if opts.pop("cold", False) and opts.get("cache"):
                shutil.rmtree(opts["cache"], ignore_errors=True)
            if opts.pop("fill", False):
                log("filling the token cache (`mixer cache`) ...")
                fill_token_cache(corpus, opts["cache"])
            log(f"measuring {label} ...")
            state = os.path.join(tmp, f"{len(results)}.state")
            res = _spawn(kind, corpus, args.batches, opts, args.threads, state_out=state)
            if "error" in res:
                results.append({"loader": label, "note": res["error"]})
                continue
            resumed, exact = None, None
            if res["saved"]:
                again = _spawn(kind, corpus, 1, opts, args.threads, resume_from=state)
                resumed = again.get("first_batch_s")
                exact = again.get("first_digest") == res["after_save_digest"]
            speed = res["tokens"] / res["seconds"]
            if label == "tokenizer alone":
                bound = speed
            results.append(
                {
                    "loader": label,
                    "tokens_per_s": speed,
                    "ratio": speed / bound if bound else None,
                    "first": res["first_batch_s"],
                    "resume": resumed,
                    "exact": exact,
                    "rss_mb": res["rss_mb"],
                    "shares": _shares(res["shares"]),
                    "tokens": res["tokens"],
                    "stream": res.get("stream_digest"),
                }
            )
    return results


def markdown(results: list[dict]) -> str:
    """The results as a markdown table."""
    sec = lambda v: "–" if v is None else f"{v:.2f} s"
    lines = [
        "| loader | tokens/s | ratio | first batch | resume, first batch | peak memory | "
        "token shares (%) | stream digest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "note" in r:
            lines.append(f"| {r['loader']} | – | – | – | – | – | {r['note']} | – |")
            continue
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.3f}"
        resume = sec(r["resume"])
        if r["exact"] is not None:
            resume += " (same batch)" if r["exact"] else " (different batch)"
        lines.append(
            f"| {r['loader']} | {r['tokens_per_s']:,.0f} | {ratio} | {sec(r['first'])} "
            f"| {resume} | {r['rss_mb']:,.0f} MB | {r['shares']} | "
            f"{r.get('stream') or '–'} |"
        )
    return "\n".join(lines)


def same_streams(results: list[dict]) -> str:
    """Whether `mixer, fastokens backend` gave the stream of the `tokenizers` backend (the
    cold-cache row, which encodes with it) at each worker count."""
    by_label = {r["loader"]: r.get("stream") for r in results}
    out = []
    for label, digest in by_label.items():
        if label.startswith("mixer, fastokens backend, num_workers="):
            workers = label.rsplit("=", 1)[1]
            hf = by_label.get(f"mixer num_workers={workers}, cache cold")
            if digest and hf:
                out.append(f"num_workers {workers}: {'same' if digest == hf else 'DIFFERENT'}")
    return "stream digest, fastokens vs tokenizers backend: " + ("; ".join(out) or "–")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=210, help="corpus size, MB of text")
    parser.add_argument("--vocab", type=int, default=32768, help="BPE vocabulary size")
    parser.add_argument("--batches", type=int, default=800, help="batches per loader")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mixer-peers"))
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="tokenizer threads of every loader (RAYON_NUM_THREADS)",
    )
    parser.add_argument(
        "--loaders",
        default=None,
        help="comma-separated subset of: "
        "generator,mixer,hf,torchdata (the tokenizer rows always run)",
    )
    parser.add_argument(
        "--workers",
        type=lambda v: [int(w) for w in v.split(",")],
        default=[0, 2],
        help="mixer num_workers values (default 0,2)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--opts", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--state-out", help=argparse.SUPPRESS)
    parser.add_argument("--resume-from", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child_main(args)
        return
    corpus = build(args.workdir, args.mb, args.vocab)
    stats = corpus.stats()["sources"]
    text = sum(s["text_bytes"] for s in stats.values())
    results = measure(args, corpus)
    docs = ", ".join(f"{name} {s['documents']:,} docs" for name, s in stats.items())
    print(
        f"\ncorpus: {text / 1e6:.0f} MB of text ({docs}); "
        f"rank {RANK} of {WORLD}, {args.batches} batches of {BATCH_SIZE} x {SEQ_LEN}, "
        f"lanes {LANES}; {args.threads} tokenizer thread(s), "
        f"{len(os.sched_getaffinity(0))} CPU(s)"
    )
    print(markdown(results))
    print(same_streams(results))


if __name__ == "__main__":
    main()
