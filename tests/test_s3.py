"""s3:// sources against a real S3 endpoint (moto's server), through a fault-injecting proxy."""

from __future__ import annotations

import base64
import json
import logging
import random
import time
from collections import Counter

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import CANARY, s3_options
from helpers import batch_digest, corpus, doc_text, expected_counts, make_tokenizer, token_counts
from s3server import FaultProxy

import mixer
from mixer.tools.cli import main as cli

pytestmark = [pytest.mark.s3]

BUCKET = "corpus"


def _noise(rng: random.Random, size: int) -> str:
    return base64.b64encode(rng.randbytes(size)).decode()


@pytest.fixture(scope="module")
def shards(s3_endpoint, tmp_path_factory):
    """The same shards on local disk and in the bucket (several MB, incompressible padding)."""
    root = tmp_path_factory.mktemp("s3data")
    rng = random.Random(5)
    docs = {
        "prose": corpus(0, 2600, max_len=20),
        "web": corpus(5000, 1800, max_len=20, seed=3),
        "code": corpus(9000, 900, max_len=30, seed=4),
    }
    files = {}
    lines = "".join(
        json.dumps({"text": doc_text(d, n), "pad": _noise(rng, 1200)}) + "\n"
        for d, n in docs["prose"]
    )
    files["prose/p0.jsonl"] = lines.encode()
    lines = "".join(
        json.dumps({"text": doc_text(d, n), "pad": _noise(rng, 1200)}) + "\n"
        for d, n in docs["web"]
    )
    files["web/w0.jsonl.zst"] = zstandard.ZstdCompressor().compress(lines.encode())
    table = pa.table(
        {
            "content": [doc_text(d, n) for d, n in docs["code"]],
            "pad": [_noise(rng, 1500) for _ in docs["code"]],
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=150)
    files["code/c0.parquet"] = sink.getvalue().to_pybytes()
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    client.create_bucket(Bucket=BUCKET)
    for key, data in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
        client.put_object(Bucket=BUCKET, Key=f"data/{key}", Body=data)
    assert all(len(d) > 1_000_000 for d in files.values()), "objects of several MB"
    tok = make_tokenizer(root / "tok.json")
    return root, docs, tok, client


def recipe(shards, base: str, options: dict | None = None, **overrides) -> dict:
    root, _, tok, _ = shards
    opts = {"storage_options": options} if options is not None else {}
    r = {
        "seed": 11,
        "tokenizer": str(tok),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 64,
        "split_bytes": 1 << 20,
        "read_ahead_bytes": 1 << 20,
        "sources": [
            {"name": "prose", "path": f"{base}/prose/*.jsonl", "weight": 0.5, "epochs": 1, **opts},
            {"name": "web", "path": f"{base}/web/*.jsonl.zst", "weight": 0.3, "epochs": 1, **opts},
            {
                "name": "code",
                "path": f"{base}/code/*.parquet",
                "weight": 0.2,
                "text_field": "content",
                "epochs": 1,
                **opts,
            },
        ],
    }
    r.update(overrides)
    return r


def digests(loader) -> list[str]:
    with loader:
        return [batch_digest(b) for b in loader]


@pytest.fixture(scope="module")
def local_digests(shards):
    return digests(mixer.build_loader(recipe(shards, str(shards[0]))))


@pytest.mark.slow
def test_s3_stream_equals_local_disk_and_states_are_interchangeable(
    shards, s3_endpoint, local_digests
):
    s3 = recipe(shards, f"s3://{BUCKET}/data", s3_options(s3_endpoint))
    assert digests(mixer.build_loader(s3, num_workers=2)) == local_digests
    # a state taken on S3 resumes on the local copy (the fingerprint ignores scheme/options)
    loader = mixer.build_loader(s3)
    with loader:
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = loader.state_dict()
    local = mixer.build_loader(recipe(shards, str(shards[0])))
    local.load_state_dict(state)
    assert digests(local) == local_digests[7:]


@pytest.mark.slow
def test_faults_are_retried_at_the_current_offset(shards, s3_endpoint, local_digests):
    proxy = FaultProxy(s3_endpoint, stall_s=2.5)
    try:
        r = recipe(shards, f"s3://{BUCKET}/data", s3_options(proxy.url))
        loader = mixer.build_loader(r)
        assert digests(loader) == local_digests
        for fault in ("slowdown", "cut", "short", "stall"):
            assert proxy.counts[fault] >= 1, f"the schedule must inject {fault}"
        gets = [p for m, p in proxy.requests if m == "GET" and "prose" in p]
        assert len(gets) > 10, "streaming spans many range requests"
        # the well-formed short bodies are caught by mixer's length check and retried
        assert loader.metrics()["io"]["retries"] >= proxy.counts["short"]
    finally:
        proxy.close()


@pytest.mark.slow
def test_workers_and_resume_over_s3(shards, s3_endpoint, local_digests):
    r = recipe(shards, f"s3://{BUCKET}/data", s3_options(s3_endpoint))
    first = mixer.build_loader(r, num_workers=2)
    with first:
        it = iter(first)
        head = [batch_digest(next(it)) for _ in range(30)]
        state = first.state_dict()
    resumed = mixer.build_loader(r, num_workers=1)
    resumed.load_state_dict(state)
    assert head + digests(resumed) == local_digests


@pytest.mark.slow
def test_every_document_once_from_s3(shards, s3_endpoint):
    _, docs, _, _ = shards
    r = recipe(shards, f"s3://{BUCKET}/data", s3_options(s3_endpoint))
    seen = []
    for rank in range(2):
        with mixer.build_loader(r, rank=rank, world_size=2, num_workers=2) as loader:
            seen.extend(list(loader))
    expected = (
        expected_counts(docs["prose"])
        + expected_counts(docs["web"])
        + expected_counts(docs["code"])
    )
    assert token_counts(seen) == expected


def test_permanent_errors_fail_fast_with_source_and_object(shards, s3_endpoint):
    proxy = FaultProxy(s3_endpoint, faults=False)
    try:
        r = recipe(shards, f"s3://{BUCKET}/data", s3_options(proxy.url))
        loader = mixer.build_loader(r)
        proxy.deny.add("p0.jsonl")
        start = time.monotonic()
        with pytest.raises(mixer.DataError) as err:
            digests(loader)
        assert time.monotonic() - start < 10
        assert "'prose'" in str(err.value) and "s3://corpus/data/prose/p0.jsonl" in str(err.value)
        assert "denied" in str(err.value).lower()
    finally:
        proxy.close()
    missing = recipe(shards, f"s3://{BUCKET}/nothing-here", s3_options(s3_endpoint))
    with pytest.raises(mixer.DataError, match="'prose'.*matches no files"):
        mixer.build_loader(missing)


def test_changed_object_is_detected_not_read_with_stale_splits(shards, s3_endpoint):
    root, _, _, client = shards
    original = (root / "prose" / "p0.jsonl").read_bytes()
    r = recipe(shards, f"s3://{BUCKET}/data", s3_options(s3_endpoint))
    loader = mixer.build_loader(r, num_workers=1)
    client.put_object(Bucket=BUCKET, Key="data/prose/p0.jsonl", Body=original + b"\n")
    try:
        with pytest.raises(mixer.DataError, match="changed since it was listed"):
            digests(loader)
    finally:
        client.put_object(Bucket=BUCKET, Key="data/prose/p0.jsonl", Body=original)


def test_canary_secret_never_leaks(shards, s3_endpoint, tmp_path, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    r = recipe(shards, f"s3://{BUCKET}/data", s3_options(s3_endpoint))
    loader = mixer.build_loader(r)
    with loader:
        next(iter(loader))
        state = json.dumps(loader.state_dict())
    bad = recipe(shards, "s3://no-such-bucket/x", s3_options(s3_endpoint))
    with pytest.raises(mixer.DataError) as err:
        mixer.build_loader(bad)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(r))
    (tmp_path / "r.yaml").write_text(json.dumps(r))  # JSON is valid YAML
    assert cli(["inspect", str(tmp_path / "r.yaml"), "--json"]) == 0
    out = capsys.readouterr()
    assert cli(["validate", str(tmp_path / "r.yaml")]) == 0
    for text in (
        state,
        str(err.value),
        repr(mixer.load_recipe(r)),
        out.out,
        out.err,
        caplog.text,
        repr(mixer.load_recipe(r).sources),
    ):
        assert CANARY not in text


@pytest.mark.slow
def test_standard_aws_environment_variables_are_the_fallback(
    shards, s3_endpoint, monkeypatch, local_digests
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    r = recipe(shards, f"s3://{BUCKET}/data")
    assert digests(mixer.build_loader(r)) == local_digests


@pytest.mark.slow
def test_manifest_skips_listing_at_start_up_and_catches_changed_objects(
    shards, s3_endpoint, tmp_path, local_digests
):
    root, _, _, client = shards
    proxy = FaultProxy(s3_endpoint, faults=False)
    try:
        r = recipe(
            shards,
            f"s3://{BUCKET}/data",
            s3_options(proxy.url),
            manifest=str(tmp_path / "corpus.manifest.json"),
        )
        (tmp_path / "r.yaml").write_text(json.dumps(r))
        assert cli(["index", str(tmp_path / "r.yaml")]) == 0
        listed = [p for m, p in proxy.requests if "list-type" in p]
        assert len(listed) == 3, "index lists each source once"
        proxy.requests.clear()
        loader = mixer.build_loader(r)
        assert proxy.requests == [], "start-up with a manifest sends no request"
        assert digests(loader) == local_digests
        assert not [p for m, p in proxy.requests if "list-type" in p]
        original = (root / "prose" / "p0.jsonl").read_bytes()
        client.put_object(Bucket=BUCKET, Key="data/prose/p0.jsonl", Body=original[:-1] + b" ")
        try:
            with pytest.raises(mixer.DataError, match="changed since it was listed or indexed"):
                digests(mixer.build_loader(r))
        finally:
            client.put_object(Bucket=BUCKET, Key="data/prose/p0.jsonl", Body=original)
    finally:
        proxy.close()


@pytest.mark.slow
def test_one_rank_lists_under_torchrun(shards, s3_endpoint, tmp_path):
    from test_torchrun import ROOT, torchrun

    _, docs, _, _ = shards
    proxy = FaultProxy(s3_endpoint, faults=False)
    try:
        r = recipe(shards, f"s3://{BUCKET}/data", s3_options(proxy.url))
        (tmp_path / "r.yaml").write_text(json.dumps(r))
        torchrun(
            2,
            str(ROOT / "tests" / "dist_finite_worker.py"),
            str(tmp_path / "r.yaml"),
            str(tmp_path / "out"),
            "1",
        )
        listed = [p for m, p in proxy.requests if "list-type" in p]
        assert len(listed) == 3, f"one listing per source, not per rank: {listed}"
    finally:
        proxy.close()
    ranks = [json.loads((tmp_path / f"out.rank{i}").read_text()) for i in range(2)]
    assert ranks[0]["batches"] == ranks[1]["batches"]
    total = Counter()
    for rank in ranks:
        total.update({int(k): v for k, v in rank["counts"].items()})
    assert total == (
        expected_counts(docs["prose"])
        + expected_counts(docs["web"])
        + expected_counts(docs["code"])
    )
