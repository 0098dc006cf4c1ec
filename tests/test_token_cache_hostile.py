"""Token cache under hostile conditions (issue 20): `mixer cache` processes filling one cache
at once, recipes with other tokenizers sharing it, entries damaged in every way we could
think of, and caches that cannot be written (read-only, full). Each asserts the batches a
run without a cache gives, and that the fallback was taken.

(Fuzz examples per run: MIXER_FUZZ_EXAMPLES; MIXER_FUZZ_RANDOM=1 explores new ones.)"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import procs
import pytest
import yaml
from helpers import JUNK, apply_ops, batch_digest, corpus, doc_text, make_tokenizer, write_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.cache import store as cache_module
from mixer.cache.fill import fill_cache
from mixer.cache.store import CACHE_STATS, TokenCache, seal_commit
from mixer.sources import FORMATS
from mixer.sources.indexed import token_dtype
from mixer.sources.manifest import list_sources
from mixer.tokenize import resolve_tokenizer

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "15"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("MIXER_FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow],
)
PARTS = ("bin", "idx", "rec", "json")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


# -- data, runs and outcomes --------------------------------------------------------------------


def write_sources(folder: Path) -> None:
    """Source a: jsonl byte-range splits, one holding a malformed line mid-split; source b:
    parquet row groups; source c: a whole zstd file."""
    docs = corpus(0, 50, max_len=24)
    write_docs(folder / "a" / "a0.jsonl", docs, "jsonl")
    lines = (folder / "a" / "a0.jsonl").read_text().splitlines(keepends=True)
    lines.insert(12, "{not json\n")
    (folder / "a" / "a0.jsonl").write_text("".join(lines))
    write_docs(
        folder / "b" / "b0.parquet",
        corpus(1000, 24, min_len=5, max_len=40),
        "parquet",
        row_group_size=9,
    )
    write_docs(folder / "c" / "c0.jsonl.zst", corpus(2000, 20, max_len=12), "jsonl.zst")


def make_recipe(
    folder: Path,
    tokenizer: Path,
    cache: Path | None,
    *,
    strict: bool = False,
    sources: str = "abc",
    **extra,
) -> dict:
    """A finite recipe (one epoch of each source) over `write_sources`' data."""
    table = {
        "a": {
            "name": "a",
            "path": str(folder / "a" / "*.jsonl"),
            "weight": 0.5,
            "on_error": "raise" if strict else "skip",
        },
        "b": {"name": "b", "path": str(folder / "b" / "*.parquet"), "weight": 0.3},
        "c": {"name": "c", "path": str(folder / "c" / "*.zst"), "weight": 0.2},
    }
    recipe = {
        "seed": 5,
        "tokenizer": str(tokenizer),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 1,
        "shuffle_window": 6,
        "shuffle_window_bytes": 400,
        "split_bytes": 1200,
        "sources": [{**table[s], "epochs": 1} for s in sources],
        **extra,
    }
    if cache is not None:
        recipe["token_cache"] = str(cache)
    return recipe


def without_cache(recipe: dict) -> dict:
    return {k: v for k, v in recipe.items() if k != "token_cache"}


@dataclass(frozen=True)
class Outcome:
    """What a run delivered: its batches' digests, skip counts and the error that ended it."""

    batches: tuple[str, ...]
    skipped: str
    error: tuple | None


def outcome(recipe: dict, *, workers: int = 0) -> Outcome:
    """Run `recipe` to its end (or to the error that stops it)."""
    loader = mixer.build_loader(recipe, num_workers=workers)
    batches: list[str] = []
    error = None
    try:
        for batch in loader:
            batches.append(batch_digest(batch))
    except mixer.DataError as err:
        error = (str(err), err.source, err.file, err.location)
    finally:
        loader.close()
    metrics = loader.metrics()
    skipped = json.dumps([metrics["skipped"], metrics["skipped_by_reason"]], sort_keys=True)
    return Outcome(tuple(batches), skipped, error)


def commits(cache: Path) -> list[Path]:
    """Committed entries (not the `tokenizers/` folder)."""
    return sorted(cache.glob("??/*.json"))


def keys_of(recipe: dict) -> set[str]:
    """Entry keys of every split of the recipe's text sources."""
    loaded = mixer.load_recipe(recipe)
    info = resolve_tokenizer(loaded.resolve(loaded.tokenizer), loaded.eos_token)
    cache = TokenCache(loaded.resolve(loaded.token_cache), info)
    keys = set()
    for src, table in zip(loaded.sources, list_sources(loaded)):
        for split in table.splits:
            entry = table.files[split.file]
            field = src.chosen_text_field or FORMATS[entry.format].default_text_field
            keys.add(cache.key(entry, split, text_field=field, max_bytes=loaded.max_document_bytes))
    return keys


def assert_trustworthy(recipe: dict) -> None:
    """Every committed entry passes every check (a folder in a commit's place is none);
    no temporary file is left behind."""
    loaded = mixer.load_recipe(recipe)
    info = resolve_tokenizer(loaded.resolve(loaded.tokenizer), loaded.eos_token)
    cache = TokenCache(recipe["token_cache"], info)
    for commit in filter(Path.is_file, commits(Path(recipe["token_cache"]))):
        assert cache.load(commit.stem, check_tokens=True) is not None, commit
    assert not list(Path(recipe["token_cache"]).rglob("*.tmp-*"))


def write_recipe(recipe: dict, folder: Path, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def cache_command(recipe_path: Path) -> list[str]:
    return [sys.executable, "-m", "mixer", "cache", str(recipe_path), "--no-progress"]


# -- 1. `mixer cache` processes filling one cache at once ---------------------------------------
# (Two processes on one recipe: test_token_cache.py::test_two_processes_filling_one_cache_at_once.)


def test_cache_processes_on_recipes_sharing_sources_while_a_run_reads(tmp_path):
    """Two `mixer cache` processes started together on two recipes that share a source
    (with other lanes, seed and weights; each has a source of its own), while runs in this
    process read and write the same cache. Both succeed; every run gives the batches of a
    run without a cache; the cache ends holding every split of both, each entry whole, and
    warm runs read only from it."""
    tok = make_tokenizer(tmp_path / "tok.json")
    write_sources(tmp_path)
    first = make_recipe(tmp_path, tok, tmp_path / "cache", sources="ab", split_bytes=300)
    second = {
        **make_recipe(tmp_path, tok, tmp_path / "cache", sources="bc", split_bytes=300),
        "seed": 9,
        "lanes": 3,
    }
    second["sources"][0]["weight"] = 0.6
    references = [outcome(without_cache(r)) for r in (first, second)]
    started = [
        procs.spawn(cache_command(write_recipe(r, tmp_path, name)), env=ENV)
        for r, name in ((first, "first"), (second, "second"))
    ]
    runs = 0
    while any(proc.poll() is None for proc in started) or runs < 2:
        assert outcome(first) == references[0]
        runs += 1
    for proc in started:
        done = procs.finish(proc, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    shared = keys_of(first) & keys_of(second)
    assert shared and keys_of(first) - shared and keys_of(second) - shared
    assert {c.stem for c in commits(tmp_path / "cache")} == keys_of(first) | keys_of(second)
    assert_trustworthy(first)
    for recipe, reference in zip((first, second), references):
        CACHE_STATS.reset()
        assert outcome(recipe) == reference
        assert CACHE_STATS.misses == 0 and CACHE_STATS.corrupt == 0 and CACHE_STATS.hits > 0


# -- 2. recipes with other tokenizers sharing a cache -------------------------------------------


def train_bpe(path: Path, texts: list[str]) -> Path:
    """A small byte-pair tokenizer trained on `texts` (ids unlike the word-level one's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=90, special_tokens=["<pad>", "<|endoftext|>"], show_progress=False
        ),
    )
    tok.save(str(path))
    return path


def wide_tokenizer(path: Path) -> Path:
    """A word-level tokenizer of more than 65,500 ids: its entries hold int32 tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<|endoftext|>": 1}
    for i in range(70000):
        vocab[f"w{(i * 7919) % 70000}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<|endoftext|>"])
    tok.save(str(path))
    return path


def test_recipes_with_other_tokenizers_share_a_cache_without_mixing(tmp_path):
    """A word-level tokenizer, the same file with another EOS token, a trained BPE, and a
    wide (int32) vocabulary: each recipe's cold and warm runs give its no-cache batches,
    whatever the others stored first, and no entry serves two of them."""
    write_sources(tmp_path)
    word = make_tokenizer(tmp_path / "word.json")
    texts = [doc_text(d, n) for d, n in corpus(0, 200, max_len=5)]
    bpe = train_bpe(tmp_path / "bpe.json", texts)
    wide = wide_tokenizer(tmp_path / "wide.json")
    recipes = [
        make_recipe(tmp_path, word, tmp_path / "cache"),
        {**make_recipe(tmp_path, word, tmp_path / "cache"), "eos_token": "<pad>"},
        make_recipe(tmp_path, bpe, tmp_path / "cache"),
        make_recipe(tmp_path, wide, tmp_path / "cache"),
    ]
    references = [outcome(without_cache(r)) for r in recipes]
    assert len(set(references)) == len(recipes)  # (the tokenizers differ in their ids)
    for recipe, reference in zip(recipes, references):  # cold, one after the other
        CACHE_STATS.reset()
        assert outcome(recipe) == reference
        assert CACHE_STATS.hits == 0 and CACHE_STATS.writes > 0
    for recipe, reference in zip(recipes, references):  # warm, each among the others
        CACHE_STATS.reset()
        assert outcome(recipe) == reference
        assert CACHE_STATS.misses == 0 and CACHE_STATS.corrupt == 0
    keys = [keys_of(r) for r in recipes]
    assert sum(map(len, keys)) == len(set().union(*keys))  # disjoint
    assert {c.stem for c in commits(tmp_path / "cache")} == set().union(*keys)
    for recipe, own in zip(recipes, keys):
        info = resolve_tokenizer(recipe["tokenizer"], recipe.get("eos_token"))
        code = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}[token_dtype(info.vocab_size)]
        for key in own:
            idx = (tmp_path / "cache" / key[:2] / f"{key}.idx").read_bytes()
            tokens = np.fromfile(
                tmp_path / "cache" / key[:2] / f"{key}.bin", token_dtype(info.vocab_size)
            )
            assert idx[17] == code and int(tokens.max()) < info.vocab_size
    assert len(list((tmp_path / "cache" / "tokenizers").glob("*.json"))) == len(recipes)


# -- 3. damaged entries -------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """A pristine cache of small blocks (many per .bin) and the no-cache outcomes."""

    folder: Path
    tokenizer: Path
    pristine: Path
    keys: tuple[str, ...]  # entries, those with error records first
    reference: Outcome  # on_error: skip
    strict: Outcome  # on_error: raise


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    folder = tmp_path_factory.mktemp("damage")
    tok = make_tokenizer(folder / "tok.json")
    write_sources(folder)
    recipe = make_recipe(folder, tok, folder / "pristine")
    block = cache_module.BIN_BLOCK
    cache_module.BIN_BLOCK = 64
    try:
        loaded = mixer.load_recipe(recipe)
        fill_cache(loaded, tables=list_sources(loaded), progress=False)
    finally:
        cache_module.BIN_BLOCK = block
    found = commits(folder / "pristine")
    with_errors = [c.stem for c in found if json.loads(c.read_text())["errors"]]
    assert with_errors and len(found) >= 6
    keys = tuple(with_errors + [c.stem for c in found if c.stem not in with_errors])
    return World(
        folder,
        tok,
        folder / "pristine",
        keys,
        outcome(without_cache(recipe)),
        outcome(without_cache(make_recipe(folder, tok, None, strict=True))),
    )


_cases = itertools.count()


def fresh_cache(world: World) -> Path:
    """A copy of the pristine cache of its own (its own root: nothing carries over)."""
    copy = world.folder / f"case{next(_cases)}"
    shutil.copytree(world.pristine, copy)
    return copy


def entry_base(cache: Path, key: str) -> Path:
    return cache / key[:2] / key


def reseal(base: Path, part: str) -> None:
    """Make the commit agree with the (damaged) `part`: its size and CRC-32(s) recomputed,
    the commit sealed again, as a writer that stored a wrong object would have done."""
    commit = json.loads(base.with_suffix(".json").read_bytes())
    commit.pop("check", None)
    if part in ("idx", "rec"):
        data = base.with_suffix(f".{part}").read_bytes()
        commit[part] = [len(data), zlib.crc32(data)]
    elif part == "bin":
        data = base.with_suffix(".bin").read_bytes()
        block = commit["bin"][1]
        commit["bin"] = [
            len(data),
            block,
            [zlib.crc32(data[at : at + block]) for at in range(0, len(data), block)],
        ]
    base.with_suffix(".json").write_bytes(seal_commit(commit))


def check_damage(
    world: World, key: str, damage: Callable[[Path], bool], consistent_part: str | None = None
) -> None:
    """Damage entry `key` of a fresh cache; the loader (strict and skipping) gives the
    no-cache outcomes, having taken the fallback (a miss, or damage counted) when the
    damage changed anything; a second run does too, from a cache holding no bad entry."""
    cache = fresh_cache(world)
    base = entry_base(cache, key)
    changed = damage(base)
    if consistent_part is not None and changed:
        reseal(base, consistent_part)
    strict = make_recipe(world.folder, world.tokenizer, cache, strict=True)
    recipe = make_recipe(world.folder, world.tokenizer, cache)
    CACHE_STATS.reset()
    assert outcome(strict) == world.strict
    assert outcome(recipe) == world.reference
    if changed:
        assert CACHE_STATS.corrupt + CACHE_STATS.misses >= 1, "a damaged entry was trusted"
    CACHE_STATS.reset()
    assert outcome(recipe) == world.reference
    if not any(p.is_dir() for p in base.parent.glob(f"{key}.*")):  # (nothing in the way)
        assert CACHE_STATS.misses == 0 and CACHE_STATS.corrupt == 0
        assert_trustworthy(recipe)


def rewrite(part: str, edit: Callable[[bytes], bytes]) -> Callable[[Path], bool]:
    """A damage that replaces the bytes of `part` with `edit(bytes)`."""

    def damage(base: Path) -> bool:
        path = base.with_suffix(f".{part}")
        data = path.read_bytes()
        path.write_bytes(edit(data))
        return path.read_bytes() != data

    return damage


def flip(at: int, mask: int = 0xFF) -> Callable[[bytes], bytes]:
    def edit(data: bytes) -> bytes:
        out = bytearray(data)
        if out:
            out[at % len(out)] ^= mask or 1
        return bytes(out)

    return edit


def cut(at: int) -> Callable[[bytes], bytes]:
    return lambda data: data[:at]


def idx_boundaries(data: bytes) -> list[int]:
    """Offsets where the .idx's fields begin: magic, version, dtype, counts, lengths,
    pointers, document indices, and its last byte."""
    sequences = struct.unpack_from("<Q", data, 18)[0]
    return [
        0,
        1,
        8,
        9,
        16,
        17,
        18,
        25,
        26,
        33,
        34,
        34 + 4 * sequences,
        34 + 12 * sequences,
        len(data) - 8,
        len(data) - 1,
    ]


def boundaries(part: str, data: bytes, block: int) -> list[int]:
    """Offsets to truncate `part` at: each structural boundary of it."""
    if part == "idx":
        return idx_boundaries(data)
    if part == "rec":
        return [0, 8, 16, 24, 31, 32, 33, len(data) - 32, len(data) - 8, len(data) - 1]
    if part == "bin":
        return sorted(
            {0, 1, block - 1, block, block + 2, len(data) // 2, len(data) - 2, len(data) - 1}
        )
    return [0, 1, len(data) // 2, len(data) - 2, len(data) - 1]


def test_each_part_truncated_at_each_structural_boundary(world):
    key = world.keys[0]
    for part in PARTS:
        data = entry_base(world.pristine, key).with_suffix(f".{part}").read_bytes()
        for at in boundaries(part, data, 64):
            check_damage(world, key, rewrite(part, cut(at)))


def test_each_header_byte_of_the_index_flipped(world):
    """Magic, version, dtype code and counts: each byte flipped, with the commit's CRC of the
    .idx left as it was and made to agree (as a writer of a wrong index would)."""
    for at in range(34):
        check_damage(world, world.keys[0], rewrite("idx", flip(at)), "idx")
    for at in (0, 9, 17, 18, 26):
        check_damage(world, world.keys[0], rewrite("idx", flip(at)))


def same_width_dtype(data: bytes) -> bytes:
    """The .idx with its dtype code replaced by int16's: the same width as uint16."""
    return data[:17] + bytes([3]) + data[18:]


def pointers_past_the_bin(data: bytes) -> bytes:
    """The .idx with its last sequence pointer moved past the end of the .bin."""
    sequences = struct.unpack_from("<Q", data, 18)[0]
    at = 34 + 4 * sequences + 8 * (sequences - 1)
    return data[:at] + struct.pack("<q", 1 << 40) + data[at + 8 :]


def other_version(data: bytes) -> bytes:
    return data[:9] + struct.pack("<Q", 2) + data[17:]


def other_magic(data: bytes) -> bytes:
    return b"MMIDIDY\x00\x00" + data[9:]


def swapped_documents(data: bytes) -> bytes:
    """Two documents' numbers in the record table exchanged (each row still well formed)."""
    rows = np.frombuffer(data, np.int64).reshape(-1, 4).copy()
    docs = np.flatnonzero(rows[:, 3] >= 0)
    rows[docs[0], 3], rows[docs[1], 3] = rows[docs[1], 3], rows[docs[0], 3]
    return rows.tobytes()


def error_as_document(data: bytes) -> bytes:
    rows = np.frombuffer(data, np.int64).reshape(-1, 4).copy()
    rows[np.flatnonzero(rows[:, 3] < 0)[0], 3] = 0
    return rows.tobytes()


def document_past_the_index(data: bytes) -> bytes:
    rows = np.frombuffer(data, np.int64).reshape(-1, 4).copy()
    rows[-1, 3] = 1 << 20
    return rows.tobytes()


def unknown_error(data: bytes) -> bytes:
    rows = np.frombuffer(data, np.int64).reshape(-1, 4).copy()
    rows[np.flatnonzero(rows[:, 3] < 0)[0], 3] = -50
    return rows.tobytes()


def indices_out_of_order(data: bytes) -> bytes:
    rows = np.frombuffer(data, np.int64).reshape(-1, 4).copy()
    rows[[1, 2], 0] = rows[[2, 1], 0]
    return rows.tobytes()


@pytest.mark.parametrize(
    "part,edit",
    [
        ("idx", same_width_dtype),
        ("idx", pointers_past_the_bin),
        ("idx", other_version),
        ("idx", other_magic),
        ("rec", swapped_documents),
        ("rec", error_as_document),
        ("rec", document_past_the_index),
        ("rec", unknown_error),
        ("rec", indices_out_of_order),
        ("idx", lambda data: data + b"\x00" * 8),
    ],
)
def test_a_wrong_index_or_record_table_whose_checksum_agrees(world, part, edit):
    """Objects a broken writer could have stored, with their CRCs in the commit: the entry is
    refused by its structure (or, trailing bytes, read the same)."""
    for consistent in (None, part):
        check_damage(world, world.keys[0], rewrite(part, edit), consistent)


def replace_with(kind: str, part: str) -> Callable[[Path], bool]:
    """The object `part` missing, empty, a folder, or random bytes of the same length."""

    def damage(base: Path) -> bool:
        path = base.with_suffix(f".{part}")
        size = path.stat().st_size
        path.unlink()
        if kind == "folder":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "garbage":
            path.write_bytes(np.random.default_rng(size).bytes(size))
        return True

    return damage


@pytest.mark.parametrize("kind", ["missing", "empty", "folder", "garbage"])
def test_each_object_missing_empty_a_folder_or_garbage(world, kind):
    for key in world.keys[:2]:
        for part in PARTS:
            check_damage(world, key, replace_with(kind, part))


def test_a_folder_in_one_entrys_place_leaves_the_rest_writable(world, caplog):
    """A folder where one entry's commit goes is that entry's problem: it is read from the
    source each time, and the cache still writes the others (no warning)."""
    import logging

    cache = fresh_cache(world)
    blocked, removed = world.keys[0], world.keys[1]
    commit = entry_base(cache, blocked).with_suffix(".json")
    commit.unlink()
    commit.mkdir()
    entry_base(cache, removed).with_suffix(".json").unlink()
    recipe = make_recipe(world.folder, world.tokenizer, cache)
    CACHE_STATS.reset()
    with caplog.at_level(logging.WARNING, logger="mixer.token_cache"):
        assert outcome(recipe) == world.reference
    assert not [r for r in caplog.records if r.name == "mixer.token_cache"]
    assert CACHE_STATS.corrupt == 1 and CACHE_STATS.writes == 1
    assert entry_base(cache, removed).with_suffix(".json").is_file()
    assert_trustworthy(recipe)


def test_a_deeply_nested_tokenizer_info_means_a_real_load(world):
    """`<token_cache>/tokenizers/*.json` is part of the cache folder too: nonsense nested
    past the recursion limit must read as a miss, like other damage to it."""
    cache = fresh_cache(world)
    for stored in (cache / "tokenizers").glob("*.json"):
        stored.write_bytes(b"[" * 100000)
    assert outcome(make_recipe(world.folder, world.tokenizer, cache)) == world.reference


def junk_commit(path: tuple, junk: object) -> Callable[[Path], bool]:
    """The commit with the value at `path` replaced by `junk`, sealed again."""

    def damage(base: Path) -> bool:
        commit = json.loads(base.with_suffix(".json").read_bytes())
        commit.pop("check", None)
        parent = commit
        try:
            for part in path[:-1]:
                parent = parent[part]
            before = parent[path[-1]]
        except (IndexError, KeyError):
            return False  # (an entry without error records)
        parent[path[-1]] = junk
        base.with_suffix(".json").write_bytes(seal_commit(commit))
        return type(before) is not type(junk) or before != junk

    return damage


COMMIT_PATHS = [
    ("v",),
    ("records",),
    ("documents",),
    ("errors",),
    ("errors", 0),
    ("errors", 0, 1),
    ("idx",),
    ("idx", 0),
    ("idx", 1),
    ("rec",),
    ("rec", 1),
    ("bin",),
    ("bin", 0),
    ("bin", 1),
    ("bin", 2),
    ("bin", 2, 0),
]
NASTY_JSON = [
    b"",
    b"\x00",
    b"[" * 100000,
    b"{" * 50000,
    b"null",
    b"[]",
    b"{}",
    b'"x"',
    b"1e999",
    b'{"v": 3}',
    b"\xff\xfe{",
    b'{"v": NaN}',
]


def test_garbage_and_structurally_wrong_commits(world):
    """Nonsense in place of the commit (deep nesting included), and each field of a sealed
    commit replaced by values of the wrong type or range."""
    key = world.keys[0]
    for text in NASTY_JSON:
        check_damage(world, key, rewrite("json", lambda _, text=text: text))
    for path in COMMIT_PATHS:
        for junk in (None, -1, "x", [[1, 2]]):
            check_damage(world, key, junk_commit(path, junk))


byte_ops = st.lists(
    st.tuples(
        st.sampled_from(["flip", "flip", "truncate", "insert"]),
        st.integers(0, 1 << 12),
        st.binary(min_size=1, max_size=8),
    ),
    min_size=1,
    max_size=3,
)


@FUZZ
@given(data=st.data())
def test_fuzzed_damage_never_yields_wrong_tokens(world, data):
    """Random byte damage to one object of one entry (any object; the commit left as it
    was), or to the .idx and the record table's document column with the commit made to
    agree: the no-cache outcome, with the fallback taken."""
    key = data.draw(st.sampled_from(world.keys))
    consistent = data.draw(st.booleans())
    if not consistent:
        part = data.draw(st.sampled_from(PARTS))
        ops = data.draw(byte_ops)
        check_damage(world, key, rewrite(part, lambda b: apply_ops(b, ops)))
        return
    part = data.draw(st.sampled_from(["idx", "rec"]))
    if part == "idx":
        ops = data.draw(byte_ops)
        check_damage(world, key, rewrite("idx", lambda b: apply_ops(b, ops)), "idx")
        return
    rows = len(entry_base(world.pristine, key).with_suffix(".rec").read_bytes()) // 32
    row = data.draw(st.integers(0, rows - 1))
    byte = data.draw(st.integers(0, 7))
    mask = data.draw(st.integers(1, 255))
    check_damage(world, key, rewrite("rec", flip(row * 32 + 24 + byte, mask)), "rec")


@FUZZ
@given(data=st.data())
def test_fuzzed_commits_never_yield_wrong_tokens(world, data):
    """A sealed commit with one of its fields replaced by junk of another type or value."""
    key = data.draw(st.sampled_from(world.keys))
    path = data.draw(st.sampled_from(COMMIT_PATHS))
    junk = data.draw(st.sampled_from([j for j in JUNK if j == j]))  # (no NaN: never equal)
    check_damage(world, key, junk_commit(path, junk))


# -- 4. caches that cannot be written -----------------------------------------------------------

UNWRITABLE = """
import json, os, resource, signal, sys
plan = json.loads(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # (a write past RLIMIT_FSIZE fails with EFBIG)
import concurrent.futures.process, yaml, mixer, mixer.tools.cli, mixer.cache.fill
from mixer.cache import spill
from mixer.cache.store import CACHE_STATS
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from helpers import batch_digest
spill.SPILL_BUFFER = 64   # (so the spill files are written too)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
for phase in plan:
    if phase["user"] is not None:   # root writes anywhere: run on as an unprivileged user
        os.setgroups([]); os.setgid(phase["user"]); os.setuid(phase["user"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (phase["limit"] or hard, hard))
    CACHE_STATS.reset()
    loader = mixer.build_loader(phase["recipe"], num_workers=phase["workers"])
    batches = [batch_digest(batch) for batch in loader]
    metrics = loader.metrics()
    stats = [CACHE_STATS.hits, CACHE_STATS.misses, CACHE_STATS.writes]
    code = mixer.tools.cli.main(["cache", phase["path"], "--no-progress"])
    print("REPORT", json.dumps({"batches": batches, "stats": stats, "cache_exit": code,
                      "skipped": json.dumps([metrics["skipped"], metrics["skipped_by_reason"]],
                                            sort_keys=True)}), flush=True)
"""


@dataclass(frozen=True)
class Unwritable:
    """Runs (then `mixer cache`) over caches that cannot be written, in one subprocess."""

    folder: Path
    recipes: dict[str, dict]  # full, workers, read-only
    references: dict[str, Outcome]
    reports: dict[str, dict]
    stderr: str
    listing: list  # the read-only cache's files and sizes before the run


def listing(folder: Path) -> list:
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def unwritable() -> Iterator[Unwritable]:
    """A full cache (files may not grow past 1200 bytes: RLIMIT_FSIZE, a real OS limit;
    writes fail with EFBIG), the same with two DataLoader workers (past 100 bytes), then a
    read-only cache holding every other entry (for root too: the process drops to an
    unprivileged user), in a folder that user can read (pytest's are private)."""
    folder = Path(tempfile.mkdtemp(prefix="mixer-hostile-"))
    folder.chmod(0o755)
    try:
        yield _run_unwritable(folder)
    finally:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(folder)


def _run_unwritable(folder: Path) -> Unwritable:
    tok = make_tokenizer(folder / "tok.json")
    write_sources(folder)
    recipes = {
        "full": make_recipe(folder, tok, folder / "full", split_bytes=3000),
        "workers": make_recipe(folder, tok, folder / "workers", lanes=2),
        "read-only": make_recipe(folder, tok, folder / "read-only"),
    }
    references = {
        name: outcome(without_cache(r), workers=2 if name == "workers" else 0)
        for name, r in recipes.items()
    }
    assert outcome(recipes["read-only"]) == references["read-only"]  # (fills it)
    for commit in commits(folder / "read-only")[::2]:
        commit.unlink()
    before = listing(folder / "read-only")
    for path in [folder / "read-only", *(folder / "read-only").rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    user = 65534 if os.geteuid() == 0 else None
    plan = [
        {
            "recipe": recipes[name],
            "path": str(write_recipe(recipes[name], folder, name)),
            "limit": limit,
            "user": who,
            "workers": workers,
        }
        for name, limit, who, workers in (
            ("full", 1200, None, 0),
            ("workers", 100, None, 2),
            ("read-only", 0, user, 0),
        )
    ]
    for item in plan:
        Path(item["path"]).chmod(0o644)
    done = procs.run(
        [sys.executable, "-c", UNWRITABLE, json.dumps(plan)],
        timeout=150,
        env={**ENV, "HOME": str(folder)},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [
        line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("REPORT ")
    ]
    reports = dict(zip(recipes, map(json.loads, lines)))
    return Unwritable(folder, recipes, references, reports, done.stderr, before)


def warnings_about(stderr: str, cache: Path) -> list[str]:
    return [
        line for line in stderr.splitlines() if "cannot be written" in line and f"{cache} " in line
    ]


def same_as_reference(run: Unwritable, name: str) -> bool:
    report, reference = run.reports[name], run.references[name]
    return (tuple(report["batches"]), report["skipped"]) == (reference.batches, reference.skipped)


def test_a_full_cache_keeps_training_and_leaves_no_entry_to_trust(unwritable):
    """The same batches, nothing raised, one warning naming the cause; every entry that was
    committed is whole and none half-written is left; `mixer cache` exits 0. A later run
    without the limit gives the same batches, finds nothing damaged and fills the rest."""
    run, recipe = unwritable, unwritable.recipes["full"]
    assert same_as_reference(run, "full") and run.reports["full"]["cache_exit"] == 0
    [warning] = warnings_about(run.stderr, run.folder / "full")  # (once per process)
    assert "File too large" in warning
    assert len(commits(run.folder / "full")) < len(keys_of(recipe))
    assert_trustworthy(recipe)
    CACHE_STATS.reset()
    assert outcome(recipe) == run.references["full"]
    assert CACHE_STATS.corrupt == 0 and CACHE_STATS.writes > 0
    assert {c.stem for c in commits(run.folder / "full")} == keys_of(recipe)
    assert_trustworthy(recipe)


def test_a_full_cache_under_dataloader_workers_keeps_the_stream(unwritable):
    run = unwritable
    assert same_as_reference(run, "workers") and run.reports["workers"]["cache_exit"] == 0
    assert 1 <= len(warnings_about(run.stderr, run.folder / "workers")) <= 3  # per process
    assert_trustworthy(run.recipes["workers"])


def test_a_read_only_cache_is_read_and_left_alone(unwritable):
    """The same batches, served from the entries there (the rest tokenized), one warning,
    nothing written; `mixer cache` exits 0."""
    run = unwritable
    assert same_as_reference(run, "read-only") and run.reports["read-only"]["cache_exit"] == 0
    hits, misses, writes = run.reports["read-only"]["stats"]
    assert hits > 0 and misses > 0 and writes == 0
    [warning] = warnings_about(run.stderr, run.folder / "read-only")
    assert "Permission denied" in warning
    assert listing(run.folder / "read-only") == run.listing
