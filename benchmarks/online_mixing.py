"""Online mixing on a tiny model: static weights vs ODM vs ADO, and the cost of an update.

    python benchmarks/online_mixing.py [--steps 300] [--every 20] [--out /tmp/online_mixing]
                                       [--runs static,odm,ado]

A 2-layer LlamaForCausalLM (hidden 64, built from a config, CPU) trains for `--steps` steps
(batch 8 × 64 tokens) on three synthetic sources of one word-level vocabulary: `easy`
(counting runs: w0 w1 w2 ...), `mid` (a Markov chain with 4 successors per word) and `hard`
(32 successors per word: higher entropy, the loss stays higher), weights 1 : 1 : 1. Each run
reports its per-token loss with `loader.report_loss`; ODM and ADO update every `--every` global
batches (ADO: start_batches 3·every, ignore_batches every). Rows: the per-source validation
loss at the end (held-out documents), the final weights, the mean cost of `report_loss` per
step, and the cost per update: the
algorithm's `update` and the whole `next()` that carries the update (with the restart of the
lane stream it causes, as `set_weights` does), next to the median `next()` without one, the
mean `next()` over the run, the mean forward-backward-optimizer time and the whole step; and
all the time `next()` took beyond the static run's, per update (the restarted lanes refill
their shuffle windows over the next batches: most of an update's cost).

Each run writes a metrics log (`<out>/<run>.jsonl`: `loader.metrics()` with `target_share`,
the weights in force, and `loss_by_source`); `mixer report <out>/<run>.jsonl` draws the
weights over global tokens (dashed, "target") against the realized shares. The figures for
the three runs are written as `<out>/<run>.png` when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402

import mixer  # noqa: E402
from mixer.tools.metrics_log import MetricsWriter  # noqa: E402

VOCAB = 256
SEQ, BATCH = 64, 8
NAMES = ("easy", "mid", "hard")


def make_tokenizer(path: Path) -> Path:
    vocab = {"<|endoftext|>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>", "<pad>"])
    tok.save(str(path))
    return path


def document(source: str, rng: random.Random) -> str:
    length = rng.randint(20, 120)
    word = rng.randrange(VOCAB)
    words = []
    for _ in range(length):
        words.append(f"w{word}")
        if source == "easy":
            word = (word + 1) % VOCAB
        else:
            fan = 4 if source == "mid" else 32
            word = (word * 7 + 3 + rng.randrange(fan) * 11) % VOCAB
    return " ".join(words)


def write_data(root: Path) -> dict[str, list[str]]:
    """Training files per source and held-out validation documents."""
    held_out = {}
    for i, name in enumerate(NAMES):
        rng = random.Random(i)
        (root / name).mkdir(parents=True, exist_ok=True)
        with open(root / name / "train.jsonl", "w") as f:
            for _ in range(3000):
                f.write(json.dumps({"text": document(name, rng)}) + "\n")
        held_out[name] = [document(name, random.Random(1000 + i * 100 + j)) for j in range(24)]
    return held_out


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB + 2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def token_loss(model, batch: dict) -> torch.Tensor:
    """The shifted per-token loss ([B, L-1]) a causal LM computes."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    logits, labels = logits[:, :-1].float(), batch["labels"][:, 1:]
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).view_as(labels)


@torch.no_grad()
def validation(model, tokenizer: Tokenizer, held_out: dict[str, list[str]]) -> dict[str, float]:
    out = {}
    for name, docs in held_out.items():
        total, count = 0.0, 0
        for doc in docs:
            ids = torch.tensor([tokenizer.encode(doc).ids[:SEQ]])
            logits = model(input_ids=ids).logits[:, :-1]
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="sum"
            )
            total, count = total + float(loss), count + ids.size(1) - 1
        out[name] = total / count
    return out


def run(name: str, recipe: dict, steps: int, held_out: dict, out: Path) -> dict:
    loader = mixer.build_loader(recipe)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mixing = loader._mixing
    update_s: list[float] = []
    if mixing is not None:  # time the algorithm's own update
        algorithm = mixing.algorithm
        plain = algorithm.update

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = plain(*args, **kwargs)
            update_s.append(time.perf_counter() - start)
            return result

        algorithm.update = timed
    writer = MetricsWriter(out / f"{name}.jsonl", loader.recipe, every=10)
    it = iter(loader)
    next_s, next_update_s, report_s, train_s = [], [], [], []
    step_start = time.perf_counter()
    for step in range(1, steps + 1):
        before = mixing.updates if mixing is not None else 0
        start = time.perf_counter()
        batch = next(it)
        elapsed = time.perf_counter() - start
        updated = mixing is not None and mixing.updates != before
        (next_update_s if updated else next_s).append(elapsed)
        start = time.perf_counter()
        losses = token_loss(model, batch)
        counted = batch["labels"][:, 1:] != -100
        loss = (losses * counted).sum() / counted.sum().clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        train_s.append(time.perf_counter() - start)
        if mixing is not None:
            start = time.perf_counter()
            loader.report_loss(losses, batch)
            report_s.append(time.perf_counter() - start)
        by_source = mixer.loss_by_source(losses, batch, names=loader.recipe.names)

        def log(loss=loss, by_source=by_source) -> dict:
            return {
                **loader.metrics(),
                "loss": float(loss.detach()),
                "loss_by_source": {n: s / t for n, (s, t) in by_source.items()},
            }

        writer.step(step, log)
    wall = time.perf_counter() - step_start
    writer.close(steps, loader.metrics())
    metrics = loader.metrics()
    loader.close()
    val = validation(model, Tokenizer.from_file(recipe["tokenizer"]), held_out)
    try:
        from mixer.tools.plots import write_report

        write_report(out / f"{name}.jsonl", out / f"{name}.png")
    except mixer.MixerError:
        pass  # (no matplotlib)
    weights = metrics.get("mixing", {}).get("weights") or dict(zip(NAMES, loader.recipe.weights))
    ms = lambda xs: f"{1000 * statistics.mean(xs):.2f}" if xs else "-"
    return {
        "run": name,
        **{f"val {n}": f"{val[n]:.3f}" for n in NAMES},
        "val mean": f"{statistics.mean(val.values()):.3f}",
        "weights (easy/mid/hard)": "/".join(f"{weights[n]:.2f}" for n in NAMES),
        "updates": len(update_s),
        "report_loss ms": ms(report_s),
        "update ms": ms(update_s),
        "next() at update ms": ms(next_update_s),
        "next() median ms": f"{1000 * statistics.median(next_s):.2f}",
        "next() mean ms": ms(next_s + next_update_s),
        "train ms": ms(train_s),
        "next_total_s": sum(next_s) + sum(next_update_s),
        "step ms": f"{1000 * wall / steps:.1f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--out", default="/tmp/online_mixing")
    parser.add_argument(
        "--runs", default="static,odm,ado", help="which runs, in this order (comma-separated)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    held_out = write_data(out / "data")
    base = {
        "seed": 1,
        "tokenizer": str(make_tokenizer(out / "tok.json")),
        "seq_len": SEQ,
        "batch_size": BATCH,
        "lanes": 4,
        "shuffle_window": 256,
        "sources": [
            {"name": n, "path": str(out / "data" / n / "*.jsonl"), "weight": 1.0} for n in NAMES
        ],
    }
    every = args.every
    runs = {
        "static": base,
        "odm": {**base, "online_mixing": {"algorithm": "odm", "every": every}},
        "ado": {
            **base,
            "online_mixing": {
                "algorithm": "ado",
                "every": every,
                "ignore_batches": every,
                "start_batches": 3 * every,
            },
        },
    }
    chosen = args.runs.split(",")
    rows = [run(name, runs[name], args.steps, held_out, out) for name in chosen]
    static = [r["next_total_s"] for r in rows if r["run"] == "static"]
    for row in rows:  # all the time next() spent more than in the static run, per update
        extra = row.pop("next_total_s") - min(static) if static else None
        row["next() extra per update ms"] = (
            f"{1000 * extra / row['updates']:.1f}" if extra is not None and row["updates"] else "-"
        )
    print(table(rows, list(rows[0])))
    print(f"metrics logs and figures: {out}/<run>.jsonl, {out}/<run>.png (mixer report)")


if __name__ == "__main__":
    main()
