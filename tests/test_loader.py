"""The loader's promises: shapes, worker independence, exact resume, exactly once, topology."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch
from helpers import EOS_ID, PAD_ID, batch_digest, expected_counts, token_counts

import mixer
from mixer.runtime.state import unpack


def take(loader, n: int) -> list[dict]:
    out: list[dict] = []
    if n == 0:
        return out
    for batch in loader:
        out.append({k: v.clone() for k, v in batch.items()})
        if len(out) == n:
            break
    return out


def digests(batches: list[dict]) -> list[str]:
    return [batch_digest(b) for b in batches]


def finite(recipe: dict, epochs: int = 1) -> dict:
    return {**recipe, "sources": [{**s, "epochs": epochs} for s in recipe["sources"]]}


def test_batches_are_int64_tensors_of_the_declared_shape(three_sources):
    recipe, _ = three_sources
    with mixer.build_loader(recipe) as loader:
        batch = next(iter(loader))
    assert set(batch) == set(mixer.BATCH_KEYS)
    for value in batch.values():
        assert value.dtype == torch.int64 and value.shape == (4, 16)


@pytest.mark.parametrize("workers", [1, 2])
def test_stream_does_not_depend_on_num_workers(three_sources, workers):
    recipe, _ = three_sources
    reference = digests(take(mixer.build_loader(recipe, num_workers=0), 30))
    assert digests(take(mixer.build_loader(recipe, num_workers=workers), 30)) == reference


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 5, 13, 40])
def test_resume_after_k_batches_with_prefetching_workers(three_sources, k):
    recipe = {**three_sources[0], "shuffle_window": 5}
    full = digests(take(mixer.build_loader(recipe, num_workers=2), k + 25))
    first = mixer.build_loader(recipe, num_workers=2)
    assert digests(take(first, k)) == full[:k]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = mixer.build_loader(recipe, num_workers=2)
    resumed.load_state_dict(state)
    assert digests(take(resumed, 25)) == full[k:]


@pytest.mark.slow
def test_resume_across_epoch_boundaries_and_twice_in_a_row(three_sources):
    recipe = three_sources[0]  # infinite sources of a few hundred documents: epochs turn over
    full = digests(take(mixer.build_loader(recipe), 180))
    position, states = 0, []
    loader = mixer.build_loader(recipe)
    for stop in (37, 38, 95, 180):
        got = digests(take(loader, stop - position))
        assert got == full[position:stop]
        states.append(loader.state_dict())
        loader = mixer.build_loader(recipe, num_workers=1)
        loader.load_state_dict(states[-1])
        position = stop
    epochs = [
        unpack(states[-1])["lanes"][str(i)]["sources"]["web"]["packer"]["stream"]["epoch"]
        for i in (0, 1, 2, 3)
    ]
    assert max(epochs) >= 1, "the test must cross an epoch boundary"


def test_second_iter_continues_where_the_first_stopped(three_sources):
    recipe, _ = three_sources
    full = digests(take(mixer.build_loader(recipe), 20))
    loader = mixer.build_loader(recipe, num_workers=2)
    assert digests(take(loader, 7)) == full[:7]
    assert digests(take(loader, 13)) == full[7:]


def test_state_is_small_json_with_a_fixed_shape_before_the_first_batch(three_sources):
    recipe, _ = three_sources
    loader = mixer.build_loader(recipe)
    fresh = loader.state_dict()
    take(loader, 9)
    later = loader.state_dict()
    assert set(fresh) == set(later) == {"format", "version", "json"}
    assert len(json.dumps(later)) < 16_000
    replay = mixer.build_loader(recipe)
    replay.load_state_dict(fresh)
    assert digests(take(replay, 3)) == digests(take(mixer.build_loader(recipe), 3))


@pytest.mark.slow
@pytest.mark.parametrize("world,workers", [(1, 0), (2, 2), (4, 1)])
def test_finite_recipe_delivers_every_document_exactly_once(three_sources, world, workers):
    recipe, docs = three_sources
    recipe = finite(recipe)
    seen = []
    for rank in range(world):
        with mixer.build_loader(recipe, rank=rank, world_size=world, num_workers=workers) as ld:
            seen.extend(list(ld))
    expected = sum((expected_counts(d) for d in docs.values()), start=expected_counts([]))
    assert token_counts(seen) == expected
    assert all(b["input_ids"].shape == (4, 16) for b in seen)


def test_two_epochs_deliver_every_document_twice(three_sources):
    recipe, docs = three_sources
    batches = list(mixer.build_loader(finite(recipe, 2), num_workers=2))
    expected = sum((expected_counts(d, 2) for d in docs.values()), start=expected_counts([]))
    assert token_counts(batches) == expected


@pytest.mark.slow
def test_finite_tail_is_padded_and_workers_keep_order(three_sources):
    recipe = finite(three_sources[0])
    reference = digests(list(mixer.build_loader(recipe)))
    assert digests(list(mixer.build_loader(recipe, num_workers=2))) == reference
    last = list(mixer.build_loader(recipe))[-1]
    assert (last["source_ids"] == -1).any(), "the tail is padded, not dropped"
    pad = last["source_ids"] == -1
    assert (last["labels"][pad] == -100).all() and (last["position_ids"][pad] == 0).all()
    assert (last["input_ids"][pad] == PAD_ID).all()


def test_resume_inside_a_finite_stream_keeps_exactly_once(three_sources):
    recipe, docs = three_sources
    recipe = finite(recipe)
    loader = mixer.build_loader(recipe, num_workers=2)
    before = take(loader, 11)
    state = loader.state_dict()
    loader.close()
    after = mixer.build_loader(recipe, num_workers=1)
    after.load_state_dict(state)
    expected = sum((expected_counts(d) for d in docs.values()), start=expected_counts([]))
    assert token_counts(before + list(after)) == expected


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_a_resume_late_in_a_finite_stream_ends_as_the_uninterrupted_run(
    three_sources, caplog, packing
):
    """Lanes whose sources ran out before the cut: the resumed run ends in the very state,
    metrics and silence of the run never cut (a best_fit lane saved its last window's start
    and, resumed, counted its source as never read: "documents left" was logged)."""
    recipe = {**finite(three_sources[0]), "packing": packing}
    full = mixer.build_loader(recipe)
    count = len(list(full))
    for cut in (count // 2, count - 3, count - 1):
        loader = mixer.build_loader(recipe)
        take(loader, cut)
        state = loader.state_dict()
        resumed = mixer.build_loader(recipe)
        resumed.load_state_dict(state)
        caplog.clear()
        with caplog.at_level("WARNING", logger="mixer.loader"):
            assert len(list(resumed)) == count - cut
        assert "left" not in caplog.text, cut
        assert unpack(resumed.state_dict()) == unpack(full.state_dict()), cut
        assert (
            resumed.metrics()["epochs"]
            == full.metrics()["epochs"]
            == {"prose": 1.0, "code": 1.0, "web": 1.0}
        )


def test_changed_batch_size_loses_and_repeats_nothing(three_sources):
    recipe, docs = three_sources
    recipe = finite(recipe)
    loader = mixer.build_loader(recipe)
    before = take(loader, 6)
    state = loader.state_dict()
    after = mixer.build_loader({**recipe, "batch_size": 3})
    after.load_state_dict(state)
    expected = sum((expected_counts(d) for d in docs.values()), start=expected_counts([]))
    assert token_counts(before + list(after)) == expected


@pytest.mark.slow
def test_merged_rank_states_resume_on_other_world_sizes(three_sources):
    recipe, _ = three_sources
    reference = digests(take(mixer.build_loader(recipe), 30))
    states = []
    for rank in range(2):
        loader = mixer.build_loader(recipe, rank=rank, world_size=2, num_workers=1)
        got = digests(take(loader, 3))
        assert got == reference[rank:6:2]
        states.append(loader.state_dict())
    merged = mixer.merge_states(states)
    single = mixer.build_loader(recipe, num_workers=2)
    single.load_state_dict(merged)
    assert digests(take(single, 24)) == reference[6:30]
    for rank in range(4):
        loader = mixer.build_loader(recipe, rank=rank, world_size=4)
        loader.load_state_dict(merged)
        assert digests(take(loader, 6)) == reference[6 + rank : 30 : 4]


def test_rank_state_refused_on_another_topology(three_sources):
    recipe, _ = three_sources
    loader = mixer.build_loader(recipe, rank=1, world_size=2)
    take(loader, 2)
    other = mixer.build_loader(recipe)
    with pytest.raises(mixer.StateError, match="merge_states"):
        other.load_state_dict(loader.state_dict())


def test_topology_that_does_not_divide_lanes_is_refused(three_sources):
    recipe, _ = three_sources
    with pytest.raises(mixer.TopologyError) as err:
        mixer.build_loader(recipe, num_workers=3)
    assert "valid num_workers" in str(err.value) and "[1, 2, 4]" in str(err.value)
    with pytest.raises(mixer.TopologyError, match=r"\[1, 2\]"):
        mixer.build_loader(recipe, rank=0, world_size=2, num_workers=4)


@pytest.mark.parametrize(
    "args,name",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": -2}, "world_size"),
        ({"world_size": 1.0}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"world_size": 2**40}, "world_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"num_workers": "2"}, "num_workers"),
        ({"num_workers": 10**6}, "num_workers"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"rank": -1, "world_size": 2}, "rank"),
        ({"rank": 0.0, "world_size": 1}, "rank"),
        ({"rank": False, "world_size": 1}, "rank"),
    ],
)
def test_bad_rank_world_size_or_num_workers_is_refused_naming_it(three_sources, args, name):
    recipe, _ = three_sources
    with pytest.raises(mixer.TopologyError, match=rf"^{name} must be an integer"):
        mixer.build_loader(recipe, **args)
    good = mixer.build_loader(recipe)
    with pytest.raises(mixer.TopologyError, match=rf"^{name} must be an integer"):
        mixer.Loader(
            good.recipe,
            tables=good.tables,
            tokenizer=good.tokenizer,
            **{"rank": 0, "world_size": 1, "num_workers": 0, **args},
        )


@pytest.mark.parametrize(
    "change,field", [({"seq_len": 32}, "seq_len"), ({"seed": 8}, "seed"), ({"lanes": 8}, "lanes")]
)
def test_state_of_another_stream_is_refused_with_the_reason(three_sources, change, field):
    recipe, _ = three_sources
    state = mixer.build_loader(recipe).state_dict()
    with pytest.raises(mixer.StateError, match=field):
        mixer.build_loader({**recipe, **change}).load_state_dict(state)


def test_changed_source_files_are_refused(three_sources, tmp_path):
    recipe, _ = three_sources
    state = mixer.build_loader(recipe).state_dict()
    with open(tmp_path / "prose" / "p0.jsonl", "a") as f:
        f.write('{"text": "w1"}\n')
    with pytest.raises(mixer.StateError, match="prose.*files"):
        mixer.build_loader(recipe).load_state_dict(state)


def test_weight_change_and_new_source_are_allowed(three_sources):
    recipe, _ = three_sources
    loader = mixer.build_loader(recipe)
    take(loader, 5)
    state = loader.state_dict()
    changed = {
        **recipe,
        "sources": [{**recipe["sources"][0], "weight": 0.9}, *recipe["sources"][1:]],
    }
    resumed = mixer.build_loader(changed)
    resumed.load_state_dict(state)
    assert len(take(resumed, 3)) == 3
    fewer = {**recipe, "sources": recipe["sources"][:2]}
    with pytest.raises(mixer.StateError, match="removed"):
        mixer.build_loader(fewer).load_state_dict(state)


def test_close_leaves_no_worker_processes(three_sources):
    recipe, _ = three_sources
    with mixer.build_loader(recipe, num_workers=2) as loader:
        iterator = iter(loader)
        next(iterator)
        assert len(multiprocessing.active_children()) == 2
    assert not multiprocessing.active_children()
    del iterator
    loader = mixer.build_loader(recipe, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    loader.close()
    assert not multiprocessing.active_children()


def test_eos_token_override_and_missing_eos(tmp_path, three_sources):
    from helpers import make_tokenizer

    recipe, _ = three_sources
    no_eos = make_tokenizer(tmp_path / "noeos.json", eos=False)
    with pytest.raises(mixer.RecipeError, match="eos_token"):
        mixer.build_loader({**recipe, "tokenizer": str(no_eos)})
    batch = next(
        iter(mixer.build_loader({**recipe, "tokenizer": str(no_eos), "eos_token": "<unk>"}))
    )
    assert (batch["input_ids"] == EOS_ID).any()


def test_close_from_another_thread_ends_the_iteration(three_sources, monkeypatch):
    """A watchdog thread closing the loader while the training thread is inside next(): no
    error in either; the iteration ends after the batch being fetched, workers stopped."""
    import threading

    from mixer.runtime.loader import Loader

    loader = mixer.build_loader(three_sources[0], num_workers=2)
    errors: list[BaseException] = []
    real = Loader._receive
    calls = []

    def receive(self, ring, data, padding):  # inside next(), in the iterating thread
        calls.append(1)
        if len(calls) == 3:

            def close():
                try:
                    loader.close()
                except BaseException as exc:
                    errors.append(exc)

            watchdog = threading.Thread(target=close)
            watchdog.start()
            watchdog.join()
        return real(self, ring, data, padding)

    monkeypatch.setattr(Loader, "_receive", receive)
    got = [batch for _, batch in zip(range(50), loader)]  # (an unlimited stream)
    assert errors == [] and len(got) == 3
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_metrics_after_a_resume_inside_windows_are_the_uninterrupted_runs(
    tokenizer_path, tmp_path, packing
):
    """A resumed stream reads the window it was saved inside only when drawn again; until
    then its skips and progress are those the state holds, as in the run never cut (they
    read 0 before)."""
    from helpers import corpus, write_docs

    sources = []
    for i in range(12):  # many sources, unequal weights: some sit inside a window for long
        path = tmp_path / f"s{i}.jsonl"
        write_docs(path, corpus(100 * i, 40, max_len=30, seed=i), "jsonl")
        with open(path, "a") as out:
            out.write("not json\n" * 3)
        sources.append(
            {"name": f"s{i}", "path": str(path), "weight": 1 + i % 5, "on_error": "skip"}
        )
    recipe = {
        "seed": 3,
        "tokenizer": str(tokenizer_path),
        "seq_len": 64,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 256,
        "packing": packing,
        "sources": sources,
    }
    keys = ("skipped", "epochs", "skipped_by_reason", "documents")
    full = mixer.build_loader(recipe)
    seen = {}
    for n, _ in zip(range(30), full):
        seen[n + 1] = {k: full.metrics()[k] for k in keys}
    for cut in (9, 21):
        loader = mixer.build_loader(recipe)
        take(loader, cut)
        resumed = mixer.build_loader(recipe)
        resumed.load_state_dict(loader.state_dict())
        assert {k: resumed.metrics()[k] for k in keys} == seen[cut]
        for n, _ in zip(range(cut + 1, 31), resumed):
            assert {k: resumed.metrics()[k] for k in keys} == seen[n], (cut, n)
