"""Exception hierarchy: every error a user can cause derives from `MixerError`."""

from __future__ import annotations

import gzip
import lzma
import zlib

import zstandard


class MixerError(Exception):
    """Base class of all errors raised by mixer."""


class RecipeError(MixerError, ValueError):
    """The recipe is invalid; the message names the field path (e.g. `sources[1].weight`)."""


# Why a record was skipped, as `metrics()["skipped_by_reason"]` counts it (docs/metrics.md):
# each `DataError` names one at its raise site.
REASONS = ("too_long", "malformed", "bad_text", "bad_image", "bad_tokens", "corrupt",
           "unreadable", "other")

# The old rule, a reason guessed from words of the message, kept only for errors that name
# none: a worker's error re-raised by torch's DataLoader (`DataError(text)`), the error rows
# of a token-cache entry (format 3 stores no reason) and the raise sites still to state
# theirs (`tests/test_error_reasons.py`'s PENDING). It goes when those do.
_GUESSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("too_long", ("longer than max_document_bytes", "more than max_document_bytes")),
    ("malformed", ("malformed json", "not a json object", "bad pax", "bad checksum",
                   "bad number", "not a tar")),
    ("bad_text", ("missing text field", "not a string", "not valid unicode", "not valid utf-8",
                  "no text", "text is ")),
    ("bad_image", ("image", "marker")),
    ("bad_tokens", ("vocabulary", "token id")),
    ("corrupt", ("corrupt", "truncated", "checksum")),
    ("unreadable", ("cannot read", "not found", "no such file", "changed since", "permission",
                    "cannot open", "is a directory")),
)


def guessed_reason(message: str) -> str:
    """The reason the old word rules give `message`: only for errors that name none (above)."""
    message = message.lower()
    for name, words in _GUESSES:
        if any(w in message for w in words):
            return name
    return "other"


_CORRUPT: tuple[type[BaseException], ...] = (zlib.error, EOFError, gzip.BadGzipFile,
                                             lzma.LZMAError, zstandard.ZstdError)


def reason_of(exc: BaseException, default: str = "other") -> str:
    """The reason of a failure raised by a library, by the exception's type: a `DataError`'s
    own; damaged compressed data is `corrupt`; undecodable text `bad_text`; other OS errors
    `unreadable`; anything else `default`."""
    if isinstance(exc, DataError):
        return exc.reason
    if isinstance(exc, _CORRUPT):
        return "corrupt"
    if isinstance(exc, UnicodeError):
        return "bad_text"
    if isinstance(exc, OSError):
        return "unreadable"
    return default


class DataError(MixerError):
    """A source's data is missing, malformed or corrupt.

    Carries where it happened so callers (and `on_error: skip`) can act on it: `.message`
    (the text without its place), `.source`, `.file`, `.location`, and `.reason`, one of
    `REASONS`, named where it is raised and counted per reason when skipped.
    """

    def __init__(self, message: str, *, source: str | None = None, file: str | None = None,
                 location: str | None = None, reason: str | None = None) -> None:
        # Without a source the message is taken as is: that is how torch's DataLoader
        # re-raises a worker's error in the main process, keeping its type.
        parts = [f"source {source!r}"] if source is not None else []
        if file is not None:
            parts.append(f"file {file!r}")
        if location is not None:
            parts.append(location)
        where = ", ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)
        if reason is not None and reason not in REASONS:
            raise ValueError(f"unknown DataError reason {reason!r} (one of {REASONS})")
        self.message = message
        self.source = source
        self.file = file
        self.location = location
        self.reason = reason if reason is not None else guessed_reason(message)

    def placed(self, *, source: str | None, file: str | None,
               location: str | None) -> DataError:
        """The same error (message, reason) at another place."""
        return type(self)(self.message, source=source, file=file, location=location,
                          reason=self.reason)

    def __reduce__(self) -> tuple:
        # Pickled whole (message, place and reason) so an error raised in a DataLoader
        # worker keeps its `.message`, `.source`, `.file`, `.location` and `.reason`.
        return (_restore_data_error, (type(self), str(self), self.source, self.file,
                                      self.location, self.reason, self.message))


def _restore_data_error(cls: type[DataError], text: str, source: str | None,
                        file: str | None, location: str | None, reason: str = "other",
                        message: str | None = None) -> DataError:
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.source, err.file, err.location, err.reason = source, file, location, reason
    err.message = text if message is None else message
    return err


class StateError(MixerError, ValueError):
    """A loader state cannot be loaded (different recipe, topology or version)."""


class TopologyError(MixerError, ValueError):
    """The ranks × workers topology does not divide the recipe's lanes."""
