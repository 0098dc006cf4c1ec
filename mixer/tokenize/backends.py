"""The libraries that turn text into ids behind `Encoder`: `tokenizers` ("hf") and fastokens.

Both implement `Backend`: ids without special tokens added, one list (or, for the encoder's
hot path, one array with EOS and BOS already in place: uint16 where every id of the call fits,
else uint32) per text. Which one a loader
uses is chosen once, by `choice.resolve_backend`, and carried in `TokenizerInfo.backend`, so
forked and spawned workers use the same one without choosing again.
"""

from __future__ import annotations

import array
import importlib.util
import os
import re
import threading
from typing import Any, Protocol

import numpy as np

from mixer.tokenize.encoding import FASTOKENS_THREADS, tokenizer_thread_budget

BACKEND_NAMES = ("auto", "hf", "fastokens")


class Backend(Protocol):
    """What `Encoder` needs of a tokenizer library."""

    name: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, no special tokens added."""
        ...

    def encode_docs(self, texts: list[str], bos: int | None, eos: int) -> list[np.ndarray]:
        """Each text's ids, `eos` appended and `bos` (when not None) prepended: uint16 where
        every id of the call fits, else uint32."""
        ...

    def token_to_id(self, token: str) -> int | None: ...

    def decode(self, ids: list[int]) -> str: ...


# Encoded documents wait in windows and packers (a stream's chunk, a row's cut tail) until
# packers copy them into int64 rows: in uint16, which holds every id of a vocabulary of up
# to 65,536, they take half the memory of uint32. An id that does not fit is never wrapped:
# the call's documents stay uint32.
NARROW = np.dtype(np.uint16)
NARROW_IDS = 1 << 16


class HfBackend:
    """The `tokenizers` library (a loaded `tokenizers.Tokenizer`)."""

    name = "hf"

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        # (a larger vocabulary would fail the narrow C array on most documents)
        self._narrow = tok.get_vocab_size(with_added_tokens=True) <= NARROW_IDS

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self.tok.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_docs(self, texts: list[str], bos: int | None, eos: int) -> list[np.ndarray]:
        lists = self.encode_batch(texts)
        for ids in lists:
            ids.append(eos)
            if bos is not None:
                ids.insert(0, bos)
        if self._narrow:
            try:  # (a C array raises OverflowError on an id that does not fit)
                return [np.frombuffer(array.array("H", ids), dtype=NARROW) for ids in lists]
            except OverflowError:
                pass
        # Through a C array: a third of np.array's time on a list of ints.
        return [np.frombuffer(array.array("I", ids), dtype=np.uint32) for ids in lists]

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


class FastokensBackend:
    """fastokens: one flat uint32 buffer per call (`encode_batch_flat`), cut per text."""

    name = "fastokens"

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def _flat(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        ids, offsets = self.tok.encode_batch_flat(texts, add_special_tokens=False)
        return np.frombuffer(ids, dtype=np.uint32), np.frombuffer(offsets, np.uint64).tolist()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        ids, at = self._flat(texts)
        return [ids[at[i] : at[i + 1]].tolist() for i in range(len(texts))]

    def encode_docs(self, texts: list[str], bos: int | None, eos: int) -> list[np.ndarray]:
        ids, at = self._flat(texts)
        head = 0 if bos is None else 1
        top = max(eos, -1 if bos is None else bos, int(ids.max()) if len(ids) else -1)
        dtype = NARROW if top < NARROW_IDS else np.uint32
        out = []
        for i in range(len(texts)):
            n = at[i + 1] - at[i]
            doc = np.empty(head + n + 1, dtype=dtype)
            if bos is not None:
                doc[0] = bos
            doc[head : head + n] = ids[at[i] : at[i + 1]]
            doc[-1] = eos
            out.append(doc)
        return out

    def token_to_id(self, token: str) -> int | None:
        return self.tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)


class Unavailable(Exception):
    """fastokens cannot encode with this tokenizer here; the message says why in a few words
    (`fastokens not installed`, `Metaspace pre-tokenizer unsupported`)."""


def fastokens_missing() -> str | None:
    """Why fastokens cannot be imported here (`fastokens not installed`, or `cannot import
    fastokens (...)` for an installed one that fails to load), or None where it can."""
    try:
        import fastokens  # noqa: F401
    except ImportError as exc:
        return _import_reason(exc)
    return None


def _import_reason(exc: ImportError) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name == "fastokens":
        return "fastokens not installed"
    return f"cannot import fastokens ({exc})"


def fastokens_version() -> str | None:
    """The installed fastokens' version, or None where it cannot be imported."""
    if fastokens_missing() is not None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastokens")
    except PackageNotFoundError:
        return "unknown"


_UNSUPPORTED = re.compile(r"unsupported ([\w-]+(?: [\w-]+)?) type: ([\w.-]+)")
_fast_loaded: dict[tuple[str, str], FastokensBackend] = {}


def _reason(exc: Exception) -> str:
    """`Metaspace pre-tokenizer unsupported` from fastokens' `pre-tokenizer error: unsupported
    pre-tokenizer type: Metaspace`; other messages as they are (first line, shortened)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    found = _UNSUPPORTED.search(text)
    if found:
        return f"{found.group(2)} {found.group(1)} unsupported"
    return text if len(text) <= 200 else text[:197] + "..."


def load_fastokens(file: str, digest: str) -> FastokensBackend:
    """fastokens' tokenizer of `file` (once per process and digest; a forked worker reuses its
    parent's), or `Unavailable` saying why not. Waits for a `preload_fastokens` under way."""
    loading = _fast_loading.get((file, digest))
    if loading is not None:
        loading.join()
        _fast_loading.pop((file, digest), None)
    held = _fast_loaded.get((file, digest))
    if held is not None:
        return held
    return _load_fastokens(file, digest)


def _load_fastokens(file: str, digest: str) -> FastokensBackend:
    try:
        import fastokens
    except ImportError as exc:
        raise Unavailable(_import_reason(exc)) from None
    set_fastokens_threads()
    try:
        tok = fastokens.Tokenizer.from_file(file)
    except Exception as exc:  # its ValueError names the component it does not support
        raise Unavailable(_reason(exc)) from None
    whole_documents(tok)
    held = _fast_loaded[(file, digest)] = FastokensBackend(tok)
    return held


def whole_documents(tok: Any) -> list[str]:
    """Turn off the `padding` and `truncation` a tokenizer.json may carry (both libraries
    apply them in batch calls): mixer encodes whole documents and packing cuts them, so
    padding would put pad ids inside documents and truncation would drop their ends. The
    names of the settings turned off."""
    off = [name for name in ("padding", "truncation") if getattr(tok, name) is not None]
    tok.no_padding()
    tok.no_truncation()
    return off


_fast_loading: dict[tuple[str, str], threading.Thread] = {}


def preload_fastokens(file: str, digest: str) -> None:
    """Start loading fastokens' tokenizer of `file` on a thread (it parses without the GIL:
    ~0.2 s for a 32k BPE, which a first batch would otherwise wait for), while the sources
    are listed and read; `load_fastokens` waits for it. A failure is left for
    `load_fastokens` to report. Call `finish_preloads` before forking."""
    key = (file, digest)
    if key in _fast_loaded or key in _fast_loading or importlib.util.find_spec("fastokens") is None:
        return

    def load() -> None:
        try:
            _load_fastokens(file, digest)
        except Unavailable:
            pass

    # Not a daemon: the interpreter waits for it at exit (a process that ends while fastokens
    # is still parsing, e.g. a script that fails before its first batch, aborts otherwise).
    thread = threading.Thread(target=load, name="mixer-fastokens-load", daemon=False)
    _fast_loading[key] = thread
    thread.start()


def finish_preloads(keep: bool = True) -> None:
    """Wait for the loads `preload_fastokens` started (a process forked while a thread is
    inside fastokens could inherit its locks held); `keep` False: drop what they loaded (the
    backend chosen is `tokenizers`)."""
    for key in list(_fast_loading):
        thread = _fast_loading.pop(key, None)
        if thread is not None:
            thread.join()
            if not keep:
                _fast_loaded.pop(key, None)


def set_fastokens_threads() -> None:
    """Size fastokens' own thread pool (it reads `FASTOKENS_BPE_THREADS` when it first encodes
    in a process, never `RAYON_NUM_THREADS`): `RAYON_NUM_THREADS` when that is set and
    `FASTOKENS_BPE_THREADS` is not; neither set: 1, each call runs on the thread that makes
    it (mixer's encoding threads make several at once). A pool of its own costs ~30 MB at its
    first call and grows with the text seen, and gained no speed: one thread encodes several
    times faster than mixer's main thread reads and packs (measured by benchmarks/memory.py and
    benchmarks/paired.py). DataLoader workers get their share in `use_worker_encoding_threads`."""
    if FASTOKENS_THREADS not in os.environ:
        rayon = os.environ.get("RAYON_NUM_THREADS")
        os.environ[FASTOKENS_THREADS] = str(tokenizer_thread_budget()) if rayon else "1"
