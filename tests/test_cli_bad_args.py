"""Every bad argument of every `mixer` command: one `error: ...` line, exit status 2.

One table (ROWS) of (argv, expected part of the error). The bulk runs in-process through
`mixer.cli.main`, which is what the console script calls; a few rows also run as real
subprocesses. A meta-check fails when a command gains a value flag that no row covers.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import procs
import pytest
import yaml

from mixer.runtime import topology
from mixer.tools import cli

# Numeric flags: (argv before the flag, the flag, its smallest valid value).
NUMERIC = [
    (["inspect", "{recipe}"], "--tokens", 1),
    (["plan", "{recipe}"], "--tokens", 1),
    (["plan", "{recipe}", "--tokens", "1e6"], "--world", 1),
    (["plan", "{recipe}", "--tokens", "1e6"], "--workers", 0),
    (["cache", "{recipe}"], "--workers", 0),
    (["preview", "{recipe}"], "-n", 1),
    (["preview", "{recipe}"], "--chars", 0),
    (["bench", "{recipe}"], "--batches", 1),
    (["bench", "{recipe}"], "--num-workers", 0),
    (["bench", "{recipe}"], "--metrics-every", 1),
]
BAD_NUMBERS = [
    ("nan", "must be a finite number"),
    ("inf", "must be a finite number"),
    ("-inf", "must be a finite number"),
    ("1e999", "must be a finite number"),
    ("-1", "got '-1'"),
    ("1.5", "must be a whole number"),
    ("abc", "must be a number"),
    ("", "must be a number"),
]
LIMITS = {
    "--world": topology.MAX_WORLD_SIZE,
    "--workers": topology.MAX_WORKERS,
    "--num-workers": topology.MAX_WORKERS,
}

# Output flags: (argv before the flag, the flag, whether it names a folder).
OUTPUTS = [
    (["index", "{recipe}"], "-o", False),
    (["index", "{recipe}"], "--output", False),
    (["bench", "{recipe}", "--batches", "1"], "--metrics-out", False),
    (["preview", "{recipe}", "-n", "1"], "--save-images", True),
    (["report", "{log}"], "-o", False),
]
BAD_FILES = [
    ("/", "names a folder"),
    ("{tmp}", "names a folder"),
    ("{tmp}/out/", "names a folder"),
    ("", "the path is empty"),
    ("{missing}/x", "does not exist"),
    ("{file}/x", "not a folder"),
    ("{unwritable}/x", "cannot write"),
]
BAD_FOLDERS = [
    ("{file}", "is a file, not a folder"),
    ("", "the path is empty"),
    ("{missing}/x", "does not exist"),
    ("{file}/x", "not a folder"),
    ("{unwritable}", "cannot write"),
    ("{unwritable}/x", "cannot write"),
]
COMMANDS = ["validate", "inspect", "plan", "index", "cache", "preview", "bench"]

ROWS: list[tuple[list[str], str]] = [
    *[
        ([*before, flag, value], problem)
        for before, flag, _ in NUMERIC
        for value, problem in BAD_NUMBERS
    ],
    *[([*before, flag, str(low - 1)], f"got '{low - 1}'") for before, flag, low in NUMERIC],
    *[
        ([*before, flag, str(LIMITS[flag] + 1)], f"to {LIMITS[flag]:,}")
        for before, flag, _ in NUMERIC
        if flag in LIMITS
    ],
    *[
        ([*before, f"{flag}={value}"], problem)  # the `--flag=VALUE` spelling too
        for before, flag, _ in NUMERIC
        if flag.startswith("--")
        for value, problem in BAD_NUMBERS[:3]
    ],
    *[
        ([*before, flag, path], problem)
        for before, flag, folder in OUTPUTS
        for path, problem in (BAD_FOLDERS if folder else BAD_FILES)
    ],
    # bad inputs, and what a command finds wrong only once it has loaded the recipe
    *[
        ([command, "{missing}/r.yaml", *extra], "cannot read recipe")
        for command, extra in [(c, ["--tokens", "1e6"] if c == "plan" else []) for c in COMMANDS]
    ],
    (["inspect", "{tmp}"], "cannot read recipe"),
    (["report", "{missing}/m.jsonl"], "cannot read the metrics log"),
    (["report", "{tmp}"], "cannot read the metrics log"),
    (["index", "{folder_manifest}"], "manifest path"),
    (["plan", "{recipe}", "--tokens", "1e6", "--world", "3"], "refuses this topology"),
    (["bench", "{recipe}", "--num-workers", "3", "--no-progress"], "not divisible"),
    *[
        (["bench", "{recipe}", "--step-time", bad], problem)
        for bad, problem in [
            ("nan", "--step-time must be a finite number of seconds >= 0"),
            ("inf", "--step-time must be a finite number of seconds >= 0"),
            ("-0.5", "--step-time must be a finite number of seconds >= 0"),
            ("abc", "--step-time must be a number"),
            ("", "--step-time must be a number"),
        ]
    ],
    # usage errors
    ([], "required"),
    (["frob"], "invalid choice"),
    (["plan", "{recipe}"], "required: --tokens"),
    (["bench", "{recipe}", "--batches"], "expected one argument"),
    (["bench", "{recipe}", "--frob"], "unrecognized arguments"),
]
# Run as the console script too (each start imports torch): the issue's own example, a
# number, an error raised once the recipe has loaded.
SUBPROCESS_ROWS = [
    (["index", "{recipe}", "-o", "/"], "names a folder"),
    (["plan", "{recipe}", "--tokens", "nan"], "must be a finite number"),
    (["bench", "{recipe}", "--num-workers", "3", "--no-progress"], "not divisible"),
]


def _writable(folder: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _unwritable_folder(tmp_path: Path) -> str:
    """A folder no new file can go in: a read-only one, or (as root, who writes in any
    folder) /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys"), Path("/proc")):
        if candidate.is_dir() and not _writable(candidate):
            return str(candidate)
    raise AssertionError("no unwritable folder to test with")


def _places(tmp_path: Path, three_sources) -> dict[str, str]:
    """What the rows' {placeholders} stand for."""
    recipe, _ = three_sources
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    (tmp_path / "manifest-folder").mkdir()
    folder_manifest = tmp_path / "folder-manifest.yaml"
    folder_manifest.write_text(
        yaml.safe_dump({**recipe, "manifest": str(tmp_path / "manifest-folder")})
    )
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 1, "tokens": {"prose": 64}}) + "\n")
    file = tmp_path / "a-file"
    file.write_text("x")
    return {
        "recipe": str(path),
        "folder_manifest": str(folder_manifest),
        "log": str(log),
        "tmp": str(tmp_path),
        "missing": str(tmp_path / "missing"),
        "file": str(file),
        "unwritable": _unwritable_folder(tmp_path),
    }


def _argv(row: list[str], places: dict[str, str]) -> list[str]:
    return [arg.format(**places) for arg in row]


def _check(argv: list[str], expected: str, status: object, out: str, err: str) -> str | None:
    """What is wrong with how a bad command ended, or None."""
    lines = err.splitlines()
    if "Traceback" in out + err:
        return f"{argv}: traceback:\n{err}"
    if status != 2:
        return f"{argv}: exit status {status!r}, not 2; stderr {err!r}"
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return f"{argv}: stderr is not one `error: ` line: {err!r}"
    if expected not in lines[0]:
        return f"{argv}: {expected!r} not in {lines[0]!r}"
    return None


def _in_process(argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status: object = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
        except Exception:  # the traceback is the failure this test reports
            status = "raised"
            print(f"Traceback\n{traceback.format_exc()}", file=sys.stderr)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_every_bad_argument_is_one_error_line(tmp_path, three_sources, monkeypatch):
    places = _places(tmp_path, three_sources)
    monkeypatch.chdir(tmp_path)  # report's default output, report.png, lands here
    failures = []
    for row, expected in ROWS:
        argv = _argv(row, places)
        failures.append(_check(argv, expected, *_in_process(argv)))
    failures = [f for f in failures if f]
    assert not failures, f"{len(failures)} of {len(ROWS)} rows:\n" + "\n".join(failures)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "report.png").exists()


@pytest.mark.slow
def test_console_script_bad_arguments(tmp_path, three_sources):
    places = _places(tmp_path, three_sources)
    mixer = str(Path(sys.executable).with_name("mixer"))
    started = [
        (argv, expected, procs.spawn([mixer, *argv]))
        for row, expected in SUBPROCESS_ROWS
        for argv in [_argv(row, places)]
    ]
    failures = []
    for argv, expected, proc in started:
        done = procs.finish(proc, timeout=120)
        failures.append(_check(argv, expected, done.returncode, done.stdout, done.stderr))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


def _value_flags() -> list[tuple[str, argparse.Action]]:
    """(command, action) for every option of every command that takes a value."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (name, action)
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.option_strings and action.nargs != 0
    ]


def test_every_value_flag_is_checked_and_has_a_row():
    flags = _value_flags()
    assert {name for name, _ in flags} >= {
        "inspect",
        "plan",
        "index",
        "cache",
        "preview",
        "bench",
        "report",
    }
    for name, action in flags:
        assert action.type is not None, (
            f"`mixer {name} {action.option_strings[0]}` has no "
            "type= that checks its value (a count or an output path)"
        )
        rows = [
            row
            for row, _ in ROWS
            if row
            and row[0] == name
            and any(
                arg == opt or arg.startswith(f"{opt}=")
                for arg in row[1:]
                for opt in action.option_strings
            )
        ]
        assert rows, f"no row of ROWS gives `mixer {name}` a bad {action.option_strings}"


def test_good_values_still_parse(tmp_path):
    parser = cli.build_parser()
    args = parser.parse_args(
        ["plan", "r.yaml", "--tokens", "2.5e6", "--world", "1_024", "--workers", "0"]
    )
    assert (args.tokens, args.world, args.workers) == (2_500_000, 1024, 0)
    assert isinstance(args.tokens, int)
    assert parser.parse_args(["inspect", "r.yaml"]).tokens == 10**9
    folder = tmp_path / "new"
    args = parser.parse_args(["preview", "r.yaml", "--save-images", str(folder)])
    assert args.save_images == str(folder) and not folder.exists()
    out = os.path.join(tmp_path, "m.jsonl")
    assert parser.parse_args(["bench", "r.yaml", "--metrics-out", out]).metrics_out == out
