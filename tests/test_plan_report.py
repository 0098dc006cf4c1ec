"""`mixer plan` (plan.py) against real runs and exact integrals; `mixer report` (plots.py) and
the metrics log (metrics_log.py) it draws."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from helpers import write_docs
from hypothesis import given, settings
from hypothesis import strategies as st

from mixer.config.recipe import load_recipe
from mixer.core.errors import DataError, MixerError, TopologyError
from mixer.runtime.loader import Loader, build_loader
from mixer.runtime.topology import check_topology
from mixer.tools.cli import main
from mixer.tools.metrics_log import complete, read_metrics
from mixer.tools.plan import SourceSize, plan, simulate

# Documents of one source all have the same length and ids of the same number of digits, so
# inspect's estimate of its size (the plan's input) is exact up to rounding.
LENGTHS = {"a": 9, "b": 20, "c": 5}  # words; +1 EOS token each
COUNTS = {"a": 120, "b": 90, "c": 200}
SIZE = {n: COUNTS[n] * (LENGTHS[n] + 1) for n in LENGTHS}  # true tokens per epoch


@pytest.fixture
def data(tmp_path, tokenizer_path):
    """A recipe dict over sources a (jsonl), b (parquet), c (jsonl) of uniform documents."""
    first = {"a": 1000, "b": 2000, "c": 3000}
    for name in LENGTHS:
        docs = [(first[name] + i, LENGTHS[name]) for i in range(COUNTS[name])]
        for part in range(4):
            fmt = "parquet" if name == "b" else "jsonl"
            write_docs(tmp_path / name / f"{part}.{fmt}", docs[part::4], fmt)
    return {
        "seed": 3,
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 4,
        "lanes": 4,
        "shuffle_window": 16,
        "sources": [
            {"name": n, "path": str(tmp_path / n / "*"), "weight": w}
            for n, w in (("a", 0.5), ("b", 0.3), ("c", 0.2))
        ],
    }


def sized(**tokens: float) -> dict[str, SourceSize]:
    return {n: SourceSize(tokens=t) for n, t in tokens.items()}


def recipe_of(
    sources: dict[str, float | None],
    caps: dict[str, int] | None = None,
    schedule: dict | None = None,
):
    caps = caps or {}
    return load_recipe(
        {
            "tokenizer": "t.json",
            "seq_len": 8,
            "batch_size": 2,
            "lanes": 8,
            "schedule": schedule,
            "sources": [
                {"name": n, "path": f"{n}/*", "weight": w, "epochs": caps.get(n)}
                for n, w in sources.items()
            ],
        }
    )


def run_tokens(recipe: dict, batches: int | None = None) -> dict[str, int]:
    """Tokens per source that the loader delivers in `batches` batches (None: to the end)."""
    loader = build_loader(recipe, num_workers=0)
    with loader:
        for got, _ in enumerate(loader, 1):
            if batches is not None and got >= batches:
                break
        return loader.metrics()["tokens"]


# -- plan against real runs ------------------------------------------------------------------
def test_plan_matches_a_finite_run_to_the_end(data):
    recipe = {**data, "sources": [{**s, "epochs": e} for s, e in zip(data["sources"], (2, 1, 3))]}
    caps = {"a": 2, "b": 1, "c": 3}
    result = plan(load_recipe(recipe), 10**6)
    realized = run_tokens(recipe)
    assert realized == {n: caps[n] * SIZE[n] for n in caps}  # the run: every epoch, whole
    total = sum(realized.values())
    assert result["ends_at_tokens"] == pytest.approx(total, rel=0.01)
    assert any("ends at" in w for w in result["warnings"])
    for name, row in result["sources"].items():
        # Tolerance 1%: the plan's sizes are inspect's estimates (sampled bytes per document).
        assert row["target_tokens"] == pytest.approx(realized[name], rel=0.01)
        assert row["epochs"] == pytest.approx(caps[name], rel=0.01)
        assert row["runs_out_at_tokens"] is not None


def test_plan_epochs_match_an_unlimited_run(data):
    batch_tokens = data["batch_size"] * data["seq_len"]
    batches = 160
    tokens = batches * batch_tokens
    result = plan(load_recipe(data), tokens)
    realized = run_tokens(data, batches)
    assert sum(realized.values()) == tokens  # concat packing: no padding in an infinite run
    for name, row in result["sources"].items():
        # Tolerance: 1% of the epochs, plus one row per lane of mixing granularity.
        slack = 0.01 * row["epochs"] + data["lanes"] * data["seq_len"] / SIZE[name]
        assert row["epochs"] == pytest.approx(realized[name] / SIZE[name], abs=slack)
        assert row["epochs"] > 1, "the run must repeat every source"


def test_capped_source_running_out_in_a_real_run(data):
    """a (weight 0.5, one epoch of 1,200 tokens) runs out near 2,400 tokens; then b and c
    share 0.6 / 0.4. The plan's tokens per source match the loader's."""
    recipe = {**data, "sources": [{**data["sources"][0], "epochs": 1}, *data["sources"][1:]]}
    batches = 120
    tokens = batches * data["batch_size"] * data["seq_len"]
    result = plan(load_recipe(recipe), tokens)
    realized = run_tokens(recipe, batches)
    assert realized["a"] == SIZE["a"]
    assert result["sources"]["a"]["runs_out_at_tokens"] == pytest.approx(2 * SIZE["a"], rel=0.01)
    assert result["renormalizations"][0]["weights"] == pytest.approx({"b": 0.6, "c": 0.4})
    for name, row in result["sources"].items():
        # Lanes run a out one by one (each its slice): allow 0.5% of the run plus a row per
        # lane (measured: 32 tokens off, two rows).
        slack = 0.005 * tokens + data["lanes"] * data["seq_len"]
        assert abs(row["target_tokens"] - realized[name]) <= slack, name


@pytest.mark.slow
@pytest.mark.parametrize("interpolate", ["step", "linear"])
@pytest.mark.parametrize("cap", [None, 1])
def test_plan_matches_a_scheduled_run(data, interpolate, cap):
    """Under a schedule (b capped or not), the plan's tokens per source are the loader's."""
    if not hasattr(Loader, "set_weights"):  # schedules came into the loader with it
        pytest.skip("this loader does not follow schedules yet")
    sources = [{**s, "weight": None} for s in data["sources"]]
    sources[1]["epochs"] = cap
    recipe = {
        **data,
        "sources": sources,
        "schedule": {
            "interpolate": interpolate,
            "points": [
                {"at_tokens": 0, "weights": {"a": 1, "b": 1}},
                {"at_tokens": 2560, "weights": {"a": 1, "b": 3, "c": 1}},
                {"at_tokens": 6400, "weights": {"c": 1, "b": 1}},
            ],
        },
    }
    batches = 160
    tokens = batches * data["batch_size"] * data["seq_len"]
    result = plan(load_recipe(recipe), tokens)
    realized = run_tokens(recipe, batches)
    assert (result["sources"]["b"]["runs_out_at_tokens"] is not None) == (cap is not None)
    for name, row in result["sources"].items():
        # Measured: at most 55 tokens off (rows are whole; lanes run b out one by one).
        slack = 0.005 * tokens + data["lanes"] * data["seq_len"]
        assert abs(row["target_tokens"] - realized[name]) <= slack, (name, row, realized)


# -- plan's arithmetic -----------------------------------------------------------------------
def test_step_schedule_target_tokens_are_the_piecewise_integral():
    recipe = recipe_of(
        {"a": None, "b": None},
        schedule={
            "interpolate": "step",
            "points": [
                {"at_tokens": 0, "weights": {"a": 1, "b": 1}},
                {"at_tokens": 1000, "weights": {"a": 3, "b": 1}},
                {"at_tokens": 3000, "weights": {"b": 1}},
            ],
        },
    )
    result = plan(recipe, 5000, sizes=sized(a=100, b=1000))
    # a: 1000·½ + 2000·¾ + 2000·0;  b: 1000·½ + 2000·¼ + 2000·1
    assert result["sources"]["a"]["target_tokens"] == 2000
    assert result["sources"]["b"]["target_tokens"] == 3000
    assert result["sources"]["a"]["epochs"] == pytest.approx(20)
    assert result["schedule"] == "step"


def test_linear_schedule_target_tokens_are_the_integral():
    recipe = recipe_of(
        {"a": None, "b": None},
        schedule={
            "interpolate": "linear",
            "points": [
                {"at_tokens": 0, "weights": {"a": 1}},
                {"at_tokens": 1000, "weights": {"b": 1}},
            ],
        },
    )
    tokens = simulate(recipe, sized(a=1e9, b=1e9), 3000)["tokens"]
    assert tokens["a"] == pytest.approx(500) and tokens["b"] == pytest.approx(2500)


def test_capped_source_running_out_renormalizes_the_others():
    recipe = recipe_of({"a": 0.5, "b": 0.3, "c": 0.2}, caps={"a": 2})
    result = plan(recipe, 10_000, sizes=sized(a=500, b=10**6, c=10**6))
    a, b, c = (result["sources"][n] for n in "abc")
    assert a["target_tokens"] == 1000 and a["runs_out_at_tokens"] == 2000 and a["epochs"] == 2
    assert b["target_tokens"] == 600 + 4800 and c["target_tokens"] == 400 + 3200
    assert result["renormalizations"] == [
        {"at_tokens": 2000, "source": "a", "weights": {"b": 0.6, "c": 0.4}}
    ]
    assert b["runs_out_at_tokens"] is None and result["ends_at_tokens"] is None


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 10), min_size=1, max_size=4),
    caps=st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=4, max_size=4),
    sizes=st.lists(st.floats(1, 1e5), min_size=4, max_size=4),
    total=st.integers(1, 10**6),
)
def test_simulation_conserves_tokens_and_respects_caps(weights, caps, sizes, total):
    names = [f"s{i}" for i in range(len(weights))]
    caps, sizes = caps[: len(names)], sizes[: len(names)]
    recipe = recipe_of(dict(zip(names, weights)), caps=dict(zip(names, caps)))
    sim = simulate(recipe, sized(**dict(zip(names, sizes))), total)
    capacity = sum(c * s if c else float("inf") for c, s in zip(caps, sizes))
    assert sum(sim["tokens"].values()) == pytest.approx(min(total, capacity), rel=1e-6)
    for name, cap, size in zip(names, caps, sizes):
        if cap is not None:
            assert sim["tokens"][name] <= cap * size * (1 + 1e-9)
    if all(c is None for c in caps):
        for name, w in zip(names, recipe.weights):
            assert sim["tokens"][name] == pytest.approx(w * total, rel=1e-6)


def test_warnings_for_repeats_and_running_out():
    recipe = recipe_of({"a": 0.5, "b": 0.5}, caps={"a": 1})
    result = plan(recipe, 10_000, sizes=sized(a=1000, b=1000))
    text = "\n".join(result["warnings"])
    assert "'b' repeats 9" in text and "'a' (epochs: 1) runs out at 2,000 tokens" in text
    quiet = plan(recipe_of({"a": 0.5, "b": 0.5}), 1000, sizes=sized(a=1000, b=1000))
    assert quiet["warnings"] == []


def test_valid_workers_agree_with_the_loaders_check():
    recipe = recipe_of({"a": 1.0})
    for world in (1, 2, 3, 4, 8, 16):
        topo = plan(recipe, 100, world_size=world, sizes=sized(a=100))["topology"]
        for n in range(1, 17):
            try:
                check_topology(recipe.lanes, world, n)
                accepted = True
            except TopologyError:
                accepted = False
            assert (n in topo["valid_num_workers"]) == accepted, (world, n)
        assert topo["valid"] == (recipe.lanes % world == 0)
        for lanes in topo["valid_lanes"]:
            assert lanes % world == 0
    assert (
        plan(recipe, 100, world_size=2, num_workers=3, sizes=sized(a=100))["topology"]["valid"]
        is False
    )


# -- the command line ------------------------------------------------------------------------
def write_recipe(tmp_path, recipe: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


PLAN_KEYS = {
    "training_tokens",
    "planned_tokens",
    "ends_at_tokens",
    "schedule",
    "lanes",
    "seq_len",
    "batch_size",
    "sources",
    "renormalizations",
    "topology",
    "resume",
    "warnings",
}
SOURCE_KEYS = {
    "target_tokens",
    "share",
    "epochs",
    "epochs_cap",
    "tokens_per_epoch",
    "runs_out_at_tokens",
    "read_amplification",
    "resume_bytes_per_stream",
}


def test_plan_cli_json_and_table(data, tmp_path, capsys):
    recipe = {**data, "sources": [{**data["sources"][0], "epochs": 1}, *data["sources"][1:]]}
    path = write_recipe(tmp_path, recipe)
    assert main(["plan", path, "--tokens", "1e5", "--world", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == PLAN_KEYS
    assert set(result["sources"]) == {"a", "b", "c"}
    for row in result["sources"].values():
        assert set(row) == SOURCE_KEYS
    assert result["topology"]["valid_num_workers"] == [1, 2]
    assert result["resume"]["worst_bytes_per_rank"] > 0
    assert main(["plan", path, "--tokens", "1e5"]) == 0  # warnings only: exit 0
    out = capsys.readouterr().out
    assert "target tokens" in out and "warning: source 'a' (epochs: 1) runs out" in out
    assert "warning: source 'c' repeats" in out
    assert main(["plan", path, "--tokens", "1e5", "--world", "2", "--workers", "3"]) == 2
    assert "refuses this topology" in capsys.readouterr().err
    assert main(["plan", path, "--tokens", "0"]) == 2
    assert "training tokens must be positive" in capsys.readouterr().err
    assert main(["plan", path, "--tokens", "1e5", "--world", "0"]) == 2
    assert "world_size must be" in capsys.readouterr().err


# -- metrics log and report ------------------------------------------------------------------
def log_lines(n: int = 6, loss: bool = False) -> list[dict]:
    lines = []
    for step in range(1, n + 1):
        line = {
            "step": step,
            "tokens": {"a": 30 * step, "b": 10 * step},
            "target_share": {"a": 0.75, "b": 0.25},
            "epochs": {"a": step / 4, "b": step / 9},
            "global_tokens": 40 * step,
        }
        if loss:
            line.update(loss=2.0, loss_by_source={"a": 1.5, "b": 2.5})
        lines.append(line)
    return lines


def write_log(tmp_path, lines: list) -> str:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return str(path)


def panels(fig) -> dict:
    return {ax.get_label(): ax for ax in fig.axes if ax.get_label() in ("share", "epochs", "loss")}


def test_report_figure_has_a_share_line_per_source_and_loss_only_when_logged(tmp_path):
    pytest.importorskip("matplotlib")
    from mixer.tools.plots import report_figure, stretch_shares, write_report

    fig = report_figure(log_lines())
    axes = panels(fig)
    assert set(axes) == {"share", "epochs"}
    assert sorted(
        line.get_label() for line in axes["share"].lines if not line.get_label().startswith("_")
    ) == ["a", "b"]
    assert sorted(line.get_label() for line in axes["epochs"].lines) == ["a", "b"]
    assert stretch_shares(log_lines())["a"] == pytest.approx([0.75] * 6)

    out = tmp_path / "out" / "report.png"
    fig = write_report(write_log(tmp_path, log_lines(loss=True)), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = panels(fig)
    assert set(axes) == {"share", "epochs", "loss"}
    assert sorted(line.get_label() for line in axes["loss"].lines) == ["a", "b"]


def test_report_draws_the_cumulative_share_bold_the_stretches_light_the_target_dashed():
    """A mix exact over the run but lumpy per stretch (a row's worth either way, as on the
    demo): the main line is the cumulative share, which settles on the target."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgba

    from mixer.tools.plots import cumulative_shares, report_figure, stretch_shares

    lines, a, b = [], 0, 0
    for step in range(1, 9):
        a, b = a + (40 if step % 2 else 20), b + (0 if step % 2 else 20)  # a: 1.0, 0.5, ...
        lines.append(
            {
                "step": step,
                "tokens": {"a": a, "b": b},
                "global_tokens": a + b,
                "target_share": {"a": 0.75, "b": 0.25},
            }
        )
    assert stretch_shares(lines)["a"] == pytest.approx([1.0, 0.5] * 4)
    assert cumulative_shares(lines)["a"][:3] == pytest.approx([1.0, 0.75, 100 / 120])
    assert cumulative_shares(lines)["a"][1::2] == pytest.approx([0.75] * 4)
    share = panels(report_figure(lines))["share"]
    drawn = {line.get_gid(): line for line in share.lines}
    assert set(drawn) == {"cumulative:a", "cumulative:b", "stretch:a", "stretch:b"}
    for name in ("a", "b"):
        bold, light = drawn[f"cumulative:{name}"], drawn[f"stretch:{name}"]
        assert list(bold.get_ydata()) == pytest.approx(cumulative_shares(lines)[name])
        assert list(light.get_ydata()) == pytest.approx(stretch_shares(lines)[name])
        assert bold.get_label() == name and light.get_label().startswith("_")  # legend: bold
        assert light.get_alpha() < (bold.get_alpha() or 1.0)
        assert light.get_linewidth() < bold.get_linewidth()
        assert to_rgba(light.get_color())[:3] == to_rgba(bold.get_color())[:3]
    targets = share.collections[0]
    assert targets.get_linestyle()[0][1] is not None  # dashed
    assert [seg[:, 1].tolist() for seg in targets.get_segments()] == [[0.75] * 8, [0.25] * 8]


def test_bench_metrics_log_feeds_report(data, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write_recipe(tmp_path, data)
    log = tmp_path / "m.jsonl"
    assert (
        main(
            [
                "bench",
                path,
                "--batches",
                "10",
                "--no-progress",
                "--metrics-out",
                str(log),
                "--metrics-every",
                "4",
            ]
        )
        == 0
    )
    lines = read_metrics(log)
    assert [x["step"] for x in lines] == [4, 8, 10]
    assert lines[-1]["global_tokens"] == 10 * 4 * 16
    assert sum(lines[-1]["tokens"].values()) == 10 * 4 * 16
    assert lines[0]["target_share"] == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2})
    png = tmp_path / "r.png"
    assert main(["report", str(log), "-o", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_complete_fills_missing_keys_only():
    recipe = recipe_of({"a": 0.5, "b": 0.5})
    line = complete(3, {"tokens": {"a": 1, "b": 2}}, recipe)
    assert line["global_tokens"] == 3 * 2 * 8 and line["target_share"] == {"a": 0.5, "b": 0.5}
    kept = complete(3, {"tokens": {}, "global_tokens": 7, "target_share": {"a": 1.0}}, recipe)
    assert kept["global_tokens"] == 7 and kept["target_share"] == {"a": 1.0}


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"step": 3}', "`tokens`"),
        ('{"step": 3, "tokens": {"a": "x"}}', "`tokens`"),
        ('{"step": 3, "tokens": {"a": 1}, "loss": "high"}', "`loss`"),
    ],
)
def test_bad_metrics_log_names_the_line(tmp_path, capsys, bad, problem):
    path = write_log(tmp_path, [*log_lines(2), "", bad])
    with pytest.raises(DataError, match=rf"line 4: .*{problem}"):
        read_metrics(path)
    assert main(["report", path, "-o", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and path in err


def test_report_without_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    from mixer.tools import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    log = write_log(tmp_path, log_lines())
    with pytest.raises(MixerError, match=r"mixer\[report\]"):
        plots.write_report(log, tmp_path / "r.png")
    assert main(["report", log, "-o", str(tmp_path / "r.png")]) == 2
    assert "pip install 'mixer[report]'" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()
