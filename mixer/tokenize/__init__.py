"""Tokenizer adapter and packing strategies."""

from mixer.tokenize.packing import IGNORE_INDEX, Packer, Row
from mixer.tokenize.tokenizer import Encoder, TokenizerInfo, resolve_tokenizer

__all__ = ["IGNORE_INDEX", "Encoder", "Packer", "Row", "TokenizerInfo", "resolve_tokenizer"]
