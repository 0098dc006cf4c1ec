"""Which library encodes a recipe's text (`tokenizer_backend: auto | hf | fastokens`), chosen
once per loader from fastokens' verdict (`verify.py`): `resolve_backend` and the
`BackendChoice` it returns, which says what was chosen and why. With `auto` and no verdict
kept, a loader starts with `tokenizers` and the verdict comes from a background verification
(`background.py`)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from mixer.core.errors import RecipeError
from mixer.core.token_info import TokenizerInfo
from mixer.sources import SourceTable
from mixer.tokenize import verify
from mixer.tokenize.background import FASTOKENS, PENDING, Steps, Verification
from mixer.tokenize.encoding import use_fastokens_encoding_threads
from mixer.tokenize.verify import Verdict

log = logging.getLogger("mixer.tokenizer")


@dataclass(frozen=True)
class BackendChoice:
    """The backend a loader encodes with (`info.backend`), what the recipe asked for, and
    the verdict behind it (None when the recipe asked for hf). With `background` (`auto`
    and no verdict kept: `resolve_backend(..., background=True)`), `tokenizers` encodes
    until the verification's verdict is in; `verdict_now`, `info_now` and `describe` follow it."""

    info: TokenizerInfo
    requested: str
    verdict: Verdict | None = None
    cached: bool = False  # the verdict came from the cache: nothing was encoded
    background: Verification | None = None

    def verdict_now(self) -> Verdict | None:
        """The verdict, once there is one."""
        return self.background.verdict if self.background is not None else self.verdict

    def info_now(self) -> TokenizerInfo:
        """What an encoder made now should be given: with a background verification,
        fastokens once it was verified, `tokenizers` once it was not (or ended without a
        verdict), until then `info` (which switches when the verdict comes)."""
        job = self.background
        if job is None or job.state == PENDING:
            return self.info
        backend = "fastokens" if job.state == FASTOKENS else "hf"
        return dataclasses.replace(self.info, backend=backend, verifying=None)

    @property
    def encoding(self) -> str:
        """The library that encodes in the loader's process now: "hf" or "fastokens"."""
        return self.info_now().backend

    def describe(self) -> str:
        """`fastokens (verified on 1,204 documents, 3.1 MB)`, `tokenizers (fastokens:
        Metaspace pre-tokenizer unsupported)` or `tokenizers (tokenizer_backend: hf)`; with a
        background verification also `tokenizers until fastokens is verified (verifying in the
        background)`, `fastokens (verified in the background on ...; tokenizers until then)`
        and `tokenizers (the fastokens verification stopped)`."""
        job = self.background
        if job is not None and job.state == PENDING:
            return "tokenizers until fastokens is verified (verifying in the background)"
        if job is not None and job.verdict is None:
            return f"tokenizers (the fastokens verification {job.why})"
        v = self.verdict_now()
        if v is None:
            return "tokenizers (tokenizer_backend: hf)"
        if not v.ok:
            return f"tokenizers (fastokens: {v.reason})"
        how = "" if job is None else " in the background"
        then = "" if job is None else "; tokenizers until then"
        if not v.documents:
            return f"fastokens (verified{how} on the stress text; no source text{then})"
        size = (
            f"{v.text_bytes / 1e6:.1f} MB"
            if v.text_bytes >= 100_000
            else f"{v.text_bytes / 1e3:.1f} KB"
        )
        plural = "" if v.documents == 1 else "s"
        return f"fastokens (verified{how} on {v.documents:,} document{plural}, {size}{then})"


def resolve_backend(
    recipe: Any,
    info: TokenizerInfo,
    tables: list[SourceTable] | None,
    *,
    info_cache: str | None = None,
    background: bool = False,
) -> BackendChoice:
    """The backend for `recipe` (`info` with `backend` set); `tables` None: the sources could
    not be listed, so only the stress text is checked (and nothing is cached).

    `fastokens` asked for and not verified is a `RecipeError` saying why; `auto` falls back
    to `tokenizers` with one log line. `background` (for `auto` with `tables`): where no
    verdict is kept, return at once with `tokenizers` and verify on a thread
    (`BackendChoice.background`; the same log line once the verdict is in)."""
    wanted = recipe.tokenizer_backend
    if wanted == "hf":
        return BackendChoice(dataclasses.replace(info, backend="hf"), wanted)
    known = verify.known_verdict(recipe, info, tables, info_cache)
    if known is None and background and wanted == "auto" and tables is not None:
        return _in_background(recipe, info, tables, info_cache)
    if known is None:
        known = verify.fresh_verdict(recipe, info, tables, info_cache), False
    verdict, cached = known
    if verdict.ok:
        use_fastokens_encoding_threads()  # (before the first chunk is handed to the pool)
    elif wanted == "fastokens":
        raise RecipeError(
            f"tokenizer_backend: fastokens is not usable with {info.path!r}: {verdict.reason}"
        )
    choice = _chosen(info, wanted, verdict, cached)
    _log_choice(choice)
    return choice


def _chosen(info: TokenizerInfo, wanted: str, verdict: Verdict, cached: bool) -> BackendChoice:
    backend = "fastokens" if verdict.ok else "hf"
    required = verdict.ok and wanted == "fastokens"
    return BackendChoice(
        dataclasses.replace(info, backend=backend, required=required), wanted, verdict, cached
    )


def _log_choice(choice: BackendChoice) -> None:
    v = choice.verdict_now()
    # Not loading is expected (a component fastokens lacks, no wheel); differing ids are not.
    level = logging.WARNING if v is not None and v.reason.startswith("differs") else logging.INFO
    log.log(level, "tokenizer backend: %s", choice.describe())


def _in_background(
    recipe: Any, info: TokenizerInfo, tables: list[SourceTable], info_cache: str | None
) -> BackendChoice:
    """`tokenizers` now; fastokens from the verdict on, where it is ok."""
    held: list[BackendChoice] = []

    def run(steps: Steps) -> tuple[bool, Verdict]:
        verdict = verify.fresh_verdict(recipe, info, tables, info_cache, steps)
        return verdict.ok, verdict

    def settle(ok: bool, verdict: Verdict) -> None:
        _log_choice(held[0])  # (the shared byte is set: it describes itself with the verdict)

    job = Verification(run, settle)
    choice = BackendChoice(
        dataclasses.replace(info, backend="hf", required=False, verifying=job.key),
        "auto",
        background=job,
    )
    held.append(choice)
    log.debug("tokenizer backend: %s", choice.describe())
    return choice
