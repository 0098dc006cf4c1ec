"""Exception hierarchy: every error a user can cause derives from `MixerError`."""

from __future__ import annotations


class MixerError(Exception):
    """Base class of all errors raised by mixer."""


class RecipeError(MixerError, ValueError):
    """The recipe is invalid; the message names the field path (e.g. `sources[1].weight`)."""


# Why a record was skipped, as `metrics()["skipped_by_reason"]` counts it; the first rule
# whose words appear in the error's message names the reason.
SKIP_REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
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


def classify(message: str) -> str:
    """A short, stable name for why a record failed: one of SKIP_REASONS' names or "other"."""
    message = message.lower()
    for name, words in SKIP_REASONS:
        if any(w in message for w in words):
            return name
    return "other"


class DataError(MixerError):
    """A source's data is missing, malformed or corrupt.

    Carries where it happened so callers (and `on_error: skip`) can act on it. `reason` is a
    short name of the kind of failure (`classify`), counted per reason when skipped.
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
        self.source = source
        self.file = file
        self.location = location
        self.reason = reason or classify(message)

    def __reduce__(self) -> tuple:
        # Pickled whole (message and where) so an error raised in a DataLoader worker keeps
        # its `.source`, `.file` and `.location` in the main process.
        return (_restore_data_error,
                (type(self), str(self), self.source, self.file, self.location, self.reason))


def _restore_data_error(cls: type[DataError], message: str, source: str | None,
                        file: str | None, location: str | None,
                        reason: str = "other") -> DataError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.source, err.file, err.location, err.reason = source, file, location, reason
    return err


class StateError(MixerError, ValueError):
    """A loader state cannot be loaded (different recipe, topology or version)."""


class TopologyError(MixerError, ValueError):
    """The ranks × workers topology does not divide the recipe's lanes."""
