"""What `mixer inspect` reads of a source: the first documents of up to 8 splits spread over it.

Each sampled split stands for its part of the source: the documents it holds (its record count
where known, else its documents per stored byte times its stored size) weigh its sample in the
per-document means (tokens, images), and the source's documents per byte are those documents
over the sampled splits' stored bytes. A source's first file is often its smallest or oddest,
and small files read whole would otherwise outweigh one large file read in part.

A split read to its end also says which of its records are documents, so the lanes that get
none of a striped source are counted from what is there (`lanes_without_documents`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from mixer.config.recipe import Recipe
from mixer.core.document import Document
from mixer.core.errors import MISSING_TEXT_FIELD, DataError
from mixer.images.video import VideoPlan
from mixer.pipeline.batch import BatchLayout
from mixer.pipeline.slices import stripe
from mixer.sources import FORMATS, SourceTable, Storage, read_split
from mixer.sources.boundary import probe_ratio
from mixer.tokenize import Encoder

SAMPLE_DOCS = 256  # documents read of a source, shared out over its sampled splits
SAMPLE_SPLITS = 8  # splits sampled of a source, spread over it
_CHUNK = 64


@dataclass
class SplitSample:
    """The first documents of one split, and how many documents the whole split holds."""

    split: int  # index into the source table's splits
    texts: list[str] = field(default_factory=list)
    images: list = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)  # lengths of pre-tokenized documents
    documents: list[int] = field(default_factory=list)  # record indexes of those read
    exhausted: bool = True  # read to its end
    holds: float = 0.0  # documents in the whole split (count or estimate)
    size: int = 0  # stored bytes
    errors: list[DataError] = field(default_factory=list)  # bad input skipped (on_error: skip)

    @property
    def count(self) -> int:
        return len(self.documents)


def sampled_splits(count: int, most: int = SAMPLE_SPLITS) -> list[int]:
    """Indexes of up to `most` splits spread evenly over `count` (first and last included)."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


def sample_source(
    recipe: Recipe, index: int, table: SourceTable, encoder: Encoder
) -> list[SplitSample]:
    """The first documents of each sampled split of source `index`.

    Bad input met while sampling (a record, or a compressed file whose head does not
    decode) raises its `DataError`, as reading would; under `on_error: skip` it is kept in
    the sample's `errors` instead."""
    src = recipe.sources[index]
    storage = Storage(src.name, src.storage_options)
    chosen = sampled_splits(len(table.splits))
    per_split = -(-SAMPLE_DOCS // max(len(chosen), 1))
    ratios: dict[str, float] = {}  # decompressed per stored byte, measured once a format

    def bad(sample: SplitSample, error: DataError) -> None:
        if src.on_error == "raise" and not _missing_field(error):
            raise error
        sample.errors.append(error)

    samples = []
    for at in chosen:
        split = table.splits[at]
        entry = table.files[split.file]
        sample = SplitSample(at, size=split.end - split.start or entry.size)
        last_offset = 0
        records = read_split(
            storage=storage,
            entry=entry,
            split=split,
            source=src.name,
            text_field=src.chosen_text_field,
            max_bytes=recipe.max_document_bytes,
            index=0,
            offset=0,
            tokenizer=encoder.info,
        )
        for record in itertools.islice(records, per_split + 1):
            if sample.count == per_split:
                sample.exhausted, last_offset = False, record.offset
                break
            if record.text is not None:
                sample.texts.append(record.text)
                sample.images.append(record.images)
                sample.files.append(entry.url)
            elif record.tokens is not None:
                sample.stored.append(len(record.tokens))
            else:  # a bad record: not a document
                if record.error is not None:
                    bad(sample, record.error)
                continue
            sample.documents.append(record.index)
        if split.records >= 0:
            sample.holds = float(split.records)
        else:
            fmt = FORMATS[entry.format]
            ratio = None
            if fmt.compression and not sample.exhausted and split.dend < 0:
                if entry.format not in ratios:
                    ratio, damage = probe_ratio(fmt, storage=storage, entry=entry, source=src.name)
                    if damage is not None:
                        bad(sample, damage)
                    ratios[entry.format] = ratio
                ratio = ratios[entry.format]
            per_byte = fmt.docs_per_byte(
                storage,
                entry,
                split,
                sample.count,
                None if sample.exhausted else last_offset,
                ratio,
            )
            sample.holds = per_byte * sample.size
        samples.append(sample)
    check_text_field(recipe, index, samples)
    return samples


def first_records(
    recipe: Recipe, index: int, table: SourceTable, encoder: Encoder, most: int = 8
) -> list[SplitSample]:
    """The first `most` records of source `index`'s first split (cheap to read), checked as
    `sample_source` checks its sample: a text field that none of them has is refused."""
    src = recipe.sources[index]
    if not table.splits:
        return []
    split, entry = table.splits[0], table.files[table.splits[0].file]
    sample = SplitSample(0, size=split.end - split.start or entry.size)
    records = read_split(
        storage=Storage(src.name, src.storage_options),
        entry=entry,
        split=split,
        source=src.name,
        text_field=src.chosen_text_field,
        max_bytes=recipe.max_document_bytes,
        index=0,
        offset=0,
        tokenizer=encoder.info,
    )
    try:
        for record in itertools.islice(records, most):
            if record.error is not None:
                sample.errors.append(record.error)
            elif record.text is not None or record.tokens is not None:
                sample.documents.append(record.index)
    finally:
        records.close()
    check_text_field(recipe, index, [sample])
    return [sample]


def _missing_field(error: DataError) -> bool:
    return error.reason == "bad_text" and error.message.startswith(MISSING_TEXT_FIELD)


def check_text_field(recipe: Recipe, index: int, samples: list[SplitSample]) -> None:
    """Raise a `DataError` when the records read of source `index` are there but none has
    its text field (whatever `on_error` says: skipping every record is no data); it names
    the field and the keys or columns the records have. A record without it among others
    that have it is bad input like any other (raised, or skipped and counted)."""
    errors = [e for s in samples for e in s.errors]
    if any(s.count for s in samples) or not errors or not all(map(_missing_field, errors)):
        src = recipe.sources[index]
        if src.on_error == "raise":
            missing = next((e for e in errors if _missing_field(e)), None)
            if missing is not None:
                raise missing
        return
    first = errors[0]
    raise DataError(
        f"no record read has the text field (sources[{index}].text_field): {first.message}",
        source=first.source,
        file=first.file,
        location=first.location,
        reason="bad_text",
    )


def summarize(
    samples: list[SplitSample], layout: BatchLayout, encoder: Encoder, source: str
) -> dict[str, float]:
    """Per document: mean tokens (and images), each split's sample weighed by the documents
    the split holds; documents per stored byte over the sampled splits."""
    size = sum(s.size for s in samples)
    out: dict[str, Any] = {
        "docs": sum(s.count for s in samples),
        "docs_per_byte": sum(s.holds for s in samples) / size if size else 0.0,
        "tokens_per_doc": 0.0,
    }
    read = [s for s in samples if s.count]
    if not read:
        return out
    builder = layout.document_builder(encoder, source)
    sums = []
    for s in read:
        if s.stored:
            sums.append({"tokens": sum(s.stored)})
        elif builder is None:
            sums.append({"tokens": sum(len(t) for t in encoder(s.texts))})
        else:
            sums.append(_build(builder, s.texts, s.images, s.files))
    weights = [s.holds / s.count for s in read]
    if not any(weights):  # (nothing says how the splits compare: each document alike)
        weights = [1.0] * len(read)
    documents = sum(w * s.count for w, s in zip(weights, read))

    def mean(key: str) -> float:
        return sum(w * part.get(key, 0) for w, part in zip(weights, sums)) / documents

    out["tokens_per_doc"] = mean("tokens")
    if builder is not None and not any(s.stored for s in read):
        for key in (
            *("images", "image_tokens", "videos", "video_frames", "video_tokens"),
            *("audios", "audio_tokens"),
        ):
            out[f"{key}_per_doc"] = mean(key)
        out["oversize"] = sum(part["oversize"] for part in sums)
        out["rejected"] = sum(part["rejected"] for part in sums)
    return out


def lanes_without_documents(recipe: Recipe, table: SourceTable, samples: list[SplitSample]) -> int:
    """Lanes that get none of a striped source's documents in any epoch. With fewer splits
    than lanes, lane l reads the split dealt to position l mod n (a different split each
    epoch) and keeps its records whose index mod m is l div n (m: the lanes at that
    position); when no split has a document at such an index, the lane never gives the
    source a token, and its realized share falls short of its weight. Splits read whole
    are judged by their documents, others by their record count (else taken to hold some)."""
    splits, lanes = table.splits, recipe.lanes
    n = len(splits)
    if n == 0 or n >= lanes:
        return 0
    whole = {s.split: s.documents for s in samples if s.exhausted}

    def gives(split: int, stride: int, phase: int) -> bool:
        if split in whole:
            return any(index % stride == phase for index in whole[split])
        records = splits[split].records
        return records < 0 or phase < records

    return sum(
        not any(gives(split, *stripe(lane, lanes, n)) for split in range(n))
        for lane in range(lanes)
    )


def _build(builder: Any, texts: list[str], images: list, files: list[str]) -> dict[str, int]:
    """Sequence tokens, images and image tokens (the placeholders, as `preview` shows them:
    qwen2_vl's `<|vision_start|>`/`<|vision_end|>` count only as sequence tokens) of sampled
    records under an image layout's document `builder`, and how many became no document
    (oversize, or bad)."""
    out = {
        "tokens": 0,
        "images": 0,
        "image_tokens": 0,
        "videos": 0,
        "video_frames": 0,
        "video_tokens": 0,
        "audios": 0,  # audio clips (`LazyAudio.kind`)
        "audio_tokens": 0,
        "oversize": 0,
        "rejected": 0,
    }
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
                out[f"{handle.kind}s"] += 1
                out[f"{handle.kind}_tokens"] += handle.plan.tokens
                if isinstance(handle.plan, VideoPlan):
                    out["video_frames"] += handle.plan.frames
    return out
