"""What `mixer inspect` reports: per-source sizes, estimates, repeats and read costs."""

from __future__ import annotations

import itertools
from typing import Any

from mixer.recipe import Recipe
from mixer.slices import read_amplification
from mixer.sources import FORMATS, SourceTable, Storage, read_split
from mixer.sources.manifest import list_sources
from mixer.tokenize import Encoder, resolve_tokenizer

_SAMPLE_DOCS = 256


def _sample(recipe: Recipe, index: int, table: SourceTable, encoder: Encoder) -> dict[str, float]:
    """Mean tokens per document and documents per stored byte, from the first split."""
    src = recipe.sources[index]
    split = table.splits[0]
    entry = table.files[split.file]
    storage = Storage(src.name, src.storage_options)
    records = read_split(storage=storage, entry=entry, split=split, source=src.name,
                         text_field=src.chosen_text_field, max_bytes=recipe.max_document_bytes,
                         index=0, offset=0)
    texts, last_offset, exhausted = [], 0, True
    for record in itertools.islice(records, _SAMPLE_DOCS + 1):
        if len(texts) == _SAMPLE_DOCS:
            exhausted, last_offset = False, record.offset
            break
        if record.text is not None:
            texts.append(record.text)
    if not texts:
        return {"tokens_per_doc": 0.0, "docs_per_byte": 0.0}
    tokens = sum(len(t) for t in encoder(texts)) / len(texts)
    docs_per_byte = FORMATS[entry.format].docs_per_byte(
        storage, entry, split, len(texts), None if exhausted else last_offset)
    return {"tokens_per_doc": tokens, "docs_per_byte": docs_per_byte}


def inspect_recipe(recipe: Recipe, *, training_tokens: int = 10**9) -> dict[str, Any]:
    """A JSON-able report of every source (no credentials: storage_options are never read out)."""
    info = resolve_tokenizer(recipe.resolve(recipe.tokenizer), recipe.eos_token)
    encoder = Encoder(info)
    rows = []
    tables = list_sources(recipe)
    for i, (src, weight, table) in enumerate(zip(recipe.sources, recipe.weights, tables)):
        sample = _sample(recipe, i, table, encoder)
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
    return {"training_tokens": training_tokens, "lanes": recipe.lanes, "seq_len": recipe.seq_len,
            "tokenizer": {"path": info.path, "eos_id": info.eos_id, "bos_id": info.bos_id,
                          "pad_id": info.pad_id, "vocab_size": info.vocab_size},
            "sources": rows}
