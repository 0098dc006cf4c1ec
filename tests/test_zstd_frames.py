"""Multi-frame zstd files are cut at frame boundaries: every line once, cheaper resume."""

from __future__ import annotations

import json

import pytest
import zstandard
from helpers import corpus, doc_text, expected_counts, make_tokenizer, token_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.pipeline.lanes import Lane
from mixer.sources import READERS, Storage, list_source
from mixer.sources.manifest import write_manifest
from mixer.tokenize import Encoder, resolve_tokenizer


def write_frames(path, docs, cuts: list[int], *, content_size: bool = True) -> bytes:
    """docs as jsonl, compressed as one frame per chunk between the byte offsets `cuts`."""
    data = "".join(json.dumps({"text": doc_text(d, n)}) + "\n" for d, n in docs).encode()
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    cctx = zstandard.ZstdCompressor(write_content_size=content_size, write_checksum=True)
    path.write_bytes(b"".join(cctx.compress(data[a:b]) for a, b in zip(bounds, bounds[1:])))
    return data


def _recipe(tmp_path, tok, path, split_bytes: int) -> mixer.Recipe:
    return mixer.load_recipe(
        {
            "tokenizer": str(tok),
            "seq_len": 16,
            "batch_size": 2,
            "lanes": 2,
            "split_bytes": split_bytes,
            "shuffle_window": 8,
            "sources": [{"name": "z", "path": str(path), "weight": 1, "epochs": 1}],
        }
    )


def _texts(recipe):
    table = list_source(recipe, recipe.sources[0], deep=True)
    out = []
    for split in table.splits:
        out += [
            r.text
            for r in READERS["jsonl.zst"](
                storage=Storage("z", {}),
                entry=table.files[split.file],
                split=split,
                source="z",
                text_field="text",
                max_bytes=1 << 20,
                index=0,
                offset=0,
            )
        ]
    return table, out


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    cuts=st.lists(st.integers(0, 4000), max_size=12),
    split_bytes=st.integers(1, 300),
)
def test_frame_groups_partition_the_lines(tmp_path_factory, lengths, cuts, split_bytes):
    folder = tmp_path_factory.mktemp("frames")
    tok = make_tokenizer(folder / "tok.json")
    docs = list(enumerate(lengths))
    write_frames(folder / "x.jsonl.zst", docs, cuts)
    table, texts = _texts(_recipe(folder, tok, folder / "x.jsonl.zst", split_bytes))
    assert texts == [doc_text(d, n) for d, n in docs]


@pytest.mark.slow
def test_frames_become_splits_and_resume_reads_one_split(tmp_path, tokenizer_path):
    docs = corpus(0, 3000, max_len=10)
    data = write_frames(tmp_path / "x.jsonl.zst", docs, list(range(0, 10**6, 997)))
    recipe = _recipe(tmp_path, tokenizer_path, tmp_path / "x.jsonl.zst", 1000)
    assert len(list_source(recipe, recipe.sources[0]).splits) == 1, "only `index` scans frames"
    table = list_source(recipe, recipe.sources[0], deep=True)
    assert len(table.splits) > 10 and all(s.dend >= 0 for s in table.splits)
    assert table.splits[-1].dend == len(data)
    encoder = Encoder(resolve_tokenizer(str(tokenizer_path)))
    lane = Lane(1, recipe, [table], encoder)
    for _ in range(300):
        lane.next_batch(2)
    resumed = Lane(1, recipe, [table], encoder, lane.state_dict())
    resumed.next_batch(2)
    per_split = max(s.dend - s.dstart for s in table.splits) // 20 + 2  # lines are >= 20 bytes
    assert resumed.packers[0].stream.records_read <= per_split + 2 * recipe.shuffle_window
    assert lane.packers[0].stream.records_read > 3 * per_split
    with_manifest = {**recipe.model_dump(), "manifest": str(tmp_path / "m.json")}
    write_manifest(mixer.load_recipe(with_manifest), tmp_path / "m.json")
    loader = mixer.build_loader(with_manifest, num_workers=2)
    assert len(loader.tables[0].splits) == len(table.splits)
    batches = list(loader)
    assert token_counts(batches) == expected_counts(docs)
    # a state from the manifest's splits is refused without it, not silently misread
    with pytest.raises(mixer.StateError, match="other splits"):
        mixer.build_loader(recipe.model_dump()).load_state_dict(loader.state_dict())


def test_frames_without_content_size_stay_one_split(tmp_path, tokenizer_path):
    docs = corpus(0, 200)
    write_frames(tmp_path / "x.jsonl.zst", docs, [500, 1000, 1500], content_size=False)
    table, texts = _texts(_recipe(tmp_path, tokenizer_path, tmp_path / "x.jsonl.zst", 100))
    assert len(table.splits) == 1 and not table.splits[0].seekable
    assert texts == [doc_text(d, n) for d, n in docs]
