"""The stages of a source stream, each checked on its own (mixer/pipeline/*: issue 21)."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from helpers import corpus, write_docs

import mixer
from mixer.core.errors import StateError
from mixer.core.rng import permutation
from mixer.pipeline.cursor import STATE_KEYS, Cursor
from mixer.pipeline.encode_ahead import EncodeAhead
from mixer.pipeline.settings import StreamSettings
from mixer.pipeline.slice_reader import SliceReader
from mixer.pipeline.window import Window, WindowItem, WindowReader, shuffle_key
from mixer.sources import list_source
from mixer.tokenize import Encoder, resolve_tokenizer


@pytest.fixture
def setup(tmp_path, tokenizer_path):
    docs = corpus(0, 120, max_len=25)
    for part in range(3):
        write_docs(tmp_path / f"d{part}.jsonl", docs[part::3], "jsonl")
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 8,
            "batch_size": 3,
            "lanes": 2,
            "shuffle_window": 7,
            "split_bytes": 600,
            "sources": [
                {"name": "d", "path": str(tmp_path / "d*.jsonl"), "weight": 1, "epochs": 2}
            ],
        }
    )
    table = list_source(recipe, recipe.sources[0])
    settings = StreamSettings.from_recipe(recipe, recipe.sources[0])
    return table, settings, Encoder(resolve_tokenizer(str(tokenizer_path)))


def _slice_texts(reader: SliceReader, epoch: int) -> list[tuple[tuple[int, int, int], str]]:
    """Every (cursor, text) the lane's slice of `epoch` holds, in slice order."""
    out = []
    for slot, item in enumerate(reader.items(epoch)):
        for record in reader.read_split(reader.split_of(item), 0, 0):
            if record.index % item.stride == item.phase and record.error is None:
                out.append(((slot, record.index, record.offset), record.text))
    return out


def test_window_holds_the_slice_permuted_by_its_key(setup):
    table, settings, _ = setup
    lane, epoch = 1, 0
    reader = SliceReader(table, lane, settings, None, None)
    windows = WindowReader(reader, settings, building=False)
    expected = _slice_texts(SliceReader(table, lane, settings, None, None), epoch)
    assert len(expected) > 3 * settings.window_docs
    start, at, index = (0, 0, 0), 0, 0
    while True:
        win = windows.read(epoch, index, start)
        docs = [text for _, text in expected[at : at + len(win.items)]]
        order = permutation(len(docs), shuffle_key(settings.seed, table.name, lane, epoch, index))
        assert [item.text for item in win.items] == [docs[i] for i in order]
        at += len(win.items)
        if win.end_of_epoch:
            break
        assert len(win.items) == settings.window_docs
        assert win.end == expected[at][0]  # the next window starts at the next document
        start, index = win.end, index + 1
    assert at == len(expected)
    reader.close()


def test_cursor_state_round_trip():
    cursor = Cursor("d", 1, epochs=None, with_oversize=True)
    fresh = cursor.state_dict()
    assert set(STATE_KEYS) <= set(fresh) and fresh["oversize"] == 0
    cursor.epoch, cursor.window_index, cursor.start, cursor.pos = 3, 5, (2, 17, 4096), 4
    cursor.skip("parse", 2)
    cursor.oversize = 1
    state = json.loads(json.dumps(cursor.state_dict()))
    assert state == {
        "epoch": 3,
        "window": 5,
        "slot": 2,
        "index": 17,
        "offset": 4096,
        "pos": 4,
        "skipped": 2,
        "done": 0,
        "oversize": 1,
        "reasons": {"parse": 2},
    }
    again = Cursor("d", 1, epochs=None, with_oversize=True)
    again.load_state_dict(state)
    assert again.state_dict() == state and again.yielded and again.resumed_window == (3, 5)
    again.load_state_dict(None)
    assert again.state_dict() == fresh
    with pytest.raises(StateError, match="lacks"):
        again.load_state_dict({"epoch": 0})


def test_cursor_advance_ends_a_finite_source():
    cursor = Cursor("d", 0, epochs=1, with_oversize=False)
    win = Window([WindowItem("x")], (1, 0, 0), False, 1, {"parse": 1})
    cursor.advance(win, on_empty=lambda: pytest.fail("asked only for unlimited sources"))
    assert (cursor.window_index, cursor.start, cursor.skipped_before) == (1, (1, 0, 0), 1)
    cursor.advance(Window([], (2, 0, 0), True, 0, {}), on_empty=lambda: None)
    assert cursor.done and cursor.epoch == 1 and cursor.start == (0, 0, 0)


def test_encode_ahead_gives_the_tokens_of_a_direct_encode(setup):
    _, _, encoder = setup
    texts = [f"document {i} " + "word " * (i % 13) for i in range(150)]
    win = Window([WindowItem(t) for t in texts], (0, 0, 0), True, 0, {})
    ahead = EncodeAhead(encoder, None)
    at = 0
    while at < len(texts):
        if win.items[at].encoded is None:
            ahead.tokenize_from(win, at)
        at += 1
    direct = encoder(texts)
    for item, tokens in zip(win.items, direct):
        assert np.array_equal(item.encoded, tokens) and item.text == ""
    for _, _, future, _ in win.ahead:
        future.cancel()


class _Calls:
    """An encoder that records each call's texts (the calls a stream cuts)."""

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        self.calls.append(tuple(texts))
        return self.encoder(texts)


@pytest.mark.slow
@pytest.mark.parametrize("limit", [0, 300, 100_000])
def test_the_process_budget_of_text_ahead_changes_no_call_and_no_token(setup, monkeypatch, limit):
    """Windows (one per stream) consumed in turn, within a process budget of text queued
    ahead: never more than the budget is held, the tokenizer gets the same calls as without
    one, and every share is given back once the windows are dropped."""
    from mixer.tokenize.encoding import TEXT_AHEAD

    _, _, encoder = setup
    # 0.1-3 KB each: the calls are cut by their text budgets (32 KB, doubling), not by count
    texts = [f"document {i} " + "word " * (20 + 40 * (i % 17)) for i in range(400)]

    def run() -> tuple[list[tuple[str, ...]], list[np.ndarray]]:
        gc.collect()  # windows of earlier tests in this process, dropped in cycles
        assert TEXT_AHEAD.held() == 0
        calls = _Calls(encoder)
        ahead = EncodeAhead(calls, None)
        windows = [
            Window([WindowItem(t) for t in texts[w::5]], (0, 0, 0), True, 0, {}) for w in range(5)
        ]
        for at in range(len(windows[0].items)):  # streams interleaved, as the mixer draws
            for win in windows:
                if at < len(win.items) and win.items[at].encoded is None:
                    ahead.tokenize_from(win, at)
                assert TEXT_AHEAD.held() <= TEXT_AHEAD.limit
        tokens = [item.encoded for win in windows for item in win.items]
        for win in windows:
            for _, _, future, _ in win.ahead:
                future.cancel()
        return sorted(calls.calls), tokens

    unlimited_calls, unlimited_tokens = run()
    monkeypatch.setattr(TEXT_AHEAD, "limit", limit)
    calls, tokens = run()
    assert calls == unlimited_calls
    assert all(np.array_equal(a, b) for a, b in zip(tokens, unlimited_tokens, strict=True))
    assert TEXT_AHEAD.held() == 0


def test_a_loader_within_a_tiny_budget_of_text_ahead_gives_the_same_batches(
    three_sources, monkeypatch
):
    from helpers import batch_digest

    from mixer.tokenize.encoding import TEXT_AHEAD

    recipe = {**three_sources[0], "shuffle_window": 256}  # windows of several chunks
    asked: list[bool] = []
    real = TEXT_AHEAD.hold
    monkeypatch.setattr(
        TEXT_AHEAD, "hold", lambda nbytes: (held := real(nbytes), asked.append(held is not None))[0]
    )

    def digests() -> list[str]:
        loader = mixer.build_loader(recipe, num_workers=0)
        out = [batch_digest(batch) for _, batch in zip(range(40), loader)]
        loader.close()
        return out

    expected = digests()
    assert asked and all(asked)  # (the default budget never binds here)
    asked.clear()
    monkeypatch.setattr(TEXT_AHEAD, "limit", 200)
    assert digests() == expected
    assert asked and not all(asked)  # (some chunks were left to be encoded when needed)


@pytest.mark.slow
@pytest.mark.parametrize("limit", [0, 300, 5_000])
def test_the_process_budget_of_tokens_held_bounds_them_and_changes_no_token(
    setup, monkeypatch, limit
):
    """Windows consumed in turn under a small `ENCODED_HELD`: the text whose tokens are held
    unpacked stays within the budget, what may be queued ahead and one document per window
    (a chunk needed now is cut to the room left, here down to one document); the tokens are a
    direct encode's; every share is given back once the windows are dropped."""
    from mixer.pipeline import encode_ahead
    from mixer.tokenize.encoding import ENCODED_HELD, TEXT_AHEAD, encoding_pool

    _, _, encoder = setup
    texts = [f"document {i} " + "word " * (20 + 40 * (i % 17)) for i in range(400)]
    encoding_pool().submit(int).result()  # (earlier tasks done: none holds a window)
    gc.collect()
    before = ENCODED_HELD.held()  # (0 unless an earlier test's windows are still alive)
    monkeypatch.setattr(ENCODED_HELD, "limit", limit)
    monkeypatch.setattr(TEXT_AHEAD, "limit", limit)
    monkeypatch.setattr(encode_ahead, "CHUNK_MIN_BYTES", 1)  # (calls of one document)
    ahead = EncodeAhead(encoder, None)
    windows = [
        Window([WindowItem(t) for t in texts[w::5]], (0, 0, 0), True, 0, {}) for w in range(5)
    ]
    consumed: list[list[np.ndarray]] = [[] for _ in windows]
    bound = 2 * limit + len(windows) * max(map(len, texts))  # (all the text: 280 KB)
    for at in range(len(windows[0].items)):
        for w, win in enumerate(windows):
            if at < len(win.items):
                if win.items[at].encoded is None:
                    ahead.tokenize_from(win, at)
                consumed[w].append(win.items[at].encoded)  # (packed, as a stream does)
                win.items[at].encoded = None
                if at + 1 >= win.encoded_end:
                    win.packing = None
            # the text of the documents whose tokens are held, encoded or queued
            held = sum(
                len(texts[v + 5 * k])
                for v, win in enumerate(windows)
                for k, item in enumerate(win.items)
                if item.encoded is not None
            )
            held += sum(
                len(texts[v + 5 * k])
                for v, win in enumerate(windows)
                for start, stop, _, _ in win.ahead
                for k in range(start, stop)
            )
            assert held <= bound
            assert ENCODED_HELD.held() - before <= bound
    direct = encoder(texts)
    got = [None] * len(texts)
    for w, tokens in enumerate(consumed):
        for k, doc in enumerate(tokens):
            got[w + 5 * k] = doc
    assert all(np.array_equal(a, b) for a, b in zip(got, direct, strict=True))
    for win in windows:
        for _, _, queued, _ in win.ahead:
            if not queued.cancel():
                queued.result()  # (a running call holds its window until it returns)
    del windows, win
    encoding_pool().submit(int).result()  # (a cancelled task holds its window until dropped)
    gc.collect()
    assert ENCODED_HELD.held() == before


def test_a_loader_within_no_budget_of_tokens_held_gives_the_same_batches(
    three_sources, monkeypatch
):
    """With no room for tokens held unpacked (and no floor under a chunk: every chunk one
    document) the batches are the default's."""
    from helpers import batch_digest

    from mixer.pipeline import encode_ahead
    from mixer.tokenize.encoding import ENCODED_HELD

    recipe = {**three_sources[0], "shuffle_window": 256}
    sizes: list[int] = []
    real = EncodeAhead.chunk_stop

    def spying(self, win, start, room=None):
        stop = real(self, win, start, room)
        sizes.append(stop - start)
        return stop

    monkeypatch.setattr(EncodeAhead, "chunk_stop", spying)

    def digests() -> list[str]:
        sizes.clear()
        loader = mixer.build_loader(recipe, num_workers=0)
        out = [batch_digest(batch) for _, batch in zip(range(40), loader)]
        loader.close()
        return out

    expected = digests()
    assert max(sizes) > 1  # (the default's chunks hold several documents)
    monkeypatch.setattr(ENCODED_HELD, "limit", 0)
    monkeypatch.setattr(encode_ahead, "CHUNK_MIN_BYTES", 1)
    assert digests() == expected
    assert sizes and max(sizes) == 1
