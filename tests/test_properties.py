"""Property tests over random recipes and topologies: exactly once, elastic resume included."""

from __future__ import annotations

import pytest
from helpers import corpus, expected_counts, make_tokenizer, token_counts, write_docs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer

FORMATS = ["jsonl", "jsonl.gz", "jsonl.zst", "parquet"]


@st.composite
def setups(draw):
    lanes = draw(st.sampled_from([1, 2, 3, 4, 6]))
    world = draw(st.sampled_from([w for w in (1, 2, 3) if lanes % w == 0]))
    new_world = draw(st.sampled_from([w for w in (1, 2, 3, 6) if lanes % w == 0]))
    sources = []
    for i in range(draw(st.integers(1, 3))):
        sources.append(
            {
                "files": draw(st.integers(1, 4)),
                "docs": draw(st.integers(1, 40)),
                "max_len": draw(st.integers(1, 60)),
                "format": draw(st.sampled_from(FORMATS)),
                "weight": draw(st.integers(1, 5)),
                "seed": i,
            }
        )
    return {
        "lanes": lanes,
        "world": world,
        "new_world": new_world,
        "sources": sources,
        "seq_len": draw(st.integers(2, 24)),
        "batch": draw(st.integers(1, 4)),
        "packing": draw(st.sampled_from(["concat", "pad", "best_fit"])),
        "pack_window": draw(st.integers(1, 9)),
        "window": draw(st.integers(1, 12)),
        "split_bytes": draw(st.integers(40, 3000)),
        "epochs": draw(st.integers(1, 2)),
        "stop": draw(st.integers(0, 12)),
    }


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(setup=setups())
def test_every_document_exactly_epochs_times_across_an_elastic_resume(tmp_path_factory, setup):
    root = tmp_path_factory.mktemp("prop")
    tok = make_tokenizer(root / "tok.json")
    expected = expected_counts([])
    sources = []
    first = 0
    for i, spec in enumerate(setup["sources"]):
        docs = corpus(first, spec["docs"], max_len=spec["max_len"], seed=spec["seed"])
        first += spec["docs"]
        expected += expected_counts(docs, setup["epochs"])
        ext = spec["format"]
        for f in range(spec["files"]):
            part = docs[f :: spec["files"]]
            if part:
                write_docs(root / f"s{i}" / f"{f}.{ext}", part, ext, row_group_size=3)
        sources.append(
            {
                "name": f"s{i}",
                "path": str(root / f"s{i}" / "*"),
                "weight": spec["weight"],
                "epochs": setup["epochs"],
            }
        )
    recipe = {
        "seed": 3,
        "tokenizer": str(tok),
        "seq_len": setup["seq_len"],
        "batch_size": setup["batch"],
        "lanes": setup["lanes"],
        "packing": setup["packing"],
        "pack_window": setup["pack_window"],
        "shuffle_window": setup["window"],
        "split_bytes": setup["split_bytes"],
        "sources": sources,
    }
    world, seen, states, iterators = setup["world"], [], [], []
    for rank in range(world):
        loader = mixer.build_loader(recipe, rank=rank, world_size=world)
        iterators.append(iter(loader))
        got = [b for _, b in zip(range(setup["stop"]), iterators[-1])]
        seen.extend(got)
        states.append(loader.state_dict() if len(got) == setup["stop"] else None)
    if all(s is not None for s in states):  # every rank at the same step: resume elsewhere
        merged = mixer.merge_states(states) if world > 1 else states[0]
        for rank in range(setup["new_world"]):
            loader = mixer.build_loader(recipe, rank=rank, world_size=setup["new_world"])
            loader.load_state_dict(merged)
            seen.extend(loader)
    else:  # a rank ran out first (outside torch.distributed ranks end independently)
        for it in iterators:
            seen.extend(it)
    assert token_counts(seen) == expected


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(setup=setups())
def test_any_valid_topology_continues_the_global_stream_after_resume(tmp_path_factory, setup):
    from helpers import batch_digest

    root = tmp_path_factory.mktemp("stream")
    tok = make_tokenizer(root / "tok.json")
    sources = []
    for i, spec in enumerate(setup["sources"]):
        # Every lane gets documents: files of >= lanes documents, one split each. (A lane with
        # no data at all yields only padding, and outside torch.distributed a rank holding
        # only such lanes ends on its own.)
        count = max(spec["docs"], setup["lanes"] * spec["files"])
        docs = corpus(1000 * i, count, max_len=spec["max_len"], seed=spec["seed"])
        for f in range(spec["files"]):
            write_docs(
                root / f"s{i}" / f"{f}.{spec['format']}",
                docs[f :: spec["files"]],
                spec["format"],
                row_group_size=1000,
            )
        sources.append(
            {"name": f"s{i}", "path": str(root / f"s{i}" / "*"), "weight": spec["weight"]}
        )  # infinite: the stream never ends
    recipe = {
        "seed": 5,
        "tokenizer": str(tok),
        "seq_len": setup["seq_len"],
        "batch_size": setup["batch"],
        "lanes": setup["lanes"],
        "packing": setup["packing"],
        "pack_window": setup["pack_window"],
        "shuffle_window": setup["window"],
        "split_bytes": 10**9,
        "sources": sources,
    }
    world, new_world, steps = setup["world"], setup["new_world"], setup["stop"]
    total = world * steps + new_world * 4
    reference = [batch_digest(b) for _, b in zip(range(total), mixer.build_loader(recipe))]
    states = []
    for rank in range(world):
        loader = mixer.build_loader(recipe, rank=rank, world_size=world)
        got = [batch_digest(b) for _, b in zip(range(steps), loader)]
        assert got == reference[rank : world * steps : world]
        states.append(loader.state_dict())
    merged = mixer.merge_states(states) if world > 1 else states[0]
    for rank in range(new_world):
        loader = mixer.build_loader(recipe, rank=rank, world_size=new_world)
        loader.load_state_dict(merged)
        got = [batch_digest(b) for _, b in zip(range(4), loader)]
        assert got == reference[world * steps + rank :: new_world][:4]
