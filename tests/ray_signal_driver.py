"""A driver for tests/test_ray_signals.py: a loader of the recipe (JSON, argv[1]) on two Ray
actors of a local cluster it starts itself; prints "ready" and the actors' pids once both
delivered, then consumes until a signal ends it. SIGINT is a KeyboardInterrupt the driver
catches as a trainer's loop would."""

from __future__ import annotations

import json
import os
import sys

import mixer

recipe = json.loads(sys.argv[1])
loader = mixer.build_loader(recipe, workers=mixer.RayWorkers(actors=2, cpus_per_actor=0.5))
try:
    n = 0
    for _batch in loader:
        n += 1
        if n == 4:
            assert loader._tier.pool is not None
            pids = [loader._tier.pool.ray.get(a.pid.remote()) for a in loader._tier.pool.actors]
            print("ready", os.getpid(), *pids, flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
