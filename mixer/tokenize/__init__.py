"""The tokenizer: resolving a recipe's tokenizer once, choosing the library that encodes with
it (`tokenizers` or fastokens, verified to agree), and encoding text with it."""

from mixer.core.token_info import TokenizerInfo
from mixer.tokenize.choice import BackendChoice, resolve_backend
from mixer.tokenize.tokenizer import Encoder, resolve_tokenizer

__all__ = ["BackendChoice", "Encoder", "TokenizerInfo", "resolve_backend", "resolve_tokenizer"]
