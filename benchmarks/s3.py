"""Object storage benchmarks against moto's S3 server on loopback (a separate process).

    python benchmarks/s3.py [--copies 10] [--objects 10000] [--big-mb 100]

1. throughput: the same shards from local disk and from s3:// (num_workers 0 and 2);
2. start-up (build_loader) over --objects small objects, with and without a manifest;
3. resident memory while streaming one large object (must stay flat).
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import TOKENIZER, recipe_for, table, write_corpus  # noqa: E402
from s3server import free_port  # noqa: E402

import mixer  # noqa: E402
from mixer.sources.manifest import write_manifest  # noqa: E402

OPTIONS = {"key": "bench", "secret": "bench", "client_kwargs": {"region_name": "us-east-1"}}


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    for _ in range(100):
        try:
            client.list_buckets()
            return proc, url
        except Exception:
            time.sleep(0.1)
    raise RuntimeError("moto server did not start")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(recipe: dict, workers: int) -> dict:
    start = time.perf_counter()
    tokens, first = 0, None
    with mixer.build_loader(recipe, num_workers=workers) as loader:
        for batch in loader:
            first = first if first is not None else time.perf_counter() - start
            tokens += int((batch["source_ids"] >= 0).sum())
        io = loader.metrics()["io"]
    elapsed = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "first_batch_s": first,
        "requests": io["requests"],
        "retries": io["retries"],
    }


def throughput(client, url: str, folder: Path, copies: int) -> list[dict]:
    write_corpus(folder, copies)
    client.create_bucket(Bucket="through")
    for path in sorted(folder.glob("*/*.jsonl")):
        client.upload_file(str(path), "through", str(path.relative_to(folder)))
    local = recipe_for(folder)
    remote = recipe_for(Path("through"))
    for r in (local, remote):
        r["sources"] = [{**s, "epochs": 1} for s in r["sources"]]
    remote["sources"] = [
        {**s, "path": "s3://" + s["path"], "storage_options": {**OPTIONS, "endpoint_url": url}}
        for s in remote["sources"]
    ]
    rows = []
    for workers in (0, 2):
        base = run(local, workers)
        s3 = run(remote, workers)
        rows.append({"run": f"local, workers={workers}", **base, "vs_local": 1.0})
        rows.append(
            {
                "run": f"s3, workers={workers}",
                **s3,
                "vs_local": s3["tokens_per_s"] / base["tokens_per_s"],
            }
        )
    return rows


def startup(client, url: str, folder: Path, objects: int) -> list[dict]:
    client.create_bucket(Bucket="many")

    def put(i: int) -> None:
        client.put_object(
            Bucket="many",
            Key=f"shards/{i:06d}.jsonl",
            Body=json.dumps({"text": f"document number {i}"}) + "\n",
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(objects)))
    recipe = {
        "tokenizer": str(TOKENIZER),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 8,
        "manifest": str(folder / "many.manifest.json"),
        "sources": [
            {
                "name": "many",
                "path": "s3://many/shards/*.jsonl",
                "weight": 1,
                "storage_options": {**OPTIONS, "endpoint_url": url},
            }
        ],
    }
    rows = []
    start = time.perf_counter()
    mixer.build_loader(recipe)
    rows.append(
        {"start-up": f"{objects:,} objects, listing", "seconds": time.perf_counter() - start}
    )
    write_manifest(mixer.load_recipe(recipe), folder / "many.manifest.json")
    start = time.perf_counter()
    loader = mixer.build_loader(recipe)
    rows.append(
        {"start-up": f"{objects:,} objects, manifest", "seconds": time.perf_counter() - start}
    )
    start = time.perf_counter()
    next(iter(loader))
    rows.append({"start-up": "... then first batch", "seconds": time.perf_counter() - start})
    return rows


def memory(client, url: str, big_mb: int) -> list[dict]:
    client.create_bucket(Bucket="big")
    rng = random.Random(0)
    lines, size, i = [], 0, 0
    while size < big_mb << 20:
        line = (
            json.dumps(
                {
                    "text": f"document {i} " * 20,
                    "pad": base64.b64encode(rng.randbytes(3000)).decode(),
                }
            )
            + "\n"
        )
        lines.append(line)
        size += len(line)
        i += 1
    client.put_object(Bucket="big", Key="big.jsonl", Body="".join(lines).encode())
    del lines
    recipe = {
        "tokenizer": str(TOKENIZER),
        "seq_len": 512,
        "batch_size": 8,
        "lanes": 1,
        "sources": [
            {
                "name": "big",
                "path": "s3://big/big.jsonl",
                "weight": 1,
                "epochs": 1,
                "storage_options": {**OPTIONS, "endpoint_url": url},
            }
        ],
    }
    rows, seen = [], 0
    with mixer.build_loader(recipe) as loader:
        for n, _ in enumerate(loader):
            seen += 1
            if n % 200 == 0:
                io = loader.metrics()["io"]
                rows.append(
                    {"batch": n, "MB read": round(io["bytes"] / 1e6, 1), "rss_mb": rss_mb()}
                )
    io = loader.metrics()["io"]
    rows.append({"batch": seen, "MB read": round(io["bytes"] / 1e6, 1), "rss_mb": rss_mb()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--big-mb", type=int, default=100)
    args = parser.parse_args()
    proc, url = start_moto()
    client = boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("throughput, same shards on local disk and loopback S3 (moto):")
            print(
                table(
                    throughput(client, url, Path(tmp), args.copies),
                    [
                        "run",
                        "tokens",
                        "seconds",
                        "tokens_per_s",
                        "vs_local",
                        "first_batch_s",
                        "requests",
                        "retries",
                    ],
                )
            )
            print(f"\nstart-up over {args.objects:,} small objects:")
            print(table(startup(client, url, Path(tmp), args.objects), ["start-up", "seconds"]))
            print(
                f"\nresident memory while streaming one {args.big_mb} MB object "
                "(read-ahead budget 64 MB):"
            )
            print(table(memory(client, url, args.big_mb), ["batch", "MB read", "rss_mb"]))
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
