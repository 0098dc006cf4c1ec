"""Writing a local file so that no reader ever sees it half-written; the user's cache folder."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable
from pathlib import Path


def write_atomically(path: str | Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (bytes, or chunks of them) under a unique temporary name beside `path`,
    then rename it into place (concurrent writers of the same path each rename a whole file;
    the last one wins)."""
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as out:
            for chunk in [data] if isinstance(data, bytes | bytearray) else data:
                out.write(chunk)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # (gone once renamed; or the folder is blocked)
            os.unlink(tmp)


def user_cache_dir() -> Path:
    """What mixer keeps for the user between runs (tokenizer ids, backend verdicts):
    `$XDG_CACHE_HOME/mixer`, by default `~/.cache/mixer`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mixer"
