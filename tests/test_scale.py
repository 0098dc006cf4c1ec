"""A 64-rank job simulated in one process: explicit rank/world loaders over one listing.

Every rank is `Loader(recipe, tables=..., rank=r, world_size=64)` sharing one listing (what
`build_loader` does under torch.distributed with `list_once`). Properties: a finite recipe
delivers every document exactly once over all ranks; each rank's realized shares are within a
point of the weights; the merged state of all ranks resumes on another world size with exactly
the global batches the uninterrupted ranks would have produced.
"""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import batch_digest, corpus, expected_counts, token_counts, write_docs

import mixer
from mixer.runtime.loader import Loader
from mixer.sources.manifest import list_sources
from mixer.tokenize import resolve_tokenizer

WORLD = 64
WEIGHTS = {"prose": 0.5, "code": 0.3, "web": 0.2}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(recipe dict, documents per source): three sources of 64+ splits each (no striping)."""
    from helpers import make_tokenizer

    root = tmp_path_factory.mktemp("scale")
    tok = make_tokenizer(root / "tok.json")
    docs = {
        "prose": corpus(0, 1024, max_len=12),
        "code": corpus(5000, 768, max_len=20, seed=1),
        "web": corpus(10000, 640, max_len=8, seed=2),
    }
    for part in range(4):
        write_docs(root / "prose" / f"p{part}.jsonl", docs["prose"][part::4], "jsonl")
        write_docs(
            root / "code" / f"c{part}.parquet",
            docs["code"][part::4],
            "parquet",
            field="content",
            row_group_size=3,
        )
        write_docs(root / "web" / f"w{part}.jsonl", docs["web"][part::4], "jsonl")
    recipe = {
        "seed": 11,
        "tokenizer": str(tok),
        "seq_len": 16,
        "batch_size": 8,
        "lanes": WORLD,
        "shuffle_window": 4,
        "split_bytes": 256,
        "sources": [
            {"name": "prose", "path": str(root / "prose" / "*.jsonl"), "weight": WEIGHTS["prose"]},
            {
                "name": "code",
                "path": str(root / "code" / "*.parquet"),
                "weight": WEIGHTS["code"],
                "text_field": "content",
            },
            {"name": "web", "path": str(root / "web" / "*.jsonl"), "weight": WEIGHTS["web"]},
        ],
    }
    return recipe, docs


def ranks(recipe: dict, world: int) -> list[Loader]:
    """One loader per rank, all from a single listing (listed once, as under list_once)."""
    r = mixer.load_recipe(recipe)
    tables = list_sources(r)
    assert min(len(t.splits) for t in tables) >= r.lanes, "every lane owns splits"
    tok = resolve_tokenizer(r.resolve(r.tokenizer), r.eos_token)
    return [
        Loader(r, tables=tables, tokenizer=tok, rank=rank, world_size=world, num_workers=0)
        for rank in range(world)
    ]


@pytest.mark.slow
def test_finite_recipe_delivers_every_document_once_over_64_ranks(job):
    recipe, docs = job
    finite = {**recipe, "sources": [{**s, "epochs": 1} for s in recipe["sources"]]}
    seen = []
    for loader in ranks(finite, WORLD):
        seen.extend(loader)
    expected = expected_counts(docs["prose"] + docs["code"] + docs["web"])
    assert sum(expected.values()) > 20_000
    assert token_counts(seen) == expected


@pytest.mark.slow
def test_each_of_64_ranks_gets_the_weights_within_a_point(job):
    recipe, _ = job
    # Invariant 6: within 1 point once a rank holds 25 · (lanes / world) · batch_size · seq_len
    # tokens: 25 batches of its one lane.
    steps = 25 * recipe["lanes"] // WORLD
    worst = 0.0
    for loader in ranks(recipe, WORLD):
        tokens: Counter = Counter()
        for _, batch in zip(range(steps), loader):
            ids = batch["source_ids"][batch["source_ids"] >= 0]
            tokens.update(ids.tolist())
        total = sum(tokens.values())
        assert total == steps * recipe["batch_size"] * recipe["seq_len"], "no padding"
        for index, weight in enumerate(WEIGHTS.values()):
            worst = max(worst, abs(tokens[index] / total - weight))
    assert worst <= 0.01


@pytest.mark.slow
def test_merged_state_of_64_ranks_resumes_on_16_exactly(job):
    recipe, _ = job
    before, after = 2, 2
    loaders = ranks(recipe, WORLD)
    states, expected = [], {}
    for rank, loader in enumerate(loaders):
        iterator = iter(loader)
        for _ in range(before):
            next(iterator)
        states.append(loader.state_dict())
        for step in range(before, before + after):  # the uninterrupted run goes on
            expected[step * WORLD + rank] = batch_digest(next(iterator))
        loader.close()
    merged = mixer.merge_states(states)
    new_world = 16
    got = {}
    for loader in ranks(recipe, new_world):
        loader.load_state_dict(merged)
        first = loader.next_global_batch
        for step, batch in zip(range(after * WORLD // new_world), loader):
            got[first + step * new_world] = batch_digest(batch)
    assert got == expected
    assert len(got) == after * WORLD
