"""Tokenizer adapter and packers."""

from mixer.tokenize.packers import PACKERS, RowPacker, make_packer
from mixer.tokenize.packing import BLOCKED, IGNORE_INDEX, Packer, Piece, Row
from mixer.tokenize.tokenizer import Encoder, TokenizerInfo, resolve_tokenizer

__all__ = ["BLOCKED", "IGNORE_INDEX", "PACKERS", "Encoder", "Packer", "Piece", "Row", "RowPacker",
           "TokenizerInfo", "make_packer", "resolve_tokenizer"]
