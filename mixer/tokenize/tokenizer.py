"""Tokenizer adapter: a local tokenizer.json or HF tokenizer folder behind one fast encoder."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from mixer.errors import RecipeError

# One tokenizer call: at most this many documents, and about this much text (enough to keep
# the tokenizer's threads busy, little enough that a lane's first rows wait for ~10k tokens).
TOKENIZE_DOCS = 64
TOKENIZE_BYTES = 32 << 10

_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eos|>", "[EOS]")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]")
# Tokenizers loaded in this process: file -> (pid, tokenizer). `resolve_tokenizer` loads the
# file once, and the main process's encoder reuses it (loading a 32k-vocabulary file takes
# ~0.1-0.3 s, which the first batch would otherwise wait for); a forked worker loads its own.
_loaded: dict[str, tuple[int, Tokenizer]] = {}


def _load(file: str) -> Tokenizer:
    cached = _loaded.get(file)
    if cached is not None and cached[0] == os.getpid():
        return cached[1]
    tok = Tokenizer.from_file(file)
    _loaded[file] = (os.getpid(), tok)
    return tok


def _token_content(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # {"content": "</s>", ...} in tokenizer_config.json
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


@dataclass(frozen=True)
class TokenizerInfo:
    """What mixer needs to know about a tokenizer, resolved once."""

    path: str
    eos_id: int
    bos_id: int | None
    pad_id: int
    digest: str
    vocab_size: int


def _files(path: Path) -> tuple[Path, dict]:
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise RecipeError(f"tokenizer: folder {str(path)!r} has no tokenizer.json "
                              "(only fast tokenizers are supported)")
        config: dict = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            extra = path / name
            if extra.is_file():
                config.update(json.loads(extra.read_text(encoding="utf-8")))
        return file, config
    if path.is_file():
        return path, {}
    raise RecipeError(f"tokenizer: {str(path)!r} is neither a tokenizer.json file nor a folder")


def _bos_from_post_processor(tok: Tokenizer) -> int | None:
    """The special token the tokenizer's own template puts before every text, if any."""
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    if len(full) > len(plain) and full[1:1 + len(plain)] == plain:
        return full[0]
    return None


def resolve_tokenizer(path: str, eos_token: str | None = None) -> TokenizerInfo:
    """Load a tokenizer's metadata and refuse one without an EOS token."""
    try:
        file, config = _files(Path(path))
    except (OSError, ValueError, TypeError) as exc:  # a path the OS refuses, a bad config file
        raise RecipeError(f"tokenizer: cannot read {path!r}: {exc}") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:
        raise RecipeError(f"tokenizer: cannot load {str(file)!r}: {exc}") from None
    vocab = tok.get_vocab(with_added_tokens=True)

    def lookup(name: str | None, field: str) -> int | None:
        if name is None:
            return None
        token_id = vocab.get(name)
        if token_id is None:
            raise RecipeError(f"{field}: token {name!r} is not in the tokenizer's vocabulary")
        return token_id

    eos_name = eos_token or _token_content(config.get("eos_token"))
    if eos_name is None:
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        eos_name = next((c for c in _EOS_CANDIDATES if c in specials), None)
    if eos_name is None:
        raise RecipeError(f"eos_token: the tokenizer {str(file)!r} defines no EOS token; name one "
                          "with `eos_token:` in the recipe")
    eos_id = lookup(eos_name, "eos_token")
    bos_id = None
    if config.get("add_bos_token"):
        bos_id = lookup(_token_content(config.get("bos_token")), "tokenizer.bos_token")
    elif "add_bos_token" not in config:
        bos_id = _bos_from_post_processor(tok)
    pad_name = _token_content(config.get("pad_token"))
    if pad_name is None:
        pad_name = next((c for c in _PAD_CANDIDATES if c in vocab), None)
    pad_id = vocab[pad_name] if pad_name in vocab else eos_id
    _loaded[str(file)] = (os.getpid(), tok)
    digest = hashlib.sha256(file.read_bytes())
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    return TokenizerInfo(str(file), eos_id, bos_id, pad_id, digest.hexdigest()[:16],
                         tok.get_vocab_size(with_added_tokens=True))


class Encoder:
    """Batched encoding with EOS (and BOS where configured) added to every document.

    The Rust tokenizer is created lazily in each process: forked DataLoader workers must not
    share one created before the fork.
    """

    def __init__(self, info: TokenizerInfo) -> None:
        self.info = info
        self._tok: Tokenizer | None = None
        self._pid = -1

    def _tokenizer(self) -> Tokenizer:
        if self._tok is None or self._pid != os.getpid():
            self._tok = _load(self.info.path)
            self._pid = os.getpid()
        return self._tok

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self._tokenizer().encode_batch_fast(texts, add_special_tokens=False)
        eos = self.info.eos_id
        bos = self.info.bos_id
        out = []
        for enc in encodings:
            ids = enc.ids
            ids.append(eos)
            if bos is not None:
                ids.insert(0, bos)
            out.append(np.array(ids, dtype=np.int64))
        return out

    def encode_raw(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text alone: no EOS or BOS added (pieces of one document)."""
        return [enc.ids for enc in
                self._tokenizer().encode_batch_fast(texts, add_special_tokens=False)]

    def token_id(self, token: str) -> int | None:
        """The id of a token given as a string (e.g. "<|image_pad|>"), or None."""
        return self._tokenizer().token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer().decode(ids, skip_special_tokens=False)

    def __getstate__(self) -> dict:
        return {"info": self.info, "_tok": None, "_pid": -1}


# Text chunks a stream keeps encoding ahead of the one it packs. 2 and 4 measured no faster:
# the pool is first in, first out, so chunks queued far ahead delay the one a packer waits on.
TEXT_CHUNKS_AHEAD = 1

_pools: dict[int, tuple[int, ThreadPoolExecutor]] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    held = _pools.get(threads)
    if held is None or held[0] != os.getpid():  # never reuse a pool across fork
        held = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix="mixer-tokenize"))
        _pools[threads] = held
    return held[1]


def encoding_thread() -> ThreadPoolExecutor:
    """One background thread per process that builds documents (image recipes) and fills
    the token cache while Python reads and packs; one thread keeps those calls in order."""
    return _pool(1)


def encoding_pool() -> ThreadPoolExecutor:
    """Two background threads per process that encode text chunks ahead of the packers.

    The Rust tokenizer releases the GIL and spreads one call over its documents; a chunk of
    a few long documents keeps one core busy, so two calls run at once to keep two busy
    while Python reads and packs. The tokens are the same whichever thread computes them.
    """
    return _pool(2)
