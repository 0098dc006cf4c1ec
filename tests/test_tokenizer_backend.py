"""tokenizer_backend: fastokens is used only where it gives the very ids of `tokenizers` (a
stress text and the sources' first documents), so the stream, states and token cache are the
same with either backend; otherwise `auto` falls back and `fastokens` is refused, saying why."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import procs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import take_digests
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import mixer
from mixer.cache.fill import fill_cache
from mixer.cache.store import CACHE_STATS
from mixer.sources.manifest import list_sources
from mixer.tokenize import Encoder, backends, resolve_backend, resolve_tokenizer, verify
from mixer.tokenize.backends import FastokensBackend
from mixer.tokenize.stress import GENERAL_CATEGORIES, LONG_WORD_CHARS, REPEATS, stress_sections
from mixer.tools.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOKENIZER = ROOT / "data" / "tokenizer.json"
MARKER = "ZEBRAMARKER"
_WORDS = (
    "the quick brown fox jumps over a lazy dog; naïve café — 東京 und Ölgemälde 😀👍🏽 "
    "def f(x):\n\treturn x**2  # ok\r\n https://example.com/?q=1 3.14159 ١٢٣"
).split(" ")


def _text(seed: int, words: int) -> str:
    return " ".join(_WORDS[(seed * 7 + i * 13) % len(_WORDS)] for i in range(words))


@pytest.fixture
def recipe(tmp_path: Path) -> dict:
    """Two sources of mixed text (jsonl files, parquet row groups), the demo tokenizer; the
    parquet source's sixth document holds MARKER."""
    (tmp_path / "a").mkdir()
    for f in range(2):
        lines = [json.dumps({"text": _text(f * 100 + d, 5 + d % 40)}) for d in range(60)]
        (tmp_path / "a" / f"a{f}.jsonl").write_text("\n".join(lines) + "\n")
    texts = [_text(1000 + d, 10 + d % 30) for d in range(50)]
    texts[5] = texts[5] + f" and {MARKER} here"
    pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet", row_group_size=8)
    return {
        "seed": 3,
        "tokenizer": str(DEMO_TOKENIZER),
        "seq_len": 64,
        "batch_size": 2,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": [
            {"name": "a", "path": str(tmp_path / "a" / "*.jsonl"), "weight": 0.6},
            {"name": "b", "path": str(tmp_path / "b.parquet"), "weight": 0.4},
        ],
    }


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch, tmp_path):
    """Each test verifies anew: no verdict in memory, its own cache folder."""
    monkeypatch.setattr(verify, "_verdicts", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


take = take_digests


def settled(loader: mixer.Loader) -> mixer.Loader:
    """`loader` once a fastokens verification it runs in the background has its verdict."""
    job = loader.backend.background if loader.backend is not None else None
    if job is not None:
        job.begin()
        assert job.wait(60)
    return loader


def backend(recipe: dict, name: str) -> dict:
    return {**recipe, "tokenizer_backend": name}


def trained(path: Path, kind: str) -> Path:
    """A small tokenizer fastokens cannot load: WordPiece with BertNormalizer, or BPE behind
    a Metaspace pre-tokenizer."""
    texts = [_text(i, 30) for i in range(50)]
    specials = ["[UNK]", "<|endoftext|>"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    else:
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


# -- the stress text ---------------------------------------------------------------------------
def test_the_stress_text_covers_its_cases_and_fastokens_matches_on_the_demo_tokenizer():
    added = ["<|endoftext|>", "<pad>"]
    sections = dict(stress_sections(added))
    everything = sections["all"]
    found = {unicodedata.category(ch) for ch in everything}
    assert found == set(GENERAL_CATEGORIES) - {"Cs"}  # (no valid UTF-8 holds a surrogate)
    for needle in (
        "\r\n",
        "\t",
        "\u00a0",
        "\u2028",
        "\u3000",
        "\u200d",
        "🇫🇷",
        "中文",
        "العربية",
        "שָׁלוֹם",
        "नमस्ते",
        "ภาษาไทย",
        "e\u0301",
        "é",
        "1234567",
        "https://",
        "def f(",
        "a" * REPEATS,
        *added,
    ):
        assert needle in everything, needle
    assert len(sections["long-word"]) == LONG_WORD_CHARS and " " not in sections["long-word"]
    assert stress_sections(added) == stress_sections(added)  # the same in every process
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(DEMO_TOKENIZER),
            "seq_len": 8,
            "batch_size": 1,
            "sources": [{"name": "a", "path": "x.jsonl", "weight": 1}],
        }
    )
    verdict, _ = verify.verify(recipe, resolve_tokenizer(str(DEMO_TOKENIZER)), None)
    assert verdict.ok, verdict.reason


def _split_bpe_verdict(
    path: Path, pattern: str, texts: list[str], vocab_size: int
) -> verify.Verdict:
    """Verification's verdict (stress text only) on a byte-level BPE trained on `texts` behind
    a `Split(pattern)` pre-tokenizer (fastokens' generic regex path)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(path))
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(path),
            "seq_len": 8,
            "batch_size": 1,
            "sources": [{"name": "a", "path": "x.jsonl", "weight": 1}],
        }
    )
    return verify.verify(recipe, resolve_tokenizer(str(path)), None)[0]


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def test_code_points_regex_engines_class_differently_are_set_where_the_class_decides():
    """U+180E (a space before Unicode 6.3), marks, other numbers, enclosed letters: each
    before an apostrophe, after spaces and a newline, between letters and between digits."""
    classes = dict(stress_sections([]))["classes"]
    for ch in (
        "\u180e",
        "\u200b",
        "\x1c",
        "\u093e",
        "\u0949",
        "\u0488",
        "\u00b9",
        "\u2074",
        "\u248c",
        "\u24b6",
        "\U0001f131",
        "\U00011f34",
    ):
        for context in (f"a{ch}b", f"{ch}'s", f"  {ch}", f"\n {ch}", f"{ch}'t", f"1{ch}2"):
            assert context in classes, (ch, context)
    # spacing marks inside words of their own script too (Myanmar, Sinhala vowel signs)
    for letter, mark in (("\u1000", "\u102c"), ("\u0d85", "\u0dcf"), ("\u0904", "\u093e")):
        assert f"{letter}{mark}{letter}{letter}{mark}" in classes


def test_a_split_pattern_fastokens_reads_with_other_unicode_tables_is_refused(tmp_path):
    """The GPT-2 pattern as a `Split` (not the `ByteLevel` regex fastokens knows): fastokens
    takes U+180E for whitespace, `tokenizers` does not; the stress text shows it."""
    text = (
        "It's what they don't say, isn't it? We're here, you've seen, I'm sure, she'll "
        "go, he'd say.\n\n  indented\n two  spaces ."
    ) * 3
    verdict = _split_bpe_verdict(tmp_path / "split.json", GPT2_PATTERN, [text] * 20, 600)
    assert not verdict.ok and "section 'classes'" in verdict.reason, verdict.reason


def test_a_word_split_whose_vocabulary_merges_vowel_signs_with_their_letters_is_refused(tmp_path):
    """`\\w` holds spacing marks for `tokenizers`, not for fastokens: a vocabulary trained with a
    `\\w+` split on Myanmar words merges each vowel sign with its letter, and fastokens would
    cut every such word. The stress text has the marks inside words of their own script."""
    import random

    r = random.Random(0)
    letters, signs = "ကခဂငစဆဇညတထဒနပဖဗဘမယရလဝသဟအ", "\u102b\u102c\u1031\u1038"
    words = [
        "".join(
            r.choice(letters) + (r.choice(signs) if r.random() < 0.6 else "")
            for _ in range(r.randrange(2, 5))
        )
        for _ in range(60)
    ]
    texts = [" ".join(r.choice(words) for _ in range(200)) for _ in range(30)]
    verdict = _split_bpe_verdict(tmp_path / "words.json", r"\w+|[^\w\s]+", texts, 800)
    assert not verdict.ok and "section 'classes'" in verdict.reason, verdict.reason


# -- same tokens, same stream ------------------------------------------------------------------
def test_batches_are_the_same_with_either_backend_at_any_worker_count(recipe):
    reference = take(mixer.build_loader(backend(recipe, "hf")), 10)
    auto = settled(mixer.build_loader(recipe))
    assert auto.backend.encoding == "fastokens"
    assert take(auto, 10) == reference
    assert take(mixer.build_loader(backend(recipe, "fastokens"), num_workers=2), 10) == reference


@pytest.mark.slow
def test_a_state_taken_with_one_backend_resumes_with_the_other(recipe):
    hf, fast = backend(recipe, "hf"), backend(recipe, "fastokens")
    reference = take(mixer.build_loader(hf), 12)
    first = mixer.build_loader(fast, num_workers=2)
    assert take(first, 4) == reference[:4]
    resumed = mixer.build_loader(hf)
    resumed.load_state_dict(first.state_dict())
    assert take(resumed, 8) == reference[4:]
    states = []  # elastic: two fastokens ranks, merged, resume on one rank with tokenizers
    for rank in range(2):
        loader = mixer.build_loader(fast, rank=rank, world_size=2)
        assert take(loader, 2) == reference[rank:4:2]
        states.append(loader.state_dict())
    single = mixer.build_loader(hf, num_workers=2)
    single.load_state_dict(mixer.merge_states(states))
    assert take(single, 8) == reference[4:]


def test_the_token_cache_serves_either_backend(recipe, tmp_path):
    recipe = {
        **recipe,
        "token_cache": str(tmp_path / "cache"),
        "sources": [{**s, "epochs": 1} for s in recipe["sources"]],
    }
    hf = mixer.load_recipe(backend(recipe, "hf"))
    assert fill_cache(hf, tables=list_sources(hf), progress=False)["written"] > 0
    reference = take(mixer.build_loader(hf), 10)
    CACHE_STATS.reset()
    loader = settled(mixer.build_loader(recipe))
    assert loader.backend.encoding == "fastokens"
    assert take(loader, 10) == reference
    assert CACHE_STATS.hits > 0 and CACHE_STATS.misses == 0
    assert list((tmp_path / "cache" / "tokenizers" / "backends").glob("backend-*.json"))


def test_encoder_output_is_identical(recipe):
    info = resolve_tokenizer(str(DEMO_TOKENIZER))
    texts = [_text(i, 3 + i) for i in range(40)] + ["", MARKER, "<|endoftext|> x"]
    for bos in (None, 7):
        plain = Encoder(dataclasses.replace(info, bos_id=bos))
        fast = Encoder(dataclasses.replace(info, bos_id=bos, backend="fastokens"))
        for a, b in zip(plain(texts), fast(texts)):
            # (a vocabulary under 65,536 ids: half the memory of uint32 while they wait)
            assert a.dtype == b.dtype == np.uint16 and a.tolist() == b.tolist()
        assert plain.encode_raw(texts) == fast.encode_raw(texts)
    assert fast.token_id("<|endoftext|>") == plain.token_id("<|endoftext|>")
    ids = plain.encode_raw(texts[:5])[3]
    assert fast.decode(ids) == plain.decode(ids)


@pytest.mark.parametrize("big", [65535, 65536, 2**32 - 1])
@pytest.mark.parametrize("where", ["text", "eos", "bos"])
def test_ids_past_uint16_are_never_wrapped(monkeypatch, big, where):
    """An id that uint16 cannot hold (a larger vocabulary, or an added token past it), in
    a text or as EOS/BOS, keeps every document of the call in uint32, with either backend."""
    from mixer.tokenize.backends import FastokensBackend, HfBackend

    texts = ["a b", "c", ""]
    ids = [[5, big if where == "text" else 6], [7], []]
    eos, bos = (big if where == "eos" else 2), (big if where == "bos" else 1)
    expected = [[bos, *x, eos] for x in ids]

    class Flat:
        def encode_batch_flat(self, texts, add_special_tokens):
            flat = [i for x in ids for i in x]
            offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.uint64)
            return np.array(flat, dtype=np.uint32).tobytes(), offsets.tobytes()

    class Hf:
        def get_vocab_size(self, with_added_tokens):
            return 32000  # (wrong: ids past it must still not wrap)

    fast = FastokensBackend(Flat())
    hf = HfBackend(Hf())
    monkeypatch.setattr(hf, "encode_batch", lambda texts: [list(x) for x in ids])
    for backend in (fast, hf):
        docs = backend.encode_docs(texts, bos, eos)
        assert [d.tolist() for d in docs] == expected, backend.name
        narrow = big < 65536
        assert {d.dtype for d in docs} == {np.dtype(np.uint16 if narrow else np.uint32)}


# -- refusals and fallbacks --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "component"),
    [("wordpiece", "BertNormalizer normalizer"), ("metaspace", "Metaspace pre-tokenizer")],
)
def test_a_tokenizer_fastokens_cannot_load_falls_back_or_is_refused(
    recipe, tmp_path, caplog, kind, component
):
    recipe = {**recipe, "tokenizer": str(trained(tmp_path / f"{kind}.json", kind))}
    caplog.set_level(logging.INFO, logger="mixer.tokenizer")
    loader = settled(mixer.build_loader(recipe))
    assert loader.backend.encoding == "hf"
    assert loader.backend.describe() == f"tokenizers (fastokens: {component} unsupported)"
    lines = [r.getMessage() for r in caplog.records if r.name == "mixer.tokenizer"]
    assert lines == [f"tokenizer backend: tokenizers (fastokens: {component} unsupported)"]
    reference = take(mixer.build_loader(backend(recipe, "hf")), 3)
    assert take(loader, 3) == reference
    with pytest.raises(mixer.RecipeError, match=f"tokenizer_backend: .*{component} unsupported"):
        mixer.build_loader(backend(recipe, "fastokens"))


def _altering(monkeypatch) -> dict:
    """fastokens' encode_batch changes one id of any text holding MARKER: the first token at
    or after the marker (per `tokenizers`' offsets). Returns where it did."""
    hf = Tokenizer.from_file(str(DEMO_TOKENIZER))
    real = FastokensBackend.encode_batch
    where: dict = {}

    def encode_batch(self, texts):
        out = real(self, texts)
        for text, ids in zip(texts, out):
            if MARKER in text:
                enc = hf.encode(text, add_special_tokens=False)
                at = text.index(MARKER)
                i = next(k for k, (start, end) in enumerate(enc.offsets) if end > at)
                ids[i] = (ids[i] + 1) % 8000
                where.update(char=enc.offsets[i][0], id=ids[i], was=enc.ids[i])
        return out

    monkeypatch.setattr(FastokensBackend, "encode_batch", encode_batch)
    return where


def test_a_mismatch_on_a_source_document_falls_back_or_is_refused(recipe, monkeypatch, caplog):
    where = _altering(monkeypatch)
    caplog.set_level(logging.INFO, logger="mixer.tokenizer")
    loader = settled(mixer.build_loader(recipe))
    assert loader.backend.encoding == "hf"
    warned = [r for r in caplog.records if r.name == "mixer.tokenizer"]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    message = warned[0].getMessage()
    assert "source 'b', document 5 (" in message and "b.parquet" in message
    assert f"character {where['char']:,}" in message
    assert "tokenizers [" in message and str(where["was"]) in message
    assert "fastokens [" in message and str(where["id"]) in message
    with pytest.raises(mixer.RecipeError, match=r"source 'b', document 5 .*character"):
        mixer.build_loader(backend(recipe, "fastokens"))


def test_fastokens_raising_on_a_document_is_a_mismatch(recipe, monkeypatch):
    real = FastokensBackend.encode_batch

    def encode_batch(self, texts):
        if any(MARKER in text for text in texts):
            raise ValueError("no such luck")
        return real(self, texts)

    monkeypatch.setattr(FastokensBackend, "encode_batch", encode_batch)
    assert settled(mixer.build_loader(recipe)).backend.encoding == "hf"
    with pytest.raises(
        mixer.RecipeError,
        match=r"source 'b', document 5 .*fastokens raised "
        r"ValueError: no such luck",
    ):
        mixer.build_loader(backend(recipe, "fastokens"))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_fastokens_raising_after_verification_leaves_the_stream_as_tokenizers_makes_it(
    recipe, monkeypatch, caplog, workers
):
    """A chunk fastokens raises on in the run (after it was verified) is encoded by
    `tokenizers`: same batches as `hf`, one warning, the run goes on."""
    real = FastokensBackend.encode_docs

    def encode_docs(self, texts, bos, eos):
        if any(MARKER in text for text in texts):
            raise ValueError("Max stack size exceeded for backtracking")
        return real(self, texts, bos, eos)

    reference = take(mixer.build_loader(backend(recipe, "hf")), 40)
    monkeypatch.setattr(FastokensBackend, "encode_docs", encode_docs)
    caplog.set_level(logging.WARNING, logger="mixer.tokenizer")
    for name in ("auto", "fastokens"):
        loader = settled(mixer.build_loader(backend(recipe, name), num_workers=workers))
        assert loader.backend.encoding == "fastokens"
        assert take(loader, 40) == reference
    if workers == 0:
        [line] = [r.getMessage() for r in caplog.records if "fastokens raised" in r.getMessage()]
        assert "Max stack size" in line and "tokenizers (the same ids)" in line


@pytest.mark.slow
def test_a_megabyte_of_spaces_that_fastokens_cannot_split_is_encoded_all_the_same(tmp_path):
    """A pre-tokenizer fastokens runs on a backtracking engine (digits, then byte-level with its
    regex: StarCoder's) raises on a run of a million spaces, after verification passed."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [_text(i, 30) for i in range(50)],
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(tmp_path / "starcoder.json"))
    texts = [_text(d, 20) for d in range(30)]
    texts[3] = "spaces:" + " " * 1_000_000 + "end"
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    recipe = {
        "tokenizer": str(tmp_path / "starcoder.json"),
        "seq_len": 512,
        "batch_size": 2,
        "lanes": 1,
        "sources": [{"name": "a", "path": str(tmp_path / "a.jsonl"), "weight": 1, "epochs": 1}],
    }
    fast = settled(mixer.build_loader(recipe))
    assert fast.backend.encoding == "fastokens"
    assert take(fast, 10_000) == take(mixer.build_loader(backend(recipe, "hf")), 10_000)


def test_tokenizers_panicking_on_the_stress_text_is_a_refusal_not_a_crash(
    recipe, monkeypatch, tmp_path
):
    """`tokenizers` itself may panic on a text (pyo3's PanicException is no Exception): no
    verdict can be had, so `auto` keeps `tokenizers` and `fastokens` is a RecipeError; such a
    refusal is not kept (a library raising may be this start's trouble): the next start verifies
    again."""

    class PanicException(BaseException):
        pass

    class Panicking:
        def __init__(self, tok):
            self.tok = tok

        def encode(self, text, **kwargs):
            if "\u180e" in text:
                raise PanicException("AddedVocabulary bad split")
            return self.tok.encode(text, **kwargs)

        def __getattr__(self, name):
            return getattr(self.tok, name)

    real = verify._load_hf
    monkeypatch.setattr(verify, "_load_hf", lambda *args: Panicking(real(*args)))
    monkeypatch.setattr(verify, "_stress", {})  # (stress verdicts of earlier tests)
    loader = settled(mixer.build_loader(recipe))
    assert loader.backend.encoding == "hf"
    assert (
        "tokenizers raised PanicException: AddedVocabulary bad split" in loader.backend.describe()
    )
    with pytest.raises(mixer.RecipeError, match="tokenizers raised PanicException"):
        mixer.build_loader(backend(recipe, "fastokens"))
    assert not list((tmp_path / "xdg").rglob("refused-*.json"))
    assert not list((tmp_path / "xdg").rglob("backend-*.json"))
    monkeypatch.setattr(verify, "_load_hf", real)
    as_in_a_new_process(monkeypatch)
    monkeypatch.setattr(verify, "_stress", {})
    assert settled(mixer.build_loader(recipe)).backend.encoding == "fastokens"


def test_the_tokenizer_is_set_up_before_another_thread_can_take_it(tmp_path, monkeypatch):
    """`padding`/`truncation` are turned off before the loaded tokenizer is shared: an
    encoding thread falling back to `tokenizers` at the same moment never sees them on."""
    from mixer.tokenize import tokenizer as tokenizer_module

    seen = []
    real = tokenizer_module.whole_documents
    monkeypatch.setattr(
        tokenizer_module,
        "whole_documents",
        lambda tok: (
            seen.append(any(t is tok for t in tokenizer_module._loaded.values())),
            real(tok),
        )[1],
    )
    monkeypatch.setattr(tokenizer_module, "_loaded", {})
    info = resolve_tokenizer(str(DEMO_TOKENIZER))
    tokenizer_module._load(info.path, info.digest)
    assert seen == [False]


def test_a_mismatch_on_the_stress_text_is_found_before_any_source(recipe, monkeypatch):
    real = FastokensBackend.encode_batch
    monkeypatch.setattr(
        FastokensBackend,
        "encode_batch",
        lambda self, texts: [
            ids[:-1] + [ids[-1] ^ 1] if "\u2028" in text and ids else ids
            for text, ids in zip(texts, real(self, texts))
        ],
    )
    monkeypatch.setattr(verify, "_stress", {})
    with pytest.raises(
        mixer.RecipeError,
        match=r"the stress text \(section 'categories'\), "
        r"character [\d,]+ \(token [\d,]+\): tokeniz",
    ):
        mixer.build_loader(backend(recipe, "fastokens"))


def _byte_level(path: Path, add) -> Path:
    """A small byte-level BPE; `add(tokenizer)` adds tokens or settings before it is saved."""
    from tokenizers import decoders

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [_text(i, 40) for i in range(80)],
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<unk>", "<|endoftext|>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    add(tok)
    tok.save(str(path))
    return path


def test_added_tokens_that_trade_whitespace_are_set_side_by_side_in_the_stress_text(
    recipe, tmp_path, monkeypatch
):
    """A special token that strips the spaces after it, followed by an added token that
    starts with one: the libraries may disagree on who owns the space. Verified means they
    agree there; otherwise the stress text finds it, before any source."""
    from tokenizers import AddedToken

    def add(tok):
        tok.add_tokens(["the", " the", "é"])
        tok.add_special_tokens(
            [AddedToken("<|endoftext|>", special=True, lstrip=True, rstrip=True)]
        )

    path = _byte_level(tmp_path / "trading.json", add)
    monkeypatch.setattr(verify, "_stress", {})
    info = resolve_tokenizer(str(path))
    verdict, _ = verify.verify(mixer.load_recipe({**recipe, "tokenizer": str(path)}), info, None)
    hf, fast = Encoder(info), Encoder(dataclasses.replace(info, backend="fastokens"))
    texts = ["<|endoftext|> the", "x<|endoftext|>  the end", "a the<|endoftext|>\né"]
    if verdict.ok:
        assert fast.encode_raw(texts) == hf.encode_raw(texts)
    else:
        assert "section 'added-pairs'" in verdict.reason
    assert "<|endoftext|> the" in dict(stress_sections(["<|endoftext|>"], [" the"]))["added-pairs"]


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["padding", "truncation"])
def test_padding_and_truncation_in_tokenizer_json_change_no_token(recipe, tmp_path, setting):
    """Whole documents whatever the file says, with either backend."""

    def add(tok):
        if setting == "padding":
            tok.enable_padding(pad_id=2, pad_token="<pad>")
        else:
            tok.enable_truncation(6)

    plain = _byte_level(tmp_path / "plain.json", lambda tok: None)
    with_setting = _byte_level(tmp_path / f"{setting}.json", add)
    assert json.loads(with_setting.read_text())[setting] is not None
    reference = take(mixer.build_loader(backend({**recipe, "tokenizer": str(plain)}, "hf")), 4)
    for name in ("hf", "auto", "fastokens"):
        loader = settled(
            mixer.build_loader(backend({**recipe, "tokenizer": str(with_setting)}, name))
        )
        assert loader.backend.encoding == ("hf" if name == "hf" else "fastokens")
        assert take(loader, 4) == reference, name


def test_a_refusal_is_kept_too_so_a_warm_fallback_pays_nothing(recipe, tmp_path, monkeypatch):
    calls = []
    real = verify.verify
    monkeypatch.setattr(verify, "verify", lambda *args: calls.append(1) or real(*args))
    recipe = {**recipe, "tokenizer": str(trained(tmp_path / "metaspace.json", "metaspace"))}
    first = settled(mixer.build_loader(recipe))
    assert first.backend.encoding == "hf" and not first.backend.cached and calls == [1]
    as_in_a_new_process(monkeypatch)
    parses = []
    real_load = backends._load_fastokens
    monkeypatch.setattr(
        backends, "_load_fastokens", lambda *args: parses.append(args) or real_load(*args)
    )
    second = mixer.build_loader(recipe)
    assert second.tokenizer.backend == "hf" and second.backend.cached and calls == [1]
    assert (
        second.backend.describe() == "tokenizers (fastokens: Metaspace pre-tokenizer unsupported)"
    )
    # fastokens is not even asked to parse the tokenizer again, nor for other sources
    other = {**recipe, "sources": recipe["sources"][:1]}
    for fresh in (False, True):
        if fresh:
            monkeypatch.setattr(verify, "_verdicts", {})
        third = mixer.build_loader(other)
        assert third.tokenizer.backend == "hf" and third.backend.cached
    assert parses == [] and not backends._fast_loading and calls == [1]
    with pytest.raises(mixer.RecipeError, match="Metaspace pre-tokenizer unsupported"):
        mixer.build_loader(backend(other, "fastokens"))


def test_a_passing_failure_to_load_fastokens_is_not_kept(recipe, tmp_path, monkeypatch):
    """fastokens failing to read the file (no memory, too many open files) is this start's
    problem: the next start tries again."""

    def failing(file, digest):
        raise backends.Unavailable("OSError: Too many open files")

    monkeypatch.setattr(backends, "_fast_loaded", {})
    monkeypatch.setattr(backends, "_load_fastokens", failing)
    assert settled(mixer.build_loader(recipe)).backend.encoding == "hf"
    assert not list((tmp_path / "xdg").rglob("backend-*.json"))
    assert not list((tmp_path / "xdg").rglob("refused-*.json"))


def test_a_process_where_fastokens_cannot_load_encodes_alike_unless_it_was_required(
    recipe, monkeypatch, caplog
):
    """The backend chosen by `auto` travels to workers on other machines or installs; where
    fastokens does not load there, `tokenizers` gives the same ids. Asked for by name, it is
    a RecipeError."""
    info = settled(mixer.build_loader(recipe)).backend.info_now()
    assert info.backend == "fastokens" and not info.required
    texts = [_text(i, 25) for i in range(20)]
    expected = Encoder(info).encode_raw(texts)

    def unavailable(file, digest):
        raise backends.Unavailable("fastokens not installed")

    monkeypatch.setattr(backends, "_fast_loaded", {})
    monkeypatch.setattr(backends, "_load_fastokens", unavailable)
    with caplog.at_level(logging.WARNING, logger="mixer.tokenizer"):
        assert Encoder(info).encode_raw(texts) == expected
    assert "fastokens, chosen where the loader was built, cannot load here" in caplog.text
    required = mixer.build_loader(backend(recipe, "fastokens")).tokenizer
    assert required.required
    with pytest.raises(mixer.RecipeError, match="in this process: fastokens not installed"):
        Encoder(required).encode_raw(texts)


EXIT_EARLY_SCRIPT = """
import sys
import mixer
loader = mixer.build_loader(sys.argv[1])   # warm: fastokens still loading on its thread
"""


@pytest.mark.slow
def test_a_process_that_ends_while_fastokens_loads_exits_cleanly(recipe, tmp_path):
    settled(mixer.build_loader(recipe))  # the verdict kept (in this test's XDG_CACHE_HOME)
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    # (before the fix, 17 of 18 such runs aborted: SIGABRT, "exception not rethrown")
    out = procs.run(
        [sys.executable, "-c", EXIT_EARLY_SCRIPT, str(tmp_path / "r.json")],
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]


# -- the verdict, cached -----------------------------------------------------------------------
def as_in_a_new_process(monkeypatch) -> list[str]:
    """No verdict, `tokenizers` or fastokens tokenizer held in memory; returns the files
    `tokenizers` is asked to load from now on."""
    from types import SimpleNamespace

    from mixer.tokenize import tokenizer as tokenizer_module

    loads: list[str] = []
    real = tokenizer_module.Tokenizer.from_file
    monkeypatch.setattr(
        tokenizer_module,
        "Tokenizer",
        SimpleNamespace(from_file=lambda file: loads.append(file) or real(file)),
    )
    monkeypatch.setattr(tokenizer_module, "_loaded", {})
    monkeypatch.setattr(backends, "_fast_loaded", {})
    monkeypatch.setattr(verify, "_verdicts", {})
    return loads


def test_a_warm_start_does_not_verify_again(recipe, tmp_path, monkeypatch):
    calls: list[float] = []
    real = verify.verify

    def counted(*args):
        start = time.perf_counter()
        try:
            return real(*args)
        finally:
            calls.append(time.perf_counter() - start)

    monkeypatch.setattr(verify, "verify", counted)
    first = settled(mixer.build_loader(recipe))
    assert len(calls) == 1 and not first.backend.cached
    [stored] = (tmp_path / "xdg" / "mixer" / "tokenizer-backends").glob("backend-*.json")
    hf_loads = as_in_a_new_process(monkeypatch)
    second = mixer.build_loader(recipe)  # fastokens loads on a thread meanwhile
    assert len(calls) == 1 and second.backend.cached
    assert second.backend.verdict == first.backend.verdict_now()
    assert second.backend.describe() == "fastokens (verified on 170 documents, 24.7 KB)"
    assert second.tokenizer.backend == "fastokens"
    assert take(second, 3) == take(first, 3)
    # the tokenizer's ids were kept too: a warm start loads no `tokenizers` tokenizer
    assert hf_loads == [] and len(backends._fast_loaded) == 1 and not backends._fast_loading
    stored.write_text(stored.read_text().replace('"ok": true', '"ok": false'))  # tampered
    monkeypatch.setattr(verify, "_verdicts", {})
    assert settled(mixer.build_loader(recipe)).backend.cached is False and len(calls) == 2
    time.sleep(0.01)  # a sampled split rewritten: its version changes, so it verifies again
    parquet = Path(recipe["sources"][1]["path"])
    parquet.write_bytes(parquet.read_bytes())
    os.utime(parquet, ns=(time.time_ns(), time.time_ns() + 10**9))
    monkeypatch.setattr(verify, "_verdicts", {})
    assert settled(mixer.build_loader(recipe)).backend.cached is False and len(calls) == 3


def test_fastokens_loaded_ahead_is_dropped_when_tokenizers_is_chosen(recipe, monkeypatch):
    monkeypatch.setattr(backends, "_fast_loaded", {})
    monkeypatch.setattr(
        verify,
        "known_verdict",
        lambda *args: (verify.Verdict(False, "differs on a document (test)"), True),
    )  # a cached refusal
    loader = mixer.build_loader(recipe)
    assert loader.tokenizer.backend == "hf"
    assert backends._fast_loaded == {} and not backends._fast_loading
    assert len(take(loader, 2)) == 2


def test_an_unwritable_cache_folder_does_not_fail_the_run(recipe, tmp_path, monkeypatch):
    (tmp_path / "blocked").write_text("a file where the folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    loader = settled(mixer.build_loader(recipe))
    assert loader.backend.encoding == "fastokens" and not loader.backend.cached
    assert len(take(loader, 2)) == 2


# -- processes ---------------------------------------------------------------------------------
def test_forked_workers_encode_with_fastokens_after_the_parent_did(recipe):
    info = resolve_backend(
        mixer.load_recipe(recipe), resolve_tokenizer(str(DEMO_TOKENIZER)), None
    ).info
    assert info.backend == "fastokens"
    Encoder(info)([_text(i, 2000) for i in range(64)])  # the parent's pool has run
    reference = take(mixer.build_loader(backend(recipe, "hf")), 8)
    assert take(mixer.build_loader(recipe, num_workers=2), 8) == reference


THREADS_SCRIPT = """
import json, os, sys
from torch.utils.data import DataLoader, IterableDataset
from mixer.runtime import worker_processes
from mixer.tokenize.backends import load_fastokens

TEXTS = ["the quick brown fox, number %d. " % i * 400 for i in range(64)]

def pool_threads():
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    return sum(name.startswith("fastokens") for name in names)

class Worker(IterableDataset):
    def __iter__(self):
        load_fastokens(sys.argv[1], "d").encode_batch(TEXTS)
        yield [os.environ.get("FASTOKENS_BPE_THREADS"), pool_threads()]

os.environ["RAYON_NUM_THREADS"] = "4"
got = list(DataLoader(Worker(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                      worker_init_fn=worker_processes.init_fn()))
os.environ["RAYON_NUM_THREADS"] = "1"
load_fastokens(sys.argv[1], "d").encode_batch(TEXTS)
print(json.dumps({"workers": got, "main": [os.environ["FASTOKENS_BPE_THREADS"], pool_threads()]}))
"""


@pytest.mark.slow
def test_fastokens_threads_follow_mixers_budget(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    out = procs.run(
        [sys.executable, "-c", THREADS_SCRIPT, str(DEMO_TOKENIZER)],
        timeout=120,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    # each of 2 workers gets half of RAYON_NUM_THREADS=4: its pool has at most 1 thread
    # beside the caller; the main process, told 1, runs every call on the calling thread
    assert [share for share, _ in got["workers"]] == ["2", "2"]
    assert all(threads <= 1 for _, threads in got["workers"])
    assert got["main"] == ["1", 0]


NO_FASTOKENS_SCRIPT = """
import sys
sys.modules["fastokens"] = None   # as where no wheel installs: `import fastokens` fails
import contextlib, io, json, logging
import mixer
from helpers import batch_digest
from mixer.tools.cli import main

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
recipe = json.load(open(sys.argv[1]))
loader = mixer.build_loader(recipe)
out = {"backend": loader.tokenizer.backend, "line": loader.backend.describe()}
digests = []
for batch in loader:
    digests.append(batch_digest(batch))
    if len(digests) == 4:
        break
out["digests"] = digests
try:
    mixer.build_loader({**recipe, "tokenizer_backend": "fastokens"})
except mixer.RecipeError as exc:
    out["refused"] = str(exc)
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    out["validate"] = main(["validate", sys.argv[1]])
out["printed"] = printed.getvalue()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_without_fastokens_auto_falls_back_and_everything_works(recipe, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    out = procs.run(
        [sys.executable, "-c", NO_FASTOKENS_SCRIPT, str(tmp_path / "r.json")],
        timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["backend"] == "hf"
    assert got["line"] == "tokenizers (fastokens: fastokens not installed)"
    assert "fastokens not installed" in out.stderr  # the one log line
    assert got["digests"] == take(mixer.build_loader(backend(recipe, "hf")), 4)
    assert "tokenizer_backend: fastokens" in got["refused"] and "not installed" in got["refused"]
    assert got["validate"] == 0
    assert "tokenizer backend: tokenizers (fastokens: fastokens not installed)" in got["printed"]


# -- the CLI and the recipe --------------------------------------------------------------------
def test_validate_and_inspect_print_the_backend(recipe, tmp_path, capsys):
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    assert cli_main(["validate", str(tmp_path / "r.json")]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == "tokenizer backend: fastokens (verified on 170 documents, 24.7 KB)"
    assert cli_main(["inspect", str(tmp_path / "r.json")]) == 0
    assert "tokenizer backend: fastokens (verified on 170 documents" in capsys.readouterr().out
    metaspace = {**recipe, "tokenizer": str(trained(tmp_path / "meta-tok.json", "metaspace"))}
    (tmp_path / "m.json").write_text(json.dumps(metaspace))
    assert cli_main(["validate", str(tmp_path / "m.json")]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "tokenizer backend: tokenizers (fastokens: Metaspace pre-tokenizer unsupported)"
    )
    (tmp_path / "f.json").write_text(json.dumps(backend(metaspace, "fastokens")))
    assert cli_main(["validate", str(tmp_path / "f.json")]) != 0
    assert "Metaspace pre-tokenizer unsupported" in capsys.readouterr().err
    (tmp_path / "h.json").write_text(json.dumps(backend(recipe, "hf")))
    assert cli_main(["validate", str(tmp_path / "h.json")]) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == "tokenizer backend: tokenizers (tokenizer_backend: hf)"
    )


def test_an_unknown_backend_is_a_recipe_error(recipe):
    with pytest.raises(mixer.RecipeError, match="tokenizer_backend"):
        mixer.load_recipe(backend(recipe, "sentencepiece"))
    assert mixer.load_recipe(recipe).tokenizer_backend == "auto"


@pytest.mark.slow
def test_workers_fork_once_fastokens_has_loaded_and_building_does_not_wait_for_it(
    recipe, monkeypatch
):
    """With a warm verdict and DataLoader workers, `build_loader` returns while fastokens
    still loads (building overlaps the load); the workers fork after it has loaded, and share
    it."""
    reference = take(settled(mixer.build_loader(recipe, num_workers=2)), 4)  # (kept: warm now)
    as_in_a_new_process(monkeypatch)
    real = backends._load_fastokens
    monkeypatch.setattr(
        backends, "_load_fastokens", lambda file, digest: (time.sleep(1.5), real(file, digest))[1]
    )
    start = time.monotonic()
    loader = mixer.build_loader(recipe, num_workers=2)
    assert time.monotonic() - start < 1.2 and backends._fast_loading  # (still loading)
    assert take(loader, 4) == reference
    assert not backends._fast_loading and len(backends._fast_loaded) == 1
