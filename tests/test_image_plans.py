"""The lower resolutions tried for a document's images, all images at once (issue 22 review:
each image's steps carried the last image's index, so one image was given another's plans
and two equal budgets compared plans and raised TypeError)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import mixer
from mixer.cache.store import tokenizer_info_dir
from mixer.images.select import layout_for
from mixer.tokenize import Encoder
from mixer.tokenize.tokenizer import resolve_recipe_tokenizer

ROOT = Path(__file__).resolve().parent.parent


def _builder():
    data = yaml.safe_load((ROOT / "recipes" / "multimodal_demo.yaml").read_text())
    data["base_dir"] = str(ROOT / "recipes")
    data["tokenizer_backend"] = "hf"
    recipe = mixer.load_recipe(data)
    info = resolve_recipe_tokenizer(recipe, tokenizer_info_dir(recipe))
    return layout_for(recipe, info).document_builder(Encoder(info), "pictures")


BUILDER = _builder()


def expected_plans(sizes: list[tuple[int, int]]) -> list[list]:
    """Each image on its own ladder (`iter_budgeted_plans`), stepped down together: at each
    budget where some image's plan shrinks, every image at its plan for that budget, none
    below min_pixels (or its recipe plan, when that is below)."""
    processing = BUILDER.processing
    ladders = [list(processing.iter_budgeted_plans(w, h)) for w, h in sizes]
    current = [ladder[0][1] for ladder in ladders]
    floors = [min(BUILDER.settings.min_pixels, p.width * p.height) for p in current]
    out = [list(current)]
    budgets = sorted({b for ladder in ladders for b, _ in ladder[1:]}, reverse=True)
    for budget in budgets:
        step = list(current)
        for i, ladder in enumerate(ladders):
            plan = min((b, k) for k, (b, _) in enumerate(ladder) if b >= budget)
            plan = ladder[plan[1]][1]
            if plan.width * plan.height >= floors[i]:
                step[i] = plan
        if step != current:
            out.append(step)
            current = step
    return out


sizes = st.lists(st.tuples(st.integers(20, 1600), st.integers(20, 1600)), min_size=1, max_size=4)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(sizes)
def test_every_image_steps_down_its_own_ladder(image_sizes):
    assert list(BUILDER._plans(image_sizes)) == expected_plans(image_sizes)


def test_two_images_of_the_same_shape_step_down_together():
    # equal budgets for both at every step: the merge must not compare their plans
    plans = list(BUILDER._plans([(448, 448), (448, 448), (301, 1203)]))
    assert len(plans) > 1 and all(p[0] == p[1] for p in plans)
    assert plans == expected_plans([(448, 448), (448, 448), (301, 1203)])


videos = st.lists(st.tuples(st.integers(32, 1920), st.integers(32, 1920)), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(videos)
def test_every_video_steps_down_its_own_frame_ladder(frame_sizes):
    """The videos' lowered plans: each video's frames only ever take sizes from its own
    ladder, no larger than before, and tokens strictly decrease (the same late-bound index
    gave one video another's frames and, for a landscape and a portrait video, TypeError)."""
    from mixer.config.images import ImageSettings
    from mixer.images.video import VideoProcessing
    from mixer.images.video_decode import VideoInfo

    processing = VideoProcessing(ImageSettings(layout="qwen2_vl", video={}))
    infos = [VideoInfo(w, h, 100, 10.0) for w, h in frame_sizes]
    ladder = list(processing.lowered(infos))
    first = ladder[0]
    for k, (info, plan) in enumerate(zip(infos, first)):
        own = {
            (p.width, p.height)
            for _, p in processing.frame_processing(plan.frames).iter_budgeted_plans(
                info.width, info.height
            )
        }
        sizes = [
            (step[k].frame.width, step[k].frame.height)
            for step in ladder
            if step[k].frames == plan.frames
        ]
        assert set(sizes) <= own, (k, sizes, own)
        areas = [w * h for w, h in sizes]
        assert areas == sorted(areas, reverse=True)
    totals = [sum(p.tokens for p in step) for step in ladder]
    assert all(a > b for a, b in zip(totals, totals[1:]))
