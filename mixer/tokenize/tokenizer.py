"""The recipe's tokenizer: a local tokenizer.json or HF tokenizer folder, resolved once
(`resolve_tokenizer`: its special ids, cached beside a token cache), behind one batched
encoder (`Encoder`: EOS, and BOS where configured, added to every document, by the library
`TokenizerInfo.backend` names)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from mixer.core.errors import RecipeError
from mixer.core.files import user_cache_dir, write_atomically
from mixer.core.resources import FREED_MEMORY
from mixer.core.stages import ENCODE, timed
from mixer.core.token_info import TokenizerInfo
from mixer.tokenize.backends import (
    Backend,
    HfBackend,
    Unavailable,
    finish_preloads,
    load_fastokens,
    whole_documents,
)
from mixer.tokenize.background import FASTOKENS, PENDING, verified
from mixer.tokenize.encoding import use_fastokens_encoding_threads

__all__ = ["Encoder", "finish_preloads", "resolve_recipe_tokenizer", "resolve_tokenizer"]

_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eos|>", "[EOS]")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]")
# Tokenizers loaded in this process: (file, digest) -> tokenizer. `resolve_tokenizer` loads the
# file once (unless its info cache answers), and encoders reuse it, in this process and in the
# DataLoader workers it forks (loading takes long enough that a first batch would notice). A
# loaded tokenizer is plain data and safe to use after fork; the tokenizer library itself turns
# its thread pool off in a child whose parent had already encoded in parallel, whichever object
# the child uses.
_loaded: dict[tuple[str, str], Tokenizer] = {}
log = logging.getLogger("mixer.tokenizer")


def _load(file: str, digest: str) -> Tokenizer:
    """The tokenizer of `file` as resolved with `digest` (a file rewritten since then loads
    anew; its digest no longer matches, which the token cache keys also see)."""
    tok = _loaded.get((file, digest))
    if tok is None:
        # Set up before it is shared: another thread (an encoding thread falling back from
        # fastokens) must never encode with padding or truncation still on.
        loaded = Tokenizer.from_file(file)
        off = whole_documents(loaded)
        tok = _loaded.setdefault((file, digest), loaded)
        if off and tok is loaded:
            log.info(
                "tokenizer %s: its %s turned off (mixer encodes whole documents; "
                "packing cuts them)",
                file,
                " and ".join(off),
            )
    return tok


def _token_content(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # {"content": "</s>", ...} in tokenizer_config.json
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def _files(path: Path) -> tuple[Path, dict]:
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise RecipeError(
                f"tokenizer: folder {str(path)!r} has no tokenizer.json "
                "(only fast tokenizers are supported)"
            )
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
    if len(full) > len(plain) and full[1 : 1 + len(plain)] == plain:
        return full[0]
    return None


def resolve_tokenizer(
    path: str, eos_token: str | None = None, *, info_cache: str | None = None
) -> TokenizerInfo:
    """Resolve a tokenizer's metadata and refuse one without an EOS token.

    With `info_cache` (a local folder) the resolved ids are kept there under the tokenizer's
    digest and the `eos_token` argument, so a later call skips loading the tokenizer (the
    `Encoder` loads it when it first encodes; a run served by the token cache never does)."""
    try:
        file, config = _files(Path(path))
        digest = hashlib.sha256(file.read_bytes())
    except (OSError, ValueError, TypeError) as exc:  # a path the OS refuses, a bad config file
        raise RecipeError(f"tokenizer: cannot read {path!r}: {exc}") from None
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    hexdigest = digest.hexdigest()[:16]
    stored = None
    if info_cache is not None:
        stored = _info_file(info_cache, hexdigest, eos_token)
        info = _read_info(stored, str(file), hexdigest, eos_token)
        if info is not None:
            return info
    info = _resolve(file, config, hexdigest, eos_token)
    if stored is not None:
        _write_info(stored, info, eos_token)
    return info


def resolve_recipe_tokenizer(recipe: Any, info_cache: str | None) -> TokenizerInfo:
    """The recipe's tokenizer for a loader: its ids kept in `info_cache`, else in the user's
    cache folder (so a warm start where fastokens encodes loads no `tokenizers` tokenizer)."""
    return resolve_tokenizer(
        recipe.resolve(recipe.tokenizer),
        recipe.eos_token,
        info_cache=info_cache or str(user_cache_dir() / "tokenizers"),
    )


def _resolve(file: Path, config: dict, digest: str, eos_token: str | None) -> TokenizerInfo:
    """Load the tokenizer and find its EOS, BOS and pad ids."""
    try:
        tok = _load(str(file), digest)
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
        raise RecipeError(
            f"eos_token: the tokenizer {str(file)!r} defines no EOS token; name one "
            "with `eos_token:` in the recipe"
        )
    eos_id = lookup(eos_name, "eos_token")
    assert eos_id is not None
    bos_id = None
    if config.get("add_bos_token"):
        bos_id = lookup(_token_content(config.get("bos_token")), "tokenizer.bos_token")
    elif "add_bos_token" not in config:
        bos_id = _bos_from_post_processor(tok)
    pad_name = _token_content(config.get("pad_token"))
    if pad_name is None:
        pad_name = next((c for c in _PAD_CANDIDATES if c in vocab), None)
    pad_id = vocab[pad_name] if pad_name in vocab else eos_id
    return TokenizerInfo(
        str(file), eos_id, bos_id, pad_id, digest, tok.get_vocab_size(with_added_tokens=True)
    )


# -- resolved tokenizers kept by digest --------------------------------------------------------
_INFO_FIELDS = ("eos_id", "bos_id", "pad_id", "vocab_size")


def _info_file(folder: str, digest: str, eos_token: str | None) -> Path:
    eos = hashlib.sha256(json.dumps(eos_token).encode()).hexdigest()[:16]
    return Path(folder) / f"{digest}-{eos}.json"


def _info_check(fields: dict) -> str:
    """A checksum of the stored fields, so a damaged file reads as a miss."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _read_info(stored: Path, file: str, digest: str, eos_token: str | None) -> TokenizerInfo | None:
    """The TokenizerInfo kept in `stored`, or None when it is missing or not trustworthy."""
    try:
        data = json.loads(stored.read_bytes())
        fields = {k: data[k] for k in ("digest", "eos_token", *_INFO_FIELDS)}
        if (
            data["check"] != _info_check(fields)
            or fields["digest"] != digest
            or fields["eos_token"] != eos_token
        ):
            raise ValueError("checksum or key mismatch")
        vocab = fields["vocab_size"]
        ids = [fields["eos_id"], fields["pad_id"]]
        ids += [] if fields["bos_id"] is None else [fields["bos_id"]]
        if type(vocab) is not int or not all(type(i) is int and 0 <= i < vocab for i in ids):
            raise ValueError("ids out of range")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        log.debug("tokenizer info %s is unusable (%s); loading the tokenizer", stored, exc)
        return None
    return TokenizerInfo(file, fields["eos_id"], fields["bos_id"], fields["pad_id"], digest, vocab)


def _write_info(stored: Path, info: TokenizerInfo, eos_token: str | None) -> None:
    """Keep `info` in `stored` (a unique temporary name renamed into place); best effort."""
    fields = {
        "digest": info.digest,
        "eos_token": eos_token,
        **{k: getattr(info, k) for k in _INFO_FIELDS},
    }
    try:
        stored.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(stored, json.dumps({**fields, "check": _info_check(fields)}).encode())
    except OSError as exc:
        log.debug("cannot keep tokenizer info in %s (%s)", stored, exc)


def load_backend(info: TokenizerInfo) -> Backend:
    """The library `info.backend` names, with the tokenizer loaded (once per process)."""
    if info.backend == "fastokens":
        try:
            return load_fastokens(info.path, info.digest)
        except Unavailable as exc:  # chosen where it loaded: another machine or install
            if info.required:
                raise RecipeError(
                    f"tokenizer_backend: fastokens cannot encode with "
                    f"{info.path!r} in this process: {exc}"
                ) from None
            log.warning(
                "tokenizer backend: tokenizers in process %d (fastokens, chosen "
                "where the loader was built, cannot load here: %s; the same ids)",
                os.getpid(),
                exc,
            )
    return HfBackend(_load(info.path, info.digest))


_fell_back: dict[int, object] = {}  # process ids where fastokens raised (logged once)


class Encoder:
    """Batched encoding with EOS (and BOS where configured) added to every document.

    The library (`info.backend`: `tokenizers` or fastokens) and its tokenizer are looked up
    lazily, by file and digest, in the process that encodes: a forked DataLoader worker reuses
    the one its parent loaded (see `_loaded`), a spawned one (or an unpickled encoder) loads
    its own. With `info.verifying` (a fastokens verification in the background) it encodes
    with `tokenizers` until the verdict is in, then with fastokens from its next call on where
    the verdict is ok: a call is encoded by one library, and both give the same ids.
    """

    def __init__(self, info: TokenizerInfo) -> None:
        self.info = info
        self._backend: Backend | None = None
        self._pid = -1
        self._waiting = False  # for the verdict of `info.verifying`
        if info.backend == "fastokens":  # (also in a Ray actor, which verified nothing)
            use_fastokens_encoding_threads()

    def backend(self) -> Backend:
        if self._backend is None or self._pid != os.getpid():
            self._backend = load_backend(self.info)
            self._pid = os.getpid()
            self._waiting = self.info.verifying is not None
        if self._waiting:  # (one byte read a call)
            self._switch()
        return self._backend

    def _switch(self) -> None:
        """Take fastokens once the background verification found it gives the same ids."""
        assert self.info.verifying is not None
        state = verified(self.info.verifying)
        if state == PENDING:
            return
        if state == FASTOKENS:
            try:
                fast = load_fastokens(self.info.path, self.info.digest)
            except Unavailable as exc:  # (verified in the parent, failing here: keep hf)
                log.warning(
                    "tokenizer backend: tokenizers in process %d (fastokens, verified, "
                    "cannot load here: %s; the same ids)",
                    os.getpid(),
                    exc,
                )
            else:
                use_fastokens_encoding_threads()  # (this process's threads, from now on)
                self._backend = fast
        self._waiting = False

    def __call__(self, texts: list[str]) -> list[np.ndarray]:
        bos, eos = self.info.bos_id, self.info.eos_id
        with timed(ENCODE):
            try:
                docs = self.backend().encode_docs(texts, bos, eos)
            except BaseException as exc:
                docs = self._reference(exc).encode_docs(texts, bos, eos)
        FREED_MEMORY.maybe_release()  # (mostly on an encoding thread, off the main one)
        return docs

    def encode_raw(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text alone: no EOS or BOS added (pieces of one document)."""
        with timed(ENCODE):
            try:
                return self.backend().encode_batch(texts)
            except BaseException as exc:
                return self._reference(exc).encode_batch(texts)

    def _reference(self, exc: BaseException) -> Backend:
        """`tokenizers`, for texts fastokens raised (or panicked) on after it was verified
        (e.g. a backtracking regex running out of stack on a megabyte of spaces): the
        reference's ids are the very ids fastokens stands in for, so the stream is the same.
        Any other failure (an interrupt, `tokenizers` itself) is raised."""
        if (
            isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit)
            or self.backend().name != "fastokens"
        ):
            raise exc
        first = object()
        if _fell_back.setdefault(os.getpid(), first) is first:  # (atomic: once per process)
            log.warning(
                "tokenizer backend: fastokens raised %s (%s) on a chunk of documents; "
                "it and any other such chunk in this process are encoded with "
                "tokenizers (the same ids)",
                type(exc).__name__,
                str(exc)[:200],
            )
        return HfBackend(_load(self.info.path, self.info.digest))

    def token_id(self, token: str) -> int | None:
        """The id of a token given as a string (e.g. "<|image_pad|>"), or None."""
        return self.backend().token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self.backend().decode(ids)

    def __getstate__(self) -> dict:
        return {"info": self.info, "_backend": None, "_pid": -1, "_waiting": False}
