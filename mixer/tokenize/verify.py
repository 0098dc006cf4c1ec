"""Whether fastokens may encode for a recipe: its verdict, found once and kept (`choice.py`
turns it into the recipe's backend).

fastokens is used only where it loads the tokenizer and gives the very ids of `tokenizers` on
the stress text (`stress.py`), the added tokens' ids, and the first documents of every source
(`sample.py`): same ids, same stream, so a state or a token cache made with one backend
serves the other. The verdict is kept in a small JSON file named by the tokenizer's digest,
fastokens' version and the sampled splits (beside the token cache's tokenizer info when there
is one, else in the user's cache folder), so a warm start reads one file and encodes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers

from mixer.core.files import user_cache_dir, write_atomically
from mixer.core.token_info import TokenizerInfo
from mixer.sources import SourceTable
from mixer.tokenize import sample
from mixer.tokenize.backends import (
    FastokensBackend,
    HfBackend,
    Unavailable,
    fastokens_missing,
    fastokens_version,
    load_fastokens,
    preload_fastokens,
)
from mixer.tokenize.background import Steps
from mixer.tokenize.encoding import (
    TOKENIZE_BYTES_AHEAD,
    chunk_full,
)
from mixer.tokenize.stress import STRESS_ID, stress_sections
from mixer.tokenize.tokenizer import _load as _load_hf

VERDICT_FORMAT = 1
_CONTEXT = 4  # ids shown on either side of the first mismatch
log = logging.getLogger("mixer.tokenizer")


@dataclass(frozen=True)
class Verdict:
    """Whether fastokens matched `tokenizers`; if not, why (a few words, or the first
    mismatching text); the source documents and text bytes it was checked on."""

    ok: bool
    reason: str = ""
    documents: int = 0
    text_bytes: int = 0


# -- the verdict, cached -----------------------------------------------------------------------
# Verdicts found in this process, by key (an unwritable cache folder still verifies once).
_verdicts: dict[str, tuple[Verdict, dict]] = {}


def cache_folder(info_cache: str | None) -> Path:
    """Where verdicts are kept: `backends/` in `info_cache` (the token cache's tokenizer
    folder), else `$XDG_CACHE_HOME/mixer/tokenizer-backends` (default `~/.cache/...`)."""
    if info_cache is not None:
        return Path(info_cache) / "backends"
    return user_cache_dir() / "tokenizer-backends"


def _tokenizer_key(info: TokenizerInfo, version: str) -> str:
    """The key of a refusal met before any source was sampled (fastokens does not load the
    tokenizer, or differs on the stress text): it holds for any recipe and sources."""
    material = [VERDICT_FORMAT, STRESS_ID, info.digest, version, tokenizers.__version__]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:24]


def known_refusal(info: TokenizerInfo, info_cache: str | None) -> Verdict | None:
    """A refusal of fastokens for this tokenizer found before (this process, or kept in
    the cache folder), whatever the sources; None where none is known."""
    version = fastokens_version()
    if version is None:
        return None
    key = _tokenizer_key(info, version)
    held = _verdicts.get(key)
    if held is None:
        held = _read(cache_folder(info_cache) / f"refused-{key}.json", key)
        if held is None or held[0].ok or held[1]:
            return None
        _verdicts[key] = held
    return held[0]


def preload(recipe: Any, info: TokenizerInfo, info_cache: str | None) -> None:
    """Start loading fastokens' tokenizer on a thread while the sources are listed, unless
    the recipe asks for `hf` or fastokens is known to refuse this tokenizer (a warm start
    then parses nothing); `finish_preloads` before forking."""
    if recipe.tokenizer_backend != "hf" and known_refusal(info, info_cache) is None:
        preload_fastokens(info.path, info.digest)


def _key(recipe: Any, info: TokenizerInfo, version: str, tables: list[SourceTable]) -> str:
    planned = sample.planned_ids(recipe, tables)
    sources = [[s.name, s.format, s.chosen_text_field, planned[s.name]] for s in recipe.sources]
    material = [
        VERDICT_FORMAT,
        STRESS_ID,
        sample.SAMPLE_BYTES,
        info.digest,
        version,
        tokenizers.__version__,
        recipe.max_document_bytes,
        sources,
    ]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:24]


def _check(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _read(path: Path, key: str) -> tuple[Verdict, dict] | None:
    try:
        data = json.loads(path.read_bytes())
        fields = {k: data[k] for k in ("key", "ok", "reason", "documents", "text_bytes", "sampled")}
        if data["check"] != _check(fields) or fields["key"] != key:
            raise ValueError("checksum or key mismatch")
        verdict = Verdict(
            bool(fields["ok"]),
            str(fields["reason"]),
            int(fields["documents"]),
            int(fields["text_bytes"]),
        )
        return verdict, dict(fields["sampled"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("backend verdict %s is unusable (%s); verifying again", path, exc)
        return None


def _write(path: Path, key: str, verdict: Verdict, sampled: dict) -> None:
    fields = {"key": key, **dataclasses.asdict(verdict), "sampled": sampled}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**fields, "check": _check(fields)}).encode())
    except OSError as exc:
        log.debug("cannot keep the backend verdict in %s (%s)", path, exc)


def known_verdict(
    recipe: Any, info: TokenizerInfo, tables: list[SourceTable] | None, info_cache: str | None
) -> tuple[Verdict, bool] | None:
    """(verdict, whether it was cached) where no encoding is needed to know it (fastokens
    missing, a refusal or a verdict kept); None where fastokens must be verified."""
    version = fastokens_version()
    if version is None:
        return Verdict(False, fastokens_missing() or "fastokens not installed"), False
    refused = known_refusal(info, info_cache)
    if refused is not None:
        return refused, True
    if tables is None:
        return None
    key = _key(recipe, info, version, tables)
    for held in (_verdicts.get(key), None):
        if held is None:
            held = _read(cache_folder(info_cache) / f"backend-{key}.json", key)
        # (a refusal before any source was sampled, `sampled` empty, holds whatever they list)
        if held is not None and (
            not held[0].ok and not held[1] or sample.still_listed(held[1], recipe, tables)
        ):
            _verdicts[key] = held
            return held[0], True
    return None


def fresh_verdict(
    recipe: Any,
    info: TokenizerInfo,
    tables: list[SourceTable] | None,
    info_cache: str | None,
    steps: Steps | None = None,
) -> Verdict:
    """Verify fastokens (on `steps`' thread where given) and keep the verdict."""
    verdict, sampled = verify(recipe, info, tables, steps)
    if tables is None:
        return verdict
    version = fastokens_version() or "unknown"
    key = _key(recipe, info, version, tables)
    with steps if steps is not None else contextlib.nullcontext():
        _verdicts[key] = (verdict, sampled)
        if not verdict.ok and not sampled and _lasting(verdict.reason):
            key = _tokenizer_key(info, version)  # whatever the sources: `known_refusal`
            _verdicts[key] = (verdict, sampled)
            _write(cache_folder(info_cache) / f"refused-{key}.json", key, verdict, sampled)
        elif verdict.ok or sampled:
            _write(cache_folder(info_cache) / f"backend-{key}.json", key, verdict, sampled)
    return verdict


def _lasting(reason: str) -> bool:
    """A refusal that the next start would meet again (an unsupported component, ids or
    decodes that differ), not one of this start (fastokens failing to read the file: no
    memory, too many open files) nor a library raising on a text (either one: it may be this
    start's trouble too), which are not kept."""
    if " raised " in reason:
        return False
    return reason.endswith(" unsupported") or reason.startswith(("differs", "decodes"))


# -- verification ------------------------------------------------------------------------------
def verify(
    recipe: Any,
    info: TokenizerInfo,
    tables: list[SourceTable] | None,
    steps: Steps | None = None,
) -> tuple[Verdict, dict[str, list]]:
    """Encode the stress text and the sources' samples with both backends (no cache); the
    verdict and the splits sampled. On a thread of its own, which takes with it when it exits
    the words cache fastokens keeps per calling thread (megabytes for a few MB of samples):
    the caller's where `steps` are given (a `background.Verification`'s, which calls this
    function through this module, so a test can slow it down), else one started here."""
    if steps is not None:
        return _verify(recipe, info, tables, steps)
    steps = Steps()
    once = ThreadPoolExecutor(1, thread_name_prefix="mixer-verify")
    try:
        return once.submit(_verify, recipe, info, tables, steps).result()
    except BaseException:  # (an interrupt, here: the thread stops at its next step)
        steps.stop.set()
        raise
    finally:
        once.shutdown()


def _verify(
    recipe: Any, info: TokenizerInfo, tables: list[SourceTable] | None, steps: Steps
) -> tuple[Verdict, dict[str, list]]:
    """Each library call is a step (`Steps`: where it may stop, and where a fork may come)."""
    try:
        with steps:
            fast = load_fastokens(info.path, info.digest)
    except Unavailable as exc:
        return Verdict(False, str(exc)), {}
    with steps:
        hf = HfBackend(_load_hf(info.path, info.digest))
        why = _check_tokenizer(hf, fast)
    if why is None:
        why = _stress_mismatch(hf, fast, info, steps)
    if why is not None:
        return Verdict(False, why), {}
    if tables is None:
        return Verdict(True), {}
    with steps:
        docs, sampled = sample.sample_sources(recipe, tables, info)
    found = _first_mismatch(hf, fast, [d.text for d in docs], steps)
    if found is not None:
        doc = docs[found[0]]
        return Verdict(
            False,
            f"differs on source {doc.source!r}, document {doc.number} "
            f"({doc.file}, {doc.where}), {found[1]}",
        ), sampled
    size = sum(len(d.text.encode("utf-8", "surrogatepass")) for d in docs)
    return Verdict(True, "", len(docs), size), sampled


def _check_tokenizer(hf: HfBackend, fast: FastokensBackend) -> str | None:
    """The added tokens' ids (padding and truncation are off in both: `whole_documents`)."""
    for token in _added_tokens(hf):
        ours, theirs = hf.token_to_id(token), fast.token_to_id(token)
        if ours != theirs:
            return f"differs on added token {token!r}: tokenizers id {ours}, fastokens id {theirs}"
    return None


def _added_tokens(hf: HfBackend) -> list[str]:
    decoder = hf.tok.get_added_tokens_decoder()
    return [decoder[i].content for i in sorted(decoder)]


PAIR_PARTNERS = 16  # at most: every added token is set beside each (see `stress._pairs`)


def _pair_partners(hf: HfBackend) -> list[str]:
    """The added tokens that take or give whitespace, those with the most ways first."""
    decoder = hf.tok.get_added_tokens_decoder()

    def ways(t: Any) -> int:
        edges = bool(t.content) and (t.content[0].isspace() or t.content[-1].isspace())
        return t.lstrip + t.rstrip + t.single_word + (not t.special) + edges

    tokens = [decoder[i] for i in sorted(decoder)]
    ranked = sorted((t for t in tokens if ways(t)), key=ways, reverse=True)
    return [t.content for t in ranked[:PAIR_PARTNERS]]


# Stress verdicts in this process by (digest, file): the stress text does not depend on data.
_stress: dict[tuple[str, str], str | None] = {}


def _stress_mismatch(
    hf: HfBackend, fast: FastokensBackend, info: TokenizerInfo, steps: Steps
) -> str | None:
    if (info.digest, info.path) in _stress:
        return _stress[(info.digest, info.path)]
    sections = stress_sections(_added_tokens(hf), _pair_partners(hf))
    texts = [text for _, text in sections]
    found = _first_mismatch(hf, fast, texts, steps)
    why = None
    if found is not None:
        why = f"differs on the stress text (section {sections[found[0]][0]!r}), {found[1]}"
    else:
        with steps:
            why = _decode_mismatch(hf, fast, sections, texts)
    _stress[(info.digest, info.path)] = why
    return why


def _decode_mismatch(
    hf: HfBackend, fast: FastokensBackend, sections: list[tuple[str, str]], texts: list[str]
) -> str | None:
    """The stress sections' ids decode to the same text with both libraries, or why not."""
    for (name, _), ids in zip(sections, fast.encode_batch(texts)):
        try:
            ours = hf.decode(ids)
        except BaseException as exc:
            ours, name = None, f"{name}: {_raised(exc, 'tokenizers')}"
        try:
            same = ours is not None and ours == fast.decode(ids)
        except BaseException as exc:
            same, name = False, f"{name}: {_raised(exc)}"
        if not same:
            return f"decodes the stress text differently (section {name!r})"
    return None


def _first_mismatch(
    hf: HfBackend, fast: FastokensBackend, texts: list[str], steps: Steps
) -> tuple[int, str] | None:
    """(text index, `character N: tokenizers [...] vs fastokens [...]`) of the first text the
    backends encode differently. fastokens encodes in the chunks `Encoder` uses; `tokenizers`
    one text at a time (no thread pool in this process: DataLoader workers forked later keep
    theirs), which also gives the character offsets. Each chunk is a step."""
    at = 0
    while at < len(texts):
        end, size = at, 0
        while end < len(texts) and not chunk_full(end - at, size, TOKENIZE_BYTES_AHEAD):
            size += len(texts[end])
            end += 1
        with steps:
            found = _chunk_mismatch(hf, fast, texts, at, end)
        if found is not None:
            return found
        at = end
    return None


def _chunk_mismatch(
    hf: HfBackend, fast: FastokensBackend, texts: list[str], at: int, end: int
) -> tuple[int, str] | None:
    try:
        encoded = fast.encode_batch(texts[at:end])
    except BaseException as exc:  # (pyo3's PanicException is no Exception)
        why = _raised(exc)
        return next((k for k in range(at, end) if _fails(fast, texts[k])), at), why
    for k, got in enumerate(encoded, start=at):
        try:
            ref = hf.tok.encode(texts[k], add_special_tokens=False)
        except BaseException as exc:  # the reference itself fails on this text
            return k, _raised(exc, "tokenizers")
        if ref.ids != got:
            return k, _describe(ref, got, len(texts[k]))
    return None


def _fails(fast: FastokensBackend, text: str) -> bool:
    try:
        fast.encode_batch([text])
    except BaseException as exc:
        _raised(exc)
        return True
    return False


def _raised(exc: BaseException, library: str = "fastokens") -> str:
    """A library's error (or panic) on a text, in words; an interrupt is raised on."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise exc
    return f"{library} raised {type(exc).__name__}: {str(exc)[:200]}"


def _describe(ref: Any, got: list[int], chars: int) -> str:
    ids = ref.ids
    i = next((k for k, (a, b) in enumerate(zip(ids, got)) if a != b), min(len(ids), len(got)))
    char = ref.offsets[i][0] if i < len(ids) else chars
    lo = max(0, i - _CONTEXT)
    return (
        f"character {char:,} (token {i:,}): tokenizers {ids[lo : i + _CONTEXT]} vs "
        f"fastokens {got[lo : i + _CONTEXT]}"
    )
