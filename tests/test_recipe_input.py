"""Fuzzing recipe files: load_recipe returns a Recipe or raises RecipeError, fast, and the
CLI prints an error line, never a traceback. (Examples per run: MIXER_FUZZ_EXAMPLES.)"""

from __future__ import annotations

import os
import time

import pytest
import yaml
from helpers import byte_mutations, make_tokenizer, structural_mutations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.tools.cli import main

EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "60"))
# CI runs a fixed sequence of examples (a random one may, rarely, miss one of the outcomes the
# tests assert they reach); MIXER_FUZZ_RANDOM=1 explores new ones.
DERANDOMIZE = not os.environ.get("MIXER_FUZZ_RANDOM")
SLOW = 5.0  # seconds; a bounded reader answers any of these in well under one

RECIPE = """\
seed: 1234
tokenizer: {tokenizer}
seq_len: 16
batch_size: 4
lanes: 8
packing: best_fit
pack_window: 32
shuffle_window: 64
split_bytes: 4096
manifest: m.json
eos_token: <|endoftext|>
sources:
  - name: prose
    path: data/prose/*.jsonl
    weight: 0.5
    epochs: 2
    storage_options: &opts {{anon: true, client_kwargs: {{region_name: eu}}}}
  - name: code
    path: [data/code/*.parquet, "data/more/*.parquet"]
    text_field: content
    format: parquet
    weight: 3
    on_error: skip
    storage_options: *opts
"""
# Characters that mean something to YAML, and bytes that are not UTF-8.
YAML_BYTES = b"&*!|>-?:[]{},#%@`'\"\\\n\t 0.e+\x00\xff\xc3"
SNIPPETS = [
    "!!int abc",
    "!!float x",
    "!!timestamp 2020-99",
    "!!binary ***",
    "*opts",
    "&x",
    "!!python/object/apply:os.system ['true']",
    "[" * 200,
    "{a: " * 80,
    "<<: *opts",
    "? [a]\n: 1",
    "!!set {a, b}",
    ".nan",
    ".inf",
    "9" * 5000,
    "1.0e+999",
    "---",
    '"\\0"',
    '"\\ud800"',
    "!!str",
    "~",
    "- - - - - - - - - - x",
]


@pytest.fixture(scope="module")
def recipe_text(tmp_path_factory) -> str:
    tokenizer = make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return RECIPE.format(tokenizer=tokenizer)


def check(path, capsys) -> bool:
    """True when the file is a valid recipe, False when it is refused with a RecipeError."""
    start = time.perf_counter()
    try:
        recipe = mixer.load_recipe(path)
    except mixer.RecipeError:
        recipe = None
    assert time.perf_counter() - start < SLOW
    assert recipe is None or isinstance(recipe, mixer.Recipe)
    code = main(["validate", str(path)])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err
    assert (code == 0) == (err == ""), err
    if recipe is None:
        assert code == 2
    return recipe is not None


def test_the_fuzzed_recipe_is_valid(recipe_text, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(recipe_text)
    assert mixer.load_recipe(path).sources[0].storage_options["anon"] is True
    assert main(["validate", str(path)]) == 0


def test_byte_mutated_recipe_files(recipe_text, tmp_path, capsys):
    path = tmp_path / "r.yaml"

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(byte_mutations(recipe_text.encode(), YAML_BYTES))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        check(path, capsys)

    run()


def test_structurally_mutated_recipe_files(recipe_text, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    data = yaml.safe_load(recipe_text)

    outcomes: set[bool] = set()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        structural_mutations(data),
        st.lists(st.tuples(st.integers(0, 40), st.sampled_from(SNIPPETS)), max_size=2),
    )
    def run(mutated, snippets) -> None:
        lines = yaml.safe_dump(mutated, allow_unicode=True).splitlines(keepends=True)
        for at, snippet in snippets:  # raw YAML (tags, aliases, nesting) inside a line
            at = min(at, len(lines))
            line = lines[at] if at < len(lines) else ""
            cut = line.find(": ") + 2 if ": " in line else len(line.rstrip("\n"))
            lines[at : at + 1] = [line[:cut] + snippet + "\n"]
        path.write_text("".join(lines))
        outcomes.add(check(path, capsys))

    run()
    assert outcomes == {True, False}  # the edits reach both sides of the check


def test_mutated_dict_recipes(recipe_text):
    data = yaml.safe_load(recipe_text)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE)
    @given(structural_mutations(data))
    def run(mutated) -> None:
        try:
            recipe = mixer.load_recipe(mutated) if isinstance(mutated, dict) else None
        except mixer.RecipeError:
            return
        assert recipe is None or all(0 < w <= 1 for w in recipe.weights)

    run()
