"""Batches as named arrays, and the layout that owns their keys, dtypes and wire format.

A `BatchLayout` says which arrays a batch has, how a lane fills them from packed rows, how a
batch crosses from a DataLoader worker to the main process (one bytes buffer plus a small
header), and what the user receives (a dict of torch tensors). The text layout has
`input_ids`, `labels`, `position_ids` and `source_ids`, all `[batch_size, seq_len]` int64;
image layouts (`mixer.images`) add theirs; `mixer.images.select.layout_for` picks a recipe's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mixer.pipeline.flatten import flatten_arrays
from mixer.pipeline.packing import IGNORE_INDEX, Row, rows_arrays

if TYPE_CHECKING:
    import torch

    from mixer.core.document import Budget, DocumentBuilder
    from mixer.tokenize import Encoder

TEXT_KEYS = ("input_ids", "labels", "position_ids", "source_ids")
# The dtypes of batch arrays: int64 token arrays for the user (int32 on the wire between a
# worker and the main process), float32 pixels. Every layout takes them from here.
INT64, INT32, FLOAT32 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float32)


@dataclass(frozen=True)
class ArraySpec:
    """One array of a batch: its dtype for the user and its (smaller) dtype on the wire, and
    its values per token of the batch (`[B, L]`: 1; qwen2_vl's `[4, B, L]` positions: 4; 0
    for arrays not sized by the tokens: pixels, image grids)."""

    key: str
    dtype: np.dtype
    wire: np.dtype
    per_token: int = 1


SHARED_BYTES = 1 << 20


@dataclass
class Wire:
    """A batch on its way from a worker: one buffer of small arrays, large ones as tensors."""

    data: bytes | memoryview
    shapes: list[tuple[str, tuple[int, ...]]]
    tensors: dict[str, torch.Tensor]


@dataclass
class Batch:
    """One lane batch: named arrays, and whether it is an exhausted lane's padding."""

    arrays: dict[str, np.ndarray]
    padding: bool

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    @property
    def input_ids(self) -> np.ndarray:
        return self.arrays["input_ids"]

    @property
    def labels(self) -> np.ndarray:
        return self.arrays["labels"]

    @property
    def position_ids(self) -> np.ndarray:
        return self.arrays["position_ids"]

    @property
    def source_ids(self) -> np.ndarray:
        return self.arrays["source_ids"]


class BatchLayout:
    """Text batches; subclasses add image arrays (see `mixer.images.layouts`)."""

    name = "text"
    specs: tuple[ArraySpec, ...] = tuple(ArraySpec(k, INT64, INT32) for k in TEXT_KEYS)

    def __init__(self, *, seq_len: int, pad_id: int, flatten: bool = False) -> None:
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.flatten = flatten  # the user's view only (`mixer.pipeline.flatten`)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(spec.key for spec in self.specs)

    def wire_bytes(self, batch_size: int) -> int:
        """At most the bytes of one batch's wire buffer (`to_wire`): the arrays sized by the
        tokens, and under `SHARED_BYTES` for each other one (a larger one crosses as a tensor;
        an image grid holds 12 bytes an image, which no batch makes a megabyte of)."""
        tokens = batch_size * self.seq_len
        return sum(
            tokens * spec.per_token * spec.wire.itemsize if spec.per_token else SHARED_BYTES
            for spec in self.specs
        )

    def document_builder(self, encoder: Encoder, source: str) -> DocumentBuilder | None:
        """What turns a source's records into documents; None: text only (the stream's own)."""
        return None

    def budget(self) -> Budget | None:
        """A fresh batch's image caps; None when there are none."""
        return None

    # -- building, in a lane -------------------------------------------------------------------
    def new_rows(self, batch_size: int) -> dict[str, np.ndarray]:
        """The per-row arrays of an all-padding batch."""
        shape = (batch_size, self.seq_len)
        return {
            "input_ids": _filled(shape, self.pad_id),
            "labels": _filled(shape, IGNORE_INDEX),
            "position_ids": np.zeros(shape, dtype=np.int64),
            "source_ids": _filled(shape, -1),
        }

    def put_row(self, arrays: dict[str, np.ndarray], index: int, row: Row, source_id: int) -> None:
        """Write a packed row into row `index` of the batch (layouts that write rows one by
        one override this; the text layout writes a batch's rows at once in `assemble`)."""
        arrays["input_ids"][index] = row.input_ids
        arrays["labels"][index] = row.labels
        arrays["position_ids"][index] = row.position_ids
        arrays["source_ids"][index, : row.real] = source_id

    def finish(self, arrays: dict[str, np.ndarray], rows: list[Row | None], padding: bool) -> Batch:
        """The batch, once every row is in (image layouts add pixels here)."""
        return Batch(arrays, padding)

    def assemble(self, rows: list[Row | None], sources: list[int], padding: bool) -> Batch:
        """The batch of packed `rows` (None: a row of padding), row i drawn from source
        `sources[i]`: `new_rows`, `put_row` for each row, `finish`; the text layout's own
        arrays are written for all rows at once (`rows_arrays`)."""
        own = type(self)
        if own.put_row is not BatchLayout.put_row or own.new_rows is not BatchLayout.new_rows:
            # a layout with arrays or rows of its own (image layouts): row by row
            arrays = self.new_rows(len(rows))
            for index, (row, source) in enumerate(zip(rows, sources)):
                if row is not None:
                    self.put_row(arrays, index, row, source)
            return self.finish(arrays, rows, padding)
        ids, labels, positions, real = rows_arrays(rows, self.seq_len, self.pad_id)
        column = np.array(sources, dtype=np.int64)[:, None]
        source_ids = (
            np.repeat(column, self.seq_len, axis=1) if real is None else np.where(real, column, -1)
        )
        return self.finish(
            {
                "input_ids": ids,
                "labels": labels,
                "position_ids": positions,
                "source_ids": source_ids,
            },
            rows,
            padding,
        )

    # -- crossing from a worker to the main process -------------------------------------------
    def to_wire(self, batch: Batch, into: np.ndarray | None = None) -> Wire:
        """Small arrays in one buffer (each in its wire dtype, in `specs` order); arrays of at
        least `SHARED_BYTES` (pixels) as tensors, which DataLoader hands over in shared memory
        instead of pickling them through the pipe. With `into` (writable bytes) the buffer
        is written there when it fits, and the wire's `data` is a view of it."""
        small, shapes, tensors = [], [], {}
        for spec in self.specs:
            array = batch.arrays[spec.key]
            if spec.wire == spec.dtype and array.nbytes >= SHARED_BYTES:
                import torch  # (only where a batch is built: the CLI starts without it)

                tensors[spec.key] = torch.from_numpy(np.ascontiguousarray(array))
                continue
            small.append((array, spec.wire))
            shapes.append((spec.key, tuple(array.shape)))
        size = sum(array.size * wire.itemsize for array, wire in small)
        if into is None or size > len(into):
            return Wire(
                b"".join(
                    np.ascontiguousarray(array, dtype=wire).tobytes() for array, wire in small
                ),
                shapes,
                tensors,
            )
        at = 0
        for array, wire in small:  # cast straight into place: no intermediate copies
            end = at + array.size * wire.itemsize
            np.copyto(into[at:end].view(wire).reshape(array.shape), array, casting="unsafe")
            at = end
        return Wire(memoryview(into[:size]), shapes, tensors)

    def from_wire(self, wire: Wire, padding: bool) -> Batch:
        arrays, at = {}, 0
        specs = {spec.key: spec for spec in self.specs}
        for key, shape in wire.shapes:
            spec = specs[key]
            count = math.prod(shape)  # (np.prod costs 3 µs on a tuple)
            array = np.frombuffer(wire.data, dtype=spec.wire, count=count, offset=at).reshape(shape)
            arrays[key] = array.astype(spec.dtype)
            at += count * spec.wire.itemsize
        for key, tensor in wire.tensors.items():
            arrays[key] = tensor.numpy()
        return Batch(arrays, padding)

    # -- the user's view ------------------------------------------------------------------------
    def to_torch(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The user's dict of tensors; nothing internal is left in it. Flattened (`flatten`),
        one row with `cu_seq_lens_q/k` and `max_length_q/k` (Python ints, as transformers'
        `DataCollatorWithFlattening` gives them)."""
        import torch

        arrays = {spec.key: batch.arrays[spec.key] for spec in self.specs}
        if not self.flatten:
            return {key: torch.from_numpy(array) for key, array in arrays.items()}
        flat = flatten_arrays(arrays, {spec.key: spec.per_token for spec in self.specs})
        return {
            key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            for key, value in flat.items()
        }


def is_padding_batch(batch: dict) -> bool:
    """True when a batch carries no token to learn from (an exhausted rank's placeholder)."""
    return bool((batch["labels"] == IGNORE_INDEX).all())


def _filled(shape: tuple[int, ...], value: int) -> np.ndarray:
    """np.full for int64 without its Python-level overhead (a few calls per batch)."""
    array = np.empty(shape, dtype=np.int64)
    array.fill(value)
    return array
