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
from mixer.pipeline.slices import lane_slice, read_amplification
from mixer.sources import FORMATS, SourceTable, Storage, read_split
from mixer.sources.manifest import list_sources
from mixer.tokenize import Encoder, resolve_backend, resolve_tokenizer

_SAMPLE_DOCS = 256
_SAMPLE_SPLITS = 8   # splits sampled a source, spread over it
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


def sampled_splits(count: int, most: int = _SAMPLE_SPLITS) -> list[int]:
    """Indexes of up to `most` splits spread evenly over `count` (first and last included):
    files of one source differ (a source's first file is often its smallest or oddest)."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


def _sample(recipe: Recipe, index: int, table: SourceTable, encoder: Encoder,
            layout: BatchLayout) -> dict[str, float]:
    """Per document: mean tokens (and images), and documents per stored byte, from the
    first documents of up to `_SAMPLE_SPLITS` splits spread over the source."""
    src = recipe.sources[index]
    storage = Storage(src.name, src.storage_options)
    chosen = sampled_splits(len(table.splits))
    per_split = -(-_SAMPLE_DOCS // len(chosen))
    texts, images, files = [], [], []
    stored: list[int] = []   # lengths of pre-tokenized documents
    docs_read, bytes_spanned = 0, 0.0
    for at in chosen:
        split = table.splits[at]
        entry = table.files[split.file]
        records = read_split(storage=storage, entry=entry, split=split, source=src.name,
                             text_field=src.chosen_text_field,
                             max_bytes=recipe.max_document_bytes, index=0, offset=0,
                             tokenizer=encoder.info)
        count, last_offset, exhausted = 0, 0, True
        for record in itertools.islice(records, per_split + 1):
            if count == per_split:
                exhausted, last_offset = False, record.offset
                break
            if record.text is not None:
                texts.append(record.text)
                images.append(record.images)
                files.append(entry.url)
                count += 1
            elif record.tokens is not None:
                stored.append(len(record.tokens))
                count += 1
        per_byte = FORMATS[entry.format].docs_per_byte(
            storage, entry, split, count, None if exhausted else last_offset)
        docs_read += count
        bytes_spanned += count / per_byte if per_byte > 0 else max(split.end - split.start, 1)
    docs_per_byte = docs_read / bytes_spanned if bytes_spanned else 0.0
    if stored:
        return {"docs": len(stored), "tokens_per_doc": sum(stored) / len(stored),
                "docs_per_byte": docs_per_byte}
    if not texts:
        return {"docs": 0, "tokens_per_doc": 0.0, "docs_per_byte": 0.0}
    if layout.document_builder(encoder, src.name) is None:
        tokens = sum(len(t) for t in encoder(texts)) / len(texts)
        return {"docs": len(texts), "tokens_per_doc": tokens, "docs_per_byte": docs_per_byte}
    built = _build(layout, encoder, src.name, texts, images, files)
    n = len(texts)
    return {"docs": n, "tokens_per_doc": built["tokens"] / n, "docs_per_byte": docs_per_byte,
            "images_per_doc": built["images"] / n,
            "image_tokens_per_doc": built["image_tokens"] / n,
            "videos_per_doc": built["videos"] / n,
            "video_frames_per_doc": built["video_frames"] / n,
            "video_tokens_per_doc": built["video_tokens"] / n,
            "oversize": built["oversize"], "rejected": built["rejected"]}


def lanes_without_documents(recipe: Recipe, name: str, table: SourceTable,
                            est_documents: float) -> int:
    """Lanes that get none of the source's documents in its first epoch: a striped split
    (fewer splits than lanes) with fewer documents than the lanes sharing it leaves some
    with nothing, so the source's realized share falls short of its weight. Documents per
    split are the split's own count where known, else the source's estimate spread evenly."""
    splits = tuple(table.splits)
    if not splits or len(splits) >= recipe.lanes:
        return 0
    spread = est_documents / len(splits)
    starved = 0
    for lane in range(recipe.lanes):
        (item,) = lane_slice(splits, seed=recipe.seed, source=name, epoch=0,
                             lanes=recipe.lanes, lane=lane)
        known = splits[item.split].records
        if item.phase >= (known if known >= 0 else spread):
            starved += 1
    return starved


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
            "lanes_without_documents": lanes_without_documents(recipe, src.name, table, docs),
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
