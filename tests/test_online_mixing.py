"""Online mixing built in: per-source sums from packed batches, ODM and ADO against reference
implementations written from the papers' pseudocode, the update points, and exact resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import batch_digest
from hypothesis import given, settings
from hypothesis import strategies as st
from online_mixing_common import EVERY, NAMES, fake_loss, make_data, train

import mixer
from mixer.mixing import ALGORITHMS, make_algorithm, register_algorithm
from mixer.mixing.odm import exploration
from mixer.mixing.power_law import ALPHAS, fit_power_law


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    return make_data(tmp_path_factory.mktemp("online_mixing"))


def with_mixing(base: dict, **mixing) -> dict:
    return {**base, "online_mixing": {**base["online_mixing"], **mixing}}


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


# -- per-source sums -------------------------------------------------------------------------


def loop_sums(token_loss: torch.Tensor, batch: dict, shifted: bool) -> dict[int, tuple]:
    """The reference: every position, one at a time."""
    out: dict[int, list] = {}
    rows, cols = batch["labels"].shape
    for b in range(rows):
        for t in range(1 if shifted else 0, cols):
            label, src = int(batch["labels"][b, t]), int(batch["source_ids"][b, t])
            if label == -100 or src < 0:
                continue
            loss = float(token_loss[b, t - 1 if shifted else t])
            entry = out.setdefault(src, [0.0, 0])
            entry[0] += loss
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.fixture(scope="module")
def packed_batches(base) -> list[dict]:
    """Batches with document masks (concat) and with padding (pad packing)."""
    out = []
    for extra in ({"mask_document_boundaries": True}, {"packing": "pad"}):
        recipe = {**base, **extra}
        del recipe["online_mixing"]
        loader = mixer.build_loader(recipe)
        it = iter(loader)
        out += [next(it) for _ in range(3)]
        loader.close()
    return out


def test_batches_hold_what_the_sums_must_skip(packed_batches):
    masked = packed_batches[0]
    padded = packed_batches[3]
    # a document boundary inside a row: a label -100 where source_ids is a real source
    assert bool(((masked["labels"] == -100) & (masked["source_ids"] >= 0)).any())
    assert bool((padded["source_ids"] == -1).any())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), which=st.integers(0, 5), shifted=st.booleans())
def test_loss_by_source_equals_a_loop_over_positions(packed_batches, seed, which, shifted):
    batch = packed_batches[which]
    rows, cols = batch["labels"].shape
    gen = torch.Generator().manual_seed(seed)
    loss = torch.rand(rows, cols - 1 if shifted else cols, generator=gen) * 10
    loss = torch.where(
        (batch["labels"][:, 1:] if shifted else batch["labels"]) == -100, float("nan"), loss
    )
    got = mixer.loss_by_source(loss, batch, names=list(NAMES))
    want = loop_sums(loss, batch, shifted)
    assert {NAMES[k] for k in want} == set(got)
    for k, (s, n) in want.items():
        assert got[NAMES[k]][1] == n
        assert math.isclose(got[NAMES[k]][0], s, rel_tol=1e-9)
    assert mixer.loss_by_source(loss, batch).keys() == want.keys()  # keyed by id without names


def test_report_loss_refuses_a_tensor_of_another_shape(base, packed_batches):
    loader = mixer.build_loader(base)
    batch = packed_batches[0]
    with pytest.raises(ValueError, match="expected"):
        loader.report_loss(torch.zeros(4, 3), batch)
    with pytest.raises(ValueError, match="NaN"):
        loader.report_loss(torch.full(batch["labels"].shape, float("nan")), batch)


def test_import_mixer_still_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, mixer, mixer.mixing; print('torch' in sys.modules)"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"


# -- the algorithms against the papers' pseudocode --------------------------------------------


def odm_reference(losses: list[list[float]], k: int, alpha: float) -> list[np.ndarray]:
    """Albalak et al. 2023, Algorithm 1 (uniform start): EXP3 with smoothed rewards."""
    rewards = np.zeros(k)
    pi = np.full(k, 1.0 / k)
    out = []
    for t, step_losses in enumerate(losses, start=1):
        rewards = alpha * rewards + (1 - alpha) * np.asarray(step_losses) / pi
        eps_prev = 1.0 / k if t == 1 else min(1.0 / k, math.sqrt(math.log(k) / (k * (t - 1))))
        eps = min(1.0 / k, math.sqrt(math.log(k) / (k * t)))
        soft = np.exp(eps_prev * rewards) / np.exp(eps_prev * rewards).sum()
        pi = (1 - k * eps) * soft + eps
        out.append(pi)
    return out


def loss_sequence(updates: int, seed: int, k: int = 3) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(2 + np.arange(k) * 0.5 + rng.normal(0, 0.3, k)) for _ in range(updates)]


def test_odm_matches_the_papers_algorithm():
    seq = loss_sequence(40, seed=1)
    odm = make_algorithm("odm", list(NAMES), [1 / 3] * 3, {"smoothing": 0.8})
    for losses, want in zip(seq, odm_reference(seq, 3, 0.8)):
        got = odm.update(dict(zip(NAMES, losses)), {n: 100 for n in NAMES}, 0)
        np.testing.assert_allclose([got[n] for n in NAMES], want, rtol=1e-12)
    assert exploration(0, 3) == 1 / 3 and exploration(100, 3) == math.sqrt(math.log(3) / 300)


def test_odm_moves_weight_to_the_source_with_persistently_higher_loss():
    odm = make_algorithm("odm", list(NAMES), [1 / 3] * 3, {})
    history = [odm.update({"easy": 2.0, "mid": 2.0, "hard": 4.0}, {}, 0) for _ in range(60)]
    # the first updates explore (ε_t = 1/K while t <= K·ln K); then the harder source leads
    assert history[2] == dict(zip(NAMES, [1 / 3] * 3))
    for w in history[4:]:
        assert w["hard"] > 0.35 > 0.32 > w["easy"]
    assert math.isclose(history[-1]["easy"], history[-1]["mid"])


def fit_reference(n: list[float], y: list[float]) -> tuple[float, float, float]:
    """The documented fit, one α at a time in plain Python."""
    best = None
    for alpha in [float(a) for a in ALPHAS]:
        x = [v ** (-alpha) for v in n]
        xm, ym = sum(x) / len(x), sum(y) / len(y)
        var = sum((a - xm) ** 2 for a in x)
        beta = max(sum((a - xm) * (b - ym) for a, b in zip(x, y)) / var if var > 0 else 0, 0)
        eps = ym - beta * xm
        if eps < 0:
            eps, beta = 0.0, sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x)
        err = sum((math.log(max(eps + beta * a, 1e-300)) - math.log(b)) ** 2 for a, b in zip(x, y))
        if best is None or err < best[0]:
            best = (err, eps, beta, alpha)
    assert best is not None
    return best[1], best[2], best[3]


def test_power_law_fit_recovers_a_known_curve():
    n = [1000.0 * i for i in range(1, 30)]
    law = fit_power_law(n, [2.0 + 50.0 * v**-0.3 for v in n])
    assert (
        math.isclose(law.alpha, 0.3) and abs(law.epsilon - 2) < 1e-6 and abs(law.beta - 50) < 1e-4
    )
    noisy = [2.0 + 50.0 * v**-0.3 + 0.01 * math.sin(v) for v in n]
    got = fit_power_law(n, noisy)
    want = fit_reference(n, noisy)
    np.testing.assert_allclose([got.epsilon, got.beta, got.alpha], want, rtol=1e-9)


def ado_reference(seq, tokens, prior, p) -> list[list[float]]:
    """Jiang et al. 2024 (ADO), per update: fit, ρ ∝ μ·h^s·(−dL/dn), π from ρ and π̄, floor
    δ_min, then h and π̄ — each source in a plain loop."""
    k = len(prior)
    n, pts = [0] * k, [[] for _ in range(k)]
    h, pi_bar, out = list(prior), list(prior), []
    for t, (losses, toks) in enumerate(zip(seq, tokens), start=1):
        step = t * p["every"]
        for i in range(k):
            n[i] += toks[i]
            if step > p["ignore_batches"]:
                pts[i].append((n[i], losses[i]))
        if step < p["start_batches"]:
            out.append(list(prior))
            continue
        raw = []
        for i in range(k):
            slope = 0.0
            if len(pts[i]) >= 3:
                eps, beta, alpha = fit_reference([a for a, _ in pts[i]], [b for _, b in pts[i]])
                slope = -alpha * beta * n[i] ** (-alpha) / n[i]
            raw.append(max(prior[i] * h[i] ** p["s"] * -slope, 0.0))
        rho = [r / sum(raw) for r in raw] if sum(raw) > 0 else list(prior)
        pi = [p["gamma2"] * r + (1 - p["gamma2"]) * b for r, b in zip(rho, pi_bar)]
        pi = [w / sum(pi) for w in pi]
        pi = [max(w, p["delta_min"]) for w in pi]
        pi = [w / sum(pi) for w in pi]
        h = [p["gamma1"] * w + (1 - p["gamma1"]) * x for w, x in zip(pi, h)]
        pi_bar = [r / (t + 1) + (1 - 1 / (t + 1)) * b for r, b in zip(rho, pi_bar)]
        pi_bar = [w / sum(pi_bar) for w in pi_bar]
        out.append(pi)
    return out


def falling_losses(updates: int, rates: list[float]) -> tuple[list, list]:
    """Losses that follow ε + β·n^(−α) per source, for equal tokens per update."""
    seq, toks = [], []
    for t in range(1, updates + 1):
        n = 64 * EVERY * t
        seq.append([1.5 + 40 * n ** (-r) for r in rates])
        toks.append([64 * EVERY] * len(rates))
    return seq, toks


def test_ado_matches_the_papers_algorithm():
    p = {"gamma1": 0.1, "gamma2": 0.1, "s": 0.5, "delta_min": 0.01}
    p.update(ignore_batches=8, start_batches=20, every=EVERY)
    seq, toks = falling_losses(30, [0.6, 0.3, 0.1])
    prior = [0.25, 0.25, 0.5]
    params = {k: v for k, v in p.items() if k != "every"}
    ado = make_algorithm("ado", list(NAMES), prior, params)
    want = ado_reference(seq, toks, prior, p)
    for t, (losses, tok) in enumerate(zip(seq, toks), start=1):
        got = ado.update(dict(zip(NAMES, losses)), dict(zip(NAMES, tok)), t * EVERY)
        np.testing.assert_allclose([got[n] for n in NAMES], want[t - 1], rtol=1e-9)


def test_ado_moves_weight_to_the_source_whose_loss_still_falls_steeply():
    seq, toks = falling_losses(40, [0.6, 0.6, 0.3])  # "hard" still improves, the others flat
    ado = make_algorithm("ado", list(NAMES), [1 / 3] * 3, {"ignore_batches": 0, "start_batches": 0})
    weights = [
        ado.update(dict(zip(NAMES, loss)), dict(zip(NAMES, tok)), t * EVERY)
        for t, (loss, tok) in enumerate(zip(seq, toks), start=1)
    ]
    assert weights[-1]["hard"] > 0.45 > 1 / 3 > weights[-1]["easy"]
    assert weights[0] == dict(zip(NAMES, [1 / 3] * 3))  # too few points to fit yet


def test_a_plugin_registered_by_name_drives_the_loader(base):
    class Favourite:
        def __init__(self, names, prior, params):
            self.names, self.calls = names, 0

        def update(self, losses, tokens, step):
            self.calls += 1
            return {self.names[0]: 1.0}

        def state_dict(self):
            return {"calls": self.calls}

        def load_state_dict(self, state):
            self.calls = state["calls"]

    register_algorithm("favourite")(Favourite)
    try:
        loader = mixer.build_loader(with_mixing(base, algorithm="favourite"))
        _, mixes = train(loader, EVERY + 1)
        assert isinstance(loader._mixture.mixing.algorithm, mixer.mixing.Algorithm)
        assert mixes[-1]["weights"] == {"easy": 1.0, "mid": 0.0, "hard": 0.0}
        assert json.loads(loader.state_dict()["json"])["mixing"]["state"] == {"calls": 1}
    finally:
        del ALGORITHMS["favourite"]


# -- the loader's update points, determinism and resume ---------------------------------------


@pytest.fixture(scope="module")
def reference_run(base) -> tuple[list[str], list[dict]]:
    return train(mixer.build_loader(base), 3 * EVERY + 2)


def test_updates_happen_at_every_kth_global_batch_and_are_deterministic(base, reference_run):
    digests, mixes = reference_run
    assert [m["updates"] for m in mixes[: 2 * EVERY]] == [0] * EVERY + [1] * EVERY
    first = mixes[EVERY]
    # the weights the algorithm gave are the loader's targets from global batch `every` on
    assert first["weights"] != mixes[0]["weights"] == {"easy": 0.25, "mid": 0.25, "hard": 0.5}
    assert first["losses"]["hard"] > first["losses"]["mid"] > first["losses"]["easy"]
    assert train(mixer.build_loader(base), len(digests)) == reference_run


def test_the_stream_follows_the_updated_weights(base):
    """Same recipe, no reported loss difference before the first update: identical batches;
    after it, the batches differ from a static run (the weights took effect)."""
    static = {**base}
    del static["online_mixing"]
    loader = mixer.build_loader(static)
    want = [batch_digest(b) for b, _ in zip(loader, range(3 * EVERY))]
    got, mixes = train(mixer.build_loader(base), 3 * EVERY)
    assert got[:EVERY] == want[:EVERY] and got[EVERY:] != want[EVERY:]


@pytest.mark.parametrize("cut", [EVERY, EVERY + 2], ids=["at_update_point", "between"])
def test_resume_continues_the_same_batches_and_weights(base, reference_run, cut):
    digests, mixes = reference_run
    first = mixer.build_loader(base)
    train(first, cut)
    state = roundtrip(first.state_dict())
    first.close()
    resumed = mixer.build_loader(base)
    resumed.load_state_dict(state)
    assert resumed.metrics()["mixing"]["updates"] == mixes[cut - 1]["updates"]
    got = train(resumed, len(digests) - cut)
    assert got == (digests[cut:], mixes[cut:])


@pytest.mark.slow
def test_merged_rank_states_resume_on_one_rank_with_their_pending_sums(base, reference_run):
    """Two ranks (world 2) up to before the first update, their states merged, resumed on one
    rank with two workers: the update combines both ranks' sums, as the one-rank run did."""
    digests, mixes = reference_run
    steps = EVERY // 2 - 1  # per rank: 2·steps global batches, before the first update
    states = []
    for rank in range(2):
        loader = mixer.build_loader(base, rank=rank, world_size=2)
        train(loader, steps)
        states.append(loader.state_dict())
    merged = mixer.merge_states(states)
    assert json.loads(merged["json"])["mixing"]["pending"]["hard"][1] > 0
    resumed = mixer.build_loader(base, num_workers=2)
    resumed.load_state_dict(roundtrip(merged))
    got = train(resumed, len(digests) - 2 * steps)
    assert got == (digests[2 * steps :], mixes[2 * steps :])
    resumed.close()


def test_a_global_state_gives_its_pending_sums_to_rank_0_only(base):
    loader = mixer.build_loader(base)
    train(loader, EVERY - 1)
    state = loader.state_dict()
    ranks = [mixer.build_loader(base, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    assert ranks[0]._mixture.mixing.pending == loader._mixture.mixing.pending != [[0, 0]] * 3
    assert ranks[1]._mixture.mixing.pending == [[0, 0]] * 3


def test_a_source_without_reported_tokens_keeps_its_estimate(base):
    """A window in which `mid` gets no counted token (its labels -100): at the update its
    mean loss and ODM's reward estimate stay those of the update before; the others move."""
    loader = mixer.build_loader(base)
    it = iter(loader)
    train(loader, EVERY, it)
    batch = next(it)  # the first update
    first = loader.metrics()["mixing"]["losses"]
    rewards = list(loader._mixture.mixing.algorithm.rewards)
    for _ in range(EVERY):
        hidden = {**batch, "labels": batch["labels"].masked_fill(batch["source_ids"] == 1, -100)}
        loader.report_loss(fake_loss(batch), hidden)
        batch = next(it)
    second = loader.metrics()["mixing"]
    assert second["updates"] == 2 and second["losses"]["mid"] == first["mid"]
    assert loader._mixture.mixing.algorithm.rewards[1] == rewards[1]
    assert loader._mixture.mixing.algorithm.rewards[0] != rewards[0]
    assert loader._mixture.mixing.algorithm.rewards[2] != rewards[2]


def test_metrics_report_the_mixing(base, reference_run):
    _, mixes = reference_run
    last = mixes[-1]
    assert set(last) == {"algorithm", "updates", "weights", "losses"}
    assert last["algorithm"] == "odm" and last["updates"] == 3
    assert math.isclose(sum(last["weights"].values()), 1.0)


# -- refused or defined together --------------------------------------------------------------


def test_set_weights_is_refused_while_online_mixing_sets_them(base):
    with pytest.raises(mixer.RecipeError, match="online_mixing"):
        mixer.build_loader(base).set_weights({"easy": 1.0})


def test_report_loss_without_online_mixing_is_refused(base, packed_batches):
    static = {**base}
    del static["online_mixing"]
    batch = packed_batches[0]
    with pytest.raises(mixer.RecipeError, match="online_mixing"):
        mixer.build_loader(static).report_loss(fake_loss(batch), batch)


def test_every_must_be_a_multiple_of_the_world_size(base):
    with pytest.raises(mixer.TopologyError, match="multiple of the world size"):
        mixer.build_loader(with_mixing(base, every=3), rank=0, world_size=2)


@pytest.mark.parametrize(
    "mixing, field",
    [
        ({"every": 5}, "online_mixing.algorithm"),
        ({"algorithm": "bandit"}, "online_mixing.algorithm"),
        ({"algorithm": "odm", "every": 0}, "online_mixing.every"),
        ({"algorithm": "odm", "smoothing": 1.0}, "online_mixing.smoothing"),
        ({"algorithm": "odm", "gamma1": 0.1}, "online_mixing.gamma1: unknown key"),
        ({"algorithm": "ado", "delta_min": -1}, "online_mixing.delta_min"),
        ({"algorithm": "ado", "min_points": 9, "max_points": 4}, "online_mixing: min_points"),
    ],
)
def test_bad_online_mixing_keys_are_recipe_errors_naming_the_field(base, mixing, field):
    with pytest.raises(mixer.RecipeError, match=field):
        mixer.load_recipe({**base, "online_mixing": mixing})


def test_a_schedule_and_online_mixing_are_refused_together(base):
    schedule = {"points": [{"at_tokens": 0, "weights": {"easy": 1.0}}]}
    with pytest.raises(mixer.RecipeError, match="online_mixing: cannot be combined"):
        mixer.load_recipe({**base, "schedule": schedule})


def test_a_state_of_another_algorithm_is_refused(base):
    loader = mixer.build_loader(base)
    train(loader, 2)
    other = mixer.build_loader(with_mixing(base, algorithm="ado"))
    with pytest.raises(mixer.StateError, match="algorithm changed"):
        other.load_state_dict(loader.state_dict())


def test_ado_state_resumes_exactly(base):
    recipe = with_mixing(base, algorithm="ado", ignore_batches=0, start_batches=2 * EVERY)
    steps, cut = 5 * EVERY, 3 * EVERY + 1
    digests, mixes = train(mixer.build_loader(recipe), steps)
    assert mixes[-1]["weights"] != mixes[0]["weights"]  # ADO moved them
    first = mixer.build_loader(recipe)
    train(first, cut)
    resumed = mixer.build_loader(recipe)
    resumed.load_state_dict(roundtrip(first.state_dict()))
    assert train(resumed, steps - cut) == (digests[cut:], mixes[cut:])


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_torchrun_job_mixes_as_one_rank_and_resumes_on_one(base, tmp_path):
    """Under torchrun the ranks' sums are combined at each update: the 2-rank job's global
    stream and weights are the 1-rank run's; its state, taken between updates with both
    ranks' sums pending, resumes on 1 rank exactly."""
    from test_torchrun import ROOT, torchrun

    steps, cut = 2 * EVERY, EVERY + 1  # per rank; the state is taken at global batch 2·cut
    (tmp_path / "recipe.json").write_text(json.dumps(base))
    prefix = tmp_path / "log"
    driver = ROOT / "tests" / "dist_online_mixing.py"
    torchrun(2, str(driver), str(tmp_path / "recipe.json"), str(prefix), str(steps), str(cut))
    job = {e["g"]: e for r in range(2) for e in json.loads((tmp_path / f"log.rank{r}").read_text())}
    digests, mixes = train(mixer.build_loader(base), 2 * steps)
    assert [job[g]["digest"] for g in range(2 * steps)] == digests
    # (a rank's metrics after its step: the weights of its next batch, as on one rank)
    assert [job[g]["mixing"]["weights"] for g in range(1, 2 * steps, 2)] == [
        m["weights"] for m in mixes[1::2]
    ]
    assert mixes[-1]["updates"] == 2 * steps // EVERY - 1  # (the next is at the next next())
    resumed = mixer.build_loader(base)
    resumed.load_state_dict(json.loads((tmp_path / "log.state").read_text()))
    assert train(resumed, 2 * (steps - cut)) == (digests[2 * cut :], mixes[2 * cut :])
