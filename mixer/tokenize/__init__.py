"""The tokenizer: resolving a recipe's tokenizer once, and encoding text with it."""

from mixer.core.token_info import TokenizerInfo
from mixer.tokenize.tokenizer import Encoder, resolve_tokenizer

__all__ = ["Encoder", "TokenizerInfo", "resolve_tokenizer"]
