"""Audio+text batches through the whole loader (`audio.layout: qwen2_audio`): keys, the same
input_ids and input_features as Qwen2AudioProcessor, worker-count independence, exact and
elastic resume, caps, bad clips, and packed rows that train like their documents alone (a
tiny random Qwen2AudioForConditionalGeneration)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from audio_data import AUDIO_TOKENS, Clip, Sample, declare_flac_samples, encode, speech, tone
from audio_data import write_tar as write_audio_tar
from helpers import EOS_ID, word_id, write_docs
from image_data import make_vlm_tokenizer, vision_ids
from test_images_loader import assert_elastic_resume, digests, take

import mixer
from mixer.audio.features import log_mel
from mixer.audio.handle import AudioProcessing
from mixer.config.audio import AudioSettings
from mixer.core.records import EncodedAudio

SEQ_LEN = 160
KEYS = {"input_ids", "labels", "position_ids", "source_ids", "input_features"}
KEYS |= {"feature_attention_mask"}


def _clip(rng: np.random.Generator, doc: int, i: int) -> Clip:
    kind = int(rng.integers(5))
    seconds = float(rng.uniform(0.3, 2.2))
    if kind == 0:
        voice, rate = speech(f"sample {doc} clip {i}", seed=doc)
        return Clip(encode(voice, rate, "flac"), "flac")  # 22.05 kHz: resampled
    if kind == 1:
        return Clip(encode(tone(seconds, freq=200.0 + 50 * doc), 16000, "wav"), "wav")
    if kind == 2:
        return Clip(encode(tone(seconds, freq=300.0 + 40 * i), 16000, "flac"), "flac")
    if kind == 3:
        return Clip(encode(tone(seconds, 22050, freq=440.0), 22050, "mp3"), "mp3")
    return Clip(encode(tone(seconds, 48000, freq=660.0), 48000, "opus"), "opus")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """2 tars of 5 audio+text samples (0 to 2 clips each, markers or not) and a jsonl."""
    root: Path = tmp_path_factory.mktemp("audio")
    tokenizer = make_vlm_tokenizer(root / "tokenizer.json", AUDIO_TOKENS)
    rng = np.random.default_rng(5)
    samples = []
    for shard in range(2):
        part = []
        for doc in range(shard * 5, shard * 5 + 5):
            clips = [_clip(rng, doc, i) for i in range(int(rng.choice([0, 1, 1, 2])))]
            marker = bool(clips) and bool(rng.integers(2))
            part.append(Sample(doc, int(rng.integers(2, 12)), clips, marker=marker))
        write_audio_tar(root / "speech" / f"shard-{shard:03d}.tar", part)
        samples += part
    texts = [(1000 + i, int(rng.integers(5, 40))) for i in range(10)]
    write_docs(root / "prose.jsonl", texts, "jsonl")
    return root, tokenizer, samples, texts


def recipe_of(corpus, *, epochs=None, packing="concat", **audio) -> dict:
    root, tokenizer, _, _ = corpus
    return {
        "seed": 4,
        "tokenizer": str(tokenizer),
        "seq_len": SEQ_LEN,
        "batch_size": 2,
        "lanes": 2,
        "packing": packing,
        "audio": {"layout": "qwen2_audio", **audio},
        "shuffle_window": 4,
        "sources": [
            {
                "name": "speech",
                "path": str(root / "speech" / "*.tar"),
                "weight": 3,
                "epochs": epochs,
            },
            {"name": "prose", "path": str(root / "prose.jsonl"), "weight": 1, "epochs": epochs},
        ],
    }


@pytest.fixture(scope="module")
def processor(corpus):
    """Qwen2AudioProcessor of the test tokenizer (local files) and WhisperFeatureExtractor
    (feature_size=128) on its numpy path."""
    import transformers.models.whisper.feature_extraction_whisper as whisper
    from transformers import PreTrainedTokenizerFast, Qwen2AudioProcessor

    patch = pytest.MonkeyPatch()
    patch.setattr(whisper, "is_torch_available", lambda: False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(corpus[1]), eos_token="<|endoftext|>", pad_token="<pad>"
    )
    yield Qwen2AudioProcessor(whisper.WhisperFeatureExtractor(feature_size=128), tokenizer)
    patch.undo()


def _waveform(clip: Clip) -> np.ndarray:
    """The clip's 16 kHz mono waveform (mixer's decoding, tested in test_audio.py)."""
    processing = AudioProcessing(AudioSettings(layout="qwen2_audio"))
    return processing.samples(EncodedAudio(clip.data, f"x.{clip.suffix}", 0), "s", "f")[0]


def _units(batch: dict) -> list[tuple[int, int, int]]:
    """(row, start, end) of each run of real tokens whose positions start at 0."""
    out = []
    for row, (positions, sources) in enumerate(
        zip(batch["position_ids"].tolist(), batch["source_ids"].tolist())
    ):
        start = None
        for i, (p, s) in enumerate(zip(positions, sources)):
            if start is not None and (s < 0 or p == 0):
                out.append((row, start, i))
                start = None
            if s >= 0 and p == 0:
                start = i
        if start is not None:
            out.append((row, start, len(positions)))
    return out


@pytest.mark.slow
def test_batches_equal_qwen2_audio_processor_document_by_document(corpus, processor):
    """Each document of the batches has the processor's input_ids for its text and clips
    (markers where the text has them, else the clips first; <|AUDIO|> expanded between
    <|audio_bos|> and <|audio_eos|>) and EOS; each clip's input_features entry and mask row
    equal the processor's for its waveform; labels are -100 on the audio tokens."""
    _, tokenizer, samples, _ = corpus
    ids = vision_ids(tokenizer, AUDIO_TOKENS)
    audio_ids = [ids[t] for t in AUDIO_TOKENS]
    by_word = {word_id(s.doc): s for s in samples}
    span = "".join(AUDIO_TOKENS)
    seen = Counter()
    for batch in take(mixer.build_loader(recipe_of(corpus, epochs=1)), None):
        assert set(batch) == KEYS
        features, mask = batch["input_features"], batch["feature_attention_mask"]
        assert features.dtype == torch.float32 and features.shape[1:] == (128, 3000)
        assert mask.shape == (features.shape[0], 3000)
        assert int((batch["input_ids"] == ids["<|audio_bos|>"]).sum()) == features.shape[0]
        is_audio = torch.isin(batch["input_ids"], torch.tensor(audio_ids))
        assert (batch["labels"][is_audio] == -100).all()
        clip = 0
        for row, start, end in _units(batch):
            tokens = batch["input_ids"][row, start:end].tolist()
            sample = next((by_word[t] for t in tokens if t in by_word), None)
            if sample is None or batch["source_ids"][row, start] != 0:
                continue
            text = sample.caption().replace("<audio>", span)
            if not sample.marker:
                text = span * len(sample.clips) + text
            waves = [_waveform(c) for c in sample.clips]
            out = processor(
                text=[text], audio=waves or None, sampling_rate=16000, return_tensors="np"
            )
            assert tokens == out["input_ids"][0].tolist() + [EOS_ID], sample
            for i in range(len(waves)):
                got = features[clip + i].numpy()
                assert np.abs(got - out["input_features"][i]).max() <= 1e-5
                assert mask[clip + i].tolist() == out["feature_attention_mask"][i].tolist()
            clip += len(waves)
            seen["documents"] += 1
            seen["clips"] += len(waves)
            seen["marked"] += sample.marker
        assert clip == features.shape[0]
    assert seen["documents"] == len(samples) and seen["clips"] >= 6 and seen["marked"] >= 1


@pytest.mark.slow
def test_same_batches_with_any_worker_count_after_resume_and_elastic(corpus):
    recipe = recipe_of(corpus)
    reference = digests(take(mixer.build_loader(recipe), 8))
    assert digests(take(mixer.build_loader(recipe, num_workers=2), 8)) == reference
    loader = mixer.build_loader(recipe, num_workers=2)
    head = digests(take(loader, 3))
    state = json.loads(json.dumps(loader.state_dict()))
    again = mixer.build_loader(recipe)
    again.load_state_dict(state)
    again.load_state_dict(state)  # twice in a row
    assert head + digests(take(again, 5)) == reference
    assert_elastic_resume(recipe, reference, steps=2, rest=4, rank_workers=1, single_workers=2)


def test_finite_recipe_delivers_every_clip_once_within_the_cap(corpus):
    _, tokenizer, samples, texts = corpus
    ids = vision_ids(tokenizer, AUDIO_TOKENS)
    loader = mixer.build_loader(recipe_of(corpus, epochs=1, max_audio_per_batch=2))
    batches = take(loader, None)
    assert all(b["input_features"].shape[0] <= 2 for b in batches)
    assert max(b["input_features"].shape[0] for b in batches) == 2, "the cap was reached"
    tokens: Counter = Counter()
    for b in batches:
        tokens.update(b["input_ids"][b["source_ids"] >= 0].tolist())
    for s in samples:
        assert tokens[word_id(s.doc)] == s.length, s
    for doc, length in texts:
        assert tokens[word_id(doc)] == length
    clips = sum(b["input_features"].shape[0] for b in batches)
    assert clips == sum(len(s.clips) for s in samples) == tokens[ids["<|audio_bos|>"]]
    assert loader.metrics()["oversize"] == {"speech": 0, "prose": 0}


def test_bad_clips_are_errors_naming_the_member_or_counted_skips(corpus, tmp_path):
    good = encode(tone(0.5), 16000, "flac")
    bad = [
        good[: len(good) // 2],  # truncated FLAC
        encode(np.zeros(0, dtype=np.float32), 16000, "wav"),  # a WAV with no samples
        declare_flac_samples(good, 3 * 3600 * 16000),  # declares 3 hours
    ]
    suffixes = ["flac", "wav", "flac"]
    path = write_audio_tar(
        tmp_path / "bad.tar",
        [Sample(1, 3, [Clip(good, "flac")])]
        + [Sample(2 + i, 3, [Clip(d, s)]) for i, (d, s) in enumerate(zip(bad, suffixes))],
    )
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"] = [{"name": "bad", "path": str(path), "weight": 1, "epochs": 1}]
    with pytest.raises(mixer.DataError) as err:
        take(mixer.build_loader(recipe), None)
    assert err.value.source == "bad" and err.value.reason == "bad_audio"
    assert re.search(r"member s00000[234]\.(flac|wav) at byte offset", str(err.value))
    recipe["sources"][0]["on_error"] = "skip"
    loader = mixer.build_loader(recipe)
    assert sum(b["input_features"].shape[0] for b in take(loader, None)) == 1
    assert loader.metrics()["skipped_by_reason"]["bad"] == {"bad_audio": 3}


def test_a_clip_over_30_seconds_is_cut_to_its_first_30_or_refused(corpus, tmp_path):
    """Through the loader, a 31.5 s clip becomes the features and 750 tokens of its first
    30 s (as Qwen2AudioProcessor truncates it); under `long_clips: refuse` it is bad_audio."""
    wave = tone(31.5, freq=250.0)
    data = encode(wave, 16000, "wav")
    path = write_audio_tar(tmp_path / "long.tar", [Sample(1, 3, [Clip(data, "wav")])])
    recipe = recipe_of(corpus, epochs=1)
    recipe["seq_len"] = 800
    recipe["sources"] = [
        {"name": "long", "path": str(path), "weight": 1, "epochs": 1, "on_error": "skip"}
    ]
    ids = vision_ids(corpus[1], AUDIO_TOKENS)
    (batch,) = take(mixer.build_loader(recipe), None)
    assert batch["input_features"].shape[0] == 1
    assert int(batch["feature_attention_mask"].sum()) == 3000
    assert int((batch["input_ids"] == ids["<|AUDIO|>"]).sum()) == 750
    first = np.clip(np.round(wave[: 30 * 16000] * 32768), -32768, 32767) / 32768
    want = log_mel(first.astype(np.float32))
    assert np.abs(batch["input_features"][0].numpy() - want).max() <= 1e-5
    loader = mixer.build_loader({**recipe, "audio": {**recipe["audio"], "long_clips": "refuse"}})
    assert take(loader, None) == []
    assert loader.metrics()["skipped_by_reason"]["long"] == {"bad_audio": 1}


def test_markers_not_as_many_as_clips_long_documents_and_audio_without_a_block(corpus, tmp_path):
    clip = Clip(encode(tone(1.0), 16000, "wav"), "wav")  # 25 <|AUDIO|> tokens
    samples = [
        Sample(1, 3, [clip, clip], text="w1 <audio> w1"),  # 1 marker, 2 clips
        Sample(2, 200, [clip]),
        Sample(3, 2, [clip] * 8),
    ]
    path = write_audio_tar(tmp_path / "m.tar", samples)
    recipe = recipe_of(corpus, epochs=1)
    recipe["sources"] = [
        {"name": "m", "path": str(path), "weight": 1, "epochs": 1, "on_error": "skip"}
    ]
    loader = mixer.build_loader(recipe)
    batches = take(loader, None)
    # Sample 2 loses the text after its clip (27 + 200 words > 160), sample 3's 8 clips
    # (216 tokens) never fit: oversize.
    assert sum(b["input_features"].shape[0] for b in batches) == 1
    assert loader.metrics()["skipped_by_reason"]["m"] == {"bad_audio": 1}
    assert loader.metrics()["oversize"] == {"m": 1}
    assert (
        sum(int((b["input_ids"] == word_id(2)).sum()) for b in batches) == SEQ_LEN - 27
    )  # no EOS either
    del recipe["audio"]
    recipe["sources"][0]["on_error"] = "raise"
    with pytest.raises(mixer.DataError, match="no `audio:` block") as err:
        take(mixer.build_loader(recipe), None)
    assert err.value.reason == "bad_audio" and "s000001.0.wav" in str(err.value)


def test_recipe_refuses_images_with_audio_and_a_state_resumes_only_the_same_audio(corpus):
    recipe = recipe_of(corpus)
    with pytest.raises(mixer.RecipeError, match="cannot be combined"):
        mixer.load_recipe({**recipe, "images": {"layout": "qwen2_vl"}})
    state = mixer.build_loader(recipe).state_dict()
    for change in ({"long_clips": "refuse"}, {"max_audio_per_batch": 3}, {"marker": "<a>"}):
        with pytest.raises(mixer.StateError):
            mixer.build_loader(recipe_of(corpus, **change)).load_state_dict(state)
    mixer.build_loader(recipe).load_state_dict(state)


@pytest.mark.slow
def test_loader_audio_batches_train_like_their_documents_alone(corpus):
    """The real loader's packed rows with clips, fed to a tiny random Qwen2-Audio: each
    document's logits in the packed batch equal its logits run alone with its clips."""
    from vlm_models import tiny_qwen2_audio

    ids = vision_ids(corpus[1], AUDIO_TOKENS)
    model = tiny_qwen2_audio(max(ids.values()) + 1, ids["<|AUDIO|>"])
    seen = Counter()
    for batch in take(mixer.build_loader(recipe_of(corpus)), 3):
        seen.update(assert_audio_packed_equals_alone(model, batch, ids["<|audio_bos|>"]))
    assert seen["units_with_clips"] > 0 and seen["packed_rows"] > 0, seen


def assert_audio_packed_equals_alone(model, batch, bos_id: int, atol: float = 1e-4) -> Counter:
    features, mask = batch["input_features"], batch["feature_attention_mask"]
    inputs = {k: batch[k] for k in ("input_ids", "position_ids")}
    if features.shape[0]:
        inputs.update(input_features=features, feature_attention_mask=mask)
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits
    seen: Counter = Counter()
    clip = 0
    units = _units(batch)
    for row, start, end in units:
        ids = batch["input_ids"][row : row + 1, start:end]
        n = int((ids == bos_id).sum())
        alone_inputs = {"input_ids": ids}
        if n:
            alone_inputs.update(
                input_features=features[clip : clip + n],
                feature_attention_mask=mask[clip : clip + n],
            )
        with torch.no_grad():
            alone = model(**alone_inputs, use_cache=False).logits[0]
        diff = (packed[row, start:end] - alone).abs().max().item()
        assert diff <= atol, f"row {row}, tokens {start}:{end}: differs by {diff:.3g}"
        clip += n
        seen["units"] += 1
        seen["units_with_clips"] += bool(n)
    assert clip == features.shape[0]
    rows = Counter(row for row, _, _ in units)
    seen["packed_rows"] += sum(count >= 2 for count in rows.values())
    return seen
