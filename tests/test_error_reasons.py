"""A `DataError` keeps its message, place and reason through pickling (errors raised in
DataLoader workers are pickled), whatever words its message holds; the raise-site scan is
`tests/test_errors.py`'s."""

from __future__ import annotations

import pickle

import pytest

from mixer.core.errors import REASONS, DataError


@pytest.mark.parametrize(
    "place", [{}, {"source": "s"}, {"source": "s", "file": "x.tar", "location": "sample k"}]
)
@pytest.mark.parametrize("reason", REASONS)
def test_data_error_pickles_with_message_place_and_reason(place, reason):
    # Words that the old guessing would have read as bad_image: the stated reason is kept.
    err = DataError("cannot read the image marker", reason=reason, **place)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is DataError and str(again) == str(err)
    assert (again.message, again.reason, again.source, again.file, again.location) == (
        "cannot read the image marker",
        reason,
        err.source,
        err.file,
        err.location,
    )


class _Sub(DataError):
    pass


def test_a_subclass_pickles_as_itself():
    err = _Sub("m", source="s", reason="corrupt")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is _Sub and (again.reason, again.message) == ("corrupt", "m")


def test_an_error_made_from_its_text_alone_is_other():
    # torch's DataLoader re-raises a worker's error as `exc_type(text)`: its type is kept.
    err = DataError("Caught DataError in DataLoader worker process 0.\nOriginal Traceback")
    assert err.reason == "other" and err.message.startswith("Caught DataError")
