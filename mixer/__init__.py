"""mixer: deterministic, resumable mixtures of tokenized training data.

The data path, by layer (each imports only those above it in this list; docs/architecture.md)::

    core/        errors, counter-based rng, atomic files, shared types (records, documents,
                 TokenizerInfo), the registries a recipe names (formats, packers)
    mixing/      online mixing algorithms (ODM, ADO) and their registry; torch-free
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
    integrations/  HF Trainer, Lightning, torchtitan and TensorBoard adapters (each imports
                 its framework; `import mixer` imports none)
"""

import importlib
from typing import TYPE_CHECKING, Any

import mixer.pipeline.packers  # noqa: F401  (fills the registries a recipe is checked against:
import mixer.sources.formats  # noqa: F401   packers and formats)
from mixer.config.recipe import Recipe, SourceConfig, load_recipe
from mixer.core.errors import DataError, MixerError, RecipeError, StateError, TopologyError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mixer.pipeline.batch import is_padding_batch
    from mixer.runtime.loader import BATCH_KEYS, Loader, build_loader
    from mixer.runtime.ray_workers import RayWorkers
    from mixer.runtime.state import merge_states

# Imported on first use, so that `import mixer` (and the CLI's start) does not import torch:
# name -> module that defines it.
_LAZY = {
    "BATCH_KEYS": "mixer.runtime.loader",
    "Loader": "mixer.runtime.loader",
    "build_loader": "mixer.runtime.loader",
    "RayWorkers": "mixer.runtime.ray_workers",
    "merge_states": "mixer.runtime.state",
    "is_padding_batch": "mixer.pipeline.batch",
    "loss_by_source": "mixer.runtime.loss_sums",
}
_LAYERS = (
    "core",
    "mixing",
    "config",
    "sources",
    "tokenize",
    "cache",
    "pipeline",
    "images",
    "runtime",
    "tools",
    "integrations",
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _LAYERS:  # `mixer.runtime.state` after a bare `import mixer`, as before
        module = importlib.import_module(f"mixer.{name}")
        if name == "runtime":
            importlib.import_module("mixer.runtime.loader")
        return module
    raise AttributeError(f"module 'mixer' has no attribute {name!r}")


__all__ = [
    "BATCH_KEYS",
    "DataError",
    "Loader",
    "MixerError",
    "RayWorkers",
    "Recipe",
    "RecipeError",
    "SourceConfig",
    "StateError",
    "TopologyError",
    "build_loader",
    "is_padding_batch",
    "load_recipe",
    "loss_by_source",
    "merge_states",
]
