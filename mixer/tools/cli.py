"""`mixer` command line: validate, index, inspect, plan, cache, preview, bench and report.

What `inspect` reports is computed in `report.py`, what `plan` reports in `plan.py`, the
metrics-log figure of `report` in `plots.py`; how `preview` shows image batches
(placeholders, images rebuilt from `pixel_values`) in `preview.py`.

Every bad argument, and every error a user can cause, ends the command with one
`error: ...` line on stderr and exit status 2: numeric flags are checked by the argparse
types below, output paths up front by `output_problem`, and `main` turns `MixerError` and
`OSError` into that line. SIGINT and SIGTERM end a command with status 130 and 143 (its
loader's workers stopped first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from mixer.core.errors import MixerError


def _load(path: str):
    from mixer.config.recipe import load_recipe

    return load_recipe(path)


def cmd_validate(args: argparse.Namespace) -> int:
    from mixer.images.select import layout_for
    from mixer.tokenize import resolve_tokenizer

    recipe = _load(args.recipe)
    info = resolve_tokenizer(recipe.resolve(recipe.tokenizer), recipe.eos_token)
    layout_for(recipe, info)   # an image layout checks that the tokenizer has its tokens
    print(f"ok: {len(recipe.sources)} source(s), seq_len {recipe.seq_len}, "
          f"batch_size {recipe.batch_size}, lanes {recipe.lanes}")
    return 0


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table; `columns` are (key, title) pairs."""
    cells = [[title for _, title in columns]]
    for row in rows:
        cells.append([_fmt(row[key]) for key, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cmd_inspect(args: argparse.Namespace) -> int:
    from mixer.tools.report import inspect_recipe

    recipe = _load(args.recipe)
    report = inspect_recipe(recipe, training_tokens=args.tokens)
    if recipe.token_cache is not None:
        report["token_cache"] = _cache_rows(recipe)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(report["sources"], [
        ("name", "source"), ("files", "files"), ("splits", "splits"), ("bytes", "bytes"),
        ("est_documents", "~docs"), ("est_tokens", "~tokens"), ("weight", "weight"),
        ("repeats_per_training_tokens", f"repeats/{args.tokens:.0e} tok"),
        ("read_amplification", "read amp."), ("worst_resume_bytes", "worst resume B"),
        ("skipped_at_listing", "skipped")]))
    for row in report["sources"]:
        if row["read_amplification"] > 1:
            print(f"note: source {row['name']!r} has fewer splits than lanes; each byte is read "
                  f"{row['read_amplification']:.2g}x per epoch (re-shard it into more files)")
        if row["worst_resume_bytes"]:
            print(f"note: source {row['name']!r} has compressed splits; resuming "
                  f"inside one decompresses up to {row['worst_resume_bytes']:,} stored bytes")
    if report["layout"] != "text":
        _print_images(report)
    if recipe.token_cache is not None:
        _print_cache(recipe, report["token_cache"])
    return 0


def _cache_rows(recipe: Any) -> list[dict[str, Any]]:
    """Per source: cached splits / splits and bytes of the recipe's token cache."""
    from mixer.cache.fill import cache_summary
    from mixer.sources.manifest import list_sources
    from mixer.tokenize import resolve_tokenizer

    info = resolve_tokenizer(recipe.resolve(recipe.tokenizer), recipe.eos_token)
    return cache_summary(recipe, list_sources(recipe), info)


def _print_cache(recipe: Any, rows: list[dict[str, Any]]) -> None:
    where = recipe.resolve(recipe.token_cache)
    if recipe.images is not None:
        print(f"\ntoken cache {where}: not used (image recipes bypass the token cache)")
        return
    for row in rows:
        row.setdefault("fraction", f"{row['cached_splits']}/{row['splits']}")
    print(f"\ntoken cache {where}:")
    print(format_table(rows, [("name", "source"), ("fraction", "cached splits"),
                              ("cached_bytes", "cached bytes")]))


def cmd_cache(args: argparse.Namespace) -> int:
    from mixer.cache.fill import fill_cache
    from mixer.runtime import dist
    from mixer.sources.manifest import list_sources

    recipe = _load(args.recipe)
    rank, world = dist.launcher_rank_and_world()
    counts = fill_cache(recipe, tables=list_sources(recipe), rank=rank, world=world,
                        workers=args.workers, progress=not args.no_progress)
    prefix = f"rank {rank}/{world}: " if world > 1 else ""
    print(f"{prefix}{counts['written']} split(s) written, {counts['cached']} already cached, "
          f"{counts['not cached']} not cacheable (ending in an error, or with images)")
    return 0


def _print_images(report: dict[str, Any]) -> None:
    """The image table of `inspect` under an image layout."""
    print(f"\nimages under the {report['layout']} layout (sampled from each source's first "
          "split; sizes from image headers,\nnothing decoded; image tokens are placeholder "
          "tokens; ~tokens above include them):")
    print(format_table(report["sources"], [
        ("name", "source"), ("sampled_documents", "sampled docs"),
        ("images_per_doc", "images/doc"), ("image_tokens_per_doc", "image tok/doc"),
        ("est_images", "~images"), ("est_image_tokens", "~image tokens"),
        ("image_token_share", "image tok share"), ("sampled_oversize", "oversize"),
        ("sampled_rejected", "rejected")]))
    for row in report["sources"]:
        if row["sampled_oversize"]:
            print(f"note: source {row['name']!r}: {row['sampled_oversize']} of "
                  f"{row['sampled_documents']} sampled documents do not fit seq_len "
                  f"{report['seq_len']} even at the lowest resolution (or the per-batch image "
                  "caps); they are skipped and counted in metrics()['oversize']")
        if row["sampled_rejected"]:
            print(f"note: source {row['name']!r}: {row['sampled_rejected']} of "
                  f"{row['sampled_documents']} sampled documents are bad input (errors, or "
                  "skipped with on_error: skip)")


def cmd_plan(args: argparse.Namespace) -> int:
    from mixer.tools.plan import plan

    result = plan(_load(args.recipe), args.tokens, world_size=args.world,
                  num_workers=args.workers)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_plan(result)
    if not result["topology"]["valid"]:
        print("error: the loader refuses this topology (see the warning above)", file=sys.stderr)
        return 2
    return 0


def _print_plan(result: dict[str, Any]) -> None:
    rows = [{"name": name, **row} for name, row in result["sources"].items()]
    print(f"plan for {result['training_tokens']:,} training tokens "
          f"(schedule: {result['schedule'] or 'none'}; sizes are inspect's estimates)")
    print(format_table(rows, [
        ("name", "source"), ("share", "share"), ("target_tokens", "target tokens"),
        ("tokens_per_epoch", "~tokens/epoch"), ("epochs", "epochs"), ("epochs_cap", "cap"),
        ("runs_out_at_tokens", "runs out at"), ("read_amplification", "read amp."),
        ("resume_bytes_per_stream", "resume B/stream")]))
    for event in result["renormalizations"]:
        weights = ", ".join(f"{n} {w:.3g}" for n, w in event["weights"].items()) or "none left"
        print(f"at {event['at_tokens']:,} tokens {event['source']!r} runs out; "
              f"weights from there: {weights}")
    topo = result["topology"]
    print(f"topology: world_size {topo['world_size']}, lanes {topo['lanes']}: valid "
          f"num_workers {topo['valid_num_workers'] or 'none'}; shares within 1 point after "
          f"{topo['exact_mixture_after_tokens_per_rank']:,.0f} tokens per rank")
    print(f"resume worst case: {result['resume']['worst_bytes_per_rank']:,} bytes re-read per "
          "rank (one shuffle window per stream, or a whole split without access points)")
    for warning in result["warnings"]:
        print(f"warning: {warning}")


def cmd_report(args: argparse.Namespace) -> int:
    from mixer.tools.plots import write_report

    write_report(args.metrics, args.output)
    print(f"wrote {args.output}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from mixer.sources.manifest import manifest_path, write_manifest

    recipe = _load(args.recipe)
    path = Path(args.output) if args.output else manifest_path(recipe)
    if path is None:
        path = Path(args.recipe).with_suffix(".manifest.json")
    problem = output_problem(str(path), make_parents=True) if not args.output else None
    if problem:
        raise MixerError(f"manifest path: {problem}")
    summary = write_manifest(recipe, path)
    rows = [{"source": name, **info} for name, info in summary.items()]
    print(format_table(rows, [("source", "source"), ("files", "files"), ("splits", "splits"),
                              ("bytes", "bytes"), ("documents", "documents")]))
    print(f"wrote {path}")
    if recipe.manifest is None or Path(recipe.resolve(recipe.manifest)) != path.resolve():
        print(f"note: set `manifest: {path}` in the recipe so that start-up uses it")
    return 0


def cmd_preview(args: argparse.Namespace) -> int:
    from mixer.runtime.loader import build_loader
    from mixer.tokenize import Encoder
    from mixer.tools.preview import RowRenderer, batch_images, join, save_images

    recipe = _load(args.recipe)
    loader = build_loader(recipe, num_workers=0)
    encoder = Encoder(loader.tokenizer)
    names = [s.name for s in recipe.sources]
    folder = Path(args.save_images) if args.save_images else None
    shown = saved = 0
    with loader:
        for b, batch in enumerate(loader):
            renderer = RowRenderer(loader.layout, encoder, batch)
            images = batch_images(batch, loader.layout) if folder is not None else []
            for r, (ids, sources) in enumerate(zip(batch["input_ids"].tolist(),
                                                   batch["source_ids"].tolist())):
                if shown >= args.n:
                    break
                real = [i for i, s in zip(ids, sources) if s >= 0]
                label = names[max(sources)] if real else "padding"
                pieces, image_tokens = renderer.render(real)
                refs = [p for p in pieces if not isinstance(p, str)]
                extra = (f", {len(refs)} image(s) of {image_tokens} tokens" if refs else "")
                print(f"--- sequence {shown} [{label}] {len(real)} tokens{extra}")
                print(join(pieces, args.chars))
                if folder is not None and refs:
                    saved += len(save_images(images, refs, folder, batch=b, row=r,
                                             source=label))
                shown += 1
            if shown >= args.n:
                break
    if folder is not None:
        print(f"saved {saved} image(s) to {folder}")
    return 0


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its finished children, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def run_bench(recipe: Any, *, batches: int, num_workers: int, progress: bool,
              metrics_out: str | None = None, metrics_every: int = 1) -> dict[str, Any]:
    """Iterate `batches` batches and measure throughput, latency, memory and shares.

    With `metrics_out`, append one JSON line of `loader.metrics()` every `metrics_every`
    batches (and after the last): the log `mixer report` draws.
    """
    from tqdm import tqdm

    from mixer.runtime.loader import build_loader
    from mixer.tools.metrics_log import MetricsWriter

    names = [s.name for s in recipe.sources]
    counts = dict.fromkeys(names, 0)
    start = time.perf_counter()
    loader = build_loader(recipe, num_workers=num_workers)
    first = None
    got = images = 0
    log = MetricsWriter(metrics_out, recipe, every=metrics_every) if metrics_out else None
    with loader, tqdm(total=batches, disable=not progress, unit="batch",
                      file=sys.stderr) as bar:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            ids = batch["source_ids"].flatten()
            if "pixel_values" in batch:   # one grid row per image (qwen2_vl), else one crop
                images += len(batch.get("image_grid_thw", batch["pixel_values"]))
            for i, name in enumerate(names):
                counts[name] += int((ids == i).sum())
            got += 1
            bar.update(1)
            if log is not None:
                log.step(got, loader.metrics)
            if got >= batches:
                break
        metrics = loader.metrics()
        if log is not None:
            log.close(got, metrics)
    elapsed = time.perf_counter() - start
    total = sum(counts.values())
    result = {"batches": got, "num_workers": num_workers, "tokens": total,
              "seconds": elapsed, "tokens_per_s": total / elapsed if elapsed else 0.0,
              "time_to_first_batch_s": first, "peak_rss_mb": peak_rss_mb(),
              "share": {n: (counts[n] / total if total else 0.0) for n in names},
              "weight": _mean_targets(recipe, got), "skipped": metrics["skipped"]}
    if recipe.images is not None:
        result.update(images=images, images_per_s=images / elapsed if elapsed else 0.0,
                      oversize=metrics.get("oversize", {}))
    return result


def _mean_targets(recipe: Any, batches: int) -> dict[str, float]:
    """Each source's target weight averaged over the run's batches (its schedule, if any)."""
    if recipe.schedule is None or batches <= 0:
        return dict(zip(recipe.names, recipe.weights))
    step = recipe.batch_size * recipe.seq_len
    rows = [recipe.weights_at(g * step) for g in range(batches)]
    return {n: sum(r[i] for r in rows) / batches for i, n in enumerate(recipe.names)}


def cmd_bench(args: argparse.Namespace) -> int:
    result = run_bench(_load(args.recipe), batches=args.batches, num_workers=args.num_workers,
                       progress=not args.json and not args.no_progress,
                       metrics_out=args.metrics_out, metrics_every=args.metrics_every)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"batches {result['batches']}  workers {result['num_workers']}  "
          f"tokens {result['tokens']:,}  in {result['seconds']:.2f} s")
    print(f"throughput {result['tokens_per_s']:,.0f} tokens/s   time to first batch "
          f"{result['time_to_first_batch_s'] or 0:.3f} s   peak RSS {result['peak_rss_mb']:.0f} MB")
    title = "mean target" if _load(args.recipe).schedule is not None else "weight"
    columns = [("source", "source"), ("weight", title), ("share", "realized share"),
               ("skipped", "skipped")]
    if "images" in result:
        print(f"images {result['images']:,} ({result['images_per_s']:,.0f} images/s)")
        columns.append(("oversize", "oversize"))
    rows = [{"source": n, "weight": result["weight"][n], "share": result["share"][n],
             "skipped": result["skipped"].get(n, 0),
             "oversize": result.get("oversize", {}).get(n, 0)} for n in result["share"]]
    print(format_table(rows, columns))
    return 0


def count(what: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` ("1e9" is one; "1.5", "nan",
    "inf" and "1e999" are not); `what` names it in the error."""
    def parse(text: str) -> int:
        try:
            value: int | float = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number, got {text!r}")
        if value != int(value):
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}")
        if value < low or (high is not None and value > high):
            span = (f"from {low:,} to {high:,}" if high is not None else
                    "positive" if low == 1 else f"at least {low:,}")
            raise argparse.ArgumentTypeError(f"{what} must be {span}, got {text!r}")
        return int(value)

    return parse


# The loader's own limits (mixer.runtime.loader.check_ranks), checked here before anything loads.
WORKERS = count("num_workers", 0, 1024)
WORLD = count("world_size", 1, 1 << 20)
TOKENS = count("training tokens", 1)


def output_problem(path: str, *, folder: bool = False, make_parents: bool = False) -> str | None:
    """Why `path` cannot be written as a file (or, with `folder`, as a folder to fill), or
    None. Its folder must exist (with `make_parents`, its nearest existing ancestor) and take
    a new file; a file's path must not name a folder ("/", "out/", an existing folder)."""
    target = Path(path)
    try:
        if not path.strip():
            return "the path is empty"
        if folder:
            if target.exists() and not target.is_dir():
                return f"{path!r} is a file, not a folder"
        elif path.endswith(os.sep) or target.name in ("", ".", "..") or target.is_dir():
            return f"{path!r} names a folder, not a file"
        elif target.exists() and not os.access(target, os.W_OK):
            return f"{path!r} is not writable"
        parent = target if folder and target.is_dir() else target.parent
        while make_parents and not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.exists():
            return f"{path!r} is under {str(parent)!r}, which does not exist (create it first)"
        if not parent.is_dir():
            return f"{path!r} is under {str(parent)!r}, which is not a folder"
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        return f"cannot write {path!r}: {exc.strerror or exc}"
    return None


def output_file(path: str) -> str:
    """An argparse type: a path a file can be written to (see `output_problem`)."""
    problem = output_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def output_folder(path: str) -> str:
    """An argparse type: a folder that exists or can be made, and takes new files."""
    problem = output_problem(path, folder=True)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


class UsageError(MixerError):
    """A bad command line: what `Parser` raises where argparse would print usage and exit."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors raise `UsageError` (one line; `main` prints it
    as `error: ...` and returns 2); `--help` still exits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "-inf", "-nan", "-1e9" reach the flag's type (argparse takes them for options).
        self._negative_number_matcher = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        raise UsageError(f"{self.prog}: {one_line} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mixer", description="Deterministic, resumable data mixtures for language and "
        "vision-language model training.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check a recipe and its tokenizer; exit non-zero "
                       "naming the bad field")
    p.add_argument("recipe")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("inspect", help="per-source files, splits, sizes, estimates, repeats; "
                       "under an image layout also images and image tokens per document")
    p.add_argument("recipe")
    p.add_argument("--tokens", type=TOKENS, default=10**9,
                   help="training tokens for the repeats column (default 1e9)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("plan", help="per source for N training tokens: target tokens, epochs, "
                       "when capped sources run out, valid topologies, resume worst case")
    p.add_argument("recipe")
    p.add_argument("--tokens", type=TOKENS, required=True, help="training tokens (e.g. 1e12)")
    p.add_argument("--world", type=WORLD, default=1, help="world size (default 1)")
    p.add_argument("--workers", type=WORKERS, default=None,
                   help="DataLoader workers per rank to check (default: list the valid ones)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("index", help="list every source once and save a manifest for start-up")
    p.add_argument("recipe")
    p.add_argument("-o", "--output", type=output_file, help="manifest path (default: the "
                   "recipe's `manifest`, else RECIPE.manifest.json)")
    p.set_defaults(func=cmd_index)
    p = sub.add_parser("cache", help="tokenize every split into the recipe's token_cache "
                       "(under torchrun the ranks share the splits)")
    p.add_argument("recipe")
    p.add_argument("--workers", type=WORKERS, default=0,
                   help="worker processes per rank (default 0: in-process)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_cache)
    p = sub.add_parser("preview", help="print the first sequences, decoded, with sources; "
                       "images as <image WxH → N tokens>")
    p.add_argument("recipe")
    p.add_argument("-n", type=count("sequences", 1), default=4,
                   help="number of sequences (default 4)")
    p.add_argument("--chars", type=count("chars", 0), default=400,
                   help="cut each text here (0: no cut)")
    p.add_argument("--save-images", metavar="DIR", type=output_folder,
                   help="write the images of the shown sequences to DIR as PNG "
                   "(batchB-rowR-imageI-SOURCE.png; I: index in the batch's pixel_values), "
                   "rebuilt from pixel_values: what the model sees, after resizing")
    p.set_defaults(func=cmd_preview)
    p = sub.add_parser("bench", help="throughput, time to first batch, peak RSS, shares "
                       "(and images/s, oversize documents under an image layout)")
    p.add_argument("recipe")
    p.add_argument("--batches", type=count("batches", 1), default=100,
                   help="batches to time (default 100)")
    p.add_argument("--num-workers", type=WORKERS, default=0,
                   help="DataLoader worker processes (default 0: in-process)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--metrics-out", metavar="FILE", type=output_file,
                   help="write a metrics log (JSONL, one line per logged batch) for "
                   "`mixer report`")
    p.add_argument("--metrics-every", type=count("K", 1), default=1, metavar="K",
                   help="log every K batches (default 1)")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("report", help="draw a metrics log (target vs realized share, epochs, "
                       "loss per source) to a PNG; needs the [report] extra")
    p.add_argument("metrics", help="metrics log (JSONL)")
    p.add_argument("-o", "--output", type=output_file, default="report.png",
                   help="PNG path (default report.png)")
    p.set_defaults(func=cmd_report)
    return parser


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived: unwinds the command (closing its loader) like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


def _stop(signum: int, frame: object) -> NoReturn:
    signal.signal(signum, signal.SIG_DFL)   # a second one ends the process at once
    raise Stopped(signum)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """While a command runs (main thread only): SIGINT and SIGTERM raise `Stopped`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status (2: a bad argument or an error)."""
    with _stop_on_signals():
        try:
            args = build_parser().parse_args(argv)
            return args.func(args)
        except BrokenPipeError:
            return 0
        except (MixerError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except Stopped as exc:
            print(f"error: stopped by {exc}", file=sys.stderr)
            return exc.status
        except KeyboardInterrupt:
            print("error: stopped by SIGINT", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
