"""The one topology rule: global batch → lane → rank → worker, as the loader, the lanes'
producer and the Ray actors use it."""

from __future__ import annotations

import itertools

from mixer.runtime.topology import fits, global_batch, lane_of, lanes_served


def test_workers_partition_their_ranks_lanes_and_make_its_steps():
    for lanes, world, workers, start in itertools.product((4, 12), (1, 2), (1, 2, 3), (0, 5)):
        if not fits(lanes, world, workers):
            continue
        for rank in range(world):
            mine = lanes_served(lanes, start, rank, world)
            per_worker = [
                lanes_served(lanes, start, rank, world, w, workers) for w in range(workers)
            ]
            assert sorted(itertools.chain(*per_worker)) == mine  # a partition of the rank's
            assert len(mine) == lanes // world
            for step in range(3 * lanes):
                g = global_batch(start, step, rank, world)
                assert g % world == (start + rank) % world  # rank r's steps are its own
                assert lane_of(g, lanes) in per_worker[step % workers]  # worker step mod N


def test_ranks_interleave_into_the_global_stream():
    got = sorted(global_batch(7, s, r, 3) for s in range(4) for r in range(3))
    assert got == list(range(7, 7 + 12))
