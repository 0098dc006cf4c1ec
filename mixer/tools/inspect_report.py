"""What `mixer inspect` reports: per-source sizes, estimates, repeats and read costs.

Estimates come from the first documents of up to 8 splits spread over each source
(`tools.sampling`). Under an image layout the sampled records go through the layout's
document builder, as in training: each image's cost is planned from its header (resized size,
tokens), never decoded, and token estimates include image tokens (weights are over sequence
tokens). Under the audio layout each sampled clip is decoded once to learn its tokens.
"""

from __future__ import annotations

from typing import Any

from mixer.cache.tokenizer_setup import recipe_backend, recipe_tokenizer
from mixer.config.recipe import Recipe
from mixer.images.select import layout_for
from mixer.pipeline.slices import read_amplification
from mixer.sources import FORMATS
from mixer.sources.manifest import list_sources
from mixer.tokenize import Encoder
from mixer.tools.sampling import lanes_without_documents, sample_source, summarize


def inspect_recipe(recipe: Recipe, *, training_tokens: int = 10**9) -> dict[str, Any]:
    """A JSON-able report of every source (no credentials: storage_options are never read out)."""
    info = recipe_tokenizer(recipe)
    layout = layout_for(recipe, info)
    rows = []
    tables = list_sources(recipe)
    backend = recipe_backend(recipe, tables, info)
    info = backend.info
    encoder = Encoder(info)
    for i, (src, weight, table) in enumerate(zip(recipe.sources, recipe.weights, tables)):
        samples = sample_source(recipe, i, table, encoder)
        errors = [e for s in samples for e in s.errors]
        sample = summarize(samples, layout, encoder, src.name)
        known = [s.records for s in table.splits]
        if all(n >= 0 for n in known):
            docs = float(sum(known))
        else:
            docs = sample["docs_per_byte"] * table.total_bytes
        tokens = docs * sample["tokens_per_doc"]
        compressed = [
            s.end - s.start for s in table.splits if FORMATS[table.files[s.file].format].compression
        ]
        rows.append(
            {
                "name": src.name,
                "files": len(table.files),
                "splits": len(table.splits),
                "bytes": table.total_bytes,
                "est_documents": round(docs),
                "est_tokens": round(tokens),
                "weight": round(weight, 6),
                "epochs_cap": src.epochs,
                "repeats_per_training_tokens": (weight * training_tokens / tokens)
                if tokens
                else None,
                "read_amplification": read_amplification(len(table.splits), recipe.lanes),
                "lanes_without_documents": lanes_without_documents(recipe, table, samples),
                "worst_resume_bytes": max(compressed, default=0),
                "skipped_at_listing": len(table.skipped),
                "skipped_in_sample": len(errors),
                "first_skipped": str(errors[0]) if errors else None,
            }
        )
        if recipe.images is not None:
            rows[-1].update(_image_columns(sample, docs))
        if recipe.images is not None and recipe.images.video is not None:
            rows[-1].update(_video_columns(sample, docs))
        if recipe.audio is not None:
            rows[-1].update(_audio_columns(sample, docs))
    return {
        "training_tokens": training_tokens,
        "lanes": recipe.lanes,
        "seq_len": recipe.seq_len,
        "tokenizer": {
            "path": info.path,
            "eos_id": info.eos_id,
            "bos_id": info.bos_id,
            "pad_id": info.pad_id,
            "vocab_size": info.vocab_size,
            "backend": info.backend,
            "backend_verdict": backend.describe(),
        },
        "layout": layout.name,
        "sources": rows,
    }


def _image_columns(sample: dict[str, float], docs: float) -> dict[str, Any]:
    """Image estimates of one source: per sampled document, and over the source."""
    per_doc = sample.get("images_per_doc", 0.0)
    tokens_per_doc = sample.get("image_tokens_per_doc", 0.0)
    return {
        "sampled_documents": sample["docs"],
        "images_per_doc": per_doc,
        "image_tokens_per_doc": tokens_per_doc,
        "est_images": round(docs * per_doc),
        "est_image_tokens": round(docs * tokens_per_doc),
        "image_token_share": (
            tokens_per_doc / sample["tokens_per_doc"] if sample["tokens_per_doc"] else 0.0
        ),
        "sampled_oversize": sample.get("oversize", 0),
        "sampled_rejected": sample.get("rejected", 0),
    }


def _video_columns(sample: dict[str, float], docs: float) -> dict[str, Any]:
    """Video estimates of one source (sampled frames, and placeholder tokens)."""
    per_doc = sample.get("videos_per_doc", 0.0)
    tokens_per_doc = sample.get("video_tokens_per_doc", 0.0)
    return {
        "videos_per_doc": per_doc,
        "frames_per_video": (sample.get("video_frames_per_doc", 0.0) / per_doc if per_doc else 0.0),
        "video_tokens_per_doc": tokens_per_doc,
        "est_videos": round(docs * per_doc),
        "est_video_tokens": round(docs * tokens_per_doc),
        "video_token_share": (
            tokens_per_doc / sample["tokens_per_doc"] if sample["tokens_per_doc"] else 0.0
        ),
    }


def _audio_columns(sample: dict[str, float], docs: float) -> dict[str, Any]:
    """Audio estimates of one source: clips and their `<|AUDIO|>` tokens (each sampled clip
    decoded once, as the loader plans it)."""
    per_doc = sample.get("audios_per_doc", 0.0)
    tokens_per_doc = sample.get("audio_tokens_per_doc", 0.0)
    return {
        "sampled_documents": sample["docs"],
        "clips_per_doc": per_doc,
        "audio_tokens_per_doc": tokens_per_doc,
        "est_clips": round(docs * per_doc),
        "est_audio_tokens": round(docs * tokens_per_doc),
        "audio_token_share": (
            tokens_per_doc / sample["tokens_per_doc"] if sample["tokens_per_doc"] else 0.0
        ),
        "sampled_oversize": sample.get("oversize", 0),
        "sampled_rejected": sample.get("rejected", 0),
    }
