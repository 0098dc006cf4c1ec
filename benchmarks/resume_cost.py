"""Resume cost vs the step: time and records re-read to resume, at step 10 and at 10,000.

    python benchmarks/resume_cost.py [--steps 10 1000 10000]

Three single-lane corpora: plain jsonl cut into 256 KB splits (resume seeks to a byte offset
and re-reads one shuffle window), one large single-frame .jsonl.zst (no access points: resume
decompresses from the file's start, the documented worst case) and the same text as a
multi-frame .jsonl.zst (resume decompresses from its split's first frame).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TOKENIZER, sample_texts, table  # noqa: E402

import mixer  # noqa: E402
from mixer.pipeline.lanes import Lane  # noqa: E402
from mixer.sources import list_source  # noqa: E402
from mixer.tokenize import Encoder, resolve_tokenizer  # noqa: E402


def _corpus(folder: Path, copies: int) -> None:
    texts = [t for group in sample_texts().values() for t in group]
    lines = "".join(
        json.dumps({"text": f"{t}\n[{c}]"}) + "\n" for c in range(copies) for t in texts
    )
    (folder / "plain.jsonl").write_text(lines)
    data = lines.encode()
    cctx = zstandard.ZstdCompressor()
    (folder / "big.jsonl.zst").write_bytes(cctx.compress(data))
    step = 1 << 20  # one frame per MB of text: access points every ~1 MB
    (folder / "frames.jsonl.zst").write_bytes(
        b"".join(cctx.compress(data[i : i + step]) for i in range(0, len(data), step))
    )


def measure(folder: Path, name: str, steps: list[int]) -> list[dict]:
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(TOKENIZER),
            "seq_len": 2048,
            "batch_size": 8,
            "lanes": 1,
            "shuffle_window": 1024,
            "split_bytes": 256 << 10,
            "sources": [{"name": name, "path": str(folder / name), "weight": 1}],
        }
    )
    tables = [list_source(recipe, s, deep=True) for s in recipe.sources]  # as `mixer index`
    encoder = Encoder(resolve_tokenizer(str(TOKENIZER)))
    rows = []
    lane = Lane(0, recipe, tables, encoder)
    done = 0
    for target in steps:
        for _ in range(target - done):
            lane.next_batch(recipe.batch_size)
        done = target
        state = lane.state_dict()
        start = time.perf_counter()
        resumed = Lane(0, recipe, tables, encoder, state)
        resumed.next_batch(recipe.batch_size)
        elapsed = time.perf_counter() - start
        stream = resumed.packers[0].stream
        rows.append(
            {
                "corpus": name,
                "step": target,
                "resume_s": elapsed,
                "records_reread": stream.records_read,
                "state_bytes": len(json.dumps(state)),
                "epoch": state["sources"][name]["packer"]["stream"]["epoch"],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--copies", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _corpus(folder, args.copies)
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        rows = [
            row
            for name in ("plain.jsonl", "big.jsonl.zst", "frames.jsonl.zst")
            for row in measure(folder, name, args.steps)
        ]
    print(
        f"plain.jsonl {sizes['plain.jsonl'] / 1e6:.1f} MB (256 KB splits), big.jsonl.zst "
        f"{sizes['big.jsonl.zst'] / 1e6:.1f} MB (one frame), frames.jsonl.zst "
        f"{sizes['frames.jsonl.zst'] / 1e6:.1f} MB (1 MB frames); resume = new lane from "
        "state + its next batch of 8 x 2048"
    )
    print(table(rows, ["corpus", "step", "epoch", "resume_s", "records_reread", "state_bytes"]))


if __name__ == "__main__":
    main()
