"""The worker side of the loader: what each DataLoader worker, Ray actor (or the main process,
at num_workers 0) runs, producing the global batches of the lanes it serves.

Torch-free, so that a Ray actor never imports torch (seconds of its start); the DataLoader's
`IterableDataset` is `runtime/torch_dataset.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mixer.config.recipe import Recipe
from mixer.core.errors import MixerError
from mixer.core.stages import CLOCK, PACK, TRANSFER, since, timed
from mixer.core.token_info import TokenizerInfo
from mixer.images.select import layout_for
from mixer.pipeline.batch import Batch, BatchLayout, Wire
from mixer.pipeline.lanes import Lane, LaneState
from mixer.pipeline.schedule import WeightPlan
from mixer.runtime.topology import global_batch, lane_of
from mixer.sources import IO_STATS, SourceTable
from mixer.tokenize import Encoder

if TYPE_CHECKING:
    import torch

Send = Callable[[BatchLayout, Batch], Any]  # a batch → what crosses to the loader's process


class LaneDataset:
    """Makes (batch array or what `send` makes of it, lane metadata) for the global batches a
    worker serves (`produce`)."""

    def __init__(
        self,
        recipe: Recipe,
        tables: list[SourceTable],
        tokenizer: TokenizerInfo,
        lane_states: dict[int, LaneState | None],
        start: int,
        rank: int,
        world_size: int,
        plan: WeightPlan,
    ) -> None:
        self.recipe = recipe
        self.plan = plan
        self.tables = tables
        self.tokenizer = tokenizer
        self.lane_states = lane_states
        self.start = start
        self.rank = rank
        self.world_size = world_size

    def produce(
        self, worker: int, workers: int, send: Send | None
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        """The batches of worker `worker` of `workers` (DataLoader workers or Ray actors).
        `send` turns a batch into what crosses the process boundary; None: in the loader's
        own process, where a `MixerError` is raised rather than sent as an item."""
        encoder = Encoder(self.tokenizer)
        layout = layout_for(self.recipe, self.tokenizer)
        IO_STATS.reset()  # count this iteration's reads (a worker's, not its parent's)
        # One read-ahead budget per worker, shared by all its open streams.
        streams = self.recipe.lanes // (workers * self.world_size) * len(self.recipe.sources)
        block = min(max(self.recipe.read_ahead_bytes // max(streams, 1), 256 << 10), 16 << 20)
        lanes: dict[int, Lane] = {}
        try:
            yield from self._batches(lanes, worker, workers, send, encoder, layout, block)
        finally:  # (not left to the cycle collector: open files, temporary files)
            for lane in lanes.values():
                lane.close()

    def _batches(
        self,
        lanes: dict[int, Lane],
        worker: int,
        workers: int,
        send: Send | None,
        encoder: Encoder,
        layout: BatchLayout,
        block: int,
    ) -> Iterator[tuple[Any, dict[str, Any]]]:
        step = worker
        clock = CLOCK.snapshot()  # this iteration's stage seconds: those since here
        while True:  # never stop: the main process decides the end
            g = global_batch(self.start, step, self.rank, self.world_size)
            index = lane_of(g, self.recipe.lanes)
            lane = lanes.get(index)
            if lane is None:
                lane = Lane(
                    index,
                    self.recipe,
                    self.tables,
                    encoder,
                    self.lane_states.get(index),
                    block_size=block,
                    layout=layout,
                    plan=self.plan,
                )
                lanes[index] = lane
            try:
                with timed(PACK):  # (the stages inside count as their own)
                    batch = lane.next_batch(self.recipe.batch_size)
                    state = lane.state_dict()
            except MixerError as exc:
                if send is None:
                    raise
                # Sent as an item, not raised: torch would re-create the error from its
                # message alone, losing `.source`, `.file` and `.location`.
                yield None, {"g": g, "error": exc, "worker": worker}
                return
            # Across a process boundary: for DataLoader workers one buffer in compact dtypes
            # through the pipe is cheaper than int64 tensors in shared memory (measured: about
            # half the time); Ray actors send arrays through the object store.
            sent: Any = batch
            if send is not None:
                with timed(TRANSFER):
                    sent = send(layout, batch)
            meta = {
                "g": g,
                "lane": index,
                "padding": batch.padding,
                "state": state,
                "worker": worker,
                "io": IO_STATS.as_dict(),
                "stages": since(clock),
            }
            yield sent, meta
            step += workers


def as_batch(layout: BatchLayout, data: Any, meta: dict) -> dict[str, torch.Tensor]:
    """The user's dict of tensors; lane metadata stays behind."""
    if isinstance(data, Wire):
        data = layout.from_wire(data, meta["padding"])
    return layout.to_torch(data)
