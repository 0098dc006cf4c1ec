"""What mixer knows about a file format (`Format`), and how files are cut into splits.

An entry names the format, the file extensions it is inferred from, how a file is cut into
splits, the reader that turns a split into records, how a record's offset reads in an error
message, and how `mixer inspect` estimates the documents of a file it sampled.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import zstandard

from mixer.core.records import FileEntry, Reader, Split
from mixer.core.registry import FORMATS, infer_format
from mixer.sources.formats.parquet import row_groups
from mixer.sources.formats.zstd_frames import group_frames, scan_frames
from mixer.sources.storage import Storage


@dataclass(frozen=True)
class SplitRequest:
    """What cutting one file into splits may use."""

    index: int  # the file's index in its source's file list
    entry: FileEntry
    storage: Storage
    split_bytes: int  # target size of byte-range splits
    deep: bool  # `mixer index`: may read whole files (zstd frame scans)


@dataclass(frozen=True)
class Format:
    """Everything mixer knows about one file format."""

    name: str
    extensions: tuple[str, ...]
    reader: Reader
    splits: Callable[[SplitRequest], list[Split]]
    default_text_field: str = "text"
    compression: str | None = None  # "gzip" | "zstd": whole-file resume decompresses
    offset_unit: str = "byte offset"
    pretokenized: bool = False  # records carry token ids; the reader takes `tokenizer`
    companion: Callable[[str], str] | None = None  # URL of a file listed with each file

    def text_field(self, chosen: str | None) -> str:
        """The field a source's texts are read from: the recipe's `text_field`, else this
        format's default (the one place the default applies)."""
        return chosen or self.default_text_field

    def describe_offset(self, split: Split, offset: int) -> str:
        """Where a record's `offset` (in this reader's units) lies, in words."""
        if self.offset_unit == "document":
            return f"document {offset}"
        if self.offset_unit == "row":
            return f"row group {split.start}, row {offset}"
        return f"{self.offset_unit} {offset}"

    def docs_per_byte(
        self,
        storage: Storage,
        entry: FileEntry,
        split: Split,
        docs: int,
        end_offset: int | None,
        ratio: float | None = None,
    ) -> float:
        """Documents per stored byte, estimated from `docs` documents read from the start of
        `split` up to `end_offset` (None: the whole split was read). A compressed file read
        in part is scaled by `ratio` (decompressed bytes per stored byte; measured on the
        file's head when None); a group of zstd frames knows its own."""
        if self.compression is None:
            span = (split.end if end_offset is None else end_offset) - split.start
            return docs / max(span, 1)
        frames = split.dend >= 0  # (offsets are decompressed bytes from the file's start)
        if end_offset is None:  # the whole split was read
            return docs / max(split.end - split.start if frames else entry.size, 1)
        if frames:
            ratio = (split.dend - split.dstart) / max(split.end - split.start, 1)
            return docs / max(end_offset - split.dstart, 1) * ratio
        if ratio is None:
            ratio, _ = self.compression_ratio(storage, entry)
        return docs / max(end_offset, 1) * ratio

    def compression_ratio(
        self, storage: Storage, entry: FileEntry, probe: int = 1 << 20
    ) -> tuple[float, int | None]:
        """Decompressed bytes per stored byte, measured on the file's first `probe` bytes,
        and the stored byte offset where the data stopped decoding (None: it decoded). A
        damaged head's ratio is that of the bytes before the damage."""
        if self.compression is None:
            return 1.0, None
        with storage.open(entry) as f:
            head = f.read(probe)
        cap = 64 * probe  # a bomb's probe must not decompress to gigabytes
        piece = 16 << 10  # the damage is located to within one piece
        out = used = 0
        damaged: int | None = None
        if self.compression == "gzip":
            inflate = zlib.decompressobj(wbits=47)
            try:
                for start in range(0, len(head), piece):
                    out += len(inflate.decompress(head[start : start + piece], cap - out))
                    used = min(start + piece, len(head)) - len(inflate.unconsumed_tail)
                    if inflate.unconsumed_tail or out >= cap:
                        break
            except zlib.error:
                damaged = used
        else:
            source = io.BytesIO(head)
            reader = zstandard.ZstdDecompressor().stream_reader(
                source, read_size=piece, read_across_frames=True
            )
            try:
                while out < cap:
                    chunk = reader.read(min(piece * 4, cap - out))
                    if not chunk:
                        break
                    out += len(chunk)
                    used = source.tell()  # (to within one read_size)
            except zstandard.ZstdError:
                damaged = used
            if damaged is None:
                used = source.tell() or len(head)
        return out / max(used, 1), damaged


def byte_ranges(req: SplitRequest) -> list[Split]:
    step = req.split_bytes
    return [
        Split(req.index, start, min(start + step, req.entry.size))
        for start in range(0, req.entry.size, step)
    ]


def whole_file(req: SplitRequest) -> list[Split]:
    return [Split(req.index, 0, req.entry.size, -1, seekable=False)]


def one_document(req: SplitRequest) -> list[Split]:
    return [Split(req.index, 0, req.entry.size, 1)]


def one_tar(req: SplitRequest) -> list[Split]:
    return [Split(req.index, 0, req.entry.size)]  # sample count unknown; seekable by offset


def row_group_splits(req: SplitRequest) -> list[Split]:
    return [
        Split(req.index, g, g, rows)
        for g, rows in enumerate(row_groups(req.storage, req.entry))
        if rows
    ]


def zstd_frame_splits(req: SplitRequest) -> list[Split]:
    if req.deep:
        # Only `mixer index` scans (for remote objects it reads them whole); local and remote
        # copies thus always get the same splits, and the same stream.
        with req.storage.open(req.entry) as f:
            frames = scan_frames(f, req.entry.size)
        groups = group_frames(frames, req.split_bytes) if frames else []
        if len(groups) > 1:
            return [
                Split(req.index, start, end, -1, True, dstart, dend)
                for start, end, dstart, dend in groups
            ]
    return whole_file(req)


def register(fmt: Format) -> Format:
    """Add a format (its name must be new); returns it."""
    if fmt.name in FORMATS:
        raise ValueError(f"format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt
    return fmt


__all__ = ["FORMATS", "Format", "SplitRequest", "infer_format", "register"]
