"""A damaged manifest is a RecipeError naming `manifest` and where inside it.
(Fuzz examples per run: MIXER_FUZZ_EXAMPLES.)"""

from __future__ import annotations

import json
import os

import pytest
from helpers import byte_mutations, structural_mutations
from hypothesis import HealthCheck, given, settings

import mixer
from mixer.sources.manifest import list_sources, write_manifest

EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "30"))
# CI runs a fixed sequence of examples (a random one may, rarely, miss one of the outcomes the
# tests assert they reach); MIXER_FUZZ_RANDOM=1 explores new ones.
DERANDOMIZE = not os.environ.get("MIXER_FUZZ_RANDOM")


@pytest.fixture
def indexed(three_sources, tmp_path):
    """(a recipe with a manifest, the manifest's path, its data)."""
    recipe, _ = three_sources
    recipe = mixer.load_recipe({**recipe, "manifest": str(tmp_path / "m.json")})
    path = tmp_path / "m.json"
    write_manifest(recipe, path)
    return recipe, path, json.loads(path.read_text())


def test_a_written_manifest_is_read(indexed):
    recipe, _, data = indexed
    tables = list_sources(recipe)
    assert [len(t.files) for t in tables] == [
        len(data["sources"][s.name]["files"]) for s in recipe.sources
    ]


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "null",
        "1",
        '"x"',
        "{}",
        "[" * 100_000,
        "not json",
        '{"format": "mixer.manifest", "version": 1, "sources": {}}',
    ],
)
def test_a_manifest_that_is_not_one(indexed, text):
    recipe, path, _ = indexed
    path.write_text(text)
    with pytest.raises(mixer.RecipeError, match="^manifest: "):
        list_sources(recipe)


def test_a_manifest_without_sources(indexed):
    recipe, path, data = indexed
    del data["sources"]
    path.write_text(json.dumps(data))
    with pytest.raises(mixer.RecipeError, match="^manifest: .* damaged at sources: Field required"):
        list_sources(recipe)


@pytest.mark.parametrize(
    "edit,where",
    [
        (lambda s: s.update(files=5), "sources.prose.files"),
        (lambda s: s["files"][0].__setitem__(2, "12"), r"sources.prose.files\[0\].2"),
        (lambda s: s["files"][0].__setitem__(3, "csv"), r"sources.prose.files\[0\].3"),
        (lambda s: s["files"][0].pop(), r"sources.prose.files\[0\]"),
        (lambda s: s["splits"][0].__setitem__(0, 99), r"sources.prose.splits\[0\]: no such file"),
        (lambda s: s["splits"][0].__setitem__(1, -5), r"sources.prose.splits\[0\].1"),
        (lambda s: s.pop("key"), "sources.prose.key"),
        (lambda s: s.update(skipped=None), "sources.prose.skipped"),
    ],
)
def test_a_damaged_manifest_entry_is_named(indexed, edit, where):
    recipe, path, data = indexed
    edit(data["sources"]["prose"])
    path.write_text(json.dumps(data))
    with pytest.raises(mixer.RecipeError, match=rf"^manifest: .* damaged at {where}"):
        list_sources(recipe)


def read_or_refuse(recipe, path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        list_sources(recipe)
    except mixer.RecipeError as exc:
        assert str(exc).startswith("manifest: ")


def test_fuzz_structurally_edited_manifests(indexed):
    recipe, path, data = indexed

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(structural_mutations(data))
    def run(mutated) -> None:
        read_or_refuse(recipe, path, json.dumps(mutated))

    run()


def test_fuzz_byte_mutated_manifests(indexed):
    recipe, path, _ = indexed
    original = path.read_bytes()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(byte_mutations(original, b'{}[]",:0123456789-'))
    def run(mutated: bytes) -> None:
        read_or_refuse(recipe, path, mutated)

    run()
