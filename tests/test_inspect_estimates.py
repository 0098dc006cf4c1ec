"""`mixer inspect` estimates a source from several of its files, and warns of a source too
small for its lanes to get its weight."""

from __future__ import annotations

import json

from helpers import write_docs

import mixer
from mixer.tools.cli import main
from mixer.tools.report import sampled_splits


def _recipe(tmp_path, tokenizer_path, sources: list[dict], **extra) -> str:
    import yaml

    recipe = {"seed": 3, "tokenizer": str(tokenizer_path), "seq_len": 64, "batch_size": 4,
              "lanes": 8, "sources": sources, **extra}
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
    recipe = _recipe(tmp_path, tokenizer_path, [
        {"name": "web", "path": str(tmp_path / "data" / "*.jsonl"), "weight": 1}])
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
        tmp_path, tokenizer_path, capsys):
    for i in range(3):   # one document per file, 3 files, 8 lanes: 5 lanes get none of it
        write_docs(tmp_path / "few" / f"t{i}.txt", [(i, 30)], "text")
    write_docs(tmp_path / "many.jsonl", [(1000 + d, 30) for d in range(400)], "jsonl")
    recipe = _recipe(tmp_path, tokenizer_path, [
        {"name": "few", "path": str(tmp_path / "few" / "*.txt"), "format": "text",
         "weight": 0.3},
        {"name": "many", "path": str(tmp_path / "many.jsonl"), "weight": 0.7}])
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
