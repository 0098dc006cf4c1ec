"""Reading a tar stream block by block: ustar, GNU long names, pax `path`/`size` (global pax
headers ignored); only the members a caller reads are read, the rest are seeked past."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import IO

from mixer.core.errors import SkipReason

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_MAX_EXTENSION = 1 << 20  # a GNU long name or pax header larger than this is corrupt
_REGULAR = (b"0", b"\0", b"7")
_EXTENSIONS = (b"L", b"K", b"x", b"X", b"g")  # GNU long names, pax, global pax
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, fifos


class Broken(Exception):
    """The tar cannot be parsed past this point."""

    def __init__(
        self,
        message: str,
        offset: int,
        name: str | None = None,
        guessed: bool = False,
        start: int | None = None,
        *,
        reason: SkipReason = "corrupt",
    ) -> None:
        super().__init__(message)
        self.reason: SkipReason = reason  # DataError.reason of the break
        self.offset = offset  # the header where it broke
        self.start = offset if start is None else start  # its member's first header
        self.name = name or None  # the member, when its header could be read
        self.guessed = guessed  # `name` read from a header that failed its checks


def _padded(size: int) -> int:
    return (size + _BLOCK - 1) // _BLOCK * _BLOCK


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256."""
    if field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"bad number {text!r}")
    return int(text, 8)


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "backslashreplace")


def _check(buf: bytes) -> None:
    stored = _number(buf[148:156])
    chksum = buf[148:156]
    if stored == sum(buf) - sum(chksum) + 256:
        return
    signed = struct.unpack("148b8x356b", buf)  # some old tars sum signed bytes
    if stored != sum(signed) + 256:
        raise ValueError("bad checksum")


def _pax(data: bytes) -> dict[bytes, bytes]:
    """Records `"<len> <key>=<value>\\n"` of a pax extended header."""
    out: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        end = pos + length
        if length < 5 or end > len(data) or data[end - 1] != 0x0A:
            raise ValueError("bad pax record")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq:
            raise ValueError("bad pax record")
        out[key] = value
        pos = end
    return out


def members(f: IO[bytes], offset: int, file_size: int) -> Iterator[tuple[str, int, int]]:
    """(name, offset of its first header, size) of each regular member from `offset`; the
    caller may read the member's data right after it is yielded. Raises `Broken`."""
    f.seek(offset)
    while True:
        start = offset  # the member's first header (extension headers included)
        name: str | None = None
        size: int | None = None  # from a pax header
        while True:
            buf = f.read(_BLOCK)
            if not buf or buf == _ZERO:
                if start == offset:
                    return  # end of the archive (end blocks, or none at all)
                raise Broken(
                    "tar ends inside a member's extension headers",
                    offset,
                    name,
                    start=start,
                    reason="corrupt",
                )
            if len(buf) < _BLOCK:
                raise Broken(
                    f"truncated tar header ({len(buf)} of {_BLOCK} bytes)",
                    offset,
                    *_guess(name, buf),
                    start=start,
                    reason="corrupt",
                )
            try:
                _check(buf)
                stored = _number(buf[124:136])
            except (ValueError, struct.error) as exc:
                raise Broken(
                    f"corrupt tar header ({exc})",
                    offset,
                    *_guess(name, buf),
                    start=start,
                    reason="malformed",
                ) from None
            kind = buf[156:157]
            extension = kind in _EXTENSIONS
            if name is None and not extension:
                name = _header_name(buf)
            if size is None or extension:
                size = stored
            data_at = offset + _BLOCK
            if kind not in _NO_DATA and (size < 0 or data_at + size > file_size):
                raise Broken(
                    f"member of {size} bytes runs past the end of the file ({file_size} bytes)",
                    start,
                    name,
                    reason="corrupt",
                )
            if not extension:
                break
            if size > _MAX_EXTENSION:
                raise Broken(
                    f"tar extension header of {size} bytes",
                    offset,
                    name,
                    start=start,
                    reason="malformed",
                )
            data = f.read(size)
            offset = data_at + _padded(size)
            f.seek(offset)
            name, size = _extension(kind, data, name, start)
            if kind == b"g" and start == data_at - _BLOCK:
                start = offset  # a global header belongs to no member (and is ignored)
        assert name is not None  # (the member's own header names it, when no extension did)
        if kind == b"S":
            raise Broken("GNU sparse members are not supported", start, name, reason="other")
        offset = data_at + (0 if kind in _NO_DATA else _padded(size))
        if kind in _REGULAR and not (kind == b"\0" and name.endswith("/")):
            yield name, start, size
        f.seek(offset)


def _extension(
    kind: bytes, data: bytes, name: str | None, start: int
) -> tuple[str | None, int | None]:
    """(name, size) of the member after an extension header: a GNU long name, or a pax
    header's `path` and `size` (X: Solaris' older spelling of x); others change neither."""
    if kind == b"L":
        return _name(data), None
    if kind not in (b"x", b"X"):
        return name, None
    try:
        records = _pax(data)
        size = int(records[b"size"]) if b"size" in records else None
    except ValueError as exc:
        raise Broken(f"corrupt pax header ({exc})", start, name, reason="malformed") from None
    if b"path" in records:
        name = records[b"path"].decode("utf-8", "backslashreplace")
    return name, size


def _guess(name: str | None, buf: bytes) -> tuple[str | None, bool]:
    """The name of a member whose header failed its checks: that of its extension headers,
    else what its name field reads (it decides which sample the break cut short)."""
    if name is not None or len(buf) < 100:
        return name, False
    return _name(buf[:100]), True


def _header_name(buf: bytes) -> str:
    name = _name(buf[0:100])
    prefix = _name(buf[345:500]) if buf[345] else ""
    return f"{prefix}/{name}" if prefix else name
