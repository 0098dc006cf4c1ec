"""State changes while a loop runs: `load_state_dict` inside a `for` loop and after its end,
and `set_weights` onto a source already spent in a finite run."""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter

import pytest
from deadline import deadline
from helpers import (
    batch_digest,
    corpus,
    expected_counts,
    token_counts,
    write_docs,
)

import mixer

# -- load_state_dict while iterating --------------------------------------------------------


@pytest.fixture
def text_recipe(tmp_path, tokenizer_path) -> dict:
    write_docs(tmp_path / "a.jsonl", corpus(0, 300), "jsonl")
    write_docs(tmp_path / "b.jsonl", corpus(1000, 100, min_len=5, max_len=60), "jsonl")
    return {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 2,
        "sources": [
            {"name": "a", "path": str(tmp_path / "a.jsonl"), "weight": 2},
            {"name": "b", "path": str(tmp_path / "b.jsonl"), "weight": 1},
        ],
    }


def _digests(batches) -> list[str]:
    return [batch_digest(b) for b in batches]


def _state_after(recipe: dict, batches: int) -> dict:
    loader = mixer.build_loader(recipe)
    for _ in itertools.islice(loader, batches):
        pass
    return loader.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_load_state_dict_while_iterating_continues_from_the_loaded_state(text_recipe, workers):
    reference = _digests(itertools.islice(mixer.build_loader(text_recipe), 30))
    loader = mixer.build_loader(text_recipe, num_workers=workers)
    batches = iter(loader)
    got = _digests(itertools.islice(batches, 3))
    earlier = loader.state_dict()
    got += _digests(itertools.islice(batches, 4))
    loader.load_state_dict(earlier)  # the same iterator goes back
    got += _digests(itertools.islice(batches, 5))
    loader.load_state_dict(_state_after(text_recipe, 20))  # and forward
    got += _digests(itertools.islice(batches, 5))
    assert got == reference[:7] + reference[3:8] + reference[20:25]
    assert loader.state_dict() == _state_after(text_recipe, 25)


@pytest.mark.slow
def test_load_state_dict_inside_a_for_loop_and_after_the_end(text_recipe):
    finite = {**text_recipe, "sources": [{**s, "epochs": 1} for s in text_recipe["sources"]]}
    reference = _digests(mixer.build_loader(finite))
    loader = mixer.build_loader(finite)
    got: list[str] = []
    saved, loaded = None, False
    for batch in loader:
        got.append(batch_digest(batch))
        if len(got) == 4:
            saved = loader.state_dict()
        if len(got) == 9 and not loaded:
            loader.load_state_dict(saved)
            loaded = True
    assert got == reference[:9] + reference[4:]
    loader.load_state_dict(saved)  # the stream ended: a new iteration from the state
    assert _digests(loader) == reference[4:]


# -- set_weights onto a spent source in a finite run ---------------------------------------


@pytest.fixture
def finite_recipe(tmp_path, tokenizer_path) -> tuple[dict, dict]:
    docs = {
        "prose": corpus(0, 120, max_len=20),
        "code": corpus(1000, 40, max_len=30, seed=1),
        "web": corpus(2000, 30, max_len=6, seed=2),
    }
    for name, items in docs.items():
        for part in range(2):
            write_docs(tmp_path / name / f"{part}.jsonl", items[part::2], "jsonl")
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 4,
        "sources": [
            {"name": n, "path": str(tmp_path / n / "*.jsonl"), "weight": w, "epochs": 1}
            for n, w in (("prose", 0.5), ("code", 0.2), ("web", 0.3))
        ],
    }
    return recipe, docs


def _run_spending_web(recipe: dict, weights: dict, workers: int) -> tuple[list, int, dict]:
    """Batches of a run that calls set_weights once `web` has run out in every lane; the
    number handed out before the call, and the state right after it."""
    loader = mixer.build_loader(recipe, num_workers=workers)
    batches = iter(loader)
    out: list = []
    for batch in batches:
        out.append(batch)
        if loader.metrics()["epochs"]["web"] >= 1:
            break
    loader.set_weights(weights)
    state = json.loads(json.dumps(loader.state_dict()))
    calls = len(out)
    with deadline(30):
        out += list(itertools.islice(batches, 10_000))
    return out, calls, state


@pytest.mark.slow
@pytest.mark.parametrize("weights", [{"web": 1}, {"web": 1, "prose": 1}])
def test_set_weights_onto_a_spent_source_is_exact_and_loses_no_batch(
    finite_recipe, weights, caplog
):
    recipe, docs = finite_recipe
    plain = _digests(mixer.build_loader(recipe))
    with caplog.at_level(logging.WARNING, logger="mixer.runtime.loader"):
        runs = {w: _run_spending_web(recipe, weights, w) for w in (0, 2)}
    left = [r.getMessage() for r in caplog.records if "documents left" in r.getMessage()]
    (out, calls, state), (out2, _, _) = runs[0], runs[2]
    assert _digests(out) == _digests(out2)  # worker-count independent
    assert _digests(out[:calls]) == plain[:calls]  # nothing before the call changed
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(state)
    assert _digests(resumed) == _digests(out[calls:])  # the state holds the call
    counts = token_counts(out)
    if "prose" in weights:
        # the spent source drops out, the named one is delivered exactly once, the rest stops
        wanted = expected_counts(docs["prose"])
        assert all(counts[t] == n for t, n in wanted.items() if t != 0)
    else:
        assert len(out) == calls  # nothing can be drawn: the run ends
    assert len(left) == 2 and "code" in left[0]  # once per run, naming what is left
    assert ("prose" in left[0]) == ("prose" not in weights)


def test_a_finite_run_that_ends_normally_warns_of_nothing(finite_recipe, caplog):
    recipe, docs = finite_recipe
    with caplog.at_level(logging.WARNING, logger="mixer.runtime.loader"):
        got = list(mixer.build_loader(recipe))
    assert token_counts(got) == sum((expected_counts(d) for d in docs.values()), Counter())
    assert not [r for r in caplog.records if r.name == "mixer.runtime.loader"]
