"""The `qwen2_audio` batch layout: text keys plus Qwen2-Audio's `input_features` and
`feature_attention_mask`.

`input_ids`, `labels`, `position_ids` and `source_ids` are the text layout's (`[B, L]`,
positions restarting at every document and row start); `labels` is -100 on `<|audio_bos|>`,
`<|AUDIO|>` and `<|audio_eos|>`. `input_features` is `[n_clips, 128, 3000]` float32, one entry
per clip of the batch in the order of their placeholders (row by row), each padded to 30 s as
`Qwen2AudioProcessor` pads it; `feature_attention_mask` is `[n_clips, 3000]` with ones on
each clip's frames. A batch without clips keeps both keys with zero entries.
"""

from __future__ import annotations

import numpy as np

from mixer.audio.documents import AudioDocuments
from mixer.audio.handle import AudioPlan, AudioProcessing, LazyAudio
from mixer.config.audio import N_FRAMES
from mixer.config.recipe import Recipe
from mixer.core.document import Budget, MediaHandle
from mixer.core.errors import RecipeError
from mixer.core.token_info import TokenizerInfo
from mixer.images.documents import VisionTokens
from mixer.images.shared_pixels import new_pixels, shared_tensor
from mixer.pipeline.batch import FLOAT32, INT32, INT64, ArraySpec, Batch, BatchLayout, Wire
from mixer.pipeline.packing import IGNORE_INDEX, Row
from mixer.tokenize import Encoder

QWEN2_AUDIO_TOKENS = ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>")


class Qwen2AudioLayout(BatchLayout):
    name = "qwen2_audio"
    specs = (
        ArraySpec("input_ids", INT64, INT32),
        ArraySpec("labels", INT64, INT32),
        ArraySpec("position_ids", INT64, INT32),
        ArraySpec("source_ids", INT64, INT32),
        ArraySpec("input_features", FLOAT32, FLOAT32, per_token=0),
        ArraySpec("feature_attention_mask", INT64, INT32, per_token=0),
    )

    def __init__(self, recipe: Recipe, tokenizer: TokenizerInfo) -> None:
        super().__init__(seq_len=recipe.seq_len, pad_id=tokenizer.pad_id)
        assert recipe.audio is not None
        self.settings = recipe.audio
        self.processing = AudioProcessing(recipe.audio)
        encoder = Encoder(tokenizer)
        ids: list[int] = []
        for name in QWEN2_AUDIO_TOKENS:
            token_id = encoder.token_id(name)
            if token_id is None:
                raise RecipeError(
                    f"audio.layout: the {self.name} layout needs the token {name!r}, which the "
                    f"tokenizer {tokenizer.path!r} does not have"
                )
            ids.append(token_id)
        bos, pad, eos = ids
        self.audio = VisionTokens(pad, (bos,), (eos,))
        self.audio_names: dict[int, str] = dict(zip(ids, QWEN2_AUDIO_TOKENS))
        self._audio_ids = np.array(sorted(ids), dtype=np.int64)

    def document_builder(self, encoder: Encoder, source: str) -> AudioDocuments:
        return AudioDocuments(
            settings=self.settings,
            processing=self.processing,
            encoder=encoder,
            tokens=self.audio,
            token_names=self.audio_names,
            seq_len=self.seq_len,
            source=source,
        )

    def budget(self) -> Budget | None:
        """`max_audio_per_batch` (a document's clips count as its images in `Budget`)."""
        cap = self.settings.max_audio_per_batch
        return None if cap is None else Budget(images=cap)

    def put_row(self, arrays: dict[str, np.ndarray], index: int, row: Row, source_id: int) -> None:
        arrays["input_ids"][index] = row.input_ids
        labels = arrays["labels"][index]
        labels[:] = row.labels
        labels[np.isin(row.input_ids, self._audio_ids)] = IGNORE_INDEX
        arrays["position_ids"][index] = row.position_ids
        arrays["source_ids"][index, : row.real] = source_id

    def finish(self, arrays: dict[str, np.ndarray], rows: list[Row | None], padding: bool) -> Batch:
        handles = [
            _clip(placement.image)
            for row in rows
            if row is not None
            for piece in row.pieces
            for placement in piece.document.images
        ]
        for clip in handles:  # those not made yet are made now, side by side on the pool
            clip.prefetch(needed=True)
        features = new_pixels((len(handles), *self.processing.row_shape))
        mask = np.zeros((len(handles), N_FRAMES), dtype=np.int64)
        for i, clip in enumerate(handles):
            features[i] = clip.pixels()
            plan: AudioPlan = clip.clip_plan
            mask[i, : plan.frames] = 1
            clip.release()
        arrays["input_features"] = features
        arrays["feature_attention_mask"] = mask
        return Batch(arrays, padding)

    def to_wire(self, batch: Batch, into: np.ndarray | None = None) -> Wire:
        """The batch as it leaves a DataLoader worker; features made in shared memory cross
        as their shared tensor, without a copy (`images.shared_pixels`)."""
        wire = super().to_wire(batch, into)
        tensor = shared_tensor(batch.arrays["input_features"])
        if tensor is not None and "input_features" in wire.tensors:
            wire.tensors["input_features"] = tensor
        return wire


def audio_layout(recipe: Recipe, tokenizer: TokenizerInfo) -> Qwen2AudioLayout:
    """The layout the recipe's `audio.layout` names (its tokens checked in the tokenizer)."""
    return Qwen2AudioLayout(recipe, tokenizer)


def _clip(handle: MediaHandle) -> LazyAudio:
    """A placed medium of an audio document: always a clip (`AudioDocuments` makes them)."""
    if not isinstance(handle, LazyAudio):
        raise TypeError(f"an audio layout got a {handle.kind} handle ({type(handle).__name__})")
    return handle
