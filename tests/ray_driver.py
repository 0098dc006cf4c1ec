"""A driver for tests/test_ray_workers.py: joins the cluster at argv[1], starts a loader of the
recipe (JSON, argv[2]) on two Ray actors, prints their ids and waits to be killed."""

from __future__ import annotations

import json
import sys
import time

import ray

import mixer

ray.init(address=sys.argv[1])
loader = mixer.build_loader(json.loads(sys.argv[2]), workers=mixer.RayWorkers(actors=2))
batches = iter(loader)
next(batches)
next(batches)  # one from each actor: both are alive
print(json.dumps([actor._actor_id.hex() for actor in loader._tier.pool.actors]), flush=True)
time.sleep(600)
