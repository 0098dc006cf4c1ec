"""Exact mixture: token shares per rank stay within 1 point of the weights (invariant 6)."""

from __future__ import annotations

import pytest
import torch
from helpers import corpus, write_docs
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.pipeline.mix import choose_by_share, grow_by_share, shares


def _worst_rank_error(
    weights: list[float], lanes: int, world: int, batch: int, batches_per_lane: int = 100
) -> float:
    """Simulate the lanes' deficit schedules (rows of one token) and measure every rank."""
    worst = 0.0
    for rank in range(world):
        mine = list(range(rank, lanes, world))
        state = {lane: [0] * len(weights) for lane in mine}
        targets = {lane: [0] * len(weights) for lane in mine}
        parts = shares(weights, [True] * len(weights))
        counts, total = [0] * len(weights), 0
        threshold = 25 * len(mine) * batch
        for _ in range(batches_per_lane):
            for lane in mine:
                for _ in range(batch):
                    s = choose_by_share(parts, state[lane], targets[lane], 1)
                    state[lane][s] += 1
                    grow_by_share(targets[lane], parts, 1)
                    counts[s] += 1
                    total += 1
                if total >= threshold:
                    worst = max(worst, max(abs(c / total - w) for c, w in zip(counts, weights)))
    return worst


def _worst_rank_error_of(raw: list[int], topology: tuple[int, int], batch: int) -> float:
    """`_worst_rank_error` for weights proportional to `raw` on (lanes, world_size)."""
    lanes, world = topology
    return _worst_rank_error([r / sum(raw) for r in raw], lanes, world, batch)


TOPOLOGIES = [(4, 1), (4, 2), (4, 4), (8, 2), (16, 4), (64, 8), (64, 2)]


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    raw=st.lists(st.integers(1, 100), min_size=2, max_size=4),
    topology=st.sampled_from(TOPOLOGIES),
    batch=st.sampled_from([4, 8]),
)
def test_deficit_rule_keeps_every_rank_within_one_point(raw, topology, batch):
    assert _worst_rank_error_of(raw, topology, batch) <= 0.01


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    raw=st.lists(st.integers(1, 100), min_size=5, max_size=6),
    topology=st.sampled_from(TOPOLOGIES),
    batch=st.sampled_from([8, 16]),
)
def test_with_five_or_more_sources_the_one_point_bound_needs_batch_size_8(raw, topology, batch):
    assert _worst_rank_error_of(raw, topology, batch) <= 0.01


@pytest.mark.xfail(
    strict=True,
    reason="five sources at batch_size 4: a rank's shares err by up "
    "to ~1.08 points after 25 batches per lane (each source within about a row "
    "of its target, and the rows of every lane err alike); docs/recipes.md",
)
def test_five_sources_at_batch_size_4_can_exceed_one_point():
    assert _worst_rank_error_of([1, 1, 1, 80, 80], (4, 1), 4) <= 0.01


@pytest.mark.slow
def test_realized_shares_per_rank_with_documents_longer_than_seq_len(tmp_path, tokenizer_path):
    write_docs(tmp_path / "short.jsonl", corpus(0, 400, max_len=10), "jsonl")
    write_docs(tmp_path / "long.jsonl", corpus(1000, 80, min_len=200, max_len=900), "jsonl")
    write_docs(tmp_path / "mid.jsonl", corpus(5000, 300, min_len=5, max_len=40), "jsonl")
    weights = {"short": 0.5, "long": 0.3, "mid": 0.2}
    lanes, world, batch, seq_len = 8, 2, 4, 16
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": seq_len,
        "batch_size": batch,
        "lanes": lanes,
        "split_bytes": 4000,
        "sources": [
            {"name": n, "path": str(tmp_path / f"{n}.jsonl"), "weight": w}
            for n, w in weights.items()
        ],
    }
    threshold = 25 * (lanes // world) * batch * seq_len
    target = torch.tensor(list(weights.values()))
    for rank in range(world):
        counts, total, checked = torch.zeros(3), 0, 0
        for batch_ in mixer.build_loader(recipe, rank=rank, world_size=world):
            ids = batch_["source_ids"].flatten()
            counts += torch.stack([(ids == i).sum() for i in range(3)])
            total += ids.numel()
            if total >= threshold:
                assert (counts / total - target).abs().max() <= 0.01, (rank, total)
                checked += 1
            if total >= 4 * threshold:
                break
        assert checked >= 3 * 25 * (lanes // world)


def test_weights_renormalize_when_a_capped_source_runs_out(tmp_path, tokenizer_path):
    write_docs(tmp_path / "a.jsonl", corpus(0, 300, max_len=20), "jsonl")
    write_docs(tmp_path / "b.jsonl", corpus(1000, 300, max_len=20), "jsonl")
    write_docs(tmp_path / "small.jsonl", corpus(5000, 10, max_len=5), "jsonl")
    recipe = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 4,
        "lanes": 2,
        "sources": [
            {"name": "a", "path": str(tmp_path / "a.jsonl"), "weight": 0.3},
            {"name": "b", "path": str(tmp_path / "b.jsonl"), "weight": 0.1},
            {"name": "small", "path": str(tmp_path / "small.jsonl"), "weight": 0.6, "epochs": 1},
        ],
    }
    counts = torch.zeros(3)
    for i, batch in enumerate(mixer.build_loader(recipe)):
        if i >= 40:  # long after `small` ran out
            ids = batch["source_ids"].flatten()
            counts += torch.stack([(ids == k).sum() for k in range(3)])
        if i == 240:
            break
    assert counts[2] == 0
    assert abs(counts[0] / counts.sum() - 0.75) <= 0.01


def test_changed_weights_apply_from_the_resume_on_without_catch_up(tmp_path, tokenizer_path):
    for name, first in (("a", 0), ("b", 5000)):
        write_docs(tmp_path / f"{name}.jsonl", corpus(first, 400, max_len=20), "jsonl")
    base = {
        "tokenizer": str(tokenizer_path),
        "seq_len": 8,
        "batch_size": 4,
        "lanes": 1,
        "sources": [
            {"name": "a", "path": str(tmp_path / "a.jsonl"), "weight": 0.5},
            {"name": "b", "path": str(tmp_path / "b.jsonl"), "weight": 0.5},
        ],
    }
    loader = mixer.build_loader(base)
    for i, _ in enumerate(loader):
        if i == 99:
            break
    state = loader.state_dict()
    changed = {
        **base,
        "sources": [{**base["sources"][0], "weight": 0.8}, {**base["sources"][1], "weight": 0.2}],
    }
    resumed = mixer.build_loader(changed)
    resumed.load_state_dict(state)
    counts = torch.zeros(2)
    for i, batch in enumerate(resumed):
        ids = batch["source_ids"].flatten()
        counts += torch.stack([(ids == k).sum() for k in range(2)])
        if i == 24:  # 100 rows after the change: 80/20, not a burst of `a` making up the past
            break
    assert counts[0] / counts.sum() == 0.8
