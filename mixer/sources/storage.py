"""Opening a source's files: local files directly, remote objects by retrying range reads.

Remote reads never download a whole object: a `RangeStream` fetches `block_size` bytes at a
time (one request in flight per process) and checks every answer against the size listed for
the object. A short body, a timeout, a reset connection, a 5xx or a throttling answer is
retried with exponential backoff and jitter *from the current offset*, so plain and compressed
shards come out byte-identical. 403/404 and exhausted retries raise at once, naming the source,
object and offset. Credentials from `storage_options` are redacted from every message.
"""

from __future__ import annotations

import io
import os
import random
import time
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from mixer.core.errors import DataError
from mixer.core.records import FileEntry
from mixer.core.resources import PerProcess
from mixer.core.stages import READ, timed

_fs_cache: PerProcess[Any] = PerProcess()  # one filesystem per process, protocol, options
DEFAULT_BLOCK = 8 << 20
_TAIL_BLOCK = 64 << 10
LOCAL_BUFFER = 128 << 10  # a local file's read buffer: one timed read per 128 KB at most


def _with_env_endpoint(protocol: str, options: dict) -> dict:
    """The standard AWS endpoint variables apply when the recipe names no endpoint."""
    if protocol not in ("s3", "s3a") or "endpoint_url" in options or "client_kwargs" in options:
        return options
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {**options, "endpoint_url": endpoint} if endpoint else options


def filesystem(url: str, storage_options: dict, source: str | None = None) -> tuple[Any, str]:
    """(fs, path) for a URL: one fs per process, protocol and options (s3fs is not fork-safe)."""
    protocol = url.split("://", 1)[0] if "://" in url else "file"

    def make() -> Any:
        try:
            return fsspec.filesystem(protocol, **_with_env_endpoint(protocol, storage_options))
        except Exception as exc:
            raise DataError(
                redact(f"cannot create the {protocol} filesystem: {exc}", storage_options),
                source=source,
                file=url,
                reason="unreadable",
            ) from None

    fs = _fs_cache.get((protocol, repr(sorted(storage_options.items()))), make)
    return fs, fs._strip_protocol(url)


def redact(text: str, storage_options: dict) -> str:
    """Replace every secret-looking value of `storage_options` in `text` by ***."""

    def values(obj: Any):
        if isinstance(obj, dict):
            for v in obj.values():
                yield from values(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from values(v)
        elif isinstance(obj, str) and len(obj) >= 4:
            yield obj

    for value in sorted(set(values(storage_options)), key=len, reverse=True):
        if "://" not in value:  # endpoints are not secret and make errors readable
            text = text.replace(value, "***")
    return text


@dataclass
class IOStats:
    """Per-process counters of remote reads (reported through loader.metrics())."""

    requests: int = 0
    retries: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "retries": self.retries, "bytes": self.bytes}

    def reset(self) -> None:
        self.requests = self.retries = self.bytes = 0


IO_STATS = IOStats()


class _ShortRead(OSError):
    pass


def _failure_kind(exc: BaseException, otherwise: str, *, missing: str = "not found") -> str:
    """How an open, stat or read failed, in the words of our errors."""
    if isinstance(exc, PermissionError):
        return "access denied"
    if isinstance(exc, FileNotFoundError):
        return missing
    return otherwise


def _is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError))


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    base_delay: float = 0.1
    max_delay: float = 5.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        # "Full jitter": uniform in [0, min(max, base * 2^attempt)].
        return rng.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))


def call_with_retries(
    call: Any, *, describe: str, policy: RetryPolicy, rng: random.Random, stats: IOStats = IO_STATS
) -> Any:
    """`call()` with retries on transient errors; permanent ones and the last failure raise.

    Raises `PermissionError`/`FileNotFoundError` as they come, and `TimeoutError` naming
    `describe` once the attempts are spent.
    """
    last: BaseException | None = None
    for attempt in range(policy.attempts):
        stats.requests += 1
        try:
            return call()
        except Exception as exc:
            if _is_permanent(exc):
                raise
            last = exc
        stats.retries += 1
        time.sleep(policy.delay(attempt, rng))
    raise TimeoutError(
        f"{describe}: giving up after {policy.attempts} attempts: {type(last).__name__}: {last}"
    )


class RangeStream(io.RawIOBase):
    """A seekable read-only view of a remote object through range requests."""

    def __init__(
        self,
        fs: Any,
        url: str,
        size: int,
        *,
        source: str,
        storage_options: dict,
        block_size: int,
        policy: RetryPolicy,
        stats: IOStats = IO_STATS,
        soft_end: int | None = None,
    ) -> None:
        self._fs, self._url, self._size = fs, url, size
        self._source, self._options = source, storage_options
        self._block = block_size
        self._policy = policy
        self._stats = stats
        self._pos = 0
        # Past `soft_end` (a split's end) only the rest of one line is needed: read small.
        self._soft_end = soft_end
        self._jitter = random.Random(f"{os.getpid()}:{url}")  # timing only, never data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        want = min(len(buffer), self._size - self._pos)
        if self._soft_end is not None:
            ahead = self._soft_end - self._pos
            want = min(want, ahead) if ahead > 0 else min(want, _TAIL_BLOCK)
        data = self._fetch(self._pos, self._pos + want)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def _error(self, message: str, offset: int) -> DataError:
        return DataError(
            redact(message, self._options),
            source=self._source,
            file=self._url,
            location=f"byte offset {offset}",
            reason="unreadable",
        )

    def _fetch(self, start: int, end: int) -> bytes:
        def get() -> bytes:
            data = self._fs.cat_file(self._url, start=start, end=end)
            if len(data) != end - start:  # a body cut short, however it was framed
                raise _ShortRead(f"got {len(data)} of {end - start} bytes")
            return data

        try:
            with timed(READ):
                data = call_with_retries(
                    get, describe="read", policy=self._policy, rng=self._jitter, stats=self._stats
                )
        except (PermissionError, FileNotFoundError) as exc:
            raise self._error(f"{_failure_kind(exc, 'not found')}: {exc}", start) from None
        except TimeoutError as exc:
            raise self._error(str(exc), start) from None
        self._stats.bytes += len(data)
        return data


class TimedFile(io.FileIO):
    """A local file whose reads count as the `read` stage (one timing per buffer filled)."""

    def readinto(self, buffer: Any) -> int | None:  # type: ignore[override]
        with timed(READ):
            return super().readinto(buffer)

    def readall(self) -> bytes:
        with timed(READ):
            return super().readall()


class Storage:
    """Opens the files of one source in this process."""

    def __init__(
        self,
        source: str,
        storage_options: dict,
        *,
        block_size: int = DEFAULT_BLOCK,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.source = source
        self.storage_options = storage_options
        self.block_size = block_size
        self.policy = policy or RetryPolicy()
        self._checked: set[str] = set()

    def open(self, entry: FileEntry, *, end_hint: int | None = None) -> IO[bytes]:
        """A buffered binary reader; `end_hint` bounds read-ahead past a byte-range split."""
        fs, path = filesystem(entry.url, self.storage_options, self.source)
        if isinstance(fs, LocalFileSystem):
            return self._open_local(path, entry)
        self._check_unchanged(fs, entry)
        raw = RangeStream(
            fs,
            entry.url,
            entry.size,
            source=self.source,
            storage_options=self.storage_options,
            block_size=self.block_size,
            policy=self.policy,
            soft_end=end_hint,
        )
        return io.BufferedReader(raw, buffer_size=self.block_size)

    def _open_local(self, path: str, entry: FileEntry) -> IO[bytes]:
        """Open a local file and refuse it if it is not the file that was listed or indexed
        (checked on the open descriptor, so what is read is what was checked)."""
        try:
            f = io.BufferedReader(TimedFile(path), buffer_size=LOCAL_BUFFER)
        except OSError as exc:
            kind = _failure_kind(
                exc, "cannot open", missing="not found (deleted or moved since listing?)"
            )
            raise DataError(
                f"{kind}: {exc.strerror or exc}",
                source=self.source,
                file=entry.url,
                location="byte offset 0",
                reason="unreadable",
            ) from None
        stat = os.fstat(f.fileno())
        if stat.st_size != entry.size or (entry.mtime_ns and stat.st_mtime_ns != entry.mtime_ns):
            f.close()
            raise DataError(
                f"file changed since it was listed or indexed (size {entry.size} -> "
                f"{stat.st_size}, modified time {entry.mtime_ns} -> "
                f"{stat.st_mtime_ns} ns); re-run `mixer index` or restart from a "
                "fresh listing",
                source=self.source,
                file=entry.url,
                location="byte offset 0",
                reason="unreadable",
            )
        return f

    def _check_unchanged(self, fs: Any, entry: FileEntry) -> None:
        """One metadata request per object and process: refuse objects changed since listing."""
        if entry.url in self._checked:
            return
        fs.invalidate_cache(fs._strip_protocol(entry.url))  # a fresh answer, not the listing's
        try:
            info = call_with_retries(
                lambda: fs.info(entry.url),
                describe="stat",
                policy=self.policy,
                rng=random.Random(entry.url),
            )
        except Exception as exc:
            kind = _failure_kind(exc, "cannot stat")
            raise DataError(
                redact(f"{kind}: {exc}", self.storage_options),
                source=self.source,
                file=entry.url,
                location="byte offset 0",
                reason="unreadable",
            ) from None
        etag = info.get("ETag") or info.get("etag")
        if int(info.get("size") or 0) != entry.size or (entry.etag and etag != entry.etag):
            raise DataError(
                f"object changed since it was listed or indexed (size "
                f"{entry.size} -> {info.get('size')}, ETag {entry.etag} -> {etag}); "
                "re-run `mixer index` or restart from a fresh listing",
                source=self.source,
                file=entry.url,
                location="byte offset 0",
                reason="unreadable",
            )
        self._checked.add(entry.url)
