"""The jsonl reader's fast parser (orjson) gives what the standard library's `json` gives
(the oracle): the same text, or the same error and reason, for any line."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mixer.sources.formats import deep_json, jsonl

TRICKY = [
    b'{"text": NaN}',
    b'{"text": "a", "n": NaN}',
    b'{"text": "a", "n": 1e400}',
    b'{"text": "\\ud800"}',
    b'{"text": "\\udc00\\ud800 x"}',
    b'{"text": "\\ud83d\\ude00"}',
    b'{"text": 123456789012345678901234567890}',
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "a", "text": "b"}',
    b'{"text": "\\u0000"}',
    b"[1, 2]",
    b"null",
    b'"text"',
    b"[" * 5000,
    b'{"text": "x"}\r\n',
    b' {"text": "x"} \t\n',
    b'{"text": "\xff"}',
    b'{"other": "x"}',
    b'{"text": ["a"]}',
    b'{"text": "a\tb"}',
    b'{"text": "a"} x',
    b'{"text": "caf\xc3\xa9 \xe2\x82\xac"}',
    b"{'text': 'x'}",
    b'{"text": "a",}',
]


def _outcome(parse, line: bytes) -> tuple:
    try:
        return ("text", parse(line, "text"))
    except jsonl._BadLine as exc:
        return ("error", str(exc), exc.reason)


def test_tricky_lines_parse_as_json_parses_them():
    for line in TRICKY:
        assert _outcome(jsonl._parse, line) == _outcome(jsonl._parse_with_json, line), line


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(
    record=st.dictionaries(st.sampled_from(["text", "id", "meta"]), values, max_size=3),
    cut=st.integers(0, 200),
    junk=st.binary(max_size=3),
)
def test_any_line_parses_as_json_parses_it(record, cut, junk):
    line = json.dumps(record).encode()  # NaN and Infinity included, as json writes
    for variant in (line, line[:cut] + junk + line[cut:], line + b"\n"):
        assert _outcome(jsonl._parse, variant) == _outcome(jsonl._parse_with_json, variant)


def _nested(depth: int, *, nan: bool) -> bytes:
    extra = b', "n": NaN' if nan else b""
    return b'{"text": "x [{ y"' + extra + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"


def test_a_deep_record_is_judged_alike_whatever_the_callers_stack_depth():
    """json's C parser counts nesting against the interpreter's recursion limit: on its own its
    verdict on a deep record changed with the caller's depth (a DataLoader worker, a trainer's
    callback), and so did the stream. Records up to MAX_NESTING levels (counting the record
    itself) parse, deeper ones are malformed, from any depth of stack, by either parser."""

    def deep_call(frames: int, line: bytes) -> tuple:
        return _outcome(jsonl._parse, line) if frames == 0 else deep_call(frames - 1, line)

    limit = deep_json.MAX_NESTING
    for depth in (limit - 40, limit - 2, limit - 1, limit, limit + 1, 3 * limit):
        for nan in (False, True):  # orjson's path and json's
            line = _nested(depth, nan=nan)
            outcomes = {deep_call(frames, line) for frames in (0, 300, 800)}
            assert len(outcomes) == 1, (depth, nan, outcomes)
            (outcome,) = outcomes
            assert (outcome[0] == "text") == (depth + 1 <= limit), (depth, nan, outcome)
            if outcome[0] == "error":
                assert outcome[1] == (
                    f"malformed JSON: nested too deeply to parse (over {limit} arrays or objects)"
                )


def test_webdatasets_json_members_are_judged_alike_whatever_the_stack_depth():
    """The same bound for every record parser: bytes (a WebDataset json member) included."""

    def deep_call(frames: int, data: bytes) -> str:
        if frames:
            return deep_call(frames - 1, data)
        try:
            return type(deep_json.loads(data)).__name__
        except ValueError as exc:
            return str(exc)

    for depth in (900, deep_json.MAX_NESTING - 1, deep_json.MAX_NESTING):
        data = b'{"txt": "a", "x": ' + b"[" * depth + b"]" * depth + b"}"
        outcomes = {deep_call(frames, data) for frames in (0, 300, 800)}
        assert outcomes == (
            {"dict"}
            if depth + 1 <= deep_json.MAX_NESTING
            else {"nested too deeply to parse (over 1024 arrays or objects)"}
        )


def test_a_malformed_record_is_placed_in_the_record_not_in_lines_of_its_own():
    """json counts "line 2 column 1" inside the value it parses: next to the file's byte
    offset that read as the file's line 2. The place is a character of the record."""
    for line, place in [(b"{broken\n", 1), (b'{"text": "a"} x\n', 14), (b"[1,\n", 4)]:
        try:
            jsonl._parse(line, "text")
        except jsonl._BadLine as exc:
            assert str(exc).endswith(f"at character {place} of the record"), str(exc)
            assert " line " not in str(exc) and "column" not in str(exc)
        else:
            raise AssertionError(line)
