"""mixer's gzip reader against Python's gzip module (the oracle for the bytes and the errors),
and the property it exists for: its position in the compressed file after N bytes of output
is the same however those bytes were read."""

from __future__ import annotations

import gzip
import io
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixer.sources.formats.gzip_stream import GzipStream

members = st.lists(st.tuples(st.binary(max_size=3000), st.integers(1, 40), st.integers(1, 9),
                             st.sampled_from([0, 0, 1, 5])), min_size=1, max_size=3)


def _file(parts) -> tuple[bytes, bytes]:
    """(gzip file of the members, zero padding after some; the bytes it holds)."""
    data = b"".join(gzip.compress(chunk * repeat, compresslevel=level) + b"\0" * pad
                    for chunk, repeat, level, pad in parts)
    return data, b"".join(chunk * repeat for chunk, repeat, _, _ in parts)


def _read(stream: GzipStream, sizes: list[int]) -> tuple[bytes, list[tuple[int, int]]]:
    """Everything, read in pieces of `sizes` in turn; (output so far, file position) after
    each read."""
    out = bytearray()
    marks = []
    i = 0
    while True:
        buffer = bytearray(sizes[i % len(sizes)])
        i += 1
        n = stream.readinto(buffer)
        if not n:
            return bytes(out), marks
        out += buffer[:n]
        marks.append((len(out), stream._raw.tell()))


@settings(max_examples=60, deadline=None)
@given(members, st.lists(st.integers(1, 70_000), min_size=1, max_size=5),
       st.integers(1, 100_000))
def test_it_reads_what_gzip_reads(parts, sizes, read_size):
    data, expected = _file(parts)
    assert gzip.decompress(data) == expected
    got, _ = _read(GzipStream(io.BytesIO(data), read_size=read_size), sizes)
    assert got == expected


@settings(max_examples=40, deadline=None)
@given(members, st.lists(st.integers(1, 70_000), min_size=1, max_size=5),
       st.lists(st.integers(1, 70_000), min_size=1, max_size=5))
def test_the_file_position_after_n_bytes_does_not_depend_on_the_reads(parts, a, b):
    data, _ = _file(parts)
    first = dict(_read(GzipStream(io.BytesIO(data), read_size=4096, max_output=8192), a)[1])
    second = dict(_read(GzipStream(io.BytesIO(data), read_size=4096, max_output=8192), b)[1])
    for n in first.keys() & second.keys():
        assert first[n] == second[n], n


def _damaged() -> dict[str, bytes]:
    good = gzip.compress(b"hello world\n" * 2000)
    return {"truncated": good[:-3], "header only": good[:12], "not gzip": b"xx" + good,
            "garbage after": good + b"garbage", "bad check": good[:-8] + bytes(4) + good[-4:],
            "one byte more": good + b"\x1f"}


@pytest.mark.parametrize("name", sorted(_damaged()))
def test_a_damaged_file_raises_as_gzip_does(name):
    data = _damaged()[name]
    with pytest.raises(Exception) as oracle:
        gzip.decompress(data)
    with pytest.raises(Exception) as ours:
        _read(GzipStream(io.BytesIO(data)), [16384])
    # gzip reports a failed check as BadGzipFile, zlib (which checks it here) as zlib.error
    assert type(ours.value) is type(oracle.value) or (
        isinstance(oracle.value, gzip.BadGzipFile) and isinstance(ours.value, zlib.error))


def test_an_empty_file_is_empty_and_a_bomb_comes_a_piece_at_a_time():
    assert _read(GzipStream(io.BytesIO(b"")), [100]) == (b"", [])
    bomb = gzip.compress(bytes(64 << 20))   # ~64 KB that expand to 64 MB
    stream = GzipStream(io.BytesIO(bomb), max_output=1 << 20)
    assert stream.readinto(bytearray(64 << 20)) <= 1 << 20
