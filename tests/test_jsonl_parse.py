"""The jsonl reader's fast parser (orjson) gives what the standard library's `json` gives
(the oracle): the same text, or the same error and reason, for any line."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mixer.sources.formats import jsonl

TRICKY = [b'{"text": NaN}', b'{"text": "a", "n": NaN}', b'{"text": "a", "n": 1e400}',
          b'{"text": "\\ud800"}', b'{"text": "\\udc00\\ud800 x"}', b'{"text": "\\ud83d\\ude00"}',
          b'{"text": 123456789012345678901234567890}', b'\xef\xbb\xbf{"text": "bom"}',
          b'{"text": "a", "text": "b"}', b'{"text": "\\u0000"}', b"[1, 2]", b"null", b'"text"',
          b"[" * 5000, b'{"text": "x"}\r\n', b' {"text": "x"} \t\n', b'{"text": "\xff"}',
          b'{"other": "x"}', b'{"text": ["a"]}', b'{"text": "a\tb"}', b'{"text": "a"} x',
          b'{"text": "caf\xc3\xa9 \xe2\x82\xac"}', b"{'text': 'x'}", b'{"text": "a",}']


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
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(record=st.dictionaries(st.sampled_from(["text", "id", "meta"]), values, max_size=3),
       cut=st.integers(0, 200), junk=st.binary(max_size=3))
def test_any_line_parses_as_json_parses_it(record, cut, junk):
    line = json.dumps(record).encode()            # NaN and Infinity included, as json writes
    for variant in (line, line[:cut] + junk + line[cut:], line + b"\n"):
        assert _outcome(jsonl._parse, variant) == _outcome(jsonl._parse_with_json, variant)
