"""The loaders mixer is compared with, each built the way its library is meant to be used.

Every loader yields `(input_ids, source_ids)` per batch, both [batch_size, seq_len] int64
(source_ids: the source index of each token), and offers `state()` / resume where its library
has a state mechanism:

    generator   hand-written: read files in order, tokenize, pack per source, weighted
                random choice of the source of each row; no state
    hf          `datasets` streaming: interleave_datasets(probabilities) over tokenized
                documents, concat packing (rows mix sources); its IterableDataset state
    torchdata   torchdata.nodes: per source read -> batch 64 -> tokenize -> unbatch -> pack
                rows; MultiNodeWeightedSampler picks each row's source; its node state

Ranks: each source's shards are split between ranks (shard i goes to rank i mod world).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import zstandard
from corpus import FIELDS, WEIGHTS, Corpus

SOURCES = list(WEIGHTS)
TOKENIZE_CHUNK = 64


def read_documents(
    corpus: Corpus, source: str, rank: int = 0, world_size: int = 1
) -> Iterator[str]:
    """The texts of one source's shards for this rank, in file order."""
    for path in corpus.files(source)[rank::world_size]:
        if path.name.endswith(".parquet"):
            for batch in pq.ParquetFile(path).iter_batches(columns=[FIELDS[source]]):
                yield from batch.column(0).to_pylist()
            continue
        with open(path, "rb") as raw:
            stream: Any = raw
            if path.name.endswith(".zst"):
                stream = zstandard.ZstdDecompressor().stream_reader(raw)
            for line in io.TextIOWrapper(stream, encoding="utf-8"):
                yield json.loads(line)[FIELDS[source]]


def encoder(corpus: Corpus) -> Callable[[list[str]], list[list[int]]]:
    """Encode a chunk of texts (one `encode_batch_fast` call), EOS appended to each."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(corpus.tokenizer))
    eos = tok.token_to_id("<|endoftext|>")

    def encode(texts: list[str]) -> list[list[int]]:
        return [enc.ids + [eos] for enc in tok.encode_batch_fast(texts, add_special_tokens=False)]

    return encode


class Loader:
    """What the benchmark drives: an iterator of source-id batches, optionally with state."""

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError

    def state(self) -> Any:
        """JSON-serialisable state after the last batch yielded (None: not resumable)."""
        return None


# -- hand-written generator --------------------------------------------------------------------
class Generator(Loader):
    """Files in order, tokenized in chunks of 64, concat-packed per source, weighted choice."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        seq_len: int,
    ) -> None:
        self.corpus, self.rank, self.world_size = corpus, rank, world_size
        self.seed, self.batch_size, self.seq_len = seed, batch_size, seq_len

    def _rows(self, source: str, encode: Callable) -> Iterator[list[int]]:
        buf: list[int] = []
        while True:  # repeat the source forever
            docs = read_documents(self.corpus, source, self.rank, self.world_size)
            while chunk := [t for _, t in zip(range(TOKENIZE_CHUNK), docs)]:
                for ids in encode(chunk):
                    buf.extend(ids)
                while len(buf) >= self.seq_len:
                    yield buf[: self.seq_len]
                    del buf[: self.seq_len]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        encode = encoder(self.corpus)
        rows = [self._rows(s, encode) for s in SOURCES]
        rng = random.Random(self.seed)
        weights = [WEIGHTS[s] for s in SOURCES]
        while True:
            picks = rng.choices(range(len(SOURCES)), weights, k=self.batch_size)
            ids = np.array([next(rows[i]) for i in picks], dtype=np.int64)
            yield ids, np.repeat(np.array(picks, dtype=np.int64)[:, None], self.seq_len, axis=1)


# -- Hugging Face datasets, streaming ------------------------------------------------------------
class HFStreaming(Loader):
    """`datasets` streaming: interleave tokenized documents by probability, pack in order."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        seq_len: int,
        resume: Any = None,
    ) -> None:
        from datasets import interleave_datasets, load_dataset
        from datasets.distributed import split_dataset_by_node

        encode = encoder(corpus)
        parts = []
        for index, source in enumerate(SOURCES):
            files = [str(p) for p in corpus.files(source)]
            kind = "parquet" if source == "code" else "json"
            ds = load_dataset(kind, data_files=files, split="train", streaming=True)
            ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
            field = FIELDS[source]
            ds = ds.map(
                lambda b, i=index, f=field: {
                    "ids": (ids := encode(b[f])),
                    "source": [i] * len(ids),
                },
                batched=True,
                batch_size=TOKENIZE_CHUNK,
                remove_columns=[field],
            )
            parts.append(ds)
        self.dataset = interleave_datasets(
            parts,
            probabilities=[WEIGHTS[s] for s in SOURCES],
            seed=seed,
            stopping_strategy="all_exhausted",
        )
        self.batch_size, self.seq_len = batch_size, seq_len
        self._ids: list[int] = []
        self._src: list[int] = []
        if resume is not None:
            self.dataset.load_state_dict(resume["dataset"])
            self._ids, self._src = resume["ids"], resume["src"]

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        need = self.batch_size * self.seq_len
        for example in self.dataset:
            self._ids.extend(example["ids"])
            self._src.extend([example["source"]] * len(example["ids"]))
            while len(self._src) >= need:
                ids = np.array(self._ids[:need], dtype=np.int64).reshape(self.batch_size, -1)
                src = np.array(self._src[:need], dtype=np.int64).reshape(self.batch_size, -1)
                del self._ids[:need], self._src[:need]
                yield ids, src

    def state(self) -> Any:
        return {
            "dataset": self.dataset.state_dict(),
            "ids": list(self._ids),
            "src": list(self._src),
        }


# -- torchdata.nodes ---------------------------------------------------------------------------
def _row_packer(base: type) -> type:
    class RowPacker(base):  # type: ignore[misc, valid-type]
        """Concatenate a source's tokenized documents and cut rows of `seq_len` (stateful)."""

        def __init__(self, source: Any, index: int, seq_len: int) -> None:
            super().__init__()
            self.source, self.index, self.seq_len = source, index, seq_len
            self._buf: list[int] = []

        def reset(self, initial_state: dict | None = None) -> None:
            super().reset(initial_state)
            self.source.reset(initial_state["source"] if initial_state else None)
            self._buf = list(initial_state["buf"]) if initial_state else []

        def next(self) -> tuple[int, list[int]]:
            while len(self._buf) < self.seq_len:
                self._buf.extend(next(self.source))
            row = self._buf[: self.seq_len]
            del self._buf[: self.seq_len]
            return self.index, row

        def get_state(self) -> dict:
            return {"source": self.source.state_dict(), "buf": list(self._buf)}

    return RowPacker


class _Documents:
    """Re-iterable texts of one source (torchdata's IterableWrapper re-iterates on reset)."""

    def __init__(self, corpus: Corpus, source: str, rank: int, world_size: int) -> None:
        self.args = (corpus, source, rank, world_size)

    def __iter__(self) -> Iterator[str]:
        return read_documents(*self.args)


class TorchdataNodes(Loader):
    """torchdata.nodes: per-source read, tokenize, pack; a weighted sampler picks rows."""

    def __init__(
        self,
        corpus: Corpus,
        *,
        rank: int,
        world_size: int,
        seed: int,
        batch_size: int,
        seq_len: int,
        resume: Any = None,
    ) -> None:
        from torchdata import nodes

        encode = encoder(corpus)
        packer = _row_packer(nodes.BaseNode)
        rows = {}
        for index, source in enumerate(SOURCES):
            node = nodes.IterableWrapper(_Documents(corpus, source, rank, world_size))
            node = nodes.Batcher(node, batch_size=TOKENIZE_CHUNK, drop_last=False)
            node = nodes.Unbatcher(nodes.Mapper(node, encode))
            rows[source] = packer(node, index, seq_len)
        mixed = nodes.MultiNodeWeightedSampler(
            rows,
            dict(WEIGHTS),
            stop_criteria=nodes.StopCriteria.CYCLE_FOREVER,
            rank=rank,
            world_size=world_size,
            seed=seed,
        )
        self.loader = nodes.Loader(nodes.Batcher(mixed, batch_size=batch_size))
        self.seq_len = seq_len
        if resume is not None:
            self.loader.load_state_dict(resume)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for batch in self.loader:
            ids = np.array([row for _, row in batch], dtype=np.int64)
            picks = np.array([index for index, _ in batch], dtype=np.int64)
            yield ids, np.repeat(picks[:, None], self.seq_len, axis=1)

    def state(self) -> Any:
        return self.loader.state_dict()


PEERS: dict[str, type[Loader]] = {
    "generator": Generator,
    "hf": HFStreaming,
    "torchdata": TorchdataNodes,
}
