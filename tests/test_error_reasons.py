"""Every `DataError` names its reason where it is raised, and keeps it (and its message)
through pickling, as errors raised in DataLoader workers are."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

import mixer
from mixer.core.errors import REASONS, DataError

PACKAGE = Path(mixer.__file__).parent


def _data_error_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else None)
            if name == "DataError":
                calls.append((str(path.relative_to(PACKAGE.parent)), node.lineno, node))
    return calls


def test_the_scan_finds_the_raise_sites():
    assert len(_data_error_calls()) > 40


def test_every_data_error_names_its_reason_at_the_raise_site():
    missing = [f"{path}:{line}" for path, line, call in _data_error_calls()
               if not any(k.arg == "reason" for k in call.keywords)]
    assert not missing, f"DataError(...) without reason=: {missing}"


def test_every_literal_reason_is_a_known_one():
    unknown = []
    for path, line, call in _data_error_calls():
        for k in call.keywords:
            if (k.arg == "reason" and isinstance(k.value, ast.Constant)
                    and k.value.value not in REASONS):
                unknown.append(f"{path}:{line}: {k.value.value!r}")
    assert not unknown


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="unknown DataError reason"):
        DataError("x", reason="mysterious")


def test_message_and_reason_are_attributes_apart_from_the_place():
    err = DataError("malformed JSON: oops", source="a", file="f.jsonl",
                    location="byte offset 3", reason="malformed")
    assert str(err) == "source 'a', file 'f.jsonl', byte offset 3: malformed JSON: oops"
    assert (err.message, err.reason) == ("malformed JSON: oops", "malformed")
    moved = err.placed(source="b", file="g.jsonl", location="byte offset 9")
    assert (moved.message, moved.reason, moved.source) == (err.message, "malformed", "b")


@pytest.mark.parametrize("place", [{}, {"source": "s"},
                                   {"source": "s", "file": "x.tar", "location": "sample k"}])
@pytest.mark.parametrize("reason", REASONS)
def test_data_error_pickles_with_message_place_and_reason(place, reason):
    # A message whose words would once have named another reason: the stated one is kept.
    err = DataError("cannot read the image marker", reason=reason, **place)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is DataError and str(again) == str(err)
    assert (again.message, again.reason, again.source, again.file, again.location) == (
        err.message, reason, err.source, err.file, err.location)


class _Sub(DataError):
    pass


def test_a_subclass_pickles_as_itself():
    err = _Sub("m", source="s", reason="corrupt")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is _Sub and again.reason == "corrupt" and again.message == "m"


def test_torchs_reraise_keeps_the_type():
    # torch's DataLoader re-raises a worker's error as `exc_type(text)`.
    err = DataError("Caught DataError in DataLoader worker process 0.\nOriginal Traceback")
    assert err.reason in REASONS and err.message.startswith("Caught DataError")
