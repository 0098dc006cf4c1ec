"""No DataLoader worker outlives the process that owns the loader, however that process ends.

Real training scripts, forked from one driver process that imported torch once (see
lifetime_driver.py), end in each way REPS times; per run we check the exit status, that the
script's stdout/stderr pipe closes (no worker still holds it) and that no worker is alive a
few seconds later. A Ctrl-C or a SIGTERM whose handler raises is sent again if the script
goes on (Python can drop the exception, see lifetime_driver.RAISING).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import procs
import pytest
from helpers import corpus, make_tokenizer, write_docs

pytestmark = [pytest.mark.slow]

REPS = int(os.environ.get("MIXER_LIFETIME_REPS", "1"))  # 15 each passed locally
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "lifetime_driver.py"
ENDINGS = {
    "end": 0,  # the script ends without close()
    "exception": 1,  # an error propagates out of the loop
    "sigterm": -signal.SIGTERM,  # default disposition: no Python code runs
    "sigterm_handler": 143,  # a handler that calls sys.exit(143)
    "sigint": -signal.SIGINT,  # Ctrl-C to the process group
    "sigkill": -signal.SIGKILL,
    "thread_sigkill": -signal.SIGKILL,  # iterated on a thread: no parent-death signal
}


def busy_recipe(folder: Path) -> Path:
    """Batches of 8 × 1024 tokens (128 KB through the pipe, more than it buffers), so workers
    are tokenizing or blocked on a full pipe whenever the script ends."""
    sources = []
    for i, name in enumerate(("prose", "code")):
        for part in range(2):
            write_docs(
                folder / name / f"{part}.jsonl",
                corpus(1000 * i + 200 * part, 200, max_len=400, seed=i),
                "jsonl",
            )
        sources.append({"name": name, "path": str(folder / name / "*.jsonl"), "weight": 1})
    recipe = {
        "seed": 3,
        "tokenizer": str(make_tokenizer(folder / "tokenizer.json")),
        "seq_len": 1024,
        "batch_size": 8,
        "lanes": 4,
        "shuffle_window": 16,
        "split_bytes": 4096,
        "sources": sources,
    }
    path = folder / "recipe.json"
    path.write_text(json.dumps(recipe))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Every ending, REPS times, interleaved; one driver so torch is imported once."""
    recipe = busy_recipe(tmp_path_factory.mktemp("lifetime"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = procs.run(
        [sys.executable, str(DRIVER), str(recipe), str(REPS), *ENDINGS], timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("ending", ENDINGS)
def test_no_worker_outlives_its_owner(runs, ending):
    assert len(runs[ending]) == REPS
    for run in runs[ending]:
        assert run["workers"] == 2, run["output"]
        assert run["status"] == ENDINGS[ending], run["output"]
        assert run["pipe_closed"], f"a process still holds the script's stdout: {run}"
        assert not run["survivors"], f"workers outlived their owner: {run}"
        assert not run["strays"], f"processes outlived their owner: {run}"
