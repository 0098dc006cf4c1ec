"""Rebuild the bundled sample corpus and tokenizer from text found on a Debian/Python machine.

Run from the repo root: `python data/make_sample.py`. The outputs are committed, so users never
need to run this; it documents where the sample data came from. It ends by running
`make_image_sample.py` (the generated image+text shards and `tokenizer_vlm.json`, which
extends the tokenizer trained here).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from make_image_sample import main as make_image_sample
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = Path(__file__).parent / "sample"


def prose_docs() -> list[str]:
    docs = []
    for path in sorted(glob.glob("/usr/share/vim/vim90/doc/usr_*.txt"))[:40]:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        sections = [s.strip() for s in text.split("=" * 78) if len(s.strip()) > 200]
        docs.extend(sections)
    return docs


def code_docs() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("json/*.py")) + sorted(stdlib.glob("email/*.py"))
    files += sorted(stdlib.glob("[a-c]*.py"))[:40]
    return [f.read_text(encoding="utf-8") for f in files]


def changelog_docs() -> list[str]:
    docs = []
    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))[:120]:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            entries = f.read().split("\n\n ")
        docs.extend(e.strip() for e in entries[:6] if len(e) > 100)
    return docs


def license_docs() -> dict[str, str]:
    names = ["Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2",
             "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "MPL-1.1", "MPL-2.0"]
    out = {}
    for name in names:
        path = Path("/usr/share/common-licenses") / name
        if path.exists():
            out[name] = path.read_text(encoding="utf-8", errors="replace")
    return out


def main() -> None:
    prose, code, changes, licenses = prose_docs(), code_docs(), changelog_docs(), license_docs()
    for sub in ("prose", "code", "changelog", "licenses"):
        (OUT / sub).mkdir(parents=True, exist_ok=True)
    cctx = zstandard.ZstdCompressor(level=10)
    for part in range(3):
        lines = "".join(json.dumps({"text": d, "id": i}) + "\n"
                        for i, d in enumerate(prose) if i % 3 == part)
        (OUT / "prose" / f"prose-{part:04d}.jsonl.zst").write_bytes(cctx.compress(lines.encode()))
    for part in range(2):
        rows = [d for i, d in enumerate(code) if i % 2 == part]
        pq.write_table(pa.table({"content": rows}), OUT / "code" / f"code-{part:04d}.parquet",
                       row_group_size=8)
    with open(OUT / "changelog" / "changelog.jsonl", "w", encoding="utf-8") as f:
        for d in changes:
            f.write(json.dumps({"text": d}) + "\n")
    for name, text in licenses.items():
        (OUT / "licenses" / f"{name}.txt").write_text(text, encoding="utf-8")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(prose + code + changes + list(licenses.values()), trainer)
    tok.save(str(Path(__file__).parent / "tokenizer.json"))
    print({k: len(v) for k, v in [("prose", prose), ("code", code), ("changelog", changes),
                                  ("licenses", licenses)]})
    make_image_sample()
    os.system(f"du -sh {OUT}/* {Path(__file__).parent / 'tokenizer*.json'}")


if __name__ == "__main__":
    main()
