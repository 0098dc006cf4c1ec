"""A 1,024-rank × 8-worker job simulated in one process: what it pays once and per rank.

    python benchmarks/scale.py [--worlds 64,256,1024] [--shards 48] [--sample-ranks 8]

Each rank is an explicit `Loader(recipe, tables=..., rank=r, world_size=W)` over one shared
listing, with lanes = 8 W (eight workers' worth). On loopback S3 (moto) it counts storage
requests: one listing (what each rank pays when every rank lists, what rank 0 alone pays under
torch.distributed's `list_once` or when tables are passed), and each rank's requests up to its
first batch (sampled ranks). On a local copy of the same shards it runs every rank of every
lane once to get real lane states, then measures one rank's state, the merged state,
`merge_states` and `load_state_dict` of the merged state.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import table  # noqa: E402
from helpers import doc_text, make_tokenizer  # noqa: E402
from s3 import OPTIONS, start_moto  # noqa: E402

import mixer  # noqa: E402
from mixer.runtime.loader import Loader  # noqa: E402
from mixer.runtime.state import pack, unpack  # noqa: E402
from mixer.sources import IO_STATS  # noqa: E402
from mixer.sources.manifest import list_sources  # noqa: E402
from mixer.sources.storage import _fs_cache  # noqa: E402
from mixer.tokenize import resolve_tokenizer  # noqa: E402

WORKERS = 8
DOCS_PER_SHARD = 600


def write_shards(folder: Path, shards: int) -> dict[str, bytes]:
    """`shards` objects over three sources: jsonl, parquet (2 row groups), jsonl.zst."""
    per = shards // 3
    files: dict[str, bytes] = {}
    doc = 0
    for i in range(per):
        lines = []
        for _ in range(DOCS_PER_SHARD):
            lines.append(json.dumps({"text": doc_text(doc % 29000, 1 + doc % 7)}) + "\n")
            doc += 1
        text = "".join(lines).encode()
        files[f"prose/{i:03d}.jsonl"] = text
        files[f"web/{i:03d}.jsonl.zst"] = zstandard.ZstdCompressor().compress(text)
        sink = pa.BufferOutputStream()
        pq.write_table(
            pa.table({"content": [json.loads(x)["text"] for x in lines]}),
            sink,
            row_group_size=DOCS_PER_SHARD // 2,
        )
        files[f"code/{i:03d}.parquet"] = sink.getvalue().to_pybytes()
    for key, data in files.items():
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        (folder / key).write_bytes(data)
    return files


def recipe_for(base: str, tokenizer: Path, lanes: int, options: dict | None = None) -> dict:
    extra = {"storage_options": options} if options else {}
    return {
        "seed": 1,
        "tokenizer": str(tokenizer),
        "seq_len": 32,
        "batch_size": 2,
        "lanes": lanes,
        "shuffle_window": 4,
        "split_bytes": 1 << 20,
        "sources": [
            {"name": "prose", "path": f"{base}/prose/*.jsonl", "weight": 0.5, **extra},
            {
                "name": "code",
                "path": f"{base}/code/*.parquet",
                "weight": 0.3,
                "text_field": "content",
                **extra,
            },
            {"name": "web", "path": f"{base}/web/*.jsonl.zst", "weight": 0.2, **extra},
        ],
    }


def fresh_filesystems() -> None:
    """Forget cached filesystems (and their listing caches), as a new process would."""
    _fs_cache.clear()


def requests(recipe: dict, worlds: list[int], sample: int) -> list[dict]:
    """Storage requests: one listing, and per rank up to its first batch (sampled ranks)."""
    rows = []
    for world in worlds:
        r = mixer.load_recipe({**recipe, "lanes": WORKERS * world})
        fresh_filesystems()
        IO_STATS.reset()
        tables = list_sources(r)
        listing = IO_STATS.requests
        tok = resolve_tokenizer(r.resolve(r.tokenizer), r.eos_token)
        firsts = []
        ranks = sorted({round(i * (world - 1) / max(sample - 1, 1)) for i in range(sample)})
        for rank in ranks:
            fresh_filesystems()
            loader = Loader(
                r, tables=tables, tokenizer=tok, rank=rank, world_size=world, num_workers=0
            )
            next(iter(loader))
            firsts.append(loader.metrics()["io"]["requests"])
            loader.close()
        per_rank = statistics.mean(firsts)
        rows.append(
            {
                "W": world,
                "lanes": r.lanes,
                "listing": listing,
                "every rank lists": listing * world,
                "list once": listing,
                "first batch / rank": f"{per_rank:.1f} (max {max(firsts)})",
                "first batches, all ranks": round(per_rank * world),
                "total, list once": round(listing + per_rank * world),
            }
        )
    return rows


def states(recipe: dict, worlds: list[int]) -> list[dict]:
    """Every rank takes WORKERS batches (each of its lanes one): real states of all lanes."""
    rows = []
    for world in worlds:
        r = mixer.load_recipe({**recipe, "lanes": WORKERS * world})
        tok = resolve_tokenizer(r.resolve(r.tokenizer), r.eos_token)
        start = time.perf_counter()
        tables = list_sources(r)
        listed = time.perf_counter() - start
        start = time.perf_counter()
        loaders = [
            Loader(r, tables=tables, tokenizer=tok, rank=rank, world_size=world, num_workers=0)
            for rank in range(world)
        ]
        built = time.perf_counter() - start
        start = time.perf_counter()
        packed = []
        for loader in loaders:
            it = iter(loader)
            for _ in range(WORKERS):
                next(it)
            packed.append(loader.state_dict())
            loader.close()
        ran = time.perf_counter() - start
        start = time.perf_counter()
        merged = mixer.merge_states(packed)
        merge_s = time.perf_counter() - start
        target = Loader(
            r, tables=tables, tokenizer=tok, rank=0, world_size=max(world // 2, 1), num_workers=0
        )
        start = time.perf_counter()
        target.load_state_dict(merged)
        load_s = time.perf_counter() - start
        rank_bytes = [len(p["json"]) for p in packed]
        long_run = pack(long_run_payload(unpack(merged)))
        rows.append(
            {
                "W": world,
                "lanes": r.lanes,
                "listing s": listed,
                "build W loaders s": built,
                "batches s": ran,
                "rank state B": max(rank_bytes),
                "merged state B": len(merged["json"]),
                "merge_states s": merge_s,
                "load merged s": load_s,
                "long-run merged B": len(long_run["json"]),
            }
        )
    return rows


def long_run_payload(payload: dict) -> dict:
    """The payload with counters of a long run (synthetic, random magnitudes): ~10^8 tokens
    per lane and source, byte offsets up to 10^9, record indices up to 10^5."""
    rng = random.Random(0)
    for lane in payload["lanes"].values():
        lane["batches"] = 15_000 + rng.randrange(2)
        for entry in lane["sources"].values():
            entry["tokens"] = rng.randrange(10**7, 10**8)
            entry["mix"] = entry["tokens"] - rng.randrange(2048)
            entry["deficit"] = rng.randrange(-2048000, 2048000)
            entry["documents"] = rng.randrange(10**5, 10**6)
            entry["epochs"] = round(rng.uniform(0, 3), 4)
            packer = entry["packer"] or {
                "offset": 0,
                "exhausted": 0,
                "stream": {
                    "epoch": 0,
                    "window": 0,
                    "slot": 0,
                    "index": 0,
                    "offset": 0,
                    "pos": 0,
                    "skipped": 0,
                    "done": 0,
                },
            }
            entry["packer"] = packer
            packer["offset"] = rng.randrange(2048)
            packer["stream"].update(
                epoch=rng.randrange(3),
                window=rng.randrange(10**4),
                slot=rng.randrange(100),
                index=rng.randrange(10**5),
                offset=rng.randrange(10**9),
                pos=rng.randrange(1024),
            )
    return payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="64,256,1024")
    parser.add_argument("--shards", type=int, default=48)
    parser.add_argument("--sample-ranks", type=int, default=8)
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--skip-states", action="store_true")
    args = parser.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tok = make_tokenizer(folder / "tok.json")
        files = write_shards(folder / "data", args.shards)
        local = recipe_for(str(folder / "data"), tok, WORKERS)
        print(f"{len(files)} shards, 3 sources, lanes = {WORKERS} × W")
        if not args.skip_s3:
            proc, url = start_moto()
            try:
                client = boto3.client(
                    "s3",
                    endpoint_url=url,
                    region_name="us-east-1",
                    aws_access_key_id="bench",
                    aws_secret_access_key="bench",
                )
                client.create_bucket(Bucket="scale")
                for key, data in files.items():
                    client.put_object(Bucket="scale", Key=f"data/{key}", Body=data)
                remote = recipe_for(
                    "s3://scale/data", tok, WORKERS, {**OPTIONS, "endpoint_url": url}
                )
                print("\nstorage requests at start-up (S3):")
                print(
                    table(
                        requests(remote, worlds, args.sample_ranks),
                        [
                            "W",
                            "lanes",
                            "listing",
                            "every rank lists",
                            "list once",
                            "first batch / rank",
                            "first batches, all ranks",
                            "total, list once",
                        ],
                    )
                )
            finally:
                proc.terminate()
        if args.skip_states:
            return
        print("\nstate, every lane visited once (local copy):")
        print(
            table(
                states(local, worlds),
                [
                    "W",
                    "lanes",
                    "listing s",
                    "build W loaders s",
                    "batches s",
                    "rank state B",
                    "merged state B",
                    "merge_states s",
                    "load merged s",
                    "long-run merged B",
                ],
            )
        )


if __name__ == "__main__":
    main()
