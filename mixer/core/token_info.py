"""TokenizerInfo: what every layer needs to know about the recipe's tokenizer (its special
ids and vocabulary), resolved once by `mixer.tokenize`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerInfo:
    """What mixer needs to know about a tokenizer, resolved once."""

    path: str
    eos_id: int
    bos_id: int | None
    pad_id: int
    digest: str
    vocab_size: int
    # What encodes: "hf" (`tokenizers`) or "fastokens", chosen once per loader
    # (`mixer.tokenize.choice.resolve_backend`); never part of a state or cache key, since both
    # give the same ids wherever it is "fastokens".
    backend: str = "hf"
    # The recipe asked for fastokens (`tokenizer_backend: fastokens`): a process where it
    # cannot load refuses. Chosen by `auto`, such a process encodes with `tokenizers` (same ids).
    required: bool = False
    # A fastokens verification running in the background (`mixer.tokenize.background`: its
    # key): `tokenizers` encodes until its verdict is in, then fastokens where it is ok.
    verifying: str | None = None
