"""DataLoader workers split the parent's tokenizer threads between them instead of each
starting a pool as large as the machine (oversubscribed cores spend CPU on contention)."""

from __future__ import annotations

import os

import pytest
from torch.utils.data import DataLoader, IterableDataset

from mixer.runtime import worker_processes


class _WorkerEnv(IterableDataset):
    def __iter__(self):
        yield os.environ.get("RAYON_NUM_THREADS")


def _worker_pools(num_workers: int) -> list[str | None]:
    loader = DataLoader(
        _WorkerEnv(),
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="fork",
        worker_init_fn=worker_processes.init_fn(),
    )
    return list(loader)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    ("budget", "num_workers", "share"),
    [("4", 2, "2"), ("2", 2, "1"), ("3", 2, "1"), ("1", 3, "1"), ("8", 3, "2")],
)
def test_each_worker_gets_its_share_of_the_tokenizer_threads(
    monkeypatch, budget, num_workers, share
):
    monkeypatch.setenv("RAYON_NUM_THREADS", budget)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    assert _worker_pools(num_workers) == [share] * num_workers
    assert os.environ["RAYON_NUM_THREADS"] == budget, "the parent's own pool is untouched"


@pytest.mark.parametrize("setting", [None, "0", "many"])
def test_without_a_usable_setting_the_budget_is_the_cpus_this_process_may_use(monkeypatch, setting):
    # rayon's own rule: unset, 0 or unparsable means its default, the CPUs available
    if setting is None:
        monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("RAYON_NUM_THREADS", setting)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert _worker_pools(2) == [str(max(1, cpus // 2))] * 2


@pytest.mark.slow
@pytest.mark.parametrize("off", ["false", "FALSE", "off", "0", "no", ""])
def test_a_tokenizer_told_not_to_parallelize_is_left_so(monkeypatch, off):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", off)
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    assert _worker_pools(2) == ["4", "4"]


def test_a_tokenizer_told_to_parallelize_gets_its_share(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    assert _worker_pools(2) == ["2", "2"]
