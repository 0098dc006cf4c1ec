"""WebDataset tar shards: one split per tar, one record per sample.

Members whose names share a key (the path up to the first dot of the basename, webdataset's
`base_plus_ext` rule) and follow each other form a sample. Its images are the members with
suffix `jpg`, `jpeg`, `png` or `webp`, or `<n>.<ext>` for several (ordered by n; unnumbered
ones come first); its videos those with suffix `mp4`, `webm`, `mkv`, `mov` or `avi` (or
`<n>.<ext>`, alike), after the images in the record's `images` as `EncodedVideo`s; its audio
clips those with suffix `wav`, `flac`, `mp3`, `ogg` or `opus` (alike), after the videos as
`EncodedAudio`s. All are passed on as stored bytes, never decoded here. Its text is chosen
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

import re
from collections.abc import Iterator
from typing import IO

from mixer.core.errors import DataError, SkipReason, bad_media
from mixer.core.records import EncodedAudio, EncodedImage, EncodedVideo, FileEntry, Record, Split
from mixer.sources.formats import deep_json
from mixer.sources.formats.tar import Broken, members

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset.tariterators.base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_IMAGE = re.compile(r"(?:([0-9]+)\.)?(?:jpg|jpeg|png|webp)")
_VIDEO = re.compile(r"(?:([0-9]+)\.)?(?:mp4|webm|mkv|mov|avi)")
_AUDIO = re.compile(r"(?:([0-9]+)\.)?(?:wav|flac|mp3|ogg|opus)")
# Media members: (pattern, what, record type), in the order a record's `images` holds them.
_MEDIA = (
    (_IMAGE, "image", EncodedImage),
    (_VIDEO, "video", EncodedVideo),
    (_AUDIO, "audio", EncodedAudio),
)


class _Sample:
    """The members of one sample read so far."""

    __slots__ = (
        "error",
        "first",
        "images",
        "index",
        "key",
        "offset",
        "size",
        "suffixes",
        "text_from",
        "texts",
    )

    def __init__(self, key: str, index: int, offset: int, first: str) -> None:
        self.key, self.index, self.offset, self.first = key, index, offset, first
        self.suffixes: set[str] = set()
        self.images: list[tuple[tuple[int, int], EncodedImage]] = []  # (kind, n), medium
        self.texts: dict[str, tuple[str, int, bytes | None]] = {}  # suffix -> name, offset, data
        self.error: tuple[str, str, int, SkipReason] | None = (
            None  # message, member, offset, reason
        )
        self.text_from: str | None = None  # the suffix of the member the text came from
        self.size = 0  # bytes of the members read into memory (images and text candidates)

    def fail(self, message: str, member: str, offset: int, reason: SkipReason) -> None:
        if self.error is None:
            self.error = (message, member, offset, reason)


def _where(key: str, member: str, offset: int) -> str:
    return f"sample {key} (member {member} at byte offset {offset})"


def _decode(sample: _Sample, suffix: str, max_bytes: int) -> str:
    name, offset, data = sample.texts[suffix]
    if data is None:
        sample.fail(
            f"text member longer than max_document_bytes ({max_bytes})", name, offset, "too_long"
        )
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        sample.fail(
            f"text is not valid UTF-8 ({exc.reason} at byte {exc.start} of the member)",
            name,
            offset,
            "bad_text",
        )
        return ""


def _from_json(sample: _Sample, field: str, max_bytes: int) -> str | None:
    """The json member's `field`, or None when it has no such key."""
    name, offset, data = sample.texts["json"]
    if data is None:
        sample.fail(
            f"json member longer than max_document_bytes ({max_bytes})", name, offset, "too_long"
        )
        return None
    try:
        obj = deep_json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        sample.fail(
            f"malformed JSON: {deep_json.problem(exc, 'the member')}", name, offset, "malformed"
        )
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
        sample.fail(
            f"json field {field!r} is {type(text).__name__}, not a string", name, offset, "bad_text"
        )
        return None
    return text


def _text(sample: _Sample, text_field: str, max_bytes: int) -> str | None:
    """The sample's text by the module's rule; None (with `sample.error` set) when it has none."""
    choices = (
        (("member", "txt"), ("key", "txt"))
        if text_field == "txt"
        else (("key", text_field), ("member", text_field))
    )
    for kind, name in choices:
        suffix = "json" if kind == "key" else name
        if suffix not in sample.texts:
            continue
        if kind == "key":
            text = _from_json(sample, name, max_bytes)
            if text is None and sample.error is None:
                continue  # no such key: the next choice
        else:
            text = _decode(sample, suffix, max_bytes)
        if sample.error is not None or text is None:
            return None
        if len(text) > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            member, offset, _ = sample.texts[suffix]
            sample.fail(
                f"text longer than max_document_bytes ({max_bytes})", member, offset, "too_long"
            )
            return None
        sample.text_from = suffix
        return text
    wanted = (
        f"no txt member and no {text_field!r} key in a json member"
        if text_field == "txt"
        else f"no {text_field!r} key in a json member and no {text_field} member"
    )
    sample.fail(f"sample without text ({wanted})", sample.first, sample.offset, "bad_text")
    return None


def _record(
    sample: _Sample, *, entry: FileEntry, source: str, text_field: str, max_bytes: int
) -> Record:
    text = None if sample.error else _text(sample, text_field, max_bytes)
    if sample.error is not None:
        message, member, offset, reason = sample.error
        err = DataError(
            message,
            source=source,
            file=entry.url,
            location=_where(sample.key, member, offset),
            reason=reason,
        )
        sample.texts.clear()
        return Record(sample.index, sample.offset, None, err)
    images = tuple(image for _, image in sorted(sample.images, key=lambda item: item[0]))
    assert sample.text_from is not None
    member, offset, _ = sample.texts[sample.text_from]
    # The members' bytes go now: the reader's frame keeps `sample` while the record is used.
    sample.texts.clear()
    return Record(
        sample.index,
        sample.offset,
        text,
        images=images,
        location=_where(sample.key, member, offset),
    )


def read_webdataset(
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
    """Samples of one tar from the cursor (sample `index` whose first header is at byte
    `offset`); see the module docstring for grouping, text and errors."""
    wanted = {"json", text_field}  # the members that may hold the text
    sample: _Sample | None = None
    with storage.open(entry) as f:
        try:
            for name, at, size in members(f, offset, entry.size):
                if _META.match(name):
                    continue
                match = _KEY.match(name)
                if match is None:
                    continue  # no suffix: not part of any sample (as in webdataset)
                key, suffix = match.group(1), match.group(2).lower()
                if sample is None or key != sample.key:
                    if sample is not None:
                        yield _record(
                            sample,
                            entry=entry,
                            source=source,
                            text_field=text_field,
                            max_bytes=max_bytes,
                        )
                        index += 1
                    sample = _Sample(key, index, at, name)
                if suffix in sample.suffixes:
                    sample.fail(
                        f"repeated member suffix {suffix!r} in one sample", name, at, "malformed"
                    )
                sample.suffixes.add(suffix)
                if sample.error is not None:
                    continue
                kind, medium, what, made = _medium(suffix)
                if medium is not None:
                    if size == 0:
                        sample.fail(f"empty {what} member (0 bytes)", name, at, bad_media(what))
                    elif size > max_bytes:
                        sample.fail(
                            f"{what} member of {size} bytes, longer than "
                            f"max_document_bytes ({max_bytes})",
                            name,
                            at,
                            "too_long",
                        )
                    elif _within(sample, size, max_bytes, name, at):
                        order = (kind, int(medium.group(1)) if medium.group(1) else -1)
                        sample.images.append((order, made(_read(f, size, name, at), name, at)))
                elif suffix in wanted:
                    if size > max_bytes:
                        sample.texts[suffix] = (name, at, None)
                    elif _within(sample, size, max_bytes, name, at):
                        sample.texts[suffix] = (name, at, _read(f, size, name, at))
        except Broken as exc:
            yield from _broken(
                exc,
                sample,
                entry=entry,
                source=source,
                text_field=text_field,
                max_bytes=max_bytes,
                index=index,
            )
            return
    if sample is not None:
        yield _record(
            sample, entry=entry, source=source, text_field=text_field, max_bytes=max_bytes
        )


def _medium(suffix: str) -> tuple[int, re.Match[str] | None, str, type[EncodedImage]]:
    """(kind, match, what, record type) of a media member's suffix; match None: no medium."""
    for kind, (pattern, what, made) in enumerate(_MEDIA):
        match = pattern.fullmatch(suffix)
        if match is not None:
            return kind, match, what, made
    return 0, None, "", EncodedImage


def _within(sample: _Sample, size: int, max_bytes: int, name: str, at: int) -> bool:
    """Count a member about to be read against the sample's `max_document_bytes`: a sample
    is one record, never held in memory past that limit however many members it has."""
    if sample.size + size > max_bytes:
        sample.fail(
            f"sample larger than max_document_bytes ({max_bytes}): its images and "
            f"text add up to {sample.size + size} bytes with this member",
            name,
            at,
            "too_long",
        )
        return False
    sample.size += size
    return True


def _read(f: IO[bytes], size: int, name: str, at: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise Broken(
            f"member ends after {len(data)} of its {size} bytes (file truncated)",
            at,
            name,
            reason="corrupt",
        )
    return data


def _broken(
    exc: Broken,
    sample: _Sample | None,
    *,
    entry: FileEntry,
    source: str,
    text_field: str,
    max_bytes: int,
    index: int,
) -> Iterator[Record]:
    """The records that end a split at a break in the tar: the sample being assembled unless
    the broken member belongs to it (then that sample, maybe incomplete, is the error), then
    the error."""
    name = exc.name
    match = _KEY.match(name) if name is not None and not _META.match(name) else None
    key = match.group(1) if match is not None else None
    if sample is not None and key != sample.key:  # the sample before the break is whole
        yield _record(
            sample, entry=entry, source=source, text_field=text_field, max_bytes=max_bytes
        )
        index, sample = sample.index + 1, None
    member = "tar header" if name is None or exc.guessed else f"member {name}"
    if sample is not None:
        where = f"sample {sample.key} ({member} at byte offset {exc.offset})"
        message = f"{exc}; the sample may be incomplete and the rest of the tar is not read"
        index, at = sample.index, sample.offset
    else:
        where = (
            f"sample {key} ({member} at byte offset {exc.offset})"
            if key is not None and not exc.guessed
            else f"{member} at byte offset {exc.offset}"
        )
        message = f"{exc}; the rest of the tar is not read"
        at = exc.start
    yield Record(
        index,
        at,
        None,
        DataError(message, source=source, file=entry.url, location=where, reason=exc.reason),
    )
