"""`mixer inspect` estimates a source from several of its files, and warns of a source too
small for its lanes to get its weight."""

from __future__ import annotations

import json

import pytest
from helpers import write_docs

import mixer
from mixer.tools.cli import main
from mixer.tools.sampling import sampled_splits


def _recipe(tmp_path, tokenizer_path, sources: list[dict], **extra) -> str:
    import yaml

    recipe = {
        "seed": 3,
        "tokenizer": str(tokenizer_path),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 8,
        "sources": sources,
        **extra,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def _inspect(capsys, recipe: str) -> dict:
    assert main(["inspect", recipe, "--json"]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)["sources"]}


def test_the_token_estimate_samples_files_across_the_source(tmp_path, tokenizer_path, capsys):
    # the first file (often a source's oddest) holds short documents, the others long ones
    docs = {i: [(100 * i + d, 2 if i == 0 else 40 + i) for d in range(20)] for i in range(12)}
    for i, file_docs in docs.items():
        write_docs(tmp_path / "data" / f"part-{i:02d}.jsonl", file_docs, "jsonl")
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [{"name": "web", "path": str(tmp_path / "data" / "*.jsonl"), "weight": 1}],
    )
    row = _inspect(capsys, recipe)["web"]
    true_tokens = sum(n + 1 for file_docs in docs.values() for _, n in file_docs)  # + EOS
    assert abs(row["est_tokens"] - true_tokens) <= 0.1 * true_tokens, (row, true_tokens)
    assert abs(row["est_documents"] - 240) <= 24


def test_sampled_splits_spread_over_the_source_and_include_both_ends():
    for count in range(1, 200):
        chosen = sampled_splits(count)
        assert chosen == sorted(set(chosen)) and chosen[0] == 0 and chosen[-1] == count - 1
        assert len(chosen) == min(count, 8)


def test_a_source_with_fewer_documents_than_its_lanes_is_warned_of_and_falls_short(
    tmp_path, tokenizer_path, capsys
):
    for i in range(3):  # one document per file, 3 files, 8 lanes: 5 lanes get none of it
        write_docs(tmp_path / "few" / f"t{i}.txt", [(i, 30)], "text")
    write_docs(tmp_path / "many.jsonl", [(1000 + d, 30) for d in range(400)], "jsonl")
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [
            {
                "name": "few",
                "path": str(tmp_path / "few" / "*.txt"),
                "format": "text",
                "weight": 0.3,
            },
            {"name": "many", "path": str(tmp_path / "many.jsonl"), "weight": 0.7},
        ],
    )
    rows = _inspect(capsys, recipe)
    assert rows["few"]["lanes_without_documents"] == 5
    assert rows["many"]["lanes_without_documents"] == 0
    assert main(["inspect", recipe]) == 0
    out = capsys.readouterr().out
    assert "warning: source 'few'" in out and "5 of 8 lanes get none of it" in out
    assert "warning: source 'many'" not in out
    assert main(["plan", recipe, "--tokens", "1e6", "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert [w for w in warnings if "'few': 5 of 8 lanes get none" in w]
    assert not [w for w in warnings if "'many'" in w and "lanes get none" in w]
    # what the warning says happens: the share falls short of the weight
    loader = mixer.build_loader(recipe)
    for _, _ in zip(range(60), loader):
        pass
    realized = loader.metrics()["realized_share"]["few"]
    assert realized < 0.3 * 0.8, realized


def _true_tokens(docs) -> int:
    return sum(n + 1 for _, n in docs)  # (+ EOS)


def test_an_indexed_multi_frame_zstd_source_is_estimated_from_its_own_splits(
    tmp_path, tokenizer_path, capsys
):
    """Frame-group splits report decompressed offsets from the file's start: each split's
    documents per byte are measured from its own start and size, not the file's."""
    from test_zstd_frames import write_frames

    docs = [(10_000 + d, 10 + d % 50) for d in range(8000)]  # (ids of one width)
    write_frames(tmp_path / "z.jsonl.zst", docs, list(range(0, 10**8, 25_000)))
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [{"name": "z", "path": str(tmp_path / "z.jsonl.zst"), "weight": 1}],
        split_bytes=5_000,
        manifest=str(tmp_path / "m.json"),
    )  # (stored bytes: ~45 KB)
    assert main(["index", recipe]) == 0
    capsys.readouterr()
    row = _inspect(capsys, recipe)["z"]
    assert row["splits"] > 4
    assert abs(row["est_documents"] - 8000) <= 800, row
    assert abs(row["est_tokens"] - _true_tokens(docs)) <= 0.1 * _true_tokens(docs), row


def test_splits_of_unequal_size_count_for_their_size(tmp_path, tokenizer_path, capsys):
    """One large file read in part and small files read whole: each split's sample stands
    for the documents that split holds, not for the documents read of it."""
    big = [(10_000 + d, 200) for d in range(5000)]  # (ids of one width: bytes alike)
    small = {i: [(20_000 + 100 * i + d, 3) for d in range(40)] for i in range(7)}
    write_docs(tmp_path / "data" / "a-big.jsonl", big, "jsonl")
    for i, file_docs in small.items():
        write_docs(tmp_path / "data" / f"b-small-{i}.jsonl", file_docs, "jsonl")
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [{"name": "mixed", "path": str(tmp_path / "data" / "*.jsonl"), "weight": 1}],
        split_bytes=1 << 30,
    )
    row = _inspect(capsys, recipe)["mixed"]
    every = big + [doc for file_docs in small.values() for doc in file_docs]
    assert abs(row["est_documents"] - len(every)) <= 0.15 * len(every), row
    assert abs(row["est_tokens"] - _true_tokens(every)) <= 0.1 * _true_tokens(every), row


def _share_after(recipe: str, source: str, batches: int = 150) -> float:
    loader = mixer.build_loader(recipe)
    for _, _ in zip(range(batches), loader):
        pass
    return loader.metrics()["realized_share"][source]


@pytest.mark.slow
def test_lanes_meet_other_splits_in_later_epochs(tmp_path, tokenizer_path, capsys):
    """A lane at stripe position p gets a different split each epoch: it lacks the source
    only when no split has a document at p. Files of 1 and 5 documents over 8 lanes leave
    no lane without (the share is met), so no warning."""
    write_docs(tmp_path / "few" / "a.jsonl", [(1, 30)], "jsonl")
    write_docs(tmp_path / "few" / "b.jsonl", [(2 + d, 30) for d in range(5)], "jsonl")
    write_docs(tmp_path / "many.jsonl", [(1000 + d, 30) for d in range(400)], "jsonl")
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [
            {"name": "few", "path": str(tmp_path / "few" / "*.jsonl"), "weight": 0.3},
            {"name": "many", "path": str(tmp_path / "many.jsonl"), "weight": 0.7},
        ],
    )
    assert _inspect(capsys, recipe)["few"]["lanes_without_documents"] == 0
    assert abs(_share_after(recipe, "few") - 0.3) < 0.03


def test_lanes_whose_stripe_holds_only_bad_records_are_counted(tmp_path, tokenizer_path, capsys):
    """Striping deals records by index, bad ones included: with every other record bad and
    skipped, the lanes at odd positions of the stripe never get a document."""
    good = [json.dumps({"text": " ".join([f"w{d}"] * 30)}) for d in range(8)]
    lines = [line for pair in zip(good, ["{broken"] * 8) for line in pair]
    (tmp_path / "half.jsonl").write_text("\n".join(lines) + "\n")
    write_docs(tmp_path / "many.jsonl", [(1000 + d, 30) for d in range(400)], "jsonl")
    recipe = _recipe(
        tmp_path,
        tokenizer_path,
        [
            {
                "name": "half",
                "path": str(tmp_path / "half.jsonl"),
                "weight": 0.3,
                "on_error": "skip",
            },
            {"name": "many", "path": str(tmp_path / "many.jsonl"), "weight": 0.7},
        ],
    )
    assert _inspect(capsys, recipe)["half"]["lanes_without_documents"] == 4
    assert _share_after(recipe, "half") < 0.3 * 0.8
