"""mixer: deterministic, resumable mixtures of tokenized training data.

The data path, by layer (each imports only those above it in this list; docs/architecture.md)::

    core/        errors, counter-based rng, atomic files, shared types (records, documents,
                 TokenizerInfo), the registries a recipe names (formats, packers)
    config/      YAML/dict -> validated, frozen Recipe (recipe_input.py: bounded reading)
    sources/     storage, listing once -> splits, manifests, the reader boundary;
                 formats/: one reader per format (jsonl, parquet, text, webdataset,
                 megatron, npy) and the registry; indexed.py: Megatron's .bin/.idx codec
    tokenize/    the recipe's tokenizer resolved once (EOS/BOS/pad); encoding.py: the chunk
                 rule and the encoding threads
    cache/       the token cache: a split's tokens as an indexed dataset, replayed instead
                 of text (store, entry, replay, blocks, spill; fill: `mixer cache`)
    pipeline/    per (lane, source): slices -> stream (slice_reader -> window -> encode_ahead
                 -> prefetch, cursor, emptiness) -> packing (concat | pad | best_fit);
                 per lane: mix (deficit rule), schedule, lanes -> batch (the text layout)
    images/      image+text: header probe, transformers-exact pixels, lazy handles, the
                 document builder, qwen2_vl / llava layouts; select.py picks a layout
    runtime/     loader (global batch g from lane g mod lanes; DataLoader workers serve
                 lanes; exact per-lane state), workers' lifetimes, dist (the only reader of
                 rank/world), metrics, state (+ codec, schema)
    tools/       the CLI (one module per command), bench harness, plan, preview, inspect's
                 report, metrics log and plots
"""

from mixer.config.recipe import Recipe, SourceConfig, load_recipe
from mixer.core.errors import DataError, MixerError, RecipeError, StateError, TopologyError
from mixer.pipeline.batch import BatchLayout
from mixer.runtime.loader import BATCH_KEYS, Loader, build_loader
from mixer.runtime.ray_workers import RayWorkers
from mixer.runtime.state import merge_states

__version__ = "0.1.0"


def is_padding_batch(batch: dict) -> bool:
    """True when a batch carries no token to learn from (an exhausted rank's placeholder)."""
    return BatchLayout.is_padding(batch)


__all__ = [
    "BATCH_KEYS", "DataError", "Loader", "MixerError", "RayWorkers", "Recipe", "RecipeError",
    "SourceConfig", "StateError", "TopologyError", "build_loader", "is_padding_batch",
    "load_recipe", "merge_states",
]
