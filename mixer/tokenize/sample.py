"""The first documents of every source, on which fastokens must match `tokenizers`.

A source's sample is its documents in listing order, from its first split on, until they
hold `SAMPLE_BYTES` of text (or the source ends); a document longer than that counts with its
first `SAMPLE_BYTES` characters. Pre-tokenized sources have no text and no sample. The splits
a sample comes from are named by `split_id` (file key, size, version, split), so a cached
verdict can be checked against a new listing without reading anything.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from mixer.core.token_info import TokenizerInfo
from mixer.sources import FORMATS, SourceTable, Storage, read_split

SAMPLE_BYTES = 256 << 10


@dataclass(frozen=True)
class SampledDocument:
    """One sampled document and where it was read, for a mismatch's message."""

    source: str
    number: int  # documents of the source before it, in the sample
    file: str
    where: str  # the format's words for its offset ("line 12", "row 3")
    text: str


def split_id(table: SourceTable, index: int) -> list:
    """What identifies split `index` of a source and its content (no URL)."""
    split = table.splits[index]
    entry = table.files[split.file]
    return [entry.key, entry.size, entry.version, split.to_list()]


def planned_splits(table: SourceTable) -> int:
    """How many of the source's first splits hold `SAMPLE_BYTES` of stored bytes (row groups
    count an equal share of their file): the splits a sample is expected to read."""
    per_file = Counter(s.file for s in table.splits)
    stored = 0
    for i, split in enumerate(table.splits):
        size = split.end - split.start
        if size <= 0:
            size = table.files[split.file].size // per_file[split.file]
        stored += size
        if stored >= SAMPLE_BYTES:
            return i + 1
    return len(table.splits)


def _has_text(table: SourceTable) -> bool:
    return bool(table.splits) and any(not FORMATS[f.format].pretokenized for f in table.files)


def sample_source(
    recipe: Any, index: int, table: SourceTable, tokenizer: TokenizerInfo
) -> tuple[list[SampledDocument], int]:
    """The source's sampled documents and how many of its first splits they came from."""
    src = recipe.sources[index]
    docs: list[SampledDocument] = []
    if not _has_text(table):
        return docs, 0
    storage = Storage(src.name, src.storage_options)
    size, used = 0, 0
    for split in table.splits:
        used += 1
        entry = table.files[split.file]
        records = read_split(
            storage=storage,
            entry=entry,
            split=split,
            source=src.name,
            text_field=src.chosen_text_field,
            max_bytes=recipe.max_document_bytes,
            index=0,
            offset=0,
            tokenizer=tokenizer,
        )
        try:
            for record in records:
                if record.text is None:  # an error record, or stored tokens
                    continue
                text = record.text[:SAMPLE_BYTES]
                docs.append(
                    SampledDocument(
                        src.name,
                        len(docs),
                        entry.url,
                        FORMATS[entry.format].describe_offset(split, record.offset),
                        text,
                    )
                )
                size += len(text.encode("utf-8", "surrogatepass"))
                if size >= SAMPLE_BYTES:
                    break
        finally:
            records.close()
        if size >= SAMPLE_BYTES:
            break
    return docs, used


def sample_sources(
    recipe: Any, tables: list[SourceTable], tokenizer: TokenizerInfo
) -> tuple[list[SampledDocument], dict[str, list]]:
    """Every source's sample, and per source the ids of the splits it was read from."""
    docs: list[SampledDocument] = []
    sampled: dict[str, list] = {}
    for i, table in enumerate(tables):
        found, used = sample_source(recipe, i, table, tokenizer)
        docs += found
        sampled[recipe.sources[i].name] = [split_id(table, k) for k in range(used)]
    return docs, sampled


def planned_ids(recipe: Any, tables: list[SourceTable]) -> dict[str, list]:
    """Per source, the ids of the splits its sample is expected to read (`planned_splits`)."""
    return {
        src.name: (
            [split_id(table, k) for k in range(planned_splits(table))] if _has_text(table) else []
        )
        for src, table in zip(recipe.sources, tables)
    }


def still_listed(sampled: dict[str, list], recipe: Any, tables: list[SourceTable]) -> bool:
    """Whether each source's first splits are still the ones `sampled` names."""
    names = [s.name for s in recipe.sources]
    if sorted(sampled) != sorted(names):
        return False
    for name, table in zip(names, tables):
        ids = sampled[name]
        if len(ids) > len(table.splits) or [split_id(table, k) for k in range(len(ids))] != ids:
            return False
    return True
