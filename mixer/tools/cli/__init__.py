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

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from mixer import __version__
from mixer.core.errors import MixerError
from mixer.tools.cli import bench, cache, index, inspect, plan, preview, report, validate
from mixer.tools.cli.args import Parser, UsageError
from mixer.tools.tables import format_table

COMMANDS = (validate, inspect, plan, index, cache, preview, bench, report)  # in --help order


def build_parser() -> Parser:
    """The `mixer` parser: one subcommand per module of COMMANDS."""
    parser = Parser(
        prog="mixer",
        description="Deterministic, resumable data mixtures for language and "
        "vision-language model training.",
    )
    parser.add_argument("--version", action="version", version=f"mixer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived: unwinds the command (closing its loader) like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


def _stop(signum: int, frame: object) -> NoReturn:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    # A signal to the process group stops the DataLoader workers too (started only where this
    # module was imported: not imported here, which would load torch for every command).
    workers = sys.modules.get("mixer.runtime.worker_processes")
    if workers is not None:
        workers.stop_reporting_worker_deaths()
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


__all__ = ["COMMANDS", "UsageError", "build_parser", "format_table", "main"]
