"""The argparse types every command shares: whole numbers in range and output paths checked
up front, and a parser whose usage errors are one line."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from mixer.core.errors import MixerError
from mixer.runtime.topology import MAX_WORKERS, MAX_WORLD_SIZE


def count(what: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` ("1e9" is one; "1.5", "nan",
    "inf" and "1e999" are not); `what` names it in the error."""

    def parse(text: str) -> int:
        try:
            value: int | float = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {text!r}")
        if value != int(value):
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}")
        if value < low or (high is not None and value > high):
            span = (
                f"from {low:,} to {high:,}"
                if high is not None
                else "positive"
                if low == 1
                else f"at least {low:,}"
            )
            raise argparse.ArgumentTypeError(f"{what} must be {span}, got {text!r}")
        return int(value)

    return parse


WORKERS = count("num_workers", 0, MAX_WORKERS)


WORLD = count("world_size", 1, MAX_WORLD_SIZE)


TOKENS = count("training tokens", 1)


def output_problem(path: str, *, folder: bool = False, make_parents: bool = False) -> str | None:
    """Why `path` cannot be written as a file (or, with `folder`, as a folder to fill), or
    None. Its folder must exist (with `make_parents`, its nearest existing ancestor) and take
    a new file; a file's path must not name a folder ("/", "out/", an existing folder)."""
    target = Path(path)
    try:
        if not path.strip():
            return "the path is empty"
        if folder:
            if target.exists() and not target.is_dir():
                return f"{path!r} is a file, not a folder"
        elif path.endswith(os.sep) or target.name in ("", ".", "..") or target.is_dir():
            return f"{path!r} names a folder, not a file"
        elif target.exists() and not os.access(target, os.W_OK):
            return f"{path!r} is not writable"
        parent = target if folder and target.is_dir() else target.parent
        while make_parents and not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.exists():
            return f"{path!r} is under {str(parent)!r}, which does not exist (create it first)"
        if not parent.is_dir():
            return f"{path!r} is under {str(parent)!r}, which is not a folder"
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        return f"cannot write {path!r}: {exc.strerror or exc}"
    return None


def output_file(path: str) -> str:
    """An argparse type: a path a file can be written to (see `output_problem`)."""
    problem = output_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def output_folder(path: str) -> str:
    """An argparse type: a folder that exists or can be made, and takes new files."""
    problem = output_problem(path, folder=True)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


class UsageError(MixerError):
    """A bad command line: what `Parser` raises where argparse would print usage and exit."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors raise `UsageError` (one line; `main` prints it
    as `error: ...` and returns 2); `--help` still exits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "-inf", "-nan", "-1e9" reach the flag's type (argparse takes them for options).
        self._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        raise UsageError(f"{self.prog}: {one_line} (see `{self.prog} --help`)")
