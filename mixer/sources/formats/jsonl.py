"""JSON Lines: plain (split into line-aligned byte ranges), gzip and zstd (whole files)."""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Iterator
from typing import IO

import orjson
import zstandard

from mixer.core.errors import DataError, SkipReason, missing_text_field
from mixer.core.records import FileEntry, Record, Split
from mixer.sources.formats import deep_json
from mixer.sources.formats.gzip_stream import GzipStream
from mixer.sources.formats.pieces import PieceReader
from mixer.sources.formats.reopen import Reopenable
from mixer.sources.formats.zstd_frames import ZstdStream

_CHUNK = 1 << 20
# Decompressed bytes buffered above a decompressor. A paused reader keeps its buffer (one per
# lane and whole-file source, also while its decompressor is suspended), so it is small; more
# calls into the decompressor cost nothing measurable (79 MB of jsonl.zst read in 223 ms at
# 16 and at 64 KB).
_BUFFER = 16 << 10


def _read_line(stream: IO[bytes], max_bytes: int) -> tuple[bytes | None, int]:
    """Next line (None if longer than max_bytes) and the number of bytes consumed.

    Read in pieces of at most 1 MiB, so a line is held once (plus one piece) however long:
    one `readline(max_bytes + 1)` would hold it twice while joining its buffers."""
    pieces: list[bytes] = []
    size = 0
    while size <= max_bytes:
        piece = stream.readline(min(_CHUNK, max_bytes + 1 - size))
        pieces.append(piece)
        size += len(piece)
        if not piece or piece.endswith(b"\n"):
            line = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            return (line if len(line) <= max_bytes or line.endswith(b"\n") else None), size
    pieces.clear()
    consumed = size
    while True:  # drain an over-long line without holding it in memory
        part = stream.readline(_CHUNK)
        consumed += len(part)
        if not part or part.endswith(b"\n"):
            return None, consumed


class _BadLine(ValueError):
    """A line that is no record: its message and reason (`DataError.reason`)."""

    def __init__(self, message: str, reason: SkipReason) -> None:
        super().__init__(message)
        self.reason: SkipReason = reason


def _parse(line: bytes, text_field: str) -> str:
    """The record's text. orjson parses the lines that hold an object whose text field is a
    string (nearly all); any other line goes through `json`, which decides what it is: it
    accepts what orjson refuses (NaN, 1e400, lone surrogate escapes, integers past 64 bits)
    and its messages name the error, so the stream and its errors do not depend on orjson."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = None
    if type(obj) is dict:
        text = obj.get(text_field)
        if type(text) is str:
            return text
    return _parse_with_json(line, text_field)


def _parse_with_json(line: bytes, text_field: str) -> str:
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:  # the record's own bytes: counted as bad text
        raise _BadLine(
            f"line is not valid UTF-8 ({exc.reason} at byte {exc.start} of the line)", "bad_text"
        ) from None
    if decoded.startswith("\ufeff"):  # a byte-order mark (json.loads of bytes allowed one)
        decoded = decoded[1:]
    try:
        obj = deep_json.loads(decoded)  # (records nested over 1,024 levels: malformed)
    except ValueError as exc:
        raise _BadLine(
            f"malformed JSON: {deep_json.problem(exc, 'the record')}", "malformed"
        ) from None
    except RecursionError:
        raise _BadLine("malformed JSON: nested too deeply to parse", "malformed") from None
    if not isinstance(obj, dict):
        raise _BadLine("record is not a JSON object", "malformed")
    text = obj.get(text_field)
    if not isinstance(text, str):
        if text_field not in obj:
            raise _BadLine(missing_text_field(text_field, list(obj), "keys"), "bad_text")
        raise _BadLine(
            f"text field {text_field!r} is {type(text).__name__}, not a string", "bad_text"
        )
    return text


def _records(
    stream: IO[bytes],
    *,
    entry: FileEntry,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
    end: int | None,
    compressed: bool,
    lines: bool = True,
    consumed: Callable[[], int] | None = None,
) -> Iterator[Record]:
    """Records from `offset` while it is below `end`; `lines`: index counts the file's lines;
    `consumed`: the position of the compressed file under `stream`, which each record
    reports."""

    def where(line_offset: int) -> str:
        if compressed and lines:
            return f"line {index + 1} (decompressed byte offset {line_offset})"
        if compressed:
            return f"decompressed byte offset {line_offset}"
        return f"byte offset {line_offset}"

    while end is None or offset < end:
        try:
            line, size = _read_line(stream, max_bytes)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            err = DataError(
                f"corrupt compressed data after decompressed byte offset {offset}: {exc}",
                source=source,
                file=entry.url,
                location=where(offset),
                reason="corrupt",
            )
            yield Record(index, offset, None, err)
            return
        if size == 0:
            return
        stored = consumed() if consumed is not None else -1
        if line is None:
            err = DataError(
                f"record longer than max_document_bytes ({max_bytes})",
                source=source,
                file=entry.url,
                location=where(offset),
                reason="too_long",
            )
            yield Record(index, offset, None, err, consumed=stored)
        elif line.strip():
            try:
                yield Record(index, offset, _parse(line, text_field), consumed=stored)
            except _BadLine as exc:
                yield Record(
                    index,
                    offset,
                    None,
                    DataError(
                        str(exc),
                        source=source,
                        file=entry.url,
                        location=where(offset),
                        reason=exc.reason,
                    ),
                    consumed=stored,
                )
        else:
            index -= 1  # blank lines are not records
        index += 1
        offset += size


def read_jsonl(
    *,
    storage,
    entry: FileEntry,
    split: Split,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
) -> Iterator[Record]:
    """Records of a plain jsonl split: the lines that *start* inside [split.start, split.end)."""
    end_hint = split.end if split.end < entry.size else None
    with storage.open(entry, end_hint=end_hint) as raw:
        stream = raw if hasattr(raw, "readline") else io.BufferedReader(raw)
        if index == 0 and offset <= split.start and split.start > 0:
            stream.seek(split.start - 1)
            # finish the line that the previous split owns
            _, skipped = _read_line(stream, max_bytes)
            offset = split.start - 1 + skipped
        else:
            offset = max(offset, split.start)
            stream.seek(offset)
        yield from _records(
            stream,
            entry=entry,
            source=source,
            text_field=text_field,
            max_bytes=max_bytes,
            index=index,
            offset=offset,
            end=split.end,
            compressed=False,
        )


def _skip_to(stream: IO[bytes], offset: int) -> None:
    remaining = offset
    while remaining > 0:
        chunk = stream.read(min(remaining, _CHUNK))
        if not chunk:
            raise EOFError("file ended before the resume offset")
        remaining -= len(chunk)


def _read_compressed(
    decompressor,
    *,
    storage,
    entry: FileEntry,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
) -> Iterator[Record]:
    whole = Reopenable(lambda: storage.open(entry), decompressor)
    with io.BufferedReader(whole, buffer_size=_BUFFER) as stream:
        try:
            _skip_to(stream, offset)  # no access points: resuming decompresses from the start
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            err = DataError(
                f"corrupt compressed data before decompressed byte offset {offset}: {exc}",
                source=source,
                file=entry.url,
                location=f"line {index + 1}",
                reason="corrupt",
            )
            yield Record(index, offset, None, err)
            return
        yield from _records(
            stream,
            entry=entry,
            source=source,
            text_field=text_field,
            max_bytes=max_bytes,
            index=index,
            offset=offset,
            end=None,
            compressed=True,
            consumed=whole.file_position,
        )


def _gzip(raw: IO[bytes]) -> PieceReader:
    return GzipStream(raw)


def _zstd(raw: IO[bytes]) -> PieceReader:
    return ZstdStream(raw)


def read_jsonl_gz(*, split: Split, **kw) -> Iterator[Record]:
    """Records of a gzip-compressed jsonl file (always a whole-file split)."""
    return _read_compressed(_gzip, **kw)


def read_jsonl_zst(*, split: Split, **kw) -> Iterator[Record]:
    """Records of a zstd-compressed jsonl file, or of one group of its frames."""
    if split.dend < 0:
        return _read_compressed(_zstd, **kw)
    return _read_frames(split=split, **kw)


def _read_frames(
    *,
    storage,
    entry: FileEntry,
    split: Split,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
    offset: int,
) -> Iterator[Record]:
    """A group of zstd frames owns the lines starting in (dstart, dend] (and 0 for the first):
    the line that contains `dstart` belongs to the group before, which reads past its end."""
    with storage.open(entry) as raw:
        raw.seek(split.start)
        with io.BufferedReader(_zstd(raw), buffer_size=_BUFFER) as stream:
            try:
                if index > 0:
                    _skip_to(stream, offset - split.dstart)
                    position = offset
                elif split.dstart > 0:
                    _, skipped = _read_line(stream, max_bytes)
                    position = split.dstart + skipped
                else:
                    position = 0
            except (OSError, EOFError, zstandard.ZstdError) as exc:
                err = DataError(
                    f"corrupt compressed data: {exc}",
                    source=source,
                    file=entry.url,
                    location=f"decompressed byte offset {split.dstart}",
                    reason="corrupt",
                )
                yield Record(index, split.dstart, None, err)
                return
            yield from _records(
                stream,
                entry=entry,
                source=source,
                text_field=text_field,
                max_bytes=max_bytes,
                index=index,
                offset=position,
                end=split.dend + 1,
                compressed=True,
                lines=False,
            )
