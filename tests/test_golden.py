"""Golden digests: the batches and states of every bundled recipe, checked after every change.

Each case digests the first batches a loader yields (every tensor, its dtype and shape) and
the state after each, for: every recipe in `recipes/`, the image recipe under both layouts,
num_workers 0 and 2, a resume from a mid-stream state, and a cold and a warm token cache.
A change that alters any batch or state fails here. Batches and states are recorded apart:
a deliberate change of the state format is recorded with
`python tests/test_golden.py --write-states`, which refuses when any batch differs; a
deliberate change of batches with `--write`. Either is said in its commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml

import mixer

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "data" / "golden_batches.json"
BATCHES = 4
RESUME_AT = 3


def _recipe(name: str, **changes) -> mixer.Recipe:
    path = ROOT / "recipes" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return mixer.load_recipe({**data, "base_dir": str(path.parent)})


def _digest_batch(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        h.update(key.encode())
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


def _without_versions(value):
    """The state without the files' versions (local mtimes differ between checkouts)."""
    if isinstance(value, dict):
        return {k: _without_versions(v) for k, v in value.items() if k != "versions"}
    if isinstance(value, list):
        return [_without_versions(v) for v in value]
    return value


def _digest_state(state: dict) -> str:
    payload = {**state, "json": _without_versions(json.loads(state["json"]))}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def _run(
    recipe: mixer.Recipe,
    *,
    num_workers: int = 0,
    state: dict | None = None,
    batches: int = BATCHES,
    rank: int = 0,
    world_size: int = 2,
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"batches": [], "states": []}
    with mixer.build_loader(
        recipe, rank=rank, world_size=world_size, num_workers=num_workers
    ) as loader:
        if state is not None:
            loader.load_state_dict(state)
        for batch, _ in zip(loader, range(batches)):
            out["batches"].append(_digest_batch(batch))
            out["states"].append(_digest_state(loader.state_dict()))
    return out


def _state_after(recipe: mixer.Recipe, steps: int) -> dict:
    with mixer.build_loader(recipe, rank=0, world_size=2, num_workers=0) as loader:
        for _, _ in zip(loader, range(steps)):
            pass
        return loader.state_dict()


RECIPES = ["demo", "schedule_demo", "train_demo", "multimodal_demo"]
CASES = [f"{name}/w0" for name in RECIPES] + [
    "demo/w2",
    "multimodal_demo/w2",
    "multimodal_llava/w0",
    "multimodal_llava/w2",
    "demo/resume",
    "multimodal_demo/resume",
    "demo/cache_cold",
    "demo/cache_warm",
]


def _case_recipe(name: str, tmp: Path | None = None) -> mixer.Recipe:
    if name == "multimodal_llava":
        return _recipe(
            "multimodal_demo",
            **{
                "images.layout": "llava",
                "images.image_size": 336,
                "images.max_patches_per_batch": None,
                "seq_len": 2048,
            },
        )
    if tmp is not None:
        return _recipe(name, token_cache=str(tmp / "cache"))
    return _recipe(name)


def compute(case: str, tmp: Path) -> dict[str, list[str]]:
    """The digests of one case (`tmp`: a fresh folder for its token cache)."""
    name, kind = case.split("/")
    if kind in ("w0", "w2"):
        return _run(_case_recipe(name), num_workers=int(kind[1]))
    if kind == "resume":
        recipe = _case_recipe(name)
        return _run(recipe, state=_state_after(recipe, RESUME_AT), num_workers=2)
    recipe = _case_recipe(name, tmp)
    if kind == "cache_warm":
        _run(recipe, batches=120)  # fills the entries its lanes read whole
        assert list((tmp / "cache").glob("*/*.bin")), "the cold run stored no entry"
    return _run(recipe)


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_batches_and_states_match_the_golden_digests(case, tmp_path):
    got, golden = compute(case, tmp_path), _golden()[case]
    assert got["batches"] == golden["batches"], (
        f"{case}: the batches changed (python tests/test_golden.py --write records a "
        "deliberate change)"
    )
    assert got["states"] == golden["states"], (
        f"{case}: the states changed (python tests/test_golden.py --write-states records a "
        "deliberate change of the state format)"
    )


def test_the_golden_file_covers_every_case():
    assert sorted(_golden()) == sorted(CASES)


def _write(states_only: bool) -> None:
    import tempfile

    old = _golden() if GOLDEN.exists() else {}
    out = {}
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            out[case] = compute(case, Path(tmp))
        if states_only and out[case]["batches"] != old.get(case, {}).get("batches"):
            sys.exit(f"{case}: the batches changed too; nothing written (use --write)")
        print(case, out[case]["batches"][0], out[case]["states"][0])
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] in (["--write"], ["--write-states"]):
        _write(states_only=sys.argv[1] == "--write-states")
    else:
        sys.exit(f"usage: {sys.argv[0]} --write | --write-states")
