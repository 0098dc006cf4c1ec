"""What `mixer inspect` reports: per-source sizes, estimates, repeats and read costs.

Under an image layout the sampled records go through the layout's document builder, as in
training: each image's cost is planned from its header (resized size, tokens), never decoded,
and token estimates include image tokens (weights are over sequence tokens).
"""

from __future__ import annotations

import itertools
from typing import Any

from mixer.cache.store import tokenizer_info_dir
from mixer.config.recipe import Recipe
from mixer.core.document import Document
from mixer.images.select import layout_for
from mixer.pipeline.batch import BatchLayout
from mixer.pipeline.slices import read_amplification
from mixer.sources import FORMATS, SourceTable, Storage, read_split
from mixer.sources.manifest import list_sources
from mixer.tokenize import Encoder, resolve_backend, resolve_tokenizer

_SAMPLE_DOCS = 256
_CHUNK = 64


def _build(layout: BatchLayout, encoder: Encoder, source: str, texts: list[str],
           images: list, files: list[str]) -> dict[str, float]:
    """Sequence tokens, images and image tokens (the placeholders, as `preview` shows them:
    qwen2_vl's `<|vision_start|>`/`<|vision_end|>` count only as sequence tokens) of sampled
    records under an image layout, and how many became no document (oversize, or bad)."""
    builder = layout.document_builder(encoder, source)
    assert builder is not None
    out = {"tokens": 0, "images": 0, "image_tokens": 0, "videos": 0, "video_frames": 0,
           "video_tokens": 0, "oversize": 0, "rejected": 0}
    for at in range(0, len(texts), _CHUNK):
        stop = at + _CHUNK
        where = [f"{file} (sampled by inspect)" for file in files[at:stop]]
        for doc in builder.build(texts[at:stop], images[at:stop], files[at:stop], where):
            if not isinstance(doc, Document):
                out["oversize" if doc.oversize else "rejected"] += 1
                continue
            out["tokens"] += doc.cost
            for placement in doc.images:
                handle = placement.image
                kind = getattr(handle, "kind", "image")
                out[f"{kind}s"] += 1
                out[f"{kind}_tokens"] += handle.plan.tokens
                if kind == "video":
                    out["video_frames"] += handle.plan.frames
    return out


def _sample(recipe: Recipe, index: int, table: SourceTable, encoder: Encoder,
            layout: BatchLayout) -> dict[str, float]:
    """Per document: mean tokens (and images), and documents per stored byte, from the first
    split."""
    src = recipe.sources[index]
    split = table.splits[0]
    entry = table.files[split.file]
    storage = Storage(src.name, src.storage_options)
    records = read_split(storage=storage, entry=entry, split=split, source=src.name,
                         text_field=src.chosen_text_field, max_bytes=recipe.max_document_bytes,
                         index=0, offset=0, tokenizer=encoder.info)
    texts, images, last_offset, exhausted = [], [], 0, True
    stored: list[int] = []   # lengths of pre-tokenized documents
    for record in itertools.islice(records, _SAMPLE_DOCS + 1):
        if len(texts) + len(stored) == _SAMPLE_DOCS:
            exhausted, last_offset = False, record.offset
            break
        if record.text is not None:
            texts.append(record.text)
            images.append(record.images)
        elif record.tokens is not None:
            stored.append(len(record.tokens))
    docs_per_byte = FORMATS[entry.format].docs_per_byte(
        storage, entry, split, len(texts) + len(stored), None if exhausted else last_offset)
    if stored:
        return {"docs": len(stored), "tokens_per_doc": sum(stored) / len(stored),
                "docs_per_byte": docs_per_byte}
    if not texts:
        return {"docs": 0, "tokens_per_doc": 0.0, "docs_per_byte": 0.0}
    if layout.document_builder(encoder, src.name) is None:
        tokens = sum(len(t) for t in encoder(texts)) / len(texts)
        return {"docs": len(texts), "tokens_per_doc": tokens, "docs_per_byte": docs_per_byte}
    built = _build(layout, encoder, src.name, texts, images, [entry.url] * len(texts))
    n = len(texts)
    return {"docs": n, "tokens_per_doc": built["tokens"] / n, "docs_per_byte": docs_per_byte,
            "images_per_doc": built["images"] / n,
            "image_tokens_per_doc": built["image_tokens"] / n,
            "videos_per_doc": built["videos"] / n,
            "video_frames_per_doc": built["video_frames"] / n,
            "video_tokens_per_doc": built["video_tokens"] / n,
            "oversize": built["oversize"], "rejected": built["rejected"]}


def inspect_recipe(recipe: Recipe, *, training_tokens: int = 10**9) -> dict[str, Any]:
    """A JSON-able report of every source (no credentials: storage_options are never read out)."""
    info = resolve_tokenizer(recipe.resolve(recipe.tokenizer), recipe.eos_token)
    layout = layout_for(recipe, info)
    rows = []
    tables = list_sources(recipe)
    backend = resolve_backend(recipe, info, tables, info_cache=tokenizer_info_dir(recipe))
    info = backend.info
    encoder = Encoder(info)
    for i, (src, weight, table) in enumerate(zip(recipe.sources, recipe.weights, tables)):
        sample = _sample(recipe, i, table, encoder, layout)
        known = [s.records for s in table.splits]
        if all(n >= 0 for n in known):
            docs = float(sum(known))
        else:
            docs = sample["docs_per_byte"] * table.total_bytes
        tokens = docs * sample["tokens_per_doc"]
        compressed = [s.end - s.start for s in table.splits
                      if FORMATS[table.files[s.file].format].compression]
        rows.append({
            "name": src.name,
            "files": len(table.files),
            "splits": len(table.splits),
            "bytes": table.total_bytes,
            "est_documents": round(docs),
            "est_tokens": round(tokens),
            "weight": round(weight, 6),
            "epochs_cap": src.epochs,
            "repeats_per_training_tokens": (weight * training_tokens / tokens) if tokens else None,
            "read_amplification": read_amplification(len(table.splits), recipe.lanes),
            "worst_resume_bytes": max(compressed, default=0),
            "skipped_at_listing": len(table.skipped),
        })
        if recipe.images is not None:
            rows[-1].update(_image_columns(sample, docs))
        if recipe.images is not None and recipe.images.video is not None:
            rows[-1].update(_video_columns(sample, docs))
    return {"training_tokens": training_tokens, "lanes": recipe.lanes, "seq_len": recipe.seq_len,
            "tokenizer": {"path": info.path, "eos_id": info.eos_id, "bos_id": info.bos_id,
                          "pad_id": info.pad_id, "vocab_size": info.vocab_size,
                          "backend": info.backend, "backend_verdict": backend.describe()},
            "layout": layout.name, "sources": rows}


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
        "image_token_share": (tokens_per_doc / sample["tokens_per_doc"]
                              if sample["tokens_per_doc"] else 0.0),
        "sampled_oversize": sample.get("oversize", 0),
        "sampled_rejected": sample.get("rejected", 0),
    }


def _video_columns(sample: dict[str, float], docs: float) -> dict[str, Any]:
    """Video estimates of one source (sampled frames, and placeholder tokens)."""
    per_doc = sample.get("videos_per_doc", 0.0)
    tokens_per_doc = sample.get("video_tokens_per_doc", 0.0)
    return {
        "videos_per_doc": per_doc,
        "frames_per_video": (sample.get("video_frames_per_doc", 0.0) / per_doc
                             if per_doc else 0.0),
        "video_tokens_per_doc": tokens_per_doc,
        "est_videos": round(docs * per_doc),
        "est_video_tokens": round(docs * tokens_per_doc),
        "video_token_share": (tokens_per_doc / sample["tokens_per_doc"]
                              if sample["tokens_per_doc"] else 0.0),
    }
