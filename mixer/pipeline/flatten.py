"""`flatten: true`: a batch as one row with the boundaries of its pieces, for varlen attention.

The unflattened batch's rows go end to end into one row `[1, batch_size · seq_len]` (`[4, 1,
batch_size · seq_len]` for qwen2_vl's positions; pixels and grids unchanged), and the batch
gains the keys of transformers' `DataCollatorWithFlattening(return_flash_attn_kwargs=True)`:

- `cu_seq_lens_q`, `cu_seq_lens_k` (int32, equal): the offsets where pieces start, then the
  total. A piece starts wherever the unflattened `position_ids` restart on a real token (every
  document start and every row start) and where a row's padding begins: padding is a piece of
  its own, so no real token ever attends to it or it to them.
- `position_ids` counting from 0 in each piece (for qwen2_vl, row 0; rows 1-3, the M-RoPE
  positions, are those of the unflattened batch).
- `max_length_q`, `max_length_k`: the longest piece, as Python ints (as the collator).
- `labels` -100 on the first token of every row: in the unflattened batch no token predicts
  it, and in the flattened one the previous row's last token would. The loss of a flattened
  batch is thus that of the unflattened one; with `mask_document_boundaries` the labels are
  the collator's (-100 on every piece's first token).

Only the user's view changes: the stream, the wire between processes and the state are those
of the unflattened recipe.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mixer.pipeline.packing import IGNORE_INDEX

FLASH_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def piece_starts(position_ids: np.ndarray, source_ids: np.ndarray) -> np.ndarray:
    """Flat offsets (into the rows end to end) where pieces start, int64 ascending: row starts,
    real tokens at position 0, and the first padding token after a real one."""
    real = source_ids >= 0
    start = real & (position_ids == 0)
    start[:, 0] = True
    start[:, 1:] |= real[:, :-1] & ~real[:, 1:]
    return np.flatnonzero(start)


def flatten_arrays(arrays: dict[str, np.ndarray], per_token: dict[str, int]) -> dict[str, Any]:
    """The flattened view of a batch's arrays (`per_token`: each key's values per token, as in
    the layout's specs; 0 for arrays not sized by the tokens, which are kept as they are)."""
    positions = arrays["position_ids"]
    text_positions = positions[0] if positions.ndim == 3 else positions
    batch_size, seq_len = text_positions.shape
    total = batch_size * seq_len
    starts = piece_starts(text_positions, arrays["source_ids"])
    bounds = np.append(starts, total)
    lengths = np.diff(bounds)
    counted = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
    out: dict[str, Any] = {}
    for key, array in arrays.items():
        values = per_token.get(key, 0)
        if values == 0:
            out[key] = array
        elif values == 1:
            out[key] = array.reshape(1, total)
        else:
            out[key] = array.reshape(values, 1, total)
    labels = arrays["labels"].copy()
    labels[:, 0] = IGNORE_INDEX
    out["labels"] = labels.reshape(1, total)
    if positions.ndim == 3:
        flat = positions.reshape(positions.shape[0], 1, total).copy()
        flat[0, 0] = counted
        out["position_ids"] = flat
    else:
        out["position_ids"] = counted.reshape(1, total)
    cu = bounds.astype(np.int32)
    longest = int(lengths.max())
    out["cu_seq_lens_q"], out["cu_seq_lens_k"] = cu, cu.copy()
    out["max_length_q"] = out["max_length_k"] = longest
    return out
