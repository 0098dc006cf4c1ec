"""mixer's collectives follow the current default process group: after
destroy_process_group and a new init_process_group (an in-process restart), nothing of the
old group is kept or used."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from mixer.runtime import dist as mixer_dist


def _init(store: str) -> None:
    # a file store: no port to race for with the other test process's jobs
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


@pytest.mark.parametrize("training_backend", ["gloo", "nccl"])
def test_gloo_group_belongs_to_the_current_default_group(monkeypatch, tmp_path, training_backend):
    # "nccl": mixer makes a gloo subgroup beside the training group (get_backend reports
    # nccl; the world itself is gloo, which is what this CPU machine can run).
    monkeypatch.setattr(mixer_dist.dist, "get_backend", lambda *a: training_backend)
    groups = []
    try:
        for attempt in range(2):
            _init(str(tmp_path / f"store{attempt}"))
            group = mixer_dist.gloo_group()
            assert mixer_dist.gloo_group() is group, "one group per default group"
            assert mixer_dist.all_gather_objects({"attempt": attempt}) == [{"attempt": attempt}]
            groups.append(group)
            dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        mixer_dist._forget_subgroup()
    assert groups[0] is not groups[1]
