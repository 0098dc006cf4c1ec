"""Token cache: a split's documents as token ids, so later epochs and runs skip tokenizing.

An entry holds *every* record of one split (all stripes), in four objects under
`<root>/<key[:2]>/<key>`:

    .bin   token ids of the kept documents, back to back (Megatron-LM's indexed dataset)
    .idx   their lengths and pointers (MMIDIDX version 1, see `indexed.py`)
    .rec   int64 [records, 4]: record index, offset, chars (len of its text), document
           number in the .idx (or -1 - e for the e-th error record)
    .json  the commit: format version, counts, the errors, a CRC-32 and size of the .idx and
           .rec, the .bin's size, block size (`BIN_BLOCK`) and a CRC-32 per block, and a
           CRC-32 of all those fields; written last, so a reader never sees half an entry

Reading an entry reads its .json, .idx and .rec, each checked against its checksum and the
layout mixer writes (whatever fails is a damaged entry, read as a miss); the .bin is read
lazily, by the blocks the replayed records need, each checked when read. A damaged block
never yields its tokens: from that record on, the replay reads the split's source file (the
same records, tokenized as on a miss), counts the entry as corrupt and drops its commit; a
replay that began at the split's first record rebuilds it as it goes, otherwise the next full
read (or `mixer cache`) does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from mixer.cache.blocks import CorruptBlock, TokenFile, crc, is_local
from mixer.cache.entry import (
    BIN_BLOCK,
    CACHE_FORMAT,
    CachedSplit,
    _check_commit,
    _check_records,
    open_commit,
    seal_commit,
)
from mixer.cache.replay import Replay
from mixer.cache.spill import SpillUnavailable, TokenSpill
from mixer.cache.writer import SplitWriter
from mixer.core.files import write_atomically
from mixer.core.records import FileEntry, Record, Split
from mixer.core.token_info import TokenizerInfo
from mixer.sources.indexed import encode_index, parse_index, token_dtype
from mixer.sources.storage import filesystem
from mixer.tokenize.encoding import TOKENIZE_BYTES, chunk_full, encoding_thread, next_budget


def _chunks(records: Iterator[Record]) -> Iterator[list[Record]]:
    """Records in the chunks the tokenizer's calls take (the chunk rule, `tokenize.encoding`)."""
    chunk: list[Record] = []
    size = 0
    budget = TOKENIZE_BYTES
    for record in records:
        chunk.append(record)
        size += len(record.text) if record.text is not None else 0
        if chunk_full(len(chunk), size, budget):
            yield chunk
            chunk, size = [], 0
            budget = next_budget(budget)
    if chunk:
        yield chunk


log = logging.getLogger("mixer.token_cache")
_warned: set[Any] = set()  # cache roots this process already warned about


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


class TokenCache:
    """The token cache at `root` (a folder or fsspec URL) for one tokenizer."""

    def __init__(
        self, root: str, tokenizer: TokenizerInfo, storage_options: dict[str, Any] | None = None
    ) -> None:
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
        material = [
            CACHE_FORMAT,
            info.digest,
            info.eos_id,
            info.bos_id,
            entry.key,
            where,
            entry.size,
            entry.version,
            entry.format,
            split.to_list()[1:],
            text_field,
            max_bytes,
        ]
        return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32]

    def path(self, key: str) -> str:
        """Path of an entry's objects without the suffix (relative to the filesystem)."""
        return f"{self.filesystem()[1]}/{key[:2]}/{key}"

    # -- reading -----------------------------------------------------------------------------
    def load(self, key: str, *, check_tokens: bool = False) -> CachedSplit | None:
        """The entry if it is complete and its .json, .idx and .rec match their checksums
        and the layout mixer writes (every block of its .bin too with `check_tokens`;
        otherwise each is checked when replayed); None on a miss. A damaged entry counts in
        `CACHE_STATS.corrupt` and reads as a miss (then it is rewritten)."""
        fs, _ = self.filesystem()
        base = self.path(key)
        try:
            data = fs.cat_file(base + ".json")
        except FileNotFoundError:
            return None
        except OSError as exc:  # (a folder in its place, an unreadable file)
            return self._damaged(base, exc)
        try:
            commit = open_commit(data)
            _check_commit(commit)
            parts = {part: fs.cat_file(f"{base}.{part}") for part in ("idx", "rec")}
            for part, raw in parts.items():
                if [len(raw), crc(raw)] != commit[part]:
                    raise ValueError(f"{part} checksum mismatch")
            starts, records = self._layout(parts["idx"], parts["rec"], commit)
            size, block, crcs = commit["bin"]
            tokens = TokenFile(fs, base + ".bin", self.dtype, size, block, crcs)
            if check_tokens:
                tokens.check_all()
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            return self._damaged(base, exc)
        return CachedSplit(tokens, starts, records, commit["errors"], key)

    def _damaged(self, base: str, exc: Exception) -> None:
        """Count an entry found damaged when loading it (it reads as a miss)."""
        CACHE_STATS.corrupt += 1
        log.info("token cache entry %s is damaged (%s); rebuilding it", base, exc)

    def _layout(
        self, idx: bytes, rec: bytes, commit: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(document starts, record table) of an entry's .idx and .rec, checked against its
        commit and the layout mixer writes (ValueError says what is wrong)."""
        index = parse_index(idx)
        if idx != encode_index(self.dtype, index.lengths):
            raise ValueError(
                "index is not one sequence per document in this cache's dtype, back to back"
            )
        if len(rec) % 32:
            raise ValueError("record table is not whole rows")
        records = np.frombuffer(rec, np.int64).reshape(-1, 4)
        if len(records) != commit["records"] or index.num_documents != commit["documents"]:
            raise ValueError("record table or index does not match its commit")
        _check_records(records, index.num_documents, len(commit["errors"]))
        starts = np.zeros(index.num_documents + 1, np.int64)
        np.cumsum(index.lengths, out=starts[1:])
        if starts[-1] * self.dtype.itemsize != commit["bin"][0]:
            raise ValueError("index does not cover the token file")
        return starts, records

    def replay(
        self,
        cached: CachedSplit,
        *,
        index: int,
        source: str,
        file: str,
        read: Callable[[int, int], Iterator[Record]],
        adopt: Callable[[SplitWriter], None] | None = None,
    ) -> Replay:
        """The split's records from record index `index`, as its reader would yield them (see
        `Replay`). From a record whose block is damaged on, they are `read(index, offset)`
        from the source; when the replay started at the split's first record, `adopt` is
        first handed a writer holding the records replayed so far, to feed with the rest (the
        entry is rebuilt)."""

        def damaged(row: int, doc: int, exc: CorruptBlock) -> None:
            self._drop(cached, exc)
            if adopt is not None and replay.first == 0 and self.writable:
                try:
                    writer = SplitWriter.prefilled(self, cached, file, row, doc)
                except CorruptBlock as err:  # (the entry changed under us: not rebuilt)
                    log.debug("token cache entry %s not rebuilt (%s)", cached.key, err)
                    return
                adopt(writer)

        replay = Replay(cached, index, source=source, file=file, read=read, damaged=damaged)
        return replay

    def _drop(self, cached: CachedSplit, exc: Exception) -> None:
        """Count a damaged entry found while replaying it and remove its commit (best effort:
        the next full read of the split rewrites it)."""
        CACHE_STATS.corrupt += 1
        base = self.path(cached.key)
        log.info(
            "token cache entry %s is damaged (%s); reading its split from the source from here on",
            base,
            exc,
        )
        try:
            self.filesystem()[0].rm_file(base + ".json")
        except OSError as err:
            log.debug("cannot remove %s.json (%s)", base, err)

    # -- writing -----------------------------------------------------------------------------
    def spill(self) -> TokenSpill:
        """An empty spill for an entry's tokens: beside the entries when the cache is a local
        folder (stored by a copy on the same disk; no RAM-backed /tmp), otherwise in the
        system's temporary folder."""
        fs, root = self.filesystem()
        return TokenSpill(self.dtype, root if is_local(fs) else None)

    def store(self, key: str, records: array, tokens: TokenSpill, errors: list[list[Any]]) -> bool:
        """Write an entry (data objects first, the commit last) from its record rows (int64,
        4 per record, flat), its documents' tokens and the errors; False when the cache
        cannot be written (warned once per process and root, then not tried again). Closes
        `tokens`."""
        try:
            if not self.writable:
                return False
            fs, _ = self.filesystem()
            base = self.path(key)
            fs.makedirs(base.rsplit("/", 1)[0], exist_ok=True)
            bin_crcs = _put_chunks(fs, f"{base}.bin", tokens.chunks(BIN_BLOCK))
            parts = {
                "idx": encode_index(self.dtype, np.array(tokens.lengths, dtype=np.int32)),
                "rec": records.tobytes(),
            }
            commit = {
                "v": CACHE_FORMAT,
                "records": len(records) // 4,
                "documents": len(tokens),
                "errors": errors,
                "idx": [len(parts["idx"]), crc(parts["idx"])],
                "rec": [len(parts["rec"]), crc(parts["rec"])],
                "bin": [tokens.nbytes, BIN_BLOCK, bin_crcs],
            }
            parts["json"] = seal_commit(commit)
            for suffix in ("idx", "rec", "json"):
                _put(fs, f"{base}.{suffix}", parts[suffix])
        except (SpillUnavailable, IsADirectoryError) as exc:  # (this entry only)
            log.debug("token cache entry %s not written (%s)", key, exc)
            return False
        except OSError as exc:
            self.unwritable(exc)
            return False
        finally:
            tokens.close()
        CACHE_STATS.writes += 1
        return True

    def unwritable(self, exc: OSError) -> None:
        """Stop writing to this cache (reads go on), warning once per process and root."""
        self.writable = False
        if self.root not in _warned:
            _warned.add(self.root)
            log.warning(
                "token cache %s cannot be written (%s): reading tokens from the "
                "cache where present, tokenizing the rest",
                self.root,
                exc,
            )

    def records(
        self,
        read: Callable[[int, int], Iterator[Record]],
        *,
        entry: FileEntry,
        split: Split,
        source: str,
        text_field: str,
        max_bytes: int,
        index: int,
        offset: int,
        adopt: Callable[[SplitWriter], None] | None = None,
    ) -> Iterator[Record]:
        """The split's records from the cursor (`index`, `offset`). With `adopt`, the entry is
        to be written from what the caller reads: `adopt` is handed the `SplitWriter` that
        the caller then feeds with the records it reads and the tokens it makes of them (so
        caching costs no tokenization of its own; the entry is stored once every record has
        its tokens). A miss reads with `read(index, offset)` and, when reading starts at the
        split's first record, adopts a writer at once; a hit replays the entry, and from a
        damaged block on reads the source with `read` and adopts the writer that rebuilds
        the entry."""
        key = self.key(entry, split, text_field=text_field, max_bytes=max_bytes)
        cached = self.load(key)
        if cached is not None:
            CACHE_STATS.hits += 1
            return self.replay(
                cached, index=index, source=source, file=entry.url, read=read, adopt=adopt
            )
        CACHE_STATS.misses += 1
        if adopt is not None and index == 0 and self.writable:
            adopt(SplitWriter(self, key, entry.url))
        return read(index, offset)

    def write_through(
        self,
        records: Iterable[Record],
        key: str,
        file: str,
        encode: Callable[[list[str]], list[np.ndarray]],
    ) -> Iterator[Record]:
        """`records` of a whole split with their texts tokenized (token records, same
        `chars`); once they are all read, the entry `key` is stored (unless the split ends
        in an error or holds images: then it stays uncached)."""
        writer = SplitWriter(self, key, file)

        def texts_of(chunk: list[Record]) -> list[str]:
            return [r.text for r in chunk if r.error is None and r.tokens is None and not r.images]

        # Pipelined: the next chunk is read and encoded in the background while the caller
        # consumes this one, so caching costs one tokenization, overlapped as without it.
        chunks = _chunks(iter(records))
        pending = None
        first = next(chunks, None)

        def submitted(chunk: list[Record]) -> tuple[list[Record], Future]:
            texts = texts_of(chunk)
            return chunk, encoding_thread().submit(encode, texts, units=sum(map(len, texts)))

        if first is not None:
            pending = submitted(first)
        while pending is not None:
            chunk, future = pending
            following = next(chunks, None)
            pending = None if following is None else submitted(following)
            encoded = iter(future.result())
            for record in chunk:
                doc = writer.record(record)
                if record.error is None and not record.images:
                    ids = record.tokens if record.tokens is not None else next(encoded)
                    if doc is not None:
                        writer.add_tokens(doc, ids)
                    record = Record(
                        record.index, record.offset, None, tokens=ids, chars=record.size
                    )
                yield record
        writer.end()


_open: dict[tuple, TokenCache] = {}


def open_cache(recipe: Any, tokenizer: TokenizerInfo) -> TokenCache | None:
    """The recipe's token cache (one per process, root and tokenizer), or None without one.
    Image recipes bypass the cache (logged once)."""
    if recipe.token_cache is None:
        return None
    root = recipe.resolve(recipe.token_cache)
    if _has_media(recipe):
        if ("images", root) not in _warned:
            _warned.add(("images", root))
            log.warning(
                "token_cache %s is not used: image and audio recipes bypass the token cache", root
            )
        return None
    key = (os.getpid(), root, tokenizer, repr(sorted(recipe.token_cache_storage_options.items())))
    if key not in _open:
        _open[key] = TokenCache(root, tokenizer, recipe.token_cache_storage_options)
    return _open[key]


def _has_media(recipe: Any) -> bool:
    return getattr(recipe, "images", None) is not None or getattr(recipe, "audio", None) is not None


def tokenizer_info_dir(recipe: Any) -> str | None:
    """Where `resolve_tokenizer` keeps resolved tokenizers for the recipe's token cache: its
    `tokenizers/` folder when the cache is a local folder the recipe uses, else None (a read
    from an object store costs about what loading the tokenizer does)."""
    if recipe.token_cache is None or _has_media(recipe):
        return None
    root = recipe.resolve(recipe.token_cache)
    if "://" in root and not root.startswith("file://"):
        return None
    return os.path.join(root.removeprefix("file://"), "tokenizers")


def _put(fs: Any, path: str, data: bytes) -> None:
    """Write one object so no reader sees it half-written: a unique temporary name renamed
    into place on a local disk; one PUT (atomic per object) on object stores."""
    if is_local(fs):
        write_atomically(path, data)
    else:
        fs.pipe_file(path, data)


def _put_chunks(fs: Any, path: str, chunks: Iterable[bytes]) -> list[int]:
    """Write one object from `chunks` as `_put` does (no reader sees it half-written) and
    return the CRC-32 of each chunk."""
    crcs: list[int] = []

    def checked() -> Iterator[bytes]:
        for chunk in chunks:
            crcs.append(crc(chunk))
            yield chunk

    if is_local(fs):
        write_atomically(path, checked())
        return crcs
    out = fs.open(path, "wb")  # an object store publishes the object when it is closed
    try:
        for chunk in checked():
            out.write(chunk)
    except BaseException:
        if hasattr(out, "discard"):
            out.discard()
        raise
    out.close()
    return crcs
