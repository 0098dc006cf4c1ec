"""Exception hierarchy: every error a user can cause derives from `MixerError`."""

from __future__ import annotations


class MixerError(Exception):
    """Base class of all errors raised by mixer."""


class RecipeError(MixerError, ValueError):
    """The recipe is invalid; the message names the field path (e.g. `sources[1].weight`)."""


class DataError(MixerError):
    """A source's data is missing, malformed or corrupt.

    Carries where it happened so callers (and `on_error: skip`) can act on it.
    """

    def __init__(self, message: str, *, source: str | None = None, file: str | None = None,
                 location: str | None = None) -> None:
        # Without a source the message is taken as is: that is how torch's DataLoader
        # re-raises a worker's error in the main process, keeping its type.
        where = f"source {source!r}" if source is not None else ""
        if file is not None:
            where += f", file {file!r}"
        if location is not None:
            where += f", {location}"
        super().__init__(f"{where}: {message}" if where else message)
        self.source = source
        self.file = file
        self.location = location

    def __reduce__(self) -> tuple:
        # Pickled whole (message and where) so an error raised in a DataLoader worker keeps
        # its `.source`, `.file` and `.location` in the main process.
        return (_restore_data_error,
                (type(self), str(self), self.source, self.file, self.location))


def _restore_data_error(cls: type[DataError], message: str, source: str | None,
                        file: str | None, location: str | None) -> DataError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.source, err.file, err.location = source, file, location
    return err


class StateError(MixerError, ValueError):
    """A loader state cannot be loaded (different recipe, topology or version)."""


class TopologyError(MixerError, ValueError):
    """The ranks × workers topology does not divide the recipe's lanes."""
