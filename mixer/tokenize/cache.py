"""Token cache: a split's documents as token ids, so later epochs and runs skip tokenizing.

An entry holds *every* record of one split (all stripes), in four objects under
`<root>/<key[:2]>/<key>`:

    .bin   token ids of the kept documents, back to back (Megatron-LM's indexed dataset)
    .idx   their lengths and pointers (MMIDIDX version 1, see `indexed.py`)
    .rec   int64 [records, 4]: record index, offset, chars (len of its text), document
           number in the .idx (or -1 - e for the e-th error record)
    .json  the commit: format version, dtype, counts, the errors, and a CRC-32 and size of
           each of the three objects above; written last, so a reader never sees half an entry

The key hashes everything that determines the tokens (tokenizer digest and BOS/EOS rule, the
object's key, size and version, the split's bounds, text field, format, max_document_bytes,
`CACHE_FORMAT`), so a changed tokenizer or file never hits a stale entry. A cached split
yields exactly the records its reader would (same index, offset, chars, tokens, errors), so
the stream's windows and state mean the same with the cache cold, warm or partly warm.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.errors import DataError
from mixer.sources.base import FileEntry, Record, Split
from mixer.sources.storage import filesystem
from mixer.tokenize.indexed import encode_index, parse_index, token_dtype
from mixer.tokenize.tokenizer import (
    TOKENIZE_BYTES,
    TOKENIZE_DOCS,
    TokenizerInfo,
    encoding_thread,
)

CACHE_FORMAT = 1
_PARTS = ("bin", "idx", "rec")


def _chunks(records: Iterator[Record]) -> Iterator[list[Record]]:
    """Records in chunks of at most TOKENIZE_DOCS records and about TOKENIZE_BYTES of text."""
    chunk: list[Record] = []
    size = 0
    for record in records:
        chunk.append(record)
        size += len(record.text) if record.text is not None else 0
        if len(chunk) >= TOKENIZE_DOCS or size >= TOKENIZE_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk
_BLOCK = 1 << 18   # tokens converted to int64 at once when replaying
log = logging.getLogger("mixer.token_cache")
_warned: set[Any] = set()   # cache roots this process already warned about


@dataclass
class CacheStats:
    """Per-process counters: splits served from the cache, read from source files (`misses`),
    entries written, and entries found damaged (then rebuilt)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    corrupt: int = 0

    def reset(self) -> None:
        self.hits = self.misses = self.writes = self.corrupt = 0


CACHE_STATS = CacheStats()


@dataclass(frozen=True)
class CachedSplit:
    """A verified entry in memory: its tokens, index and per-record table."""

    tokens: np.ndarray     # the .bin, in its stored dtype
    starts: np.ndarray     # int64[D + 1]: element offset of each document, then the end
    records: np.ndarray    # int64[R, 4]
    errors: list[list[Any]]


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


class TokenCache:
    """The token cache at `root` (a folder or fsspec URL) for one tokenizer."""

    def __init__(self, root: str, tokenizer: TokenizerInfo,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.root = root.rstrip("/")
        self.tokenizer = tokenizer
        self.storage_options = dict(storage_options or {})
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.writable = True

    def filesystem(self) -> tuple[Any, str]:
        """(fs, root path) of the cache in this process."""
        return filesystem(self.root, self.storage_options, source="token_cache")

    def key(self, entry: FileEntry, split: Split, *, text_field: str, max_bytes: int) -> str:
        """The entry's name: a digest of everything that determines its tokens."""
        info = self.tokenizer
        # An ETag names content; a modification time does not (copies keep it, tools pin it),
        # so files versioned by mtime are also told apart by their path.
        where = "" if entry.etag else entry.url
        material = [CACHE_FORMAT, info.digest, info.eos_id, info.bos_id, entry.key, where,
                    entry.size, entry.version, entry.format, split.to_list()[1:], text_field,
                    max_bytes]
        return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]

    def path(self, key: str) -> str:
        """Path of an entry's objects without the suffix (relative to the filesystem)."""
        return f"{self.filesystem()[1]}/{key[:2]}/{key}"

    # -- reading -----------------------------------------------------------------------------
    def load(self, key: str) -> CachedSplit | None:
        """The entry if it is complete and its checksums match; None on a miss. A damaged
        entry counts in `CACHE_STATS.corrupt` and reads as a miss (then it is rewritten)."""
        fs, _ = self.filesystem()
        base = self.path(key)
        try:
            commit = json.loads(fs.cat_file(base + ".json"))
        except (OSError, ValueError):
            return None
        try:
            data = {part: fs.cat_file(f"{base}.{part}") for part in _PARTS}
            for part in _PARTS:
                size, crc = commit[part]
                if len(data[part]) != size or _crc(data[part]) != crc:
                    raise ValueError(f"{part} checksum mismatch")
            index = parse_index(data["idx"])
            records = np.frombuffer(data["rec"], np.int64).reshape(-1, 4)
            if commit["v"] != CACHE_FORMAT or len(records) != commit["records"]:
                raise ValueError("record table does not match its commit")
            tokens = np.frombuffer(data["bin"], index.dtype)
            starts = np.zeros(index.num_documents + 1, np.int64)
            np.cumsum(index.lengths, out=starts[1:])
            if starts[-1] != len(tokens):
                raise ValueError("index does not cover the token file")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            CACHE_STATS.corrupt += 1
            log.info("token cache entry %s is damaged (%s); rebuilding it", base, exc)
            return None
        return CachedSplit(tokens, starts, records, commit["errors"])

    def replay(self, cached: CachedSplit, *, index: int, source: str,
               file: str) -> Iterator[Record]:
        """The split's records from record index `index`, as its reader would yield them.

        Tokens become int64 a block of documents at a time; each record's tokens are a view
        into its block (one conversion per block instead of one per document)."""
        rows = cached.records
        first = int(np.searchsorted(rows[:, 0], index))
        tokens, starts = cached.tokens, cached.starts.tolist()
        block, base, block_end = tokens[:0].astype(np.int64), 0, 0
        for record_index, offset, chars, doc in rows[first:].tolist():
            if doc < 0:
                message, same_file, other_file, location = cached.errors[-1 - doc]
                yield Record(record_index, offset, None, _error(
                    message, source, file if same_file else other_file, location))
                continue
            if doc >= block_end:   # documents [doc, block_end) share one int64 block
                base = starts[doc]
                block_end = max(int(np.searchsorted(cached.starts, base + _BLOCK, "right")) - 1,
                                doc + 1)
                block = tokens[base:starts[block_end]].astype(np.int64)
            ids = block[starts[doc] - base:starts[doc + 1] - base]
            yield Record(record_index, offset, None, tokens=ids, chars=chars)

    # -- writing -----------------------------------------------------------------------------
    def store(self, key: str, records: list[tuple[int, int, int, int]], lengths: list[int],
              tokens: list[np.ndarray], errors: list[list[Any]]) -> bool:
        """Write an entry (data objects first, the commit last) from its record rows, its
        documents' lengths and their tokens (arrays in the cache's dtype, back to back);
        False when the cache cannot be written (warned once per process and root, then not
        tried again)."""
        if not self.writable:
            return False
        parts = {"bin": b"".join(t.tobytes() for t in tokens),
                 "idx": encode_index(self.dtype, np.array(lengths, dtype=np.int32)),
                 "rec": np.array(records, dtype=np.int64).reshape(-1, 4).tobytes()}
        commit = {"v": CACHE_FORMAT, "records": len(records), "documents": len(lengths),
                  "errors": errors, **{p: [len(d), _crc(d)] for p, d in parts.items()}}
        parts["json"] = json.dumps(commit).encode()
        fs, _ = self.filesystem()
        base = self.path(key)
        try:
            fs.makedirs(base.rsplit("/", 1)[0], exist_ok=True)
            for suffix in (*_PARTS, "json"):
                _put(fs, f"{base}.{suffix}", parts[suffix])
        except OSError as exc:
            self.writable = False
            if self.root not in _warned:
                _warned.add(self.root)
                log.warning("token cache %s cannot be written (%s): reading tokens from the "
                            "cache where present, tokenizing the rest", self.root, exc)
            return False
        CACHE_STATS.writes += 1
        return True

    def records(self, read: Callable[[], Iterator[Record]], *, entry: FileEntry, split: Split,
                source: str, text_field: str, max_bytes: int, index: int,
                write: bool) -> tuple[Iterator[Record], SplitWriter | None]:
        """The split's records from `index`, and a writer to feed when the entry is to be
        written. A hit replays the entry; a miss reads with `read()`, and when `write` (and
        reading starts at the split's first record) returns a `SplitWriter` that the stream
        feeds with the records it reads and the tokens it makes of them (so caching costs no
        tokenization of its own); the entry is stored once every record has its tokens."""
        key = self.key(entry, split, text_field=text_field, max_bytes=max_bytes)
        cached = self.load(key)
        if cached is not None:
            CACHE_STATS.hits += 1
            return self.replay(cached, index=index, source=source, file=entry.url), None
        CACHE_STATS.misses += 1
        if not write or index != 0 or not self.writable:
            return read(), None
        return read(), SplitWriter(self, key, entry.url)

    def write_through(self, records: Iterable[Record], key: str, file: str,
                      encode: Callable[[list[str]], list[np.ndarray]]) -> Iterator[Record]:
        """`records` of a whole split with their texts tokenized (token records, same
        `chars`); once they are all read, the entry `key` is stored (unless the split ends
        in an error or holds images: then it stays uncached)."""
        rows: list[tuple[int, int, int, int]] = []
        lengths: list[int] = []
        tokens: list[np.ndarray] = []   # per chunk, in the cache's dtype (2-4 bytes a token)
        errors: list[list[Any]] = []
        keep = True   # False once a record cannot be cached (images, ids beyond the dtype)
        last_error = False
        limit = np.iinfo(self.dtype).max

        def texts_of(chunk: list[Record]) -> list[str]:
            return [r.text for r in chunk if r.error is None and r.tokens is None
                    and not r.images]

        # Pipelined: the next chunk is read and encoded in the background while the caller
        # consumes this one, so caching costs one tokenization, overlapped as without it.
        chunks = _chunks(iter(records))
        pending = None
        first = next(chunks, None)
        if first is not None:
            pending = (first, encoding_thread().submit(encode, texts_of(first)))
        while pending is not None:
            chunk, future = pending
            following = next(chunks, None)
            pending = None if following is None else (
                following, encoding_thread().submit(encode, texts_of(following)))
            encoded = iter(future.result())
            kept = []
            for record in chunk:
                last_error = record.error is not None
                if record.images:
                    keep = False
                elif record.error is not None:
                    rows.append((record.index, record.offset, 0, -1 - len(errors)))
                    errors.append(_error_fields(record.error, file))
                else:
                    chars = record.size
                    ids = record.tokens if record.tokens is not None else next(encoded)
                    rows.append((record.index, record.offset, chars, len(lengths)))
                    lengths.append(len(ids))
                    kept.append(ids)
                    record = Record(record.index, record.offset, None, tokens=ids, chars=chars)
                yield record
            if kept and keep:
                joined = np.concatenate(kept)
                if len(joined) and (joined.min() < 0 or joined.max() > limit):
                    keep = False   # pre-tokenized ids of another vocabulary
                tokens.append(joined.astype(self.dtype))
        # A split that ends in an error may have been cut short by a storage failure: such an
        # error must not outlive this run, so the split stays uncached.
        if keep and not last_error:
            self.store(key, rows, lengths, tokens, errors)


_open: dict[tuple, TokenCache] = {}


def open_cache(recipe: Any, tokenizer: TokenizerInfo) -> TokenCache | None:
    """The recipe's token cache (one per process, root and tokenizer), or None without one.
    Image recipes bypass the cache (logged once)."""
    if recipe.token_cache is None:
        return None
    root = recipe.resolve(recipe.token_cache)
    if recipe.images is not None:
        if ("images", root) not in _warned:
            _warned.add(("images", root))
            log.warning("token_cache %s is not used: image recipes bypass the token cache", root)
        return None
    key = (os.getpid(), root, tokenizer, repr(sorted(recipe.token_cache_storage_options.items())))
    if key not in _open:
        _open[key] = TokenCache(root, tokenizer, recipe.token_cache_storage_options)
    return _open[key]


def _put(fs: Any, path: str, data: bytes) -> None:
    """Write one object so no reader sees it half-written: a unique temporary name renamed
    into place on a local disk; one PUT (atomic per object) on object stores."""
    if getattr(fs, "protocol", None) in ("file", ("file", "local")) or \
            type(fs).__name__ == "LocalFileSystem":
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        fs.pipe_file(path, data)


def _error_fields(error: DataError, file: str) -> list[Any]:
    """[message, same_file, file, location] of an error record (message without its place)."""
    where = str(error)
    prefix = f"source {error.source!r}" if error.source is not None else ""
    if error.file is not None:
        prefix += f", file {error.file!r}"
    if error.location is not None:
        prefix += f", {error.location}"
    message = where[len(prefix) + 2:] if prefix and where.startswith(prefix + ": ") else where
    return [message, error.file == file, error.file, error.location]


def _error(message: str, source: str, file: str | None, location: str | None) -> DataError:
    return DataError(message, source=source, file=file, location=location)


class SplitWriter:
    """An entry filled as a stream reads its split (every record, in order) and tokenizes
    its documents (in any order); stored when the split was read to its end and every
    document has its tokens, unless it ends in an error or holds images."""

    def __init__(self, cache: TokenCache, key: str, file: str) -> None:
        self.cache = cache
        self.key = key
        self.file = file
        self.rows: list[tuple[int, int, int, int]] = []
        self.errors: list[list[Any]] = []
        self.tokens: dict[int, np.ndarray] = {}
        self.documents = 0
        self.keep = True
        self.last_error = False
        self.ended = False
        self.done = False

    def record(self, record: Record) -> int | None:
        """Note a record read from the split; the document number to feed tokens for (None
        for an error, or a document that already carries its tokens)."""
        if record.images:
            self.keep = False
            return None
        self.last_error = record.error is not None
        if record.error is not None:
            self.rows.append((record.index, record.offset, 0, -1 - len(self.errors)))
            self.errors.append(_error_fields(record.error, self.file))
            return None
        doc = self.documents
        self.documents += 1
        self.rows.append((record.index, record.offset, record.size, doc))
        if record.tokens is not None:
            self.tokens[doc] = record.tokens
            return None
        return doc

    def add_tokens(self, doc: int, ids: np.ndarray) -> None:
        self.tokens[doc] = ids
        self._maybe_store()

    def end(self) -> None:
        """The split was read to its end."""
        self.ended = True
        self._maybe_store()

    def _maybe_store(self) -> None:
        if self.done or not self.ended or len(self.tokens) < self.documents:
            return
        self.done = True
        if not self.keep or self.last_error:
            return   # (an error at the end may be a storage failure: it must not outlive us)
        arrays = [self.tokens[d] for d in range(self.documents)]
        lengths = [len(a) for a in arrays]
        joined = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        limit = np.iinfo(self.cache.dtype).max
        if len(joined) and (joined.min() < 0 or joined.max() > limit):
            return   # pre-tokenized ids of another vocabulary
        self.cache.store(self.key, self.rows, lengths, [joined.astype(self.cache.dtype)],
                         self.errors)
        self.tokens.clear()
