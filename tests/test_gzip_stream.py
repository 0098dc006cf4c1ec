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

# (chunk, repeats, level, zero bytes after): repeated chunks compress well, so that a read of
# the file makes more output than a piece holds
members = st.lists(
    st.tuples(
        st.binary(max_size=600),
        st.integers(1, 400),
        st.integers(1, 9),
        st.sampled_from([0, 0, 1, 5]),
    ),
    min_size=1,
    max_size=4,
)
pieces = st.tuples(st.integers(1, 5000), st.integers(1, 20_000))  # read_size, max_output


def _file(parts) -> tuple[bytes, bytes]:
    """(gzip file of the members, zero padding after some; the bytes it holds)."""
    data = b"".join(
        gzip.compress(chunk * repeat, compresslevel=level) + b"\0" * pad
        for chunk, repeat, level, pad in parts
    )
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


@settings(max_examples=80, deadline=None)
@given(members, st.lists(st.integers(1, 70_000), min_size=1, max_size=5), pieces)
def test_it_reads_what_gzip_reads(parts, sizes, piece):
    data, expected = _file(parts)
    assert gzip.decompress(data) == expected
    read_size, max_output = piece
    got, _ = _read(GzipStream(io.BytesIO(data), read_size=read_size, max_output=max_output), sizes)
    assert got == expected


reads = st.lists(st.integers(1, 1 << 20), min_size=1, max_size=5)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(members, reads, reads, pieces)
def test_the_file_position_after_n_bytes_does_not_depend_on_the_reads(parts, a, b, piece):
    data, expected = _file(parts)
    read_size, max_output = piece
    made = [
        _read(GzipStream(io.BytesIO(data), read_size=read_size, max_output=max_output), sizes)
        for sizes in (a, b, [1])
    ]
    assert all(out == expected for out, _ in made)
    # byte by byte: the position after every N; reads of other sizes stop at some of them
    position = dict(made[2][1])
    for _, marks in made[:2]:
        assert all(position[n] == at for n, at in marks)


def _damaged() -> dict[str, bytes]:
    good = gzip.compress(b"hello world\n" * 2000)
    return {
        "truncated": good[:-3],
        "header only": good[:12],
        "not gzip": b"xx" + good,
        "garbage after": good + b"garbage",
        "bad check": good[:-8] + bytes(4) + good[-4:],
        "bad length": good[:-4] + bytes(4),
        "one byte more": good + b"\x1f",
        "zeros": bytes(100_000),
        "zeros first": bytes(10) + good,
        "half a header": good[:5],
        "other method": good[:2] + b"\x07" + good[3:],
    }


@pytest.mark.parametrize("name", sorted(_damaged()))
def test_a_damaged_file_raises_as_gzip_does(name):
    data = _damaged()[name]
    with pytest.raises(Exception) as oracle:
        gzip.decompress(data)
    with pytest.raises(Exception) as ours:
        _read(GzipStream(io.BytesIO(data)), [16384])
    assert type(ours.value) is type(oracle.value)


def _header(flags: int, extra: bytes = b"") -> bytes:
    return b"\x1f\x8b\x08" + bytes([flags]) + bytes(6) + extra


@pytest.mark.parametrize(
    "flags, fields",
    [
        (4, b"\x05\x00abcde"),  # FEXTRA
        (8, b"name.jsonl\x00"),  # FNAME
        (16, b"a comment\x00"),  # FCOMMENT
        (2, b"\xff\xff"),  # FHCRC, wrong (gzip does not check it)
        (4 | 8 | 16 | 2, b"\x00\x00n\x00c\x00\x12\x34"),
        (0xE0, b""),  # reserved bits (gzip ignores them)
    ],
)
def test_header_fields_are_read_as_gzip_reads_them(flags, fields):
    body = gzip.compress(b"some text\n" * 500)[10:]  # (its own header has no fields)
    data = _header(flags, fields) + body + gzip.compress(b"second member\n")
    expected = gzip.decompress(data)
    for read_size in (1, 3, 16384):
        assert _read(GzipStream(io.BytesIO(data), read_size=read_size), [7, 4096])[0] == expected


@pytest.mark.slow
def test_an_empty_file_is_empty_and_a_bomb_comes_a_piece_at_a_time():
    assert _read(GzipStream(io.BytesIO(b"")), [100]) == (b"", [])
    bomb = gzip.compress(bytes(64 << 20))  # ~64 KB that expand to 64 MB
    stream = GzipStream(io.BytesIO(bomb), max_output=1 << 20)
    assert stream.readinto(bytearray(64 << 20)) <= 1 << 20


def test_a_name_of_any_length_is_skipped_in_bounded_memory():
    import tracemalloc

    body = gzip.compress(b"after the name\n")[10:]
    data = _header(8) + b"A" * (8 << 20) + b"\0" + body
    tracemalloc.start()
    try:
        got = _read(GzipStream(io.BytesIO(data)), [4096])[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == b"after the name\n" and peak < 512 << 10  # (the name: 8 MB)
    with pytest.raises(EOFError):  # a name that never ends
        _read(GzipStream(io.BytesIO(_header(8) + b"A" * 100_000)), [4096])


def test_a_read_after_an_error_raises_it_again_and_holds_nothing_more():
    data = _damaged()["bad check"] + gzip.compress(b"a good member\n")
    stream = GzipStream(io.BytesIO(data))
    errors = []
    for _ in range(5):
        with pytest.raises(gzip.BadGzipFile) as caught:
            stream.readinto(bytearray(1 << 20))
        errors.append(caught.value)
    assert all(e is errors[0] for e in errors) and len(stream._tail) < 64 << 10


@pytest.mark.parametrize("option", ["read_size", "max_output"])
def test_sizes_must_be_positive(option):
    with pytest.raises(ValueError):
        GzipStream(io.BytesIO(b""), **{option: 0})


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(members, st.data(), pieces)
def test_a_damaged_file_of_any_kind_reads_or_fails_as_gzip_does(parts, data, piece):
    """Truncated anywhere, a byte changed anywhere: the same bytes where gzip reads it, the
    same exception class where gzip refuses it, for any read and piece sizes."""
    good, _ = _file(parts)
    cut = data.draw(st.integers(0, len(good)))
    damaged = bytearray(good[:cut])
    if damaged and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] ^= data.draw(st.integers(1, 255))
    damaged = bytes(damaged)
    read_size, max_output = piece
    try:
        expected: bytes | type = gzip.decompress(damaged)
    except Exception as exc:  # noqa: BLE001  (the oracle's verdict)
        expected = type(exc)
    try:
        got: bytes | type = _read(
            GzipStream(io.BytesIO(damaged), read_size=read_size, max_output=max_output), [4096]
        )[0]
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected


# Found by a differential fuzzer: the file ends inside a member whose last deflate data is
# bad; zlib says so only when asked for what it still holds (gzip: zlib.error).
ENDS_ON_BAD_DATA = (
    b"\x1f\x8b\x08\x01\x00\x00\x00\x00\x00\xff-\x8d\xc1\r\x000\x08\x02\xff"
    b'\xb7%\xec?D\x01\xdbDA\x0b"\x1bIi&\xb5\xc9\x05\x07\x95\x81P\x97-m'
)


@pytest.mark.parametrize("max_output", [1, 20, 42, 64 << 10])
def test_a_file_ending_on_bad_data_fails_as_gzip_does_for_any_piece_size(max_output):
    with pytest.raises(zlib.error):
        gzip.decompress(ENDS_ON_BAD_DATA)
    with pytest.raises(zlib.error):
        _read(GzipStream(io.BytesIO(ENDS_ON_BAD_DATA), max_output=max_output), [100])
