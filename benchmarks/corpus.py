"""A corpus of real text found on this machine, plus a BPE trained on it.

    python benchmarks/corpus.py [--mb 210] [--workdir /tmp/mixer-peers]

Three sources, 16 shards each, sized by their weights (prose 0.5, code 0.3, web 0.2):

    prose/*.jsonl.zst   man pages, /usr/share/doc texts, licenses, .txt files, docstrings
    code/*.parquet      .py/.c/.h files of the stdlib, site-packages and /usr/include
    web/*.jsonl         HTML, markdown, reStructuredText, READMEs and package METADATA

and `tokenizer.json`: a byte-level BPE (32k) with `<|endoftext|>` as its EOS, trained on an
evenly spread sample of the corpus. The result is cached under the workdir (keyed by size and
vocabulary), so a second call returns at once. Files are visited in sorted order, so the same
machine gives the same corpus.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

SHARDS = 16
WEIGHTS = {"prose": 0.5, "code": 0.3, "web": 0.2}
FILES = {"prose": "{:02d}.jsonl.zst", "code": "{:02d}.parquet", "web": "{:02d}.jsonl"}
FIELDS = {"prose": "text", "code": "content", "web": "text"}
EOS = "<|endoftext|>"
MAX_DOC_BYTES = 64 << 10  # longer files are cut into documents at line boundaries
MIN_DOC_BYTES = 200
VENV = Path(sys.prefix)
SITE = sorted(VENV.glob("lib/python3*/site-packages"))
STDLIB = sorted(Path("/usr/lib").glob("python3*")) + sorted(
    Path(sys.base_prefix).glob("lib/python3*")
)


@dataclass(frozen=True)
class Corpus:
    """Where a built corpus lives: its folder, each source's glob and the tokenizer file."""

    folder: Path
    mb: float

    @property
    def tokenizer(self) -> Path:
        return self.folder / "tokenizer.json"

    def glob(self, source: str) -> str:
        return str(self.folder / source / FILES[source].replace("{:02d}", "*"))

    def files(self, source: str) -> list[Path]:
        return sorted((self.folder / source).glob(FILES[source].replace("{:02d}", "*")))

    def stats(self) -> dict:
        return json.loads((self.folder / "corpus.json").read_text())


# -- finding text ------------------------------------------------------------------------------
def _walk(roots: list[Path], keep: Callable[[str], bool]) -> Iterator[Path]:
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            continue
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                path = Path(folder, name)
                if keep(name) and not path.is_symlink() and path.resolve() not in seen:
                    seen.add(path.resolve())
                    yield path


def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", errors="replace")


_ROFF_COMMENT = re.compile(r"^\.\s*\\\".*$|^'\\\".*$", re.M)
_ROFF_MACRO = re.compile(r"^\.[A-Za-z]{1,3}\s?", re.M)
_ROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\\(..|\\[-e&|^]")


def _man_text(text: str) -> str:
    text = _ROFF_COMMENT.sub("", text)
    text = _ROFF_MACRO.sub("", text)
    return _ROFF_ESCAPE.sub("", text)


def _docstrings(text: str) -> str | None:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None
    docs = [
        ast.get_docstring(node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    return "\n\n".join(d for d in docs if d and len(d) > 80) or None


def _prose() -> Iterator[str]:
    man = [Path("/usr/share/man", f"man{i}") for i in range(1, 9)]
    for path in _walk(man, lambda n: True):
        text = _read(path)
        if text is not None:
            yield _man_text(text)
    docs = [Path("/usr/share/doc"), Path("/usr/share/common-licenses")]
    for path in _walk(
        docs,
        lambda n: (
            not n.endswith((".html", ".htm", ".html.gz", ".png", ".svg", ".js", ".css", ".jpg"))
        ),
    ):
        text = _read(path)
        if text is not None:
            yield text
    texts = lambda n: n.endswith(".txt") or n.startswith(("LICENSE", "COPYING", "NOTICE"))
    for path in _walk(SITE + STDLIB, texts):
        text = _read(path)
        if text is not None:
            yield text
    for path in _walk(STDLIB + SITE, lambda n: n.endswith(".py")):
        text = _read(path)
        doc = _docstrings(text) if text is not None else None
        if doc is not None:
            yield doc


def _code() -> Iterator[str]:
    for path in _walk(
        STDLIB + SITE + [Path("/usr/include")], lambda n: n.endswith((".py", ".c", ".h"))
    ):
        text = _read(path)
        if text is not None:
            yield text


def _web() -> Iterator[str]:
    web = lambda n: (
        n.endswith((".html", ".htm", ".md", ".rst", ".html.gz", ".md.gz"))
        or n.startswith("README")
        or n == "METADATA"
    )
    for path in _walk([Path("/usr/share/doc"), Path("/usr/share"), Path("/usr/lib")] + SITE, web):
        text = _read(path)
        if text is not None:
            yield text


FINDERS: dict[str, Callable[[], Iterator[str]]] = {"prose": _prose, "code": _code, "web": _web}


def documents(source: str, budget: int) -> list[str]:
    """Distinct documents of one source, in a fixed order, up to `budget` UTF-8 bytes."""
    docs: list[str] = []
    seen: set[bytes] = set()
    total = 0
    for text in FINDERS[source]():
        for doc in _cut(text):
            digest = hashlib.blake2b(doc.encode(), digest_size=16).digest()
            if digest in seen:
                continue
            seen.add(digest)
            docs.append(doc)
            total += len(doc.encode())
            if total >= budget:
                return docs
    return docs


def _cut(text: str) -> Iterator[str]:
    text = text.strip()
    while len(text) > MAX_DOC_BYTES:
        cut = text.rfind("\n", 0, MAX_DOC_BYTES)
        cut = cut if cut > MAX_DOC_BYTES // 2 else MAX_DOC_BYTES
        yield text[:cut]
        text = text[cut:].lstrip("\n")
    if len(text.encode()) >= MIN_DOC_BYTES:
        yield text


# -- writing -----------------------------------------------------------------------------------
def _write(folder: Path, source: str, docs: list[str]) -> None:
    (folder / source).mkdir(parents=True, exist_ok=True)
    for shard in range(SHARDS):
        part = docs[shard::SHARDS]
        path = folder / source / FILES[source].format(shard)
        if source == "code":
            table = pa.table({"content": part})
            pq.write_table(table, path, row_group_size=256)
            continue
        lines = "".join(json.dumps({"text": d}) + "\n" for d in part).encode()
        if source == "prose":
            lines = zstandard.ZstdCompressor(level=3).compress(lines)
        path.write_bytes(lines)


def train_tokenizer(docs: dict[str, list[str]], path: Path, vocab: int, sample_bytes: int) -> None:
    """A byte-level BPE with `<|endoftext|>`, trained on an evenly spread sample."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    total = sum(len(d) for texts in docs.values() for d in texts)
    step = max(1, round(total / sample_bytes))
    sample = [d for texts in docs.values() for d in texts[::step]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(sample, trainer)
    tok.save(str(path))


def build(
    workdir: Path,
    mb: float = 210,
    vocab: int = 32768,
    train_mb: float = 32,
    log: Callable[[str], None] = print,
) -> Corpus:
    """Build (or find in `workdir`) the corpus of `mb` megabytes and its tokenizer."""
    corpus = Corpus(workdir / f"corpus-{mb:g}mb-v{vocab}", mb)
    if (corpus.folder / "corpus.json").exists():
        return corpus
    corpus.folder.mkdir(parents=True, exist_ok=True)
    docs = {}
    stats: dict = {"mb": mb, "vocab": vocab, "sources": {}}
    for source, weight in WEIGHTS.items():
        docs[source] = documents(source, int(mb * weight * 1e6))
        _write(corpus.folder, source, docs[source])
        size = sum(len(d.encode()) for d in docs[source])
        stats["sources"][source] = {
            "documents": len(docs[source]),
            "text_bytes": size,
            "file_bytes": sum(p.stat().st_size for p in corpus.files(source)),
        }
        log(f"corpus: {source}: {len(docs[source]):,} documents, {size / 1e6:.1f} MB of text")
    train_tokenizer(docs, corpus.tokenizer, vocab, int(min(train_mb, mb) * 1e6))
    (corpus.folder / "corpus.json").write_text(json.dumps(stats, indent=1))
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=210, help="corpus size in MB of text")
    parser.add_argument("--vocab", type=int, default=32768, help="BPE vocabulary size")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mixer-peers"))
    args = parser.parse_args()
    corpus = build(args.workdir, args.mb, args.vocab)
    print(json.dumps({"folder": str(corpus.folder), **corpus.stats()}, indent=1))


if __name__ == "__main__":
    main()
