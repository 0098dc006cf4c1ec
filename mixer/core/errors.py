"""Exception hierarchy: every error a user can cause derives from `MixerError`."""

from __future__ import annotations

from typing import Literal, get_args


class MixerError(Exception):
    """Base class of all errors raised by mixer."""


class RecipeError(MixerError, ValueError):
    """The recipe is invalid; the message names the field path (e.g. `sources[1].weight`)."""


# Why a record was skipped, as `metrics()["skipped_by_reason"]` counts it (docs/metrics.md):
# each `DataError` names one at its raise site.
SkipReason = Literal[
    "too_long",
    "malformed",
    "bad_text",
    "bad_image",
    "bad_video",
    "bad_audio",
    "bad_tokens",
    "corrupt",
    "unreadable",
    "other",
]
REASONS: tuple[SkipReason, ...] = get_args(SkipReason)
_BAD_MEDIA: dict[str, SkipReason] = {
    "image": "bad_image",
    "video": "bad_video",
    "audio": "bad_audio",
}


def bad_media(what: str) -> SkipReason:
    """The reason of a bad medium: `what` is "image", "video" or "audio"."""
    return _BAD_MEDIA[what]


MISSING_TEXT_FIELD = "missing text field"  # how every reader's message for it begins


def missing_text_field(field: str, present: list[str], kind: str) -> str:
    """A reader's message for a record without the text field: `kind` ("keys",
    "columns") names what `present` lists."""
    shown = ", ".join(present[:16]) + (", ..." if len(present) > 16 else "")
    return f"{MISSING_TEXT_FIELD} {field!r} ({kind}: {shown or 'none'})"


class DataError(MixerError):
    """A source's data is missing, malformed or corrupt.

    Carries where it happened so callers (and `on_error: skip`) can act on it: `.message`
    (the text without its place), `.source`, `.file`, `.location`, and `.reason`, one of
    `REASONS`, named where it is raised and counted per reason when skipped. Every raise
    site in mixer names it (`tests/test_errors.py` scans them); the default "other" is for
    an error made elsewhere from its text alone (torch's DataLoader re-raising a worker's
    error as `DataError(text)`).
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        file: str | None = None,
        location: str | None = None,
        reason: SkipReason = "other",
    ) -> None:
        # Without a source the message is taken as is: that is how torch's DataLoader
        # re-raises a worker's error in the main process, keeping its type.
        parts = [f"source {source!r}"] if source is not None else []
        if file is not None:
            parts.append(f"file {file!r}")
        if location is not None:
            parts.append(location)
        where = ", ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)
        if reason not in REASONS:
            raise ValueError(f"unknown DataError reason {reason!r} (one of {REASONS})")
        self.message = message
        self.source = source
        self.file = file
        self.location = location
        self.reason: SkipReason = reason

    def __reduce__(self) -> tuple:
        # Pickled whole (message, place and reason) so an error raised in a DataLoader
        # worker keeps its `.message`, `.source`, `.file`, `.location` and `.reason`.
        return (
            _restore_data_error,
            (
                type(self),
                str(self),
                self.source,
                self.file,
                self.location,
                self.reason,
                self.message,
            ),
        )


def _restore_data_error(
    cls: type[DataError],
    text: str,
    source: str | None,
    file: str | None,
    location: str | None,
    reason: SkipReason = "other",
    message: str | None = None,
) -> DataError:
    err = cls.__new__(cls)
    Exception.__init__(err, text)
    err.source, err.file, err.location, err.reason = source, file, location, reason
    err.message = text if message is None else message
    return err


class StateError(MixerError, ValueError):
    """A loader state cannot be loaded (different recipe, topology or version)."""


class TopologyError(MixerError, ValueError):
    """The ranks × workers topology does not divide the recipe's lanes."""
