"""Schedules and set_weights: realized shares follow the target over global tokens, exactly
resumable across change points, independent of ranks and workers (issue 10's contract)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import batch_digest, corpus, write_docs

import mixer
from mixer.core.errors import RecipeError, StateError

NAMES = ("prose", "code", "web")
SEQ, BATCH, LANES = 16, 4, 4
BATCH_TOKENS = SEQ * BATCH
STRETCH = 25 * LANES * BATCH_TOKENS  # the contract's minimum stretch for the 1-point bound


@pytest.fixture
def data(tmp_path, tokenizer_path):
    sizes = {"prose": (0, 300, 1, 30), "code": (1000, 80, 40, 200), "web": (5000, 400, 1, 10)}
    for name, (first, count, low, high) in sizes.items():
        docs = corpus(first, count, min_len=low, max_len=high, seed=first)
        for part in range(2):
            write_docs(tmp_path / name / f"{part}.jsonl", docs[part::2], "jsonl")
    return tmp_path, tokenizer_path


def recipe(data, schedule=None, **extra) -> dict:
    folder, tokenizer = data
    out = {
        "seed": 3,
        "tokenizer": str(tokenizer),
        "seq_len": SEQ,
        "batch_size": BATCH,
        "lanes": LANES,
        "split_bytes": 2000,
        "shuffle_window": 64,
        "sources": [{"name": n, "path": str(folder / n / "*.jsonl"), "weight": 1.0} for n in NAMES],
    }
    if schedule is not None:
        out["schedule"] = schedule
    out.update(extra)
    return out


def global_counts(recipe_dict, world: int, steps: int, workers: int = 0) -> np.ndarray:
    """Tokens per (global batch, source), every rank's batches in their global order."""
    out = np.zeros((steps * world, len(NAMES)), dtype=np.int64)
    for rank in range(world):
        loader = mixer.build_loader(recipe_dict, rank=rank, world_size=world, num_workers=workers)
        for step, batch in enumerate(itertools.islice(loader, steps)):
            ids = batch["source_ids"].numpy().ravel()
            out[step * world + rank] = np.bincount(ids[ids >= 0], minlength=len(NAMES))
        loader.close()
    return out


def shares(counts: np.ndarray) -> np.ndarray:
    total = counts.sum(axis=0)
    return total / total.sum()


STEP = {
    "interpolate": "step",
    "points": [
        {"at_tokens": 0, "weights": {"prose": 0.6, "code": 0.3, "web": 0.1}},
        {"at_tokens": 2 * STRETCH, "weights": {"prose": 0.2, "code": 0.3, "web": 0.5}},
        {"at_tokens": 4 * STRETCH, "weights": {"code": 1, "web": 1}},
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_step_schedule_stretches_hold_their_weights(data, world):
    steps = 6 * STRETCH // BATCH_TOKENS // world
    counts = global_counts(recipe(data, STEP), world, steps)
    per = STRETCH * 2 // BATCH_TOKENS
    targets = [(0.6, 0.3, 0.1), (0.2, 0.3, 0.5), (0.0, 0.5, 0.5)]
    for i, target in enumerate(targets):
        realized = shares(counts[i * per : (i + 1) * per])
        assert np.abs(realized - target).max() <= 0.01, (i, realized)
    # weight 0 supplies nothing in its stretch
    assert counts[2 * per : 3 * per, 0].sum() == 0


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_linear_schedule_follows_the_mean_target_over_each_stretch(data, world):
    end = 8 * STRETCH
    schedule = {
        "interpolate": "linear",
        "points": [
            {"at_tokens": 0, "weights": {"prose": 0.7, "code": 0.2, "web": 0.1}},
            {"at_tokens": end, "weights": {"prose": 0.1, "code": 0.3, "web": 0.6}},
        ],
    }
    r = mixer.load_recipe(recipe(data, schedule))
    steps = end // BATCH_TOKENS // world
    counts = global_counts(recipe(data, schedule), world, steps)
    per = STRETCH // BATCH_TOKENS
    for start in range(0, len(counts) - per + 1, per):
        target = np.mean(
            [r.weights_at(g * BATCH_TOKENS) for g in range(start, start + per)], axis=0
        )
        realized = shares(counts[start : start + per])
        assert np.abs(realized - target).max() <= 0.01, (start, realized, target)


@pytest.mark.slow
def test_schedule_stream_is_independent_of_ranks_and_workers(data):
    r = recipe(data, STEP)
    steps = 2 * STRETCH // BATCH_TOKENS  # crosses the first change point
    one = global_counts(r, 1, steps)
    assert np.array_equal(one, global_counts(r, 2, steps // 2, workers=2))
    assert np.array_equal(one, global_counts(r, 4, steps // 4))


def digests(loader, n: int) -> list[str]:
    return [batch_digest(b) for b in itertools.islice(loader, n)]


@pytest.mark.slow
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_resume_at_just_before_and_just_after_a_change_point(data, offset):
    r = recipe(data, STEP)
    change = 2 * STRETCH // BATCH_TOKENS
    cut = change + offset
    full = digests(mixer.build_loader(r), cut + 6)
    first = mixer.build_loader(r)
    assert digests(first, cut) == full[:cut]
    state = first.state_dict()
    assert first.metrics()["global_tokens"] == cut * BATCH_TOKENS
    resumed = mixer.build_loader(r)
    resumed.load_state_dict(state)
    assert digests(resumed, 6) == full[cut:]


@pytest.mark.slow
def test_elastic_resume_across_a_change_point_continues_the_global_stream(data):
    r = recipe(data, STEP)
    change = 2 * STRETCH // BATCH_TOKENS
    full = digests(mixer.build_loader(r), change + 8)
    states = []
    for rank in range(2):
        loader = mixer.build_loader(r, rank=rank, world_size=2)
        list(itertools.islice(loader, (change - 4) // 2))
        states.append(loader.state_dict())
    merged = mixer.merge_states(states)
    resumed = mixer.build_loader(r)
    resumed.load_state_dict(merged)
    assert digests(resumed, 12) == full[change - 4 :]


def test_resume_with_another_batch_size_continues_from_the_saved_position(data):
    r = recipe(data, STEP)
    first = mixer.build_loader(r)
    list(itertools.islice(first, 10))
    state = first.state_dict()
    bigger = mixer.build_loader({**r, "batch_size": 2 * BATCH})
    bigger.load_state_dict(state)
    assert bigger.metrics()["global_tokens"] == 10 * BATCH_TOKENS
    next(iter(bigger))
    assert bigger.metrics()["global_tokens"] == 10 * BATCH_TOKENS + 2 * BATCH_TOKENS


def test_editing_points_before_the_checkpoint_is_refused_later_ones_are_allowed(data):
    r = recipe(data, STEP)
    loader = mixer.build_loader(r)
    list(itertools.islice(loader, 2 * STRETCH // BATCH_TOKENS + 3))  # past point 1
    state = loader.state_dict()
    edited = {**STEP, "points": [dict(p) for p in STEP["points"]]}
    edited["points"][1] = {"at_tokens": 2 * STRETCH, "weights": {"prose": 1, "web": 1}}
    with pytest.raises(StateError, match=r"schedule.points\[1\] changed"):
        mixer.build_loader(recipe(data, edited)).load_state_dict(state)
    later = {
        **STEP,
        "points": STEP["points"][:2]
        + [
            {"at_tokens": 5 * STRETCH, "weights": {"prose": 1}},
            {"at_tokens": 7 * STRETCH, "weights": {"web": 1}},
        ],
    }
    mixer.build_loader(recipe(data, later)).load_state_dict(state)  # allowed
    with pytest.raises(StateError, match="schedule"):
        mixer.build_loader(recipe(data)).load_state_dict(state)  # schedule removed


@pytest.mark.slow
def test_set_weights_applies_to_the_next_batch_and_resume_reproduces_it(data):
    r = recipe(data)
    loader = mixer.build_loader(r, num_workers=2)
    it = iter(loader)
    before = [batch_digest(next(it)) for _ in range(4)]
    loader.set_weights({"web": 1.0})
    after = [next(it) for _ in range(3)]
    for batch in after:  # every batch handed out after the call follows the new weights
        ids = batch["source_ids"].numpy()
        assert set(np.unique(ids[ids >= 0])) == {2}
    state = loader.state_dict()
    more = [batch_digest(next(it)) for _ in range(5)]
    loader.close()
    assert loader.metrics()["target_share"] == {"prose": 0.0, "code": 0.0, "web": 1.0}

    again = mixer.build_loader(r)
    it2 = iter(again)
    assert [batch_digest(next(it2)) for _ in range(4)] == before
    again.set_weights({"web": 1.0})
    assert [batch_digest(next(it2)) for _ in range(3)] == [batch_digest(b) for b in after]
    resumed = mixer.build_loader(r)
    resumed.load_state_dict(state)
    assert digests(resumed, 5) == more


def test_set_weights_refuses_bad_weights(data):
    loader = mixer.build_loader(recipe(data))
    for bad in (
        {"nope": 1},
        {"prose": -1},
        {"prose": 0},
        {"prose": float("nan")},
        {},
        {"prose": True},
    ):
        with pytest.raises(RecipeError, match="set_weights"):
            loader.set_weights(bad)


def test_metrics_add_up_to_the_delivered_batches(data):
    r = recipe(data, STEP)
    world = 2
    totals = np.zeros(len(NAMES), dtype=np.int64)
    summed = dict.fromkeys(NAMES, 0)
    for rank in range(world):
        loader = mixer.build_loader(r, rank=rank, world_size=world)
        for batch in itertools.islice(loader, 30):
            ids = batch["source_ids"].numpy().ravel()
            totals += np.bincount(ids[ids >= 0], minlength=len(NAMES))
        m = loader.metrics()
        for n in NAMES:
            summed[n] += m["tokens"][n]
        assert m["next_global_batch"] == 30 * world + rank
        assert m["global_tokens"] == (30 * world + rank) * BATCH_TOKENS
        assert sum(m["realized_share"].values()) == pytest.approx(1.0)
        assert set(m) >= {
            "tokens",
            "documents",
            "target_share",
            "realized_share",
            "epochs",
            "skipped",
            "skipped_by_reason",
            "io",
            "next_global_batch",
            "global_tokens",
        }
        assert all(m["documents"][n] > 0 for n in NAMES)
        assert all(0 < m["epochs"][n] for n in NAMES)
    assert [summed[n] for n in NAMES] == totals.tolist()


def test_skips_are_counted_by_reason(tmp_path, tokenizer_path):
    good = corpus(0, 40, max_len=10)
    write_docs(tmp_path / "a.jsonl", good, "jsonl")
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write("{not json\n" + '{"other": 1}\n' + '{"text": "' + "x" * 400 + '"}\n')
    r = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 2,
        "lanes": 1,
        "max_document_bytes": 200,
        "sources": [
            {
                "name": "a",
                "path": str(tmp_path / "a.jsonl"),
                "weight": 1,
                "epochs": 1,
                "on_error": "skip",
            }
        ],
    }
    loader = mixer.build_loader(r)
    list(loader)
    m = loader.metrics()
    assert m["skipped"] == {"a": 3}
    assert m["skipped_by_reason"] == {"a": {"malformed": 1, "bad_text": 1, "too_long": 1}}
    assert m["epochs"]["a"] == pytest.approx(1.0)
