"""Recipes: validated into frozen config, errors name the field path."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import mixer
from mixer.cli import main


def base(**overrides) -> dict:
    recipe = {"tokenizer": "tok.json", "seq_len": 8, "batch_size": 2,
              "sources": [{"name": "a", "path": "a/*.jsonl", "weight": 1},
                          {"name": "b", "path": ["b/*.jsonl", "c/*.parquet"], "weight": 2}]}
    recipe.update(overrides)
    return recipe


@pytest.mark.parametrize("change,path", [
    ({"seq_len": 0}, "seq_len"),
    ({"packing": "zigzag"}, "packing"),
    ({"colour": "red"}, "colour"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1},
                  {"name": "b", "path": "y", "weight": -1}]}, "sources[1].weight"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1, "epochs": 0}]}, "sources[0].epochs"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1, "format": "csv"}]},
     "sources[0].format"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1, "on_error": "ignore"}]},
     "sources[0].on_error"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1, "typo": 1}]}, "sources[0].typo"),
    ({"sources": [{"name": "a", "path": "x", "weight": 1}, {"name": "a", "path": "y",
                                                             "weight": 1}]}, "sources[1].name"),
    ({"sources": []}, "sources"),
])
def test_bad_values_name_the_field_path(change, path):
    with pytest.raises(mixer.RecipeError) as err:
        mixer.load_recipe(base(**change))
    assert f"{path}:" in str(err.value)


def test_recipe_is_frozen_and_normalizes_weights():
    recipe = mixer.load_recipe(base())
    assert recipe.weights == pytest.approx([1 / 3, 2 / 3])
    with pytest.raises(ValidationError):
        recipe.seq_len = 4  # type: ignore[misc]


def test_yaml_file_paths_resolve_against_the_recipe_folder(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "tokenizer: tok.json\nseq_len: 4\nbatch_size: 1\n"
        "sources:\n  - {name: a, path: data/*.jsonl, weight: 1}\n")
    recipe = mixer.load_recipe(tmp_path / "r.yaml")
    assert recipe.resolve(recipe.tokenizer) == str(tmp_path / "tok.json")
    assert recipe.resolve("s3://bucket/x") == "s3://bucket/x"


def test_yaml_is_loaded_safely(tmp_path):
    (tmp_path / "r.yaml").write_text("seed: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(mixer.RecipeError, match="not valid YAML"):
        mixer.load_recipe(tmp_path / "r.yaml")


@given(seq_len=st.integers(-5, 5), batch=st.integers(-5, 5))
def test_only_positive_sizes_are_accepted(seq_len, batch):
    data = base(seq_len=seq_len, batch_size=batch)
    if seq_len > 0 and batch > 0:
        assert mixer.load_recipe(data).seq_len == seq_len
    else:
        with pytest.raises(mixer.RecipeError):
            mixer.load_recipe(data)


def test_cli_validate_exit_codes(tmp_path, capsys, tokenizer_path):
    good = tmp_path / "good.yaml"
    good.write_text(f"tokenizer: {tokenizer_path}\nseq_len: 4\nbatch_size: 1\n"
                    "sources: [{name: a, path: x.jsonl, weight: 1}]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tokenizer: t.json\nseq_len: 4\nbatch_size: 1\n"
                   "sources: [{name: a, path: x.jsonl, weight: 1}, {name: b, path: y}]\n")
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(bad)]) != 0
    assert "sources[1].weight" in capsys.readouterr().err
    no_tokenizer = tmp_path / "no_tok.yaml"
    no_tokenizer.write_text(good.read_text().replace(str(tokenizer_path), "missing.json"))
    assert main(["validate", str(no_tokenizer)]) != 0
    assert "tokenizer:" in capsys.readouterr().err
