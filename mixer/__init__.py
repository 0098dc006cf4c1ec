"""mixer: deterministic, resumable mixtures of tokenized training data.

The data path, one module per stage::

    recipe.py        YAML/dict -> validated, frozen Recipe (recipe_input.py: bounded reading)
    sources/         list each source once (listing.py) -> splits; the format registry
                     (formats.py) names each format's reader (jsonl, parquet, text, webdataset)
    slices.py        epoch e: permute splits, deal them to lanes (stripe when too few)
    stream.py        per (lane, source): read the slice, window-shuffle, tokenize in batches
    document.py      a document: token ids plus lazy image handles (cost known before decoding)
    images/          image+text: header probe, transformers-exact pixels, the document builder
                     (markers, placeholders, fitting a row), qwen2_vl / llava layouts
    tokenize/        tokenizer adapter (EOS/BOS) and the packer registry
                     (concat | pad | best_fit) -> rows; the token cache (cache.py: a
                     split's tokens as a Megatron indexed dataset, read instead of text)
    mix.py           per lane: deficit rule picks the source of each row (token weights)
    lanes.py         a lane = packers + mixing counters -> whole batches, small state
    batch.py         the batch layout: keys, dtypes, worker-to-main wire format
    loader.py        global batch g comes from lane g mod lanes; DataLoader workers serve
                     lanes; the main process keeps exact per-lane state (state.py, its
                     shape checked on load by state_schema.py, lanes written column by
                     column by state_codec.py)
    workers.py       DataLoader workers die with the process that owns the loader
    dist.py          the only place that asks torch.distributed about rank and world size
    cli.py           `mixer validate | inspect | plan | cache | preview | bench | report`
                     (report.py: inspect's numbers; plan.py: a run's plan; metrics_log.py
                     and plots.py: the metrics log and its figure)
"""

from mixer.config.recipe import Recipe, SourceConfig, load_recipe
from mixer.core.errors import DataError, MixerError, RecipeError, StateError, TopologyError
from mixer.pipeline.batch import BatchLayout
from mixer.runtime.loader import BATCH_KEYS, Loader, build_loader
from mixer.runtime.state import merge_states

__version__ = "0.1.0"


def is_padding_batch(batch: dict) -> bool:
    """True when a batch carries no token to learn from (an exhausted rank's placeholder)."""
    return BatchLayout.is_padding(batch)


__all__ = [
    "BATCH_KEYS", "DataError", "Loader", "MixerError", "Recipe", "RecipeError", "SourceConfig",
    "StateError", "TopologyError", "build_loader", "is_padding_batch", "load_recipe",
    "merge_states",
]
