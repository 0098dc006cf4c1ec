"""A damaged loader state is a StateError naming where, never a KeyError from deep inside.
(Fuzz examples per run: MIXER_FUZZ_EXAMPLES.)"""

from __future__ import annotations

import os

import pytest
from helpers import byte_mutations, structural_mutations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mixer
from mixer.runtime.state import pack, unpack

EXAMPLES = int(os.environ.get("MIXER_FUZZ_EXAMPLES", "30"))
# CI runs a fixed sequence of examples (a random one may, rarely, miss one of the outcomes the
# tests assert they reach); MIXER_FUZZ_RANDOM=1 explores new ones.
DERANDOMIZE = not os.environ.get("MIXER_FUZZ_RANDOM")


def take(loader, n: int) -> None:
    for i, _ in enumerate(loader):
        if i + 1 == n:
            break


@pytest.fixture(params=["concat", "best_fit"])
def saved(request, three_sources):
    """(a fresh loader, the state of another after three batches, its payload)."""
    recipe, _ = three_sources
    recipe = {**recipe, "packing": request.param, "pack_window": 8}
    loader = mixer.build_loader(recipe)
    take(loader, 3)
    state = loader.state_dict()
    return mixer.build_loader(recipe), state, unpack(state)


def with_json(text: str) -> dict:
    return {"format": "mixer.loader", "version": mixer.runtime.state.STATE_VERSION, "json": text}


@pytest.mark.slow
@pytest.mark.parametrize(
    "text", ["{}", "[]", "null", "1", '"x"', "[" * 100_000, "{" * 3000, "NaN", '{"kind": "global"}']
)
def test_state_json_of_the_wrong_shape(saved, text):
    loader, _, _ = saved
    with pytest.raises(mixer.StateError, match="damaged"):
        loader.load_state_dict(with_json(text))


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", ["kind", "fingerprint", "next_global", "world_size", "rank", "lanes", "listing_skipped"]
)
def test_state_missing_a_key_names_it(saved, key):
    loader, _, payload = saved
    del payload[key]
    with pytest.raises(mixer.StateError, match=rf"\['{key}'\]: Field required"):
        loader.load_state_dict(pack(payload))


@pytest.mark.slow
@pytest.mark.parametrize("value", ["3", 3.0, True, -1, None, 2**63, [3]])
def test_next_global_of_the_wrong_type(saved, value):
    loader, _, payload = saved
    payload["next_global"] = value
    with pytest.raises(mixer.StateError, match=r"\['next_global'\]"):
        loader.load_state_dict(pack(payload))


def test_nested_lane_packer_and_stream_states_are_checked(saved):
    loader, state, payload = saved
    lane = next(k for k, v in payload["lanes"].items() if v)
    source = next(iter(payload["lanes"][lane]["sources"]))
    edits = {  # name in the error -> edit of (lane state, the source's entry)
        "sources": lambda lane_state, entry: lane_state.update(sources=[]),
        "tokens": lambda lane_state, entry: entry.update(tokens="many"),
        "packer": lambda lane_state, entry: entry.update(packer=[1]),
        "exhausted": lambda lane_state, entry: entry["packer"].update(exhausted=2),
        "stream": lambda lane_state, entry: entry["packer"].update(stream={}),
        "epoch": lambda lane_state, entry: entry["packer"]["stream"].update(epoch=-1),
        "done": lambda lane_state, entry: entry["packer"]["stream"].pop("done"),
    }
    for name, edit in edits.items():
        edited = unpack(state)
        lane_state = edited["lanes"][lane]
        edit(lane_state, lane_state["sources"][source])
        with pytest.raises(mixer.StateError, match=rf"\['lanes'\]\['{lane}'\].*'{name}'"):
            loader.load_state_dict(pack(edited))


def test_lane_keys_and_ranks_are_checked(saved):
    loader, state, payload = saved
    lanes = payload["lanes"]
    for edit, message in [
        (lambda p: p["lanes"].update({"x": None}), r"\['lanes'\]\['x'\]"),
        (lambda p: p["lanes"].update({"64": None}), "lane 64 of a 4-lane recipe"),
        (
            lambda p: p["lanes"].update({"0": lanes["1"] or {**lanes["0"], "lane": 1}}),
            "lane 0 holds the state of lane 1",
        ),
        (lambda p: p.update(rank=1), "rank 1 is outside world_size 1"),
        (lambda p: p.update(kind="other"), r"\['kind'\]"),
        (lambda p: p["fingerprint"].update(stream={}), r"\['fingerprint'\]\['stream'\]"),
        (lambda p: p["fingerprint"]["sources"].update(prose=5), r"\['fingerprint'\]"),
    ]:
        edited = unpack(state)
        edit(edited)
        with pytest.raises(mixer.StateError, match=message):
            loader.load_state_dict(pack(edited))


def test_a_packer_of_the_other_packing_is_refused(saved):
    loader, _, payload = saved
    packing = payload["fingerprint"]["stream"]["packing"]
    for lane in payload["lanes"].values():
        for entry in (lane or {}).get("sources", {}).values():
            packer = entry["packer"]
            if packing == "best_fit":
                packer["offset"] = packer.pop("emitted")
            else:
                packer["emitted"] = packer.pop("offset")
    with pytest.raises(mixer.StateError, match="Field required"):
        loader.load_state_dict(pack(payload))


def test_merge_states_checks_shapes(saved):
    _, state, payload = saved
    del payload["lanes"]
    with pytest.raises(mixer.StateError, match="lanes"):
        mixer.merge_states([state, pack(payload)])


def test_a_checked_state_still_resumes_exactly(saved):
    loader, state, _ = saved
    loader.load_state_dict(state)
    assert loader.next_global_batch == 3


def load_or_refuse(loader, state) -> str:
    """Loading succeeds or is a StateError; a loaded state then yields or raises MixerError."""
    try:
        loader.load_state_dict(state)
    except mixer.StateError:
        return "refused"
    try:
        take(loader, 1)
    except mixer.MixerError:
        pass
    finally:
        loader.close()
    return "loaded"


def test_fuzz_structurally_edited_states(saved):
    loader, state, payload = saved

    outcomes: set[str] = set()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(structural_mutations(payload))
    def run(mutated) -> None:
        outcomes.add(load_or_refuse(loader, pack(mutated)))

    run()
    # One edit known to load (an unknown key is ignored) and one known to be refused, so both
    # sides of the check are reached whatever the fixed example sequence happens to hold.
    outcomes.add(load_or_refuse(loader, pack({**payload, "x": [1]})))
    outcomes.add(load_or_refuse(loader, pack({**payload, "next_global": -1})))
    assert outcomes == {"loaded", "refused"}


def test_fuzz_byte_mutated_and_reshaped_states(saved):
    loader, state, payload = saved
    outer = structural_mutations(state)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        st.one_of(
            byte_mutations(state["json"].encode(), b'{}[]",:0123456789-.eE').map(
                lambda b: with_json(b.decode("utf-8", "replace"))
            ),
            outer,
        )
    )
    def run(mutated) -> None:
        load_or_refuse(loader, mutated)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2, 3, 99, None, "4"])
def test_a_state_of_another_format_version_is_refused_naming_both_versions(saved, version):
    loader, state, _ = saved
    with pytest.raises(
        mixer.StateError, match=rf"version {version} is not supported.*writes version 4"
    ):
        loader.load_state_dict({**state, "version": version})
