"""The column encoding of lane states: exact round trip, strict decoding, and small at scale."""

from __future__ import annotations

import copy
import json
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mixer
from mixer.runtime.state import pack, unpack
from mixer.runtime.state_codec import decode_lanes, encode_lanes

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=4),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
lane_states = st.dictionaries(st.sampled_from(["a", "b", "c", "d.e", ""]), values, max_size=5)
lanes_dicts = st.dictionaries(
    st.integers(0, 50).map(str), st.one_of(st.none(), lane_states), max_size=8
)


def exact(value) -> str:
    """A spelling that tells true from 1 and 1.0 from 1."""
    return json.dumps(value, sort_keys=True)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(lanes_dicts)
@example({"0": {"a": 0.0}, "1": {"a": -0.0}, "2": {"a": True}, "3": {"a": 1}})
def test_decoding_gives_back_exactly_what_was_encoded(lanes):
    encoded = json.loads(json.dumps(encode_lanes(lanes)))  # through JSON, as in a state
    assert exact(decode_lanes(encoded)) == exact(lanes)


@settings(max_examples=100, deadline=None)
@given(lanes_dicts, st.sets(st.integers(0, 50).map(str)))
def test_a_loader_decodes_only_the_lanes_it_keeps(lanes, keep):
    decoded = decode_lanes(json.loads(json.dumps(encode_lanes(lanes))), keep)
    assert set(decoded) == set(lanes)
    for key, state in decoded.items():
        if key in keep or lanes[key] is None:
            assert exact(state) == exact(lanes[key])
        else:
            assert state == {}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(codec="zip"), "codec"),
        (lambda c: c["groups"][0]["columns"][0].__setitem__(0, "?"), "not a column"),
        (lambda c: c["groups"][0].update(paths=[["a"]]), "as many 'columns'"),
        (lambda c: c["empty"].append("0"), "appears twice"),
        (lambda c: c["groups"][0]["columns"][1].__setitem__(3, "A!"), "wrong shape"),
        (lambda c: c["groups"][0]["columns"][1].__setitem__(3, "A"), "wrong shape"),
    ],
)
def test_a_damaged_encoding_is_a_state_error_naming_where(edit, message):
    encoded = encode_lanes({"0": {"a": 1, "b": {"c": 5}}, "1": {"a": 1, "b": {"c": 7}}})
    assert encoded["groups"][0]["columns"][1][0] == "+"
    edit(encoded)
    with pytest.raises(mixer.StateError, match=message):
        decode_lanes(encoded)


@pytest.mark.slow
def test_8192_lanes_of_a_long_run_fit_in_a_megabyte(three_sources):
    """A 1,024-rank × 8-worker job: its merged state lands in every rank's checkpoint.

    Integer counters and cursors take random long-run values; the float fields (`target`,
    `epochs`) keep the template's values. With random full-precision floats as well the
    state is about 1.4 MB (`benchmarks/scale.py`; docs/benchmarks/scale.md)."""
    recipe, _ = three_sources
    loader = mixer.build_loader(recipe)
    next(iter(loader))
    payload = unpack(loader.state_dict())
    template = payload["lanes"]["0"]
    assert all(entry["packer"] for entry in template["sources"].values())
    rng = random.Random(0)
    lanes = {}
    for index in range(8192):  # counters of a long run: random, so they do not compress
        lane = copy.deepcopy(template)
        lane["lane"], lane["batches"] = index, 15_000 + rng.randrange(2)
        for entry in lane["sources"].values():
            entry["tokens"] = rng.randrange(10**7, 10**8)
            entry["mix"] = entry["tokens"] - rng.randrange(2048)
            entry["packer"]["offset"] = rng.randrange(2048)
            entry["packer"]["stream"].update(
                epoch=rng.randrange(3),
                window=rng.randrange(10**4),
                slot=rng.randrange(100),
                index=rng.randrange(10**5),
                offset=rng.randrange(10**9),
                pos=rng.randrange(1024),
            )
        lanes[str(index)] = lane
    payload["lanes"] = lanes
    payload["fingerprint"]["stream"]["lanes"] = 8192
    state = pack(payload)
    assert len(state["json"]) <= 1 << 20
    assert unpack(state) == payload
