"""`mixer inspect` and `mixer preview` on the bundled audio demo (recipes/audio_demo.yaml):
clips counted and shown by their length and `<|AUDIO|>` tokens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mixer.tools.cli import main

RECIPE = str(Path(__file__).resolve().parent.parent / "recipes" / "audio_demo.yaml")


@pytest.mark.slow
def test_inspect_counts_clips_and_audio_tokens(capsys):
    assert main(["inspect", RECIPE, "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["sources"]}
    assert rows["sounds"]["est_clips"] == 14 and rows["sounds"]["sampled_rejected"] == 0
    assert 0 < rows["sounds"]["audio_token_share"] < 1
    assert rows["prose"]["est_clips"] == 0
    assert main(["inspect", RECIPE]) == 0
    assert "audio tok/doc" in capsys.readouterr().out


def test_preview_shows_each_clip_by_length_and_tokens(capsys):
    assert main(["preview", RECIPE, "-n", "3", "--chars", "0"]) == 0
    out = capsys.readouterr().out
    assert "<|AUDIO|>" not in out
    clips = re.findall(r"<audio (\d+\.\d\d) s → (\d+) tokens>", out)
    assert clips
    for seconds, tokens in clips:
        frames = round(float(seconds) * 100)
        assert int(tokens) == (((frames - 1) // 2 + 1) - 2) // 2 + 1
    assert re.search(r"\d+ audio clip\(s\) of \d+ tokens", out)
