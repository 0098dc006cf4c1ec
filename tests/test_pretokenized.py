"""Pre-tokenized sources: Megatron `.bin`/`.idx` pairs and flat `.npy` token arrays.

Document d holds `n` copies of `word_id(d)` (as the text corpora's documents tokenize), so
token counts prove exactly-once delivery across formats. The Megatron files are written by
an oracle that follows Megatron-LM's documented MMIDIDX layout, independent of mixer's writer.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import boto3
import numpy as np
import pytest
from helpers import (
    EOS_ID,
    batch_digest,
    byte_mutations,
    corpus,
    expected_counts,
    token_counts,
    word_id,
    write_docs,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.config.recipe import load_recipe
from mixer.runtime.state import unpack
from mixer.sources import IO_STATS, Storage, list_source, read_split
from mixer.sources.formats.tokens import finish_document
from mixer.sources.indexed import encode_index, parse_index, read_index_slice
from mixer.sources.manifest import list_sources, write_manifest
from mixer.tokenize import TokenizerInfo, resolve_tokenizer
from mixer.tools.inspect_report import inspect_recipe

# -- oracle: Megatron-LM's indexed dataset layout, written from its documentation --------------

ORACLE_CODES = {np.uint16: 8, np.int32: 4}


def write_megatron(prefix: Path, documents: list[list[list[int]]], dtype=np.uint16) -> Path:
    """`prefix`.bin/.idx; each document is a list of sequences (lists of ids)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lengths, pointers, doc_index, data, at = [], [], [0], b"", 0
    for sequences in documents:
        for seq in sequences:
            raw = np.asarray(seq, dtype=dtype).tobytes()
            lengths.append(len(seq))
            pointers.append(at)
            data += raw
            at += len(raw)
        doc_index.append(len(lengths))
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", ORACLE_CODES[dtype])
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index))
    idx += struct.pack(f"<{len(lengths)}i", *lengths)
    idx += struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(doc_index)}q", *doc_index)
    prefix.with_suffix(".idx").write_bytes(idx)
    bin_path = prefix.with_suffix(".bin")
    bin_path.write_bytes(data)
    return bin_path


def megatron_docs(docs: list[tuple[int, int]]) -> list[list[list[int]]]:
    """Stored documents: every third ends with EOS already, every fifth is two sequences."""
    out = []
    for i, (d, n) in enumerate(docs):
        ids = [word_id(d)] * n + ([EOS_ID] if i % 3 == 0 else [])
        out.append([ids[:1], ids[1:]] if i % 5 == 0 and len(ids) > 1 else [ids])
    return out


def npy_tokens(docs: list[tuple[int, int]], *, empty_every: int = 7) -> list[int]:
    """A flat array: documents each followed by EOS; now and then an empty document (two EOS
    in a row); the last document has no EOS (the end of the file ends it)."""
    flat: list[int] = []
    for i, (d, n) in enumerate(docs):
        flat += [word_id(d)] * n + [EOS_ID]
        if i % empty_every == 3:
            flat.append(EOS_ID)
    return flat[:-1]


# -- fixtures -------------------------------------------------------------------------------------

DOCS = {
    "mega": corpus(0, 150, max_len=30),
    "npy": corpus(3000, 160, max_len=25, seed=1),
    "text": corpus(6000, 120, max_len=20, seed=2),
}


@pytest.fixture
def mixture(tmp_path, tokenizer_path) -> dict:
    """A recipe over a megatron, an npy (one with header, one headerless) and a jsonl source."""
    mega = DOCS["mega"]
    write_megatron(tmp_path / "mega" / "a", megatron_docs(mega[:80]))
    write_megatron(tmp_path / "mega" / "b", megatron_docs(mega[80:]), dtype=np.int32)
    arr = DOCS["npy"]
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "x.npy", np.array(npy_tokens(arr[:90]), dtype=np.uint16))
    np.array(npy_tokens(arr[90:]), dtype=np.uint16).tofile(tmp_path / "npy" / "y.npy")
    write_docs(tmp_path / "text" / "t.jsonl", DOCS["text"], "jsonl")
    return {
        "seed": 3,
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 8,
        "split_bytes": 300,
        "sources": [
            {"name": "mega", "path": str(tmp_path / "mega" / "*.bin"), "weight": 0.4},
            {
                "name": "npy",
                "path": str(tmp_path / "npy" / "*.npy"),
                "weight": 0.35,
                "token_dtype": "uint16",
            },
            {"name": "text", "path": str(tmp_path / "text" / "*.jsonl"), "weight": 0.25},
        ],
    }


def finite(recipe: dict) -> dict:
    return {**recipe, "sources": [{**s, "epochs": 1} for s in recipe["sources"]]}


def everything() -> object:
    return sum((expected_counts(d) for d in DOCS.values()), start=expected_counts([]))


def take(loader, n: int) -> list[dict]:
    out = []
    for batch in loader:
        out.append({k: v.clone() for k, v in batch.items()})
        if len(out) == n:
            break
    return out


def mid_split(payload, name: str = "") -> set[str]:
    """Names of the sources whose stream state (anywhere in a state payload) is inside a
    split: past its first record."""
    if isinstance(payload, dict):
        if {"slot", "index", "offset"} <= payload.keys():
            return {name} if payload["index"] > 0 else set()
        return set().union(*(mid_split(v, k if k in DOCS else name) for k, v in payload.items()))
    if isinstance(payload, list):
        return set().union(*(mid_split(v, name) for v in payload))
    return set()


def info_of(recipe: dict) -> TokenizerInfo:
    return resolve_tokenizer(recipe["tokenizer"])


def records_of(recipe: dict, name: str) -> list:
    """Every record of a source, split by split, in file order."""
    loaded = load_recipe(recipe)
    src = next(s for s in loaded.sources if s.name == name)
    table = list_source(loaded, src)
    storage = Storage(name, {})
    out = []
    for split in table.splits:
        out += list(
            read_split(
                storage=storage,
                entry=table.files[split.file],
                split=split,
                source=name,
                text_field=None,
                max_bytes=1 << 20,
                index=0,
                offset=0,
                tokenizer=info_of(recipe),
            )
        )
    return out


# -- the formats --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_oracle_layout_is_read_document_by_document(tmp_path, tokenizer_path, dtype):
    stored = [[[5, 6], [7, EOS_ID]], [[8, 9, 10]], [[11] * 40, [12] * 3], [[13]]]
    bin_path = write_megatron(tmp_path / "m" / "s", stored, dtype=dtype)
    index = parse_index(bin_path.with_suffix(".idx").read_bytes())
    assert index.dtype == np.dtype(dtype) and index.num_documents == 4
    assert index.document_span(2) == (4 + 3, 43)  # two sequences, contiguous
    whole = bin_path.with_suffix(".idx").read_bytes()
    part = read_index_slice(lambda at, size: whole[at : at + size], 1, 3)
    assert part.num_documents == 2 and part.document_span(1) == index.document_span(2)
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 1,
        "lanes": 1,
        "split_bytes": 12,
        "sources": [{"name": "m", "path": str(bin_path), "weight": 1}],
    }
    records = records_of(recipe, "m")
    assert [r.tokens.tolist() for r in records] == [
        [5, 6, 7, EOS_ID],
        [8, 9, 10, EOS_ID],
        [11] * 40 + [12] * 3 + [EOS_ID],
        [13, EOS_ID],
    ]
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert all(r.chars == 4 * len(r.tokens) for r in records)


def test_mixers_own_writer_writes_the_oracles_layout(tmp_path):
    lengths = np.array([3, 1, 4], dtype=np.int32)
    write_megatron(tmp_path / "o", [[[1] * 3], [[1]], [[1] * 4]])
    assert encode_index(np.uint16, lengths) == (tmp_path / "o.idx").read_bytes()


def test_splits_are_document_ranges_and_token_ranges(mixture):
    loaded = load_recipe(mixture)
    mega, npy = (list_source(loaded, s) for s in loaded.sources[:2])
    assert len(mega.splits) > 4 and len(npy.splits) > 4, "large shards give several splits"
    assert sum(s.records for s in mega.splits) == len(DOCS["mega"])
    starts = [r.offset for r in records_of(mixture, "npy")]
    assert len(starts) == len(DOCS["npy"]), "every document once over all splits"


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 9), max_size=6), bos=st.sampled_from([None, 9]))
def test_eos_appended_and_bos_prepended_only_when_absent(ids, bos):
    info = TokenizerInfo("t", eos_id=0, bos_id=bos, pad_id=1, digest="d", vocab_size=10)
    out = finish_document(np.array(ids, dtype=np.uint16), info)
    body = ids[1:] if bos is not None and ids[:1] == [bos] else ids
    body = body[:-1] if body[-1:] == [0] else body
    if not body:
        assert out is None, "an empty document is skipped"
        return
    assert out[-1] == 0 and out.dtype in (np.uint16, np.int64)  # stored dtype when final
    assert out.tolist() == ([bos] if bos is not None else []) + body + [0]


def test_headerless_npy_needs_token_dtype(mixture):
    del mixture["sources"][1]["token_dtype"]
    with pytest.raises(mixer.DataError, match="token_dtype") as err:
        mixer.build_loader(mixture)
    assert err.value.source == "npy" and err.value.file.endswith("y.npy")
    mixture["sources"][1]["token_dtype"] = "uint32"  # x.npy's header says uint16
    with pytest.raises(mixer.DataError, match="header says uint16") as err:
        mixer.build_loader(mixture)
    assert err.value.file.endswith("x.npy")


def test_headerless_uint32_npy_with_token_dtype(tmp_path, tokenizer_path):
    docs = corpus(100, 30, max_len=9)
    tokens = np.array(npy_tokens(docs), dtype=np.uint32)
    tokens.tofile(tmp_path / "raw.npy")
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "split_bytes": 40,
        "sources": [
            {
                "name": "raw",
                "path": str(tmp_path / "raw.npy"),
                "weight": 1,
                "epochs": 1,
                "token_dtype": "uint32",
            }
        ],
    }
    assert token_counts(mixer.build_loader(recipe)) == expected_counts(docs)


# -- the guarantees, mixed with text --------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_every_document_once_per_epoch_over_two_ranks(mixture, workers):
    seen = []
    for rank in range(2):
        with mixer.build_loader(
            finite(mixture), rank=rank, world_size=2, num_workers=workers
        ) as loader:
            seen += list(loader)
    assert token_counts(seen) == everything()


@pytest.mark.slow
def test_same_stream_after_resume_mid_split_and_elastic_resume(mixture):
    reference = [batch_digest(b) for b in take(mixer.build_loader(mixture), 50)]
    loader = mixer.build_loader(mixture, num_workers=2)
    assert [batch_digest(b) for b in take(loader, 21)] == reference[:21]
    state = loader.state_dict()
    loader.close()
    assert mid_split(unpack(state)) >= {"mega", "npy"}, "resumed inside splits"
    resumed = mixer.build_loader(mixture, num_workers=1)
    resumed.load_state_dict(state)
    assert [batch_digest(b) for b in take(resumed, 29)] == reference[21:]
    states = []
    for rank in range(2):
        part = mixer.build_loader(mixture, rank=rank, world_size=2)
        assert [batch_digest(b) for b in take(part, 5)] == reference[rank:10:2]
        states.append(part.state_dict())
    single = mixer.build_loader(mixture, num_workers=2)
    single.load_state_dict(mixer.merge_states(states))
    assert [batch_digest(b) for b in take(single, 40)] == reference[10:]


def test_realized_token_shares_follow_the_weights(mixture):
    weights = np.array([s["weight"] for s in mixture["sources"]])
    world, lanes = 2, mixture["lanes"]
    threshold = 25 * (lanes // world) * mixture["batch_size"] * mixture["seq_len"]
    for rank in range(world):
        counts, total, checked = np.zeros(3), 0, 0
        for batch in mixer.build_loader(mixture, rank=rank, world_size=world):
            ids = batch["source_ids"].flatten().numpy()
            counts += [(ids == i).sum() for i in range(3)]
            total += ids.size
            if total >= threshold:
                assert np.abs(counts / total - weights).max() <= 0.01, (rank, total)
                checked += 1
            if total >= 2 * threshold:
                break
        assert checked >= 25


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["megatron", "npy"])
def test_token_id_outside_the_vocabulary_names_file_and_offset(tmp_path, tokenizer_path, fmt):
    docs = corpus(0, 12, max_len=6)
    bad = 40000  # fits uint16; the tokenizer has 30,002 ids
    if fmt == "megatron":
        stored = megatron_docs(docs)
        stored[5] = [[word_id(5), bad, word_id(5)]]
        path = write_megatron(tmp_path / "bad", stored)
        where = "document 5, token offset"
    else:
        flat = npy_tokens(docs, empty_every=1000)
        at = sum(n + 1 for _, n in docs[:5]) + 1
        flat[at] = bad
        path = tmp_path / "bad.npy"
        np.save(path, np.array(flat, dtype=np.uint16))
        where = f"token offset {at} "
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [{"name": "bad", "path": str(path), "weight": 1, "epochs": 1}],
    }
    with pytest.raises(mixer.DataError, match="outside the tokenizer's vocabulary") as err:
        list(mixer.build_loader(recipe))
    assert err.value.source == "bad" and err.value.file == str(path)
    assert where in err.value.location
    recipe["sources"][0]["on_error"] = "skip"
    loader = mixer.build_loader(recipe)
    assert token_counts(loader) == expected_counts(docs[:5] + docs[6:])
    assert loader.metrics()["skipped"]["bad"] == 1


def test_missing_or_changed_index_is_refused(tmp_path, tokenizer_path):
    path = write_megatron(tmp_path / "m", megatron_docs(corpus(0, 20)))
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [{"name": "m", "path": str(path), "weight": 1, "epochs": 1}],
    }
    loader = mixer.build_loader(recipe)  # listed now
    idx = path.with_suffix(".idx")
    idx.write_bytes(idx.read_bytes() + b"\x00" * 8)
    with pytest.raises(mixer.DataError, match="changed since it was listed") as err:
        list(loader)
    assert err.value.file == str(idx)
    idx.unlink()
    with pytest.raises(mixer.DataError, match="missing") as err:
        mixer.build_loader(recipe)
    assert err.value.file == str(idx)


# -- storage, manifests, inspect ------------------------------------------------------------------


@pytest.mark.slow
def test_megatron_source_on_s3_reads_only_its_splits(mixture, tmp_path, s3_endpoint):
    from conftest import s3_options

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    client.create_bucket(Bucket="pretok")
    for path in sorted((tmp_path / "mega").iterdir()):
        client.put_object(Bucket="pretok", Key=f"mega/{path.name}", Body=path.read_bytes())
    local = {**finite(mixture), "sources": [finite(mixture)["sources"][0]]}
    remote = {
        **local,
        "sources": [
            {
                **local["sources"][0],
                "path": "s3://pretok/mega/*.bin",
                "storage_options": s3_options(s3_endpoint),
            }
        ],
    }
    expected = [batch_digest(b) for b in mixer.build_loader(local)]
    assert [batch_digest(b) for b in mixer.build_loader(remote)] == expected
    loaded = load_recipe(remote)
    table = list_source(loaded, loaded.sources[0])
    split = table.splits[len(table.splits) // 2]
    entry = table.files[split.file]
    IO_STATS.reset()
    records = list(
        read_split(
            storage=Storage("mega", loaded.sources[0].storage_options),
            entry=entry,
            split=split,
            source="mega",
            text_field=None,
            max_bytes=1 << 20,
            index=0,
            offset=0,
            tokenizer=info_of(mixture),
        )
    )
    assert len(records) == split.records
    payload = sum(len(r.tokens) for r in records) * 2
    assert IO_STATS.bytes < payload + 40 * (split.end - split.start + 1) + 100, (
        "only the split's slice of the .idx and its range of the .bin are fetched"
    )
    assert IO_STATS.bytes < entry.size


def test_manifest_keeps_index_and_dtype(mixture, tmp_path, monkeypatch):
    mixture["manifest"] = str(tmp_path / "manifest.json")
    loaded = load_recipe(mixture)
    write_manifest(loaded, Path(mixture["manifest"]))
    listed = [list_source(loaded, s) for s in loaded.sources]
    with monkeypatch.context() as patch:
        patch.setattr("mixer.sources.manifest.list_source", None)  # must not list again
        saved = list_sources(loaded)
    assert [t.files for t in saved] == [t.files for t in listed]
    assert [t.splits for t in saved] == [t.splits for t in listed]
    assert saved[0].files[0].index is not None and saved[1].files[0].dtype == "uint16"
    assert token_counts(mixer.build_loader(finite(mixture))) == everything()


def test_inspect_estimates_documents_and_tokens(mixture):
    rows = {r["name"]: r for r in inspect_recipe(load_recipe(mixture))["sources"]}
    assert rows["mega"]["est_documents"] == len(DOCS["mega"])
    npy_tokens_total = sum(n + 1 for _, n in DOCS["npy"])
    assert abs(rows["npy"]["est_documents"] / len(DOCS["npy"]) - 1) < 0.3
    assert abs(rows["npy"]["est_tokens"] / npy_tokens_total - 1) < 0.3
    mega_tokens = sum(n + 1 for _, n in DOCS["mega"])
    assert abs(rows["mega"]["est_tokens"] / mega_tokens - 1) < 0.3


def test_a_glob_over_both_halves_of_the_pairs_lists_each_pair_once(mixture):
    source = {**mixture["sources"][0], "epochs": 1, "format": "megatron"}
    source["path"] = source["path"].replace("*.bin", "*")
    recipe = {**mixture, "sources": [source]}
    assert token_counts(mixer.build_loader(recipe)) == expected_counts(DOCS["mega"])


@pytest.mark.parametrize("target", ["idx", "bin", "npy"])
@settings(
    max_examples=int(os.environ.get("MIXER_FUZZ_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), on_error=st.sampled_from(["raise", "skip"]))
def test_mutated_files_give_batches_or_named_data_errors(
    tmp_path_factory, tokenizer_path, target, data, on_error
):
    folder = tmp_path_factory.mktemp("fuzz")
    docs = corpus(0, 20, max_len=8)
    if target == "npy":
        path = folder / "x.npy"
        np.save(path, np.array(npy_tokens(docs), dtype=np.uint16))
        victim = path
    else:
        path = write_megatron(folder / "x", megatron_docs(docs))
        victim = path.with_suffix("." + target)
    victim.write_bytes(data.draw(byte_mutations(victim.read_bytes(), bytes([0, 0x75, 0xFF]))))
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "split_bytes": 24,
        "max_document_bytes": 400,
        "sources": [
            {"name": "fz", "path": str(path), "weight": 1, "epochs": 1, "on_error": on_error}
        ],
    }
    try:
        for batch in mixer.build_loader(recipe):
            assert batch["input_ids"].shape == (2, 8)
    except mixer.DataError as err:
        assert err.source == "fz" and err.file in (str(path), str(victim)), err
        if on_error == "skip":
            assert "no readable files" in str(err), err
