"""Test data: integer-token documents whose tokens name the document, in every format.

Document d of a corpus is the word `w{d}` repeated `length` times, so its tokens are all
`d + FIRST_WORD_ID`: counting tokens proves coverage and exactly-once delivery.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

EOS_ID = 0
PAD_ID = 1
FIRST_WORD_ID = 2
VOCAB_WORDS = 30000


def word_id(doc: int) -> int:
    return doc + FIRST_WORD_ID


def make_tokenizer(path: Path, *, eos: bool = True) -> Path:
    vocab = {"<|endoftext|>" if eos else "<unk>": EOS_ID, "<pad>": PAD_ID}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>" if eos else "<unk>", "<pad>"])
    tok.save(str(path))
    return path


def doc_text(doc: int, length: int) -> str:
    return " ".join([f"w{doc}"] * length)


def write_docs(
    path: Path,
    docs: list[tuple[int, int]],
    fmt: str,
    *,
    field: str = "text",
    row_group_size: int = 16,
) -> Path:
    """Write (doc id, length) documents to `path` in `fmt`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = [doc_text(d, n) for d, n in docs]
    lines = "".join(json.dumps({field: t, "id": d}) + "\n" for t, (d, _) in zip(texts, docs))
    if fmt == "jsonl":
        path.write_text(lines)
    elif fmt == "jsonl.gz":
        path.write_bytes(gzip.compress(lines.encode()))
    elif fmt == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    elif fmt == "parquet":
        pq.write_table(pa.table({field: texts}), path, row_group_size=row_group_size)
    elif fmt == "text":
        assert len(docs) == 1
        path.write_text(texts[0])
    else:
        raise ValueError(fmt)
    return path


def corpus(
    first: int, count: int, *, min_len: int = 1, max_len: int = 40, seed: int = 0
) -> list[tuple[int, int]]:
    """`count` documents with ids from `first` and pseudo-random lengths."""
    out = []
    for d in range(first, first + count):
        h = int(hashlib.md5(f"{seed}:{d}".encode()).hexdigest(), 16)
        out.append((d, min_len + h % (max_len - min_len + 1)))
    return out


def token_counts(batches: Iterable[dict]) -> Counter:
    """Counter of real (non-padding) tokens over batches."""
    counts: Counter = Counter()
    for b in batches:
        ids = b["input_ids"][b["source_ids"] >= 0]
        counts.update(ids.tolist())
    return counts


def expected_counts(docs: list[tuple[int, int]], epochs: int = 1) -> Counter:
    counts: Counter = Counter()
    for d, n in docs:
        counts[word_id(d)] += n * epochs
    counts[EOS_ID] += len(docs) * epochs
    return counts


# metrics() keys that measure this iteration's time and processes rather than what was
# delivered: they differ between num_workers, Ray actors and runs of the same stream.
MEASURED_KEYS = ("io", "stages", "wait", "bottleneck", "workers")


def delivered_metrics(metrics: dict) -> dict:
    """`metrics` without `MEASURED_KEYS`: what two transports of one stream agree on."""
    return {k: v for k, v in metrics.items() if k not in MEASURED_KEYS}


def batch_digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in ("input_ids", "labels", "position_ids", "source_ids"):
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


# -- fuzzing: structural and byte mutations of plain data ---------------------------------------

JUNK = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    2**64,
    -(2**63) - 1,
    10**30,
    "",
    "x",
    "1",
    "nan",
    [],
    {},
    [1],
    {"x": 1},
    [[[]]],
    float("nan"),
    float("inf"),
    -float("inf"),
    1e308,
]


def take_digests(loader, n: int, seconds: float = 120) -> list[str]:
    """The digests of the loader's first `n` batches (within `seconds`); the loader closed."""
    from deadline import deadline

    out = []
    with deadline(seconds):
        for batch in loader:
            out.append(batch_digest(batch))
            if len(out) == n:
                break
    loader.close()
    return out


def _paths(value, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, prefix + (i,))
    return out


def _mutate_once(draw, value):
    path = draw(st.sampled_from(_paths(value)))
    op = draw(st.sampled_from(["replace", "replace", "delete", "add", "wrap", "copy"]))
    junk = copy.deepcopy(draw(st.sampled_from(JUNK)))  # JUNK itself must never change
    if not path:
        return junk if op in ("replace", "delete") else [value] if op == "wrap" else value
    parent = value
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "replace":
        parent[last] = junk
    elif op == "delete":
        del parent[last]
    elif op == "add":
        target = parent[last]
        if isinstance(target, dict):
            target[draw(st.sampled_from(["x", "parquet", "str", "0", "lanes"]))] = junk
        elif isinstance(target, list):
            target.append(junk)
        else:
            parent[last] = junk
    elif op == "wrap":
        parent[last] = draw(st.sampled_from([[parent[last]], {"x": parent[last]}]))
    else:  # copy another part of the data here
        other = draw(st.sampled_from(_paths(value)))
        source = value
        for part in other:
            source = source[part]
        parent[last] = copy.deepcopy(source)
    return value


def structural_mutations(value):
    """A strategy of deep copies of `value` with one to three structural edits."""

    @st.composite
    def mutated(draw):
        out = copy.deepcopy(value)
        for _ in range(draw(st.integers(1, 3))):
            out = _mutate_once(draw, out)
        return out

    return mutated()


def apply_ops(data: bytes, ops: list[tuple[str, int, bytes]]) -> bytes:
    """`data` with each (kind, at, payload) applied: flip a byte, truncate, or insert."""
    for kind, at, payload in ops:
        at = at % (len(data) + 1)
        if kind == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ (payload[0] | 1)]) + data[at + 1 :]
        elif kind == "truncate":
            data = data[:at]
        elif kind == "insert":
            data = data[:at] + payload + data[at:]
    return data


def byte_mutations(data: bytes, alphabet: bytes = b""):
    """A strategy of `data` with one to eight bytes replaced, inserted, deleted or duplicated."""
    chunk = st.one_of(
        st.binary(min_size=1, max_size=8),
        st.sampled_from([bytes([b]) for b in alphabet] or [b"\x00"]),
    )

    @st.composite
    def mutated(draw):
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(out)))
            op = draw(st.sampled_from(["replace", "insert", "delete", "duplicate"]))
            if op == "replace" and at < len(out):
                out[at : at + 1] = draw(chunk)
            elif op == "insert":
                out[at:at] = draw(chunk)
            elif op == "delete":
                del out[at : at + draw(st.integers(1, 16))]
            else:
                out[at:at] = out[at : at + draw(st.integers(1, 64))]
        return bytes(out)

    return mutated()
