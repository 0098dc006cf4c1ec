"""WebDataset tar shards: one split per tar, one record per sample.

Members whose names share a key (the path up to the first dot of the basename, webdataset's
`base_plus_ext` rule) and follow each other form a sample. Its images are the members with
suffix `jpg`, `jpeg`, `png` or `webp`, or `<n>.<ext>` for several (ordered by n; unnumbered
ones come first); they are passed on as stored bytes, never decoded here. Its text is chosen
by `text_field`:

- `txt` (the format's default): the `txt` member, else the `txt` key of the `json` member;
- any other name: that key of the `json` member, else the member with that suffix.

Other members (`cls`, `__key__`-style metadata, names without a dot) are skipped unread.

The tar is parsed block by block (ustar, GNU long names, pax `path`/`size`; global pax headers
are ignored), streaming through `Storage`: only the members a sample needs are read, the rest
are seeked past. A record's offset is the byte offset of its sample's first header (a GNU or
pax extension header included), so a cursor seeks straight to its sample.

A bad sample (empty or oversized image, no text, text that is not UTF-8, malformed json,
oversized text, members adding up to more than `max_document_bytes`, a repeated member) is an
error record and reading goes on with the next one; a corrupt or truncated header, or a member
running past the end of the file, is an error record in place of the sample being assembled
(it may be incomplete) and ends the split.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from typing import IO

from mixer.core.errors import DataError
from mixer.core.records import EncodedImage, FileEntry, Record, Split

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_MAX_EXTENSION = 1 << 20          # a GNU long name or pax header larger than this is corrupt
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")   # webdataset.tariterators.base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")               # webdataset's skip_meta
_IMAGE = re.compile(r"(?:([0-9]+)\.)?(?:jpg|jpeg|png|webp)")
_REGULAR = (b"0", b"\0", b"7")
_EXTENSIONS = (b"L", b"K", b"x", b"X", b"g")        # GNU long names, pax, global pax
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")     # links, devices, directories, fifos


class _Broken(Exception):
    """The tar cannot be parsed past this point."""

    def __init__(self, message: str, offset: int, name: str | None = None,
                 guessed: bool = False, start: int | None = None, *,
                 reason: str = "corrupt") -> None:
        super().__init__(message)
        self.reason = reason     # DataError.reason of the break
        self.offset = offset     # the header where it broke
        self.start = offset if start is None else start   # its member's first header
        self.name = name or None   # the member, when its header could be read
        self.guessed = guessed   # `name` read from a header that failed its checks


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
    signed = struct.unpack("148b8x356b", buf)   # some old tars sum signed bytes
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
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq:
            raise ValueError("bad pax record")
        out[key] = value
        pos = end
    return out


def _members(f: IO[bytes], offset: int, file_size: int) -> Iterator[tuple[str, int, int]]:
    """(name, offset of its first header, size) of each regular member from `offset`; the
    caller may read the member's data right after it is yielded. Raises `_Broken`."""
    f.seek(offset)
    while True:
        start = offset   # the member's first header (extension headers included)
        name: str | None = None
        size: int | None = None   # from a pax header
        while True:
            buf = f.read(_BLOCK)
            if not buf or buf == _ZERO:
                if start == offset:
                    return   # end of the archive (end blocks, or none at all)
                raise _Broken("tar ends inside a member's extension headers", offset, name,
                              start=start, reason="corrupt")
            if len(buf) < _BLOCK:
                raise _Broken(f"truncated tar header ({len(buf)} of {_BLOCK} bytes)", offset,
                              *_guess(name, buf), start=start, reason="corrupt")
            try:
                _check(buf)
                stored = _number(buf[124:136])
            except (ValueError, struct.error) as exc:
                raise _Broken(f"corrupt tar header ({exc})", offset, *_guess(name, buf),
                              start=start, reason="malformed") from None
            kind = buf[156:157]
            extension = kind in _EXTENSIONS
            if name is None and not extension:
                name = _header_name(buf)
            if size is None or extension:
                size = stored
            data_at = offset + _BLOCK
            if kind not in _NO_DATA and (size < 0 or data_at + size > file_size):
                raise _Broken(f"member of {size} bytes runs past the end of the file "
                              f"({file_size} bytes)", start, name, reason="corrupt")
            if not extension:
                break
            if size > _MAX_EXTENSION:
                raise _Broken(f"tar extension header of {size} bytes", offset, name,
                              start=start, reason="malformed")
            data = f.read(size)
            offset = data_at + _padded(size)
            f.seek(offset)
            name, size = _extension(kind, data, name, start)
            if kind == b"g" and start == data_at - _BLOCK:
                start = offset   # a global header belongs to no member (and is ignored)
        if kind == b"S":
            raise _Broken("GNU sparse members are not supported", start, name, reason="other")
        offset = data_at + (0 if kind in _NO_DATA else _padded(size))
        if kind in _REGULAR and not (kind == b"\0" and name.endswith("/")):
            yield name, start, size
        f.seek(offset)


def _extension(kind: bytes, data: bytes, name: str | None,
               start: int) -> tuple[str | None, int | None]:
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
        raise _Broken(f"corrupt pax header ({exc})", start, name, reason="malformed") from None
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


class _Sample:
    """The members of one sample read so far."""

    __slots__ = ("error", "first", "images", "index", "key", "offset", "size", "suffixes",
                 "text_from", "texts")

    def __init__(self, key: str, index: int, offset: int, first: str) -> None:
        self.key, self.index, self.offset, self.first = key, index, offset, first
        self.suffixes: set[str] = set()
        self.images: list[tuple[int, EncodedImage]] = []
        self.texts: dict[str, tuple[str, int, bytes | None]] = {}  # suffix -> name, offset, data
        self.error: tuple[str, str, int, str] | None = None   # message, member, offset, reason
        self.text_from: str | None = None   # the suffix of the member the text came from
        self.size = 0   # bytes of the members read into memory (images and text candidates)

    def fail(self, message: str, member: str, offset: int, reason: str) -> None:
        if self.error is None:
            self.error = (message, member, offset, reason)


def _where(key: str, member: str, offset: int) -> str:
    return f"sample {key} (member {member} at byte offset {offset})"


def _decode(sample: _Sample, suffix: str, max_bytes: int) -> str:
    name, offset, data = sample.texts[suffix]
    if data is None:
        sample.fail(f"text member longer than max_document_bytes ({max_bytes})", name, offset,
                    "too_long")
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        sample.fail(f"text is not valid UTF-8 ({exc.reason} at byte {exc.start} of the member)",
                    name, offset, "bad_text")
        return ""


def _from_json(sample: _Sample, field: str, max_bytes: int) -> str | None:
    """The json member's `field`, or None when it has no such key."""
    name, offset, data = sample.texts["json"]
    if data is None:
        sample.fail(f"json member longer than max_document_bytes ({max_bytes})", name, offset,
                    "too_long")
        return None
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        sample.fail(f"malformed JSON: {exc}", name, offset, "malformed")
        return None
    except RecursionError:
        sample.fail("malformed JSON: nested too deeply to parse", name, offset, "malformed")
        return None
    if not isinstance(obj, dict):
        sample.fail("json member is not a JSON object", name, offset, "malformed")
        return None
    if field not in obj:
        return None
    text = obj[field]
    if not isinstance(text, str):
        sample.fail(f"json field {field!r} is {type(text).__name__}, not a string", name, offset,
                    "bad_text")
        return None
    return text


def _text(sample: _Sample, text_field: str, max_bytes: int) -> str | None:
    """The sample's text by the module's rule; None (with `sample.error` set) when it has none."""
    choices = ((("member", "txt"), ("key", "txt")) if text_field == "txt"
               else (("key", text_field), ("member", text_field)))
    for kind, name in choices:
        suffix = "json" if kind == "key" else name
        if suffix not in sample.texts:
            continue
        if kind == "key":
            text = _from_json(sample, name, max_bytes)
            if text is None and sample.error is None:
                continue   # no such key: the next choice
        else:
            text = _decode(sample, suffix, max_bytes)
        if sample.error is not None:
            return None
        if len(text) > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            member, offset, _ = sample.texts[suffix]
            sample.fail(f"text longer than max_document_bytes ({max_bytes})", member, offset,
                        "too_long")
            return None
        sample.text_from = suffix
        return text
    wanted = (f"no txt member and no {text_field!r} key in a json member" if text_field == "txt"
              else f"no {text_field!r} key in a json member and no {text_field} member")
    sample.fail(f"sample without text ({wanted})", sample.first, sample.offset, "bad_text")
    return None


def _record(sample: _Sample, *, entry: FileEntry, source: str, text_field: str,
            max_bytes: int) -> Record:
    text = None if sample.error else _text(sample, text_field, max_bytes)
    if sample.error is not None:
        message, member, offset, reason = sample.error
        err = DataError(message, source=source, file=entry.url,
                        location=_where(sample.key, member, offset), reason=reason)
        sample.texts.clear()
        return Record(sample.index, sample.offset, None, err)
    images = tuple(image for _, image in sorted(sample.images, key=lambda item: item[0]))
    assert sample.text_from is not None
    member, offset, _ = sample.texts[sample.text_from]
    # The members' bytes go now: the reader's frame keeps `sample` while the record is used.
    sample.texts.clear()
    return Record(sample.index, sample.offset, text, images=images,
                  location=_where(sample.key, member, offset))


def read_webdataset(*, storage, entry: FileEntry, split: Split, source: str, text_field: str,
                    max_bytes: int, index: int, offset: int) -> Iterator[Record]:
    """Samples of one tar from the cursor (sample `index` whose first header is at byte
    `offset`); see the module docstring for grouping, text and errors."""
    wanted = {"json", text_field}   # the members that may hold the text
    sample: _Sample | None = None
    with storage.open(entry) as f:
        try:
            for name, at, size in _members(f, offset, entry.size):
                if _META.match(name):
                    continue
                match = _KEY.match(name)
                if match is None:
                    continue   # no suffix: not part of any sample (as in webdataset)
                key, suffix = match.group(1), match.group(2).lower()
                if sample is None or key != sample.key:
                    if sample is not None:
                        yield _record(sample, entry=entry, source=source,
                                      text_field=text_field, max_bytes=max_bytes)
                        index += 1
                    sample = _Sample(key, index, at, name)
                if suffix in sample.suffixes:
                    sample.fail(f"repeated member suffix {suffix!r} in one sample", name, at,
                                "malformed")
                sample.suffixes.add(suffix)
                if sample.error is not None:
                    continue
                image = _IMAGE.fullmatch(suffix)
                if image is not None:
                    if size == 0:
                        sample.fail("empty image member (0 bytes)", name, at, "bad_image")
                    elif size > max_bytes:
                        sample.fail(f"image member of {size} bytes, longer than "
                                    f"max_document_bytes ({max_bytes})", name, at, "too_long")
                    elif _within(sample, size, max_bytes, name, at):
                        order = int(image.group(1)) if image.group(1) else -1
                        sample.images.append((order, EncodedImage(_read(f, size, name, at),
                                                                  name, at)))
                elif suffix in wanted:
                    if size > max_bytes:
                        sample.texts[suffix] = (name, at, None)
                    elif _within(sample, size, max_bytes, name, at):
                        sample.texts[suffix] = (name, at, _read(f, size, name, at))
        except _Broken as exc:
            yield from _broken(exc, sample, entry=entry, source=source,
                               text_field=text_field, max_bytes=max_bytes, index=index)
            return
    if sample is not None:
        yield _record(sample, entry=entry, source=source, text_field=text_field,
                      max_bytes=max_bytes)


def _within(sample: _Sample, size: int, max_bytes: int, name: str, at: int) -> bool:
    """Count a member about to be read against the sample's `max_document_bytes`: a sample
    is one record, never held in memory past that limit however many members it has."""
    if sample.size + size > max_bytes:
        sample.fail(f"sample larger than max_document_bytes ({max_bytes}): its images and "
                    f"text add up to {sample.size + size} bytes with this member", name, at,
                    "too_long")
        return False
    sample.size += size
    return True


def _read(f: IO[bytes], size: int, name: str, at: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise _Broken(f"member ends after {len(data)} of its {size} bytes (file truncated)",
                      at, name, reason="corrupt")
    return data


def _broken(exc: _Broken, sample: _Sample | None, *, entry: FileEntry, source: str,
            text_field: str, max_bytes: int, index: int) -> Iterator[Record]:
    """The records that end a split at a break in the tar: the sample being assembled unless
    the broken member belongs to it (then that sample, maybe incomplete, is the error), then
    the error."""
    name = exc.name
    match = _KEY.match(name) if name is not None and not _META.match(name) else None
    key = match.group(1) if match is not None else None
    if sample is not None and key != sample.key:   # the sample before the break is whole
        yield _record(sample, entry=entry, source=source, text_field=text_field,
                      max_bytes=max_bytes)
        index, sample = sample.index + 1, None
    member = "tar header" if name is None or exc.guessed else f"member {name}"
    if sample is not None:
        where = f"sample {sample.key} ({member} at byte offset {exc.offset})"
        message = f"{exc}; the sample may be incomplete and the rest of the tar is not read"
        index, at = sample.index, sample.offset
    else:
        where = (f"sample {key} ({member} at byte offset {exc.offset})" if key is not None
                 and not exc.guessed else f"{member} at byte offset {exc.offset}")
        message = f"{exc}; the rest of the tar is not read"
        at = exc.start
    yield Record(index, at, None, DataError(message, source=source, file=entry.url,
                                            location=where, reason=exc.reason))
