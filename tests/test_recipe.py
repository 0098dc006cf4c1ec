"""Recipes: validated into frozen config, errors name the field path."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

import mixer
from mixer.tools.cli import main


def base(**overrides) -> dict:
    recipe = {
        "tokenizer": "tok.json",
        "seq_len": 8,
        "batch_size": 2,
        "sources": [
            {"name": "a", "path": "a/*.jsonl", "weight": 1},
            {"name": "b", "path": ["b/*.jsonl", "c/*.parquet"], "weight": 2},
        ],
    }
    recipe.update(overrides)
    return recipe


@pytest.mark.parametrize(
    "change,path",
    [
        ({"seq_len": 0}, "seq_len"),
        ({"packing": "zigzag"}, "packing"),
        ({"colour": "red"}, "colour"),
        (
            {
                "sources": [
                    {"name": "a", "path": "x", "weight": 1},
                    {"name": "b", "path": "y", "weight": -1},
                ]
            },
            "sources[1].weight",
        ),
        ({"sources": [{"name": "a", "path": "x", "weight": 1, "epochs": 0}]}, "sources[0].epochs"),
        (
            {"sources": [{"name": "a", "path": "x", "weight": 1, "format": "csv"}]},
            "sources[0].format",
        ),
        (
            {"sources": [{"name": "a", "path": "x", "weight": 1, "on_error": "ignore"}]},
            "sources[0].on_error",
        ),
        ({"sources": [{"name": "a", "path": "x", "weight": 1, "typo": 1}]}, "sources[0].typo"),
        (
            {
                "sources": [
                    {"name": "a", "path": "x", "weight": 1},
                    {"name": "a", "path": "y", "weight": 1},
                ]
            },
            "sources[1].name",
        ),
        ({"sources": []}, "sources"),
    ],
)
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
        "sources:\n  - {name: a, path: data/*.jsonl, weight: 1}\n"
    )
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
    good.write_text(
        f"tokenizer: {tokenizer_path}\nseq_len: 4\nbatch_size: 1\n"
        "sources: [{name: a, path: x.jsonl, weight: 1}]\n"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "tokenizer: t.json\nseq_len: 4\nbatch_size: 1\n"
        "sources: [{name: a, path: x.jsonl, weight: 1}, {name: b, path: y}]\n"
    )
    assert main(["validate", str(good)]) == 0
    assert main(["validate", str(bad)]) != 0
    assert "sources[1].weight" in capsys.readouterr().err
    no_tokenizer = tmp_path / "no_tok.yaml"
    no_tokenizer.write_text(good.read_text().replace(str(tokenizer_path), "missing.json"))
    assert main(["validate", str(no_tokenizer)]) != 0
    assert "tokenizer:" in capsys.readouterr().err


@pytest.mark.parametrize(("backend", "on_error"), [("hf", "raise"), ("auto", "skip")])
def test_cli_validate_warns_of_each_source_whose_files_are_not_there(
    tmp_path, capsys, tokenizer_path, backend, on_error
):
    """A recipe can be checked before its data exists (exit 0), but never silently: every
    backend's output names each source whose path matches no files."""
    recipe = tmp_path / "later.yaml"
    recipe.write_text(
        f"tokenizer: {tokenizer_path}\nseq_len: 4\nbatch_size: 1\n"
        f"tokenizer_backend: {backend}\n"
        f"sources: [{{name: later, path: nothere/*.jsonl, weight: 1, "
        f"on_error: {on_error}}},\n"
        "          {name: also, path: gone/*.parquet, weight: 1}]\n"
    )
    assert main(["validate", str(recipe)]) == 0
    out = capsys.readouterr()
    assert out.err == ""  # (exit 0 with nothing on stderr, as every command that succeeds)
    warnings = [line for line in out.out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "'later'" in warnings[0] and "nothere/*.jsonl" in warnings[0]
    assert "'also'" in warnings[1] and "gone/*.parquet" in warnings[1]
    assert all("matches no files" in w for w in warnings)


def test_cli_validate_refuses_a_file_that_is_there_but_empty(tmp_path, capsys, tokenizer_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"tokenizer: {tokenizer_path}\nseq_len: 4\nbatch_size: 1\n"
        f"sources: [{{name: e, path: {tmp_path / 'empty.jsonl'}, weight: 1}}]\n"
    )
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "empty shard" in err and "empty.jsonl" in err


# -- hardening: every bad recipe is a RecipeError from load_recipe, at once ---------------------

GOOD_YAML = (
    "tokenizer: t.json\nseq_len: 8\nbatch_size: 2\n"
    "sources: [{name: a, path: x, weight: 1}, {name: b, path: y, weight: 2}]\n"
)


def load_text(tmp_path, text: str | bytes):
    path = tmp_path / "r.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return mixer.load_recipe(path)


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf", "'nan'", "'inf'", "1.0e+999"])
def test_non_finite_weights_are_refused(tmp_path, weight):
    with pytest.raises(mixer.RecipeError, match=r"sources\[0\]\.weight"):
        load_text(tmp_path, GOOD_YAML.replace("weight: 1", f"weight: {weight}"))


@pytest.mark.parametrize(
    "where", ["storage_options: {timeout: .nan}", "storage_options: {a: [1, {b: .inf}]}"]
)
def test_non_finite_numbers_are_refused_anywhere(tmp_path, where):
    with pytest.raises(mixer.RecipeError, match=r"sources\[0\]\.storage_options\..*finite"):
        load_text(tmp_path, GOOD_YAML.replace("weight: 1", f"weight: 1, {where}"))
    with pytest.raises(mixer.RecipeError, match="finite"):
        mixer.load_recipe(base(seed=float("nan")))


def test_weights_whose_sum_overflows_still_normalize():
    recipe = mixer.load_recipe(
        base(
            sources=[
                {"name": "a", "path": "x", "weight": 1e308},
                {"name": "b", "path": "y", "weight": 1e308},
            ]
        )
    )
    assert recipe.weights == [0.5, 0.5]
    assert mixer.load_recipe(base()).weights == [1 / 3, 2 / 3]  # unchanged when it does not


def test_weights_whose_share_is_zero_are_refused():
    with pytest.raises(mixer.RecipeError, match=r"sources\[1\]\.weight.*share"):
        mixer.load_recipe(
            base(
                sources=[
                    {"name": "a", "path": "x", "weight": 1e308},
                    {"name": "b", "path": "y", "weight": 1e-308},
                ]
            )
        )


@pytest.mark.parametrize(
    "key",
    ["parquet", "text", "jsonl", "jsonl.gz", "str", "list[str]", "literal['a']", "function-after"],
)
def test_unknown_source_key_named_like_a_format_keeps_its_name(key):
    with pytest.raises(
        mixer.RecipeError,
        match=rf"sources\[0\]\.{re.escape(key)}: "
        r"unknown key",
    ):
        mixer.load_recipe(base(sources=[{"name": "a", "path": "x", "weight": 1, key: 1}]))


@pytest.mark.parametrize("path", [5, [], [""], ["a", 3], {"a": 1}, None])
def test_bad_path_is_one_error_at_the_path(path):
    with pytest.raises(mixer.RecipeError) as err:
        mixer.load_recipe(base(sources=[{"name": "a", "path": path, "weight": 1}]))
    assert str(err.value) == (
        "invalid recipe: sources[0].path: path must be a non-empty glob "
        "or a non-empty list of globs"
    )


@pytest.mark.parametrize(
    "change,field",
    [
        ({"lanes": 2**40}, "lanes"),
        ({"seq_len": 10**6, "batch_size": 10**6}, "batch_size"),
        ({"seq_len": 2**30}, "seq_len"),
        ({"batch_size": 2**30}, "batch_size"),
        ({"shuffle_window": 2**40}, "shuffle_window"),
        ({"pack_window": 2**40}, "pack_window"),
        ({"split_bytes": 2**50}, "split_bytes"),
        ({"shuffle_window_bytes": 2**50}, "shuffle_window_bytes"),
        ({"max_document_bytes": 2**50}, "max_document_bytes"),
        ({"read_ahead_bytes": 2**50}, "read_ahead_bytes"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seq_len": True}, "seq_len"),
        ({"batch_size": False}, "batch_size"),
        ({"lanes": 2.5}, "lanes"),
        ({"sources": [{"name": "a", "path": "x", "weight": True}]}, "sources[0].weight"),
        (
            {"sources": [{"name": "a", "path": "x", "weight": 1, "epochs": 2**40}]},
            "sources[0].epochs",
        ),
    ],
)
def test_absurd_or_mistyped_numbers_name_their_field(change, field):
    with pytest.raises(mixer.RecipeError, match=rf"{re.escape(field)}:"):
        mixer.load_recipe(base(**change))


def test_large_but_sane_sizes_are_accepted():
    recipe = mixer.load_recipe(base(seq_len=131072, batch_size=64, lanes=4096, seed=2**64 - 1))
    assert recipe.seq_len * recipe.batch_size == 2**23


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_alias_bomb_fails_in_load_recipe_at_once(tmp_path):
    options = "\n".join("      " + line for line in billion_laughs().splitlines())
    text = (
        "tokenizer: t.json\nseq_len: 8\nbatch_size: 2\nsources:\n"
        f"  - name: a\n    path: x\n    weight: 1\n    storage_options:\n{options}\n"
    )
    start = time.perf_counter()
    with pytest.raises(mixer.RecipeError, match="too large.*aliases expanded"):
        load_text(tmp_path, text)
    assert time.perf_counter() - start < 1


def test_shared_structures_in_dict_recipes_are_bounded_too():
    inner: list = ["lol"] * 10
    for _ in range(8):
        inner = [inner] * 10
    start = time.perf_counter()
    with pytest.raises(mixer.RecipeError, match="too large"):
        mixer.load_recipe(
            base(sources=[{"name": "a", "path": "x", "weight": 1, "storage_options": {"x": inner}}])
        )
    assert time.perf_counter() - start < 1
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(mixer.RecipeError, match="nested deeper"):
        mixer.load_recipe(
            base(sources=[{"name": "a", "path": "x", "weight": 1, "storage_options": loop}])
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "text,message",
    [
        (
            GOOD_YAML.encode() + b"x: \xff\xfe\n",
            f"not UTF-8 text (byte offset {len(GOOD_YAML) + 3})",
        ),
        (GOOD_YAML + "x: " + "[" * 500 + "]" * 500 + "\n", "nested deeper than 64"),
        (GOOD_YAML + "x: " + "[" * 5000 + "]" * 5000 + "\n", "line 5, column"),
        (GOOD_YAML + "x:\n" + "- " * 100 + "a\n", "nested deeper than 64"),
        (
            GOOD_YAML.replace("seq_len: 8", "seq_len: !!int abc"),
            "line 2, column 10: cannot read 'abc' as int",
        ),
        (GOOD_YAML + "x: !!timestamp 2020-99\n", "line 5, column 4: cannot read '2020-99'"),
        (GOOD_YAML + "x: !!bool maybe\n", "cannot read 'maybe' as bool"),
        (GOOD_YAML + "x: !!float abc\n", "cannot read 'abc' as float"),
        (GOOD_YAML + "? [a]\n: 1\n", "unhashable key"),
        (GOOD_YAML + "x: " + "9" * 5000 + "\n", "line 5, column 4: cannot read"),
        (GOOD_YAML + "x: &a [*a]\n", "recursive alias"),
        (GOOD_YAML + "x: *nowhere\n", "undefined alias"),
        (GOOD_YAML + "x: [" + ", ".join(["*a"] * 101) + "]\n", "undefined alias"),
        (GOOD_YAML + "x: &a 1\ny: [" + ", ".join(["*a"] * 101) + "]\n", "more than 100 aliases"),
        (GOOD_YAML + "x: [" + "0, " * 100_001 + "]\n", "more than 100,000 values"),
        ("a: " + "x" * (1 << 20) + "\n", "larger than 1,048,576 bytes"),
        (GOOD_YAML + "---\na: 1\n", "expected a single document"),
        (GOOD_YAML + "1: 2\n", "key 1 is not a string"),
        (GOOD_YAML.replace("t.json", '"t\\0.json"'), "tokenizer: text with a NUL"),
        (GOOD_YAML.replace("t.json", '"t\\ud800.json"'), "line 1, column 16"),
        ("", "must be a mapping"),
        ("[1, 2]\n", "must be a mapping"),
    ],
)
def test_bad_recipe_files_are_recipe_errors(tmp_path, text, message):
    with pytest.raises(mixer.RecipeError) as err:
        load_text(tmp_path, text)
    assert message in str(err.value)


@pytest.mark.parametrize("text", ["t\x00.json", "t\ud800.json"])
def test_text_the_os_cannot_take_is_refused(text):
    with pytest.raises(mixer.RecipeError, match="tokenizer: text with a NUL or unpaired"):
        mixer.load_recipe(base(tokenizer=text))


def test_cli_validate_prints_no_traceback_for_bad_files(tmp_path, capsys):
    for i, text in enumerate(
        [
            b"\xff\xfe",
            b"a: " + b"[" * 5000,
            b"seq_len: !!int abc",
            billion_laughs().encode(),
            b"? [a]\n: 1\n",
        ]
    ):
        path = tmp_path / f"r{i}.yaml"
        path.write_bytes(text)
        assert main(["validate", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read recipe" in capsys.readouterr().err


@given(
    lanes=st.integers(1, 4096), budget=st.integers(1 << 16, 1 << 40), window=st.integers(1, 1 << 40)
)
def test_window_bytes_is_an_equal_share_of_the_shuffle_budget(lanes, budget, window):
    """Each (lane, source) window gets at most its share of the budget, so all windows
    together never exceed it; the share depends on recipe values only (no topology)."""
    recipe = mixer.load_recipe(
        base(lanes=lanes, shuffle_budget_bytes=budget, shuffle_window_bytes=window)
    )
    streams = lanes * len(recipe.sources)
    assert 1 <= recipe.window_bytes <= window
    assert recipe.window_bytes * streams <= max(budget, streams)
    if window <= budget // streams:
        assert recipe.window_bytes == window


def test_shuffle_budget_below_64_kib_is_refused():
    with pytest.raises(mixer.RecipeError, match="shuffle_budget_bytes"):
        mixer.load_recipe(base(shuffle_budget_bytes=1000))
