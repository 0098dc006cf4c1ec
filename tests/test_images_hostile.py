"""A hostile user's image+text recipes: hangs, error locations, memory, formats, resume.

Each test below first failed on the code it guards (see the review notes in the commit), or
pins a contract point a new user is likely to trip over. Tiny images and seq_len keep the
whole file fast.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import tarfile
import time
import weakref

import numpy as np
import pytest
from deadline import deadline
from helpers import EOS_ID, word_id, write_docs
from image_data import Sample, encode_image, make_image, make_vlm_tokenizer, vision_ids, write_tar
from PIL import Image

import mixer
from mixer.images import handle
from mixer.images.handle import LazyImage

QWEN = {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 56 * 56}


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(batch):
        h.update(key.encode() + str(tuple(batch[key].shape)).encode())
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()[:16]


def take(loader, n: int | None = None) -> list[str]:
    out: list[str] = []
    if n == 0:
        return out
    for batch in loader:
        out.append(digest(batch))
        if n is not None and len(out) == n:
            break
    return out


def add_members(path, members: list[tuple[str, bytes]]) -> dict[str, int]:
    """A tar of (name, data) members; each member's header offset."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def png(doc: int, size=(40, 30)) -> bytes:
    return encode_image(make_image(doc, 0, size), "png")


def one_source(
    tokenizer, path, *, epochs=1, on_error="raise", lanes=1, seq_len=64, images=None, **extra
) -> dict:
    return {
        "tokenizer": str(tokenizer),
        "seq_len": seq_len,
        "batch_size": 1,
        "lanes": lanes,
        "images": images or QWEN,
        **extra,
        "sources": [
            {"name": "src", "path": str(path), "weight": 1, "epochs": epochs, "on_error": on_error}
        ],
    }


@pytest.fixture
def tokenizer(tmp_path):
    return make_vlm_tokenizer(tmp_path / "tokenizer.json")


# -- no hang when a source's records all become no document -------------------------------


@pytest.mark.parametrize("why", ["oversize", "corrupt"])
def test_unlimited_source_whose_every_sample_is_rejected_is_an_error_not_a_hang(
    tmp_path, tokenizer, why
):
    # Every record reads fine, but none becomes a document: too long for a row at any
    # resolution, or an image that does not decode (skipped). The stream used to re-read
    # its epochs forever, because only an epoch without *records* counted as empty.
    if why == "oversize":
        write_tar(tmp_path / "a.tar", [Sample(1, 3, [(200, 200)] * 3)])
        recipe = one_source(
            tokenizer,
            tmp_path / "a.tar",
            epochs=None,
            seq_len=16,
            images={**QWEN, "min_pixels": 56 * 56, "max_pixels": 200 * 200},
        )
    else:
        data = png(1, (200, 150))
        add_members(tmp_path / "a.tar", [("s1.png", data[: len(data) // 2]), ("s1.txt", b"w1")])
        recipe = one_source(tokenizer, tmp_path / "a.tar", epochs=None, on_error="skip")
    with deadline(30), pytest.raises(mixer.DataError, match="yields no document") as err:
        take(mixer.build_loader(recipe), 1)
    assert err.value.source == "src"


def test_lane_whose_slice_is_all_oversize_gives_up_the_source_and_others_go_on(tmp_path, tokenizer):
    # Two lanes stripe one tar: one lane's sample is oversize (6 images, 18 tokens at the
    # least), the other's fits.
    write_tar(tmp_path / "a.tar", [Sample(1, 2, [(28, 28)]), Sample(2, 2, [(28, 28)] * 6)])
    recipe = one_source(tokenizer, tmp_path / "a.tar", epochs=None, lanes=2, seq_len=16)
    with deadline(60):
        batches = take(mixer.build_loader(recipe), 3)
    assert len(batches) == 3


# -- errors found after reading name the record's text ------------------------------------

TEXT_ERRORS = {
    "marker without image": ([("s2.txt", b"w2 <image> w2")], "s2.txt", "marker"),
    "more markers than images": (
        [("s2.png", png(2)), ("s2.txt", b"<image> w2 <image>")],
        "s2.txt",
        "marker",
    ),
    "literal image token": (
        [("s2.png", png(2)), ("s2.txt", b"w2 <|image_pad|> w2")],
        "s2.txt",
        "<|image_pad|>",
    ),
    "marker in a json text": (
        [("s2.json", json.dumps({"txt": "w2 <image>"}).encode())],
        "s2.json",
        "marker",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TEXT_ERRORS))
def test_text_errors_name_the_text_member_and_its_offset(tmp_path, tokenizer, case):
    bad, member, words = TEXT_ERRORS[case]
    members = [
        ("s1.png", png(1)),
        ("s1.txt", b"w1 w1"),
        *bad,
        ("s3.png", png(3)),
        ("s3.txt", b"w3"),
    ]
    offsets = add_members(tmp_path / "a.tar", members)
    for workers in (0, 2):
        recipe = one_source(tokenizer, tmp_path / "a.tar", lanes=2)
        with pytest.raises(mixer.DataError, match=f"(?i){words}") as err:
            take(mixer.build_loader(recipe, num_workers=workers))
        assert err.value.source == "src" and err.value.file == str(tmp_path / "a.tar")
        assert err.value.location is not None
        assert f"{member} at byte offset {offsets[member]}" in err.value.location, err.value
        assert "sample s2" in err.value.location
    loader = mixer.build_loader(one_source(tokenizer, tmp_path / "a.tar", on_error="skip"))
    batches = list(loader)
    assert loader.metrics()["skipped"]["src"] == 1
    assert sum(b["image_grid_thw"].shape[0] for b in batches) == 2


def test_jsonl_text_with_a_marker_in_an_image_recipe_names_its_byte_offset(tmp_path, tokenizer):
    good = json.dumps({"text": "w1 w1"}) + "\n"
    (tmp_path / "t.jsonl").write_text(good + json.dumps({"text": "w2 <image> w2"}) + "\n")
    recipe = one_source(tokenizer, tmp_path / "t.jsonl")
    with pytest.raises(mixer.DataError, match="without an image") as err:
        take(mixer.build_loader(recipe))
    assert err.value.location == f"byte offset {len(good)}"
    loader = mixer.build_loader(one_source(tokenizer, tmp_path / "t.jsonl", on_error="skip"))
    assert len(take(loader)) == 1 and loader.metrics()["skipped"]["src"] == 1


# -- bad image bytes, every class, raised and skipped ---------------------------------------


def _bad_members() -> dict[str, tuple[list[tuple[str, bytes]], str, str]]:
    data, jpeg = png(2, (60, 40)), encode_image(make_image(2, 0, (60, 40)), "jpg")
    bomb = io.BytesIO()
    Image.new("1", (3000, 3000)).save(bomb, "PNG")
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 40 30\nshowpage\n%%EOF\n"
    return {
        "truncated png": ([("s2.png", data[: len(data) // 2])], "s2.png", "truncated"),
        "truncated jpeg": ([("s2.jpg", jpeg[: len(jpeg) // 2])], "s2.jpg", "truncated"),
        "not an image": ([("s2.jpg", b"plain text, no image at all")], "s2.jpg", "not an image"),
        "empty member": ([("s2.png", b"")], "s2.png", "empty"),
        "bomb": ([("s2.png", bomb.getvalue())], "s2.png", "max_source_pixels"),
        "aspect ratio": ([("s2.png", png(2, (201, 1)))], "s2.png", "aspect ratio"),
        # PostScript in an image member: PIL would hand it to Ghostscript to decode
        "postscript": ([("s2.png", eps)], "s2.png", "not an image"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_bad_members()))
def test_bad_image_bytes_are_named_errors_or_counted_skips(tmp_path, tokenizer, case):
    bad, member, words = _bad_members()[case]
    members = [
        ("s1.png", png(1)),
        ("s1.txt", b"w1"),
        *bad,
        ("s2.txt", b"w2"),
        ("s3.png", png(3)),
        ("s3.txt", b"w3"),
    ]
    offsets = add_members(tmp_path / "a.tar", members)
    path = tmp_path / "a.tar"
    images = {**QWEN, "max_source_pixels": 3000 * 3000 - 1}
    for workers in (0, 2):
        with pytest.raises(mixer.DataError, match=words) as err:
            take(
                mixer.build_loader(
                    one_source(tokenizer, path, lanes=2, images=images), num_workers=workers
                )
            )
        assert err.value.source == "src" and err.value.file == str(path)
        assert f"{member} at byte offset {offsets[member]}" in err.value.location
        loader = mixer.build_loader(
            one_source(tokenizer, path, lanes=2, images=images, on_error="skip"),
            num_workers=workers,
        )
        batches = list(loader)
        assert loader.metrics()["skipped"]["src"] == 1
        assert sum(b["image_grid_thw"].shape[0] for b in batches) == 2


# -- pixels are not held far ahead of need -------------------------------------------------


def _held() -> list[LazyImage]:
    gc.collect()
    return [
        o
        for o in gc.get_objects()
        if type(o) is LazyImage and (o._pixels is not None or o._future is not None)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["best_fit", "concat"])
def test_pixels_made_ahead_stay_within_the_process_budget(tmp_path, tokenizer, packing):
    # best_fit draws a whole packing window of documents; each used to keep its decoded
    # pixels until its row was emitted (the whole window's pixels in memory at once).
    write_tar(tmp_path / "a.tar", [Sample(d, 2, [(56, 56)]) for d in range(48)])
    recipe = one_source(
        tokenizer, tmp_path / "a.tar", epochs=None, seq_len=24, packing=packing, pack_window=48
    )
    reference = take(mixer.build_loader(recipe), 6)
    one_image = 16 * 1176 * 4
    old = handle.pixel_budget()
    try:
        handle.set_pixel_budget(3 * one_image)
        loader = mixer.build_loader(recipe)
        batches = iter(loader)
        got = [digest(next(batches)) for _ in range(6)]
        held = _held()
        assert sum(image.nbytes for image in held) <= 3 * one_image, held
        assert handle.held_ahead() <= 3 * one_image
        assert got == reference
        handle.set_pixel_budget(0)  # nothing made ahead at all: the same batches
        assert take(mixer.build_loader(recipe), 6) == reference
    finally:
        handle.set_pixel_budget(old)


# -- resume, elastic resume, every packing, caps, many epochs ------------------------------


@pytest.fixture
def mixed(tmp_path, tokenizer):
    rng = np.random.default_rng(11)
    sizes = [(28, 28), (56, 28), (28, 84), (60, 40), (100, 30), (28, 1000)]
    for shard in range(3):
        samples = []
        for doc in range(shard * 5, shard * 5 + 5):
            n = int(rng.integers(0, 3))
            samples.append(
                Sample(
                    doc,
                    int(rng.integers(1, 10)),
                    [sizes[int(rng.integers(len(sizes)))] for _ in range(n)],
                    fmt=str(rng.choice(["png", "jpg", "webp"])),
                    marker=bool(rng.integers(2)) and n > 0,
                )
            )
        write_tar(tmp_path / "pics" / f"s{shard}.tar", samples)
    write_docs(
        tmp_path / "p.jsonl", [(1000 + i, int(rng.integers(1, 30))) for i in range(12)], "jsonl"
    )

    def recipe(packing: str, epochs=None) -> dict:
        return {
            "seed": 3,
            "tokenizer": str(tokenizer),
            "seq_len": 24,
            "batch_size": 2,
            "lanes": 4,
            "packing": packing,
            "pack_window": 4,
            "shuffle_window": 3,
            "images": {**QWEN, "max_images_per_batch": 2, "max_patches_per_batch": 40},
            "sources": [
                {
                    "name": "pics",
                    "path": str(tmp_path / "pics" / "*.tar"),
                    "weight": 2,
                    "epochs": epochs,
                },
                {"name": "p", "path": str(tmp_path / "p.jsonl"), "weight": 1, "epochs": epochs},
            ],
        }

    return recipe


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit", "pad"])
def test_resume_at_every_batch_over_several_epochs_with_caps(mixed, packing):
    recipe = mixed(packing)
    reference = take(mixer.build_loader(recipe), 12)
    for k in range(12):
        loader = mixer.build_loader(recipe)
        head = take(loader, k)
        state = json.loads(json.dumps(loader.state_dict()))
        assert len(json.dumps(state)) < 64_000
        again = mixer.build_loader(recipe, num_workers=2 if k == 5 else 0)
        again.load_state_dict(state)
        again.load_state_dict(state)  # twice in a row
        assert head + take(again, 12 - k) == reference, k


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best_fit"])
def test_elastic_resume_of_a_finite_image_recipe_from_two_ranks(mixed, packing):
    recipe = mixed(packing, epochs=2)
    reference = take(mixer.build_loader(recipe))
    states, heads = [], []
    for rank in range(2):
        loader = mixer.build_loader(recipe, rank=rank, world_size=2, num_workers=rank)
        heads.append(take(loader, 3))
        states.append(loader.state_dict())
    resumed = mixer.build_loader(recipe, num_workers=1)
    resumed.load_state_dict(mixer.merge_states(states))
    interleaved = [h for pair in zip(*heads) for h in pair]
    assert interleaved + take(resumed) == reference


# -- the recipe's image settings ------------------------------------------------------------


def test_changing_an_image_setting_is_refused_naming_it(tmp_path, tokenizer):
    write_tar(tmp_path / "a.tar", [Sample(d, 3, [(28, 28)]) for d in range(3)])
    recipe = one_source(tokenizer, tmp_path / "a.tar", epochs=None)
    state = mixer.build_loader(recipe).state_dict()
    changed = one_source(
        tokenizer, tmp_path / "a.tar", epochs=None, images={**QWEN, "max_pixels": 28 * 28 * 2}
    )
    with pytest.raises(mixer.StateError) as err:
        mixer.build_loader(changed).load_state_dict(state)
    assert "images.max_pixels: 3136 -> 1568" in str(err.value)
    assert "image_mean" not in str(err.value)


def test_inspect_counts_image_tokens(tmp_path, tokenizer):
    from mixer.tools.inspect_report import inspect_recipe

    # 4 samples: 2 words + EOS + one 56x56 image (4 placeholders + start + end) = 9 tokens
    write_tar(tmp_path / "a.tar", [Sample(d, 2, [(56, 56)]) for d in range(4)])
    report = inspect_recipe(mixer.load_recipe(one_source(tokenizer, tmp_path / "a.tar")))
    assert report["sources"][0]["est_tokens"] == 4 * 9


# -- contract points a new user checks first ----------------------------------------------


def test_bos_mask_and_exact_seq_len_with_images(tmp_path, tokenizer):
    import shutil

    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(tokenizer, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|endoftext|>",
                "bos_token": "w29999",
                "add_bos_token": True,
                "pad_token": "<pad>",
            }
        )
    )
    ids = vision_ids(tokenizer)
    bos = word_id(29999)
    write_tar(tmp_path / "a.tar", [Sample(1, 3, [(28, 28)])])
    # BOS + start + 1 pad + end + 3 words + EOS = 8 tokens: exactly seq_len, for each packing
    for packing in ("concat", "best_fit", "pad"):
        recipe = one_source(
            folder,
            tmp_path / "a.tar",
            seq_len=8,
            packing=packing,
            mask_document_boundaries=True,
            images={**QWEN, "max_pixels": 784},
        )
        loader = mixer.build_loader(recipe)
        (batch,) = list(loader)
        row = batch["input_ids"][0].tolist()
        assert row == [
            bos,
            ids["<|vision_start|>"],
            ids["<|image_pad|>"],
            ids["<|vision_end|>"],
            word_id(1),
            word_id(1),
            word_id(1),
            EOS_ID,
        ]
        assert batch["labels"][0].tolist() == [-100] * 4 + row[4:]
        assert batch["mm_token_type_ids"][0].tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
        assert loader.metrics()["oversize"] == {"src": 0}


def test_seq_len_below_one_image_at_min_pixels_counts_oversize(tmp_path, tokenizer):
    write_tar(tmp_path / "a.tar", [Sample(1, 3, [(100, 100)]), Sample(2, 2, [])])
    for packing in ("concat", "best_fit", "pad"):
        recipe = one_source(
            tokenizer,
            tmp_path / "a.tar",
            seq_len=4,
            packing=packing,
            images={**QWEN, "min_pixels": 56 * 56, "max_pixels": 100 * 100},
        )
        loader = mixer.build_loader(recipe)
        batches = list(loader)
        assert [b["input_ids"][0].tolist() for b in batches] == [[word_id(2)] * 2 + [EOS_ID, 1]]
        assert all(b["pixel_values"].shape == (0, 1176) for b in batches)
        assert loader.metrics()["oversize"] == {"src": 1}
        assert "oversize" in loader.state_dict()["json"]


ANIMATED = ["apng", "webp", "gif"]


@pytest.mark.parametrize("kind", ANIMATED)
def test_animated_images_use_their_first_frame_as_transformers_does(kind):
    from test_image_processing import check_against_oracle, llava_settings, qwen_settings

    frames = [make_image(9, i, (61, 45)) for i in range(3)]
    if kind == "gif":
        frames = [f.quantize(32) for f in frames]
    out = io.BytesIO()
    fmt = {"apng": "PNG", "webp": "WEBP", "gif": "GIF"}[kind]
    frames[0].save(out, fmt, save_all=True, append_images=frames[1:])
    assert getattr(Image.open(io.BytesIO(out.getvalue())), "n_frames", 1) == 3
    check_against_oracle(out.getvalue(), qwen_settings(min_pixels=784, max_pixels=12544))
    check_against_oracle(out.getvalue(), llava_settings(image_size=28))


def test_a_sample_larger_than_max_document_bytes_in_all_is_refused_before_it_is_read(
    tmp_path, tokenizer
):
    # Each image member is under the limit, but together they are far over it: the sample
    # used to be read into memory whole (any number of members of up to the limit each).
    data = png(2, (60, 40))
    limit = 3 * len(data) + 100
    members = [("s1.png", png(1)), ("s1.txt", b"w1")]
    members += [(f"s2.{i}.png", data) for i in range(8)] + [("s2.txt", b"w2")]
    members += [("s3.png", png(3)), ("s3.txt", b"w3")]
    offsets = add_members(tmp_path / "a.tar", members)
    recipe = one_source(tokenizer, tmp_path / "a.tar", max_document_bytes=limit)
    with pytest.raises(mixer.DataError, match="max_document_bytes") as err:
        take(mixer.build_loader(recipe))
    assert f"s2.3.png at byte offset {offsets['s2.3.png']}" in err.value.location
    from mixer.sources import IO_STATS, FileEntry, Split, Storage, read_split

    path = tmp_path / "a.tar"
    entry = FileEntry(str(path), "a.tar", path.stat().st_size, "webdataset")
    IO_STATS.reset()
    records = list(
        read_split(
            storage=Storage("src", {}, block_size=1024),
            entry=entry,
            split=Split(0, 0, entry.size),
            source="src",
            text_field="txt",
            max_bytes=limit,
            index=0,
            offset=0,
        )
    )
    assert [r.error is None for r in records] == [True, False, True]
    assert records[1].images == ()
    loader = mixer.build_loader(
        one_source(tokenizer, tmp_path / "a.tar", on_error="skip", max_document_bytes=limit)
    )
    assert sum(b["image_grid_thw"].shape[0] for b in loader) == 2
    assert loader.metrics()["skipped"]["src"] == 1


@pytest.mark.slow
def test_a_tar_on_s3_gives_the_local_batches_and_resumes_on_the_local_copy(
    tmp_path, tokenizer, s3_endpoint
):
    import boto3
    from conftest import s3_options

    write_tar(
        tmp_path / "a.tar", [Sample(d, 3, [(28, 28)] * (d % 3), fmt="jpg") for d in range(12)]
    )
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    client.create_bucket(Bucket="pics")
    client.put_object(Bucket="pics", Key="shards/a.tar", Body=(tmp_path / "a.tar").read_bytes())

    def recipe(path: str, **storage) -> dict:
        out = one_source(tokenizer, path, lanes=2, seq_len=16, read_ahead_bytes=1 << 16)
        out["sources"][0].update(storage)
        return out

    local = take(mixer.build_loader(recipe(str(tmp_path / "a.tar"))))
    remote = recipe("s3://pics/shards/*.tar", storage_options=s3_options(s3_endpoint))
    assert take(mixer.build_loader(remote, num_workers=2)) == local
    loader = mixer.build_loader(remote, num_workers=2)
    head = take(loader, 3)
    state = loader.state_dict()
    loader.close()
    resumed = mixer.build_loader(recipe(str(tmp_path / "a.tar")))
    resumed.load_state_dict(state)
    assert head + take(resumed) == local


# -- lowering the resolution of a long document -------------------------------------------


def _grids(recipe) -> list[list[int]]:
    return [g for b in mixer.build_loader(recipe) for g in b["image_grid_thw"].tolist()]


def test_a_long_document_gets_the_largest_resolution_that_fits(tmp_path, tokenizer):
    # 300x200 has plans of 40, 35, 28, 24, ... tokens; 2 words + EOS + 28 + 2 = 33 tokens
    # fit exactly. Fixed steps of the budget (x0.75) used to jump from 35 to 24 tokens.
    write_tar(tmp_path / "a.tar", [Sample(1, 2, [(300, 200)])])
    recipe = one_source(
        tokenizer,
        tmp_path / "a.tar",
        seq_len=33,
        images={**QWEN, "min_pixels": 3136, "max_pixels": 200 * 200},
    )
    assert _grids(recipe) == [[1, 8, 14]]  # 28 tokens: 196x112


def test_a_lowered_image_never_has_fewer_than_min_pixels(tmp_path, tokenizer):
    # 48x75 at min_pixels 3136: 56x84 (4704 pixels), and below it only 28x84 and 28x56,
    # both under min_pixels. The document (12 tokens) does not fit 8: its text is cut
    # after the image instead of the image going under min_pixels.
    write_tar(tmp_path / "a.tar", [Sample(1, 3, [(48, 75)])])
    for packing in ("concat", "best_fit", "pad"):
        recipe = one_source(
            tokenizer,
            tmp_path / "a.tar",
            seq_len=8,
            packing=packing,
            images={**QWEN, "min_pixels": 3136, "max_pixels": 3136 * 4},
        )
        assert _grids(recipe) == [[1, 6, 4]]


def test_validate_refuses_a_tokenizer_without_the_layouts_image_tokens(tmp_path, capsys):
    from helpers import make_tokenizer

    from mixer.tools.cli import main as cli_main

    plain = make_tokenizer(tmp_path / "plain.json")
    write_tar(tmp_path / "a.tar", [Sample(1, 2, [(28, 28)])])
    for layout, token in (("qwen2_vl", "<|vision_start|>"), ("llava", "<image>")):
        recipe = one_source(
            plain, tmp_path / "a.tar", images={**QWEN, "layout": layout, "image_size": 28}
        )
        (tmp_path / "r.json").write_text(json.dumps(recipe))
        assert cli_main(["validate", str(tmp_path / "r.json")]) != 0
        assert repr(token) in capsys.readouterr().err
        with pytest.raises(mixer.RecipeError, match=token.replace("|", r"\|")):
            mixer.build_loader(recipe)


@pytest.mark.slow
def test_the_pixel_budget_is_given_back_by_release_and_by_dropped_handles():
    from mixer.config.images import ImageSettings
    from mixer.core.records import EncodedImage
    from mixer.images.processing import processing_for

    processing = processing_for(ImageSettings(**QWEN))

    def handle_of(doc: int) -> LazyImage:
        return LazyImage.probe(
            EncodedImage(png(doc, (56, 56)), f"s{doc}.png", 0),
            processing,
            extra_tokens=2,
            source="src",
            file="a.tar",
            max_source_pixels=1 << 20,
        )

    def settled() -> int:
        # What earlier tests' handles still hold, once their garbage is collected (a handle
        # dropped by another test gives its bytes back when the collector gets to it).
        last = -1
        for _ in range(200):
            gc.collect()
            now = handle.held_ahead()
            if now == last:
                return now
            last = now
            time.sleep(0.01)
        return last

    old = handle.pixel_budget()
    before = settled()
    threads = handle.decode_threads()
    handle.set_decode_threads(4)  # (waiting images start while no more jobs than threads queue)
    try:
        images = [handle_of(d) for d in range(5)]
        a, b, c, d, e = images
        size = a.nbytes
        # Images made ahead may fill all but a quarter of the budget (kept for documents
        # being built): a budget whose three quarters hold exactly two of them.
        budget = before + 2 * size
        while budget - budget // 4 < before + 2 * size:
            budget += 1
        assert budget - budget // 4 < before + 3 * size
        handle.set_pixel_budget(budget)
        # Past the budget, prefetched images wait, to start soonest needed first.
        assert [image.prefetch(priority) for image, priority in zip(images, (5, 6, 9, 8, 7))] == [
            True
        ] * 5
        assert handle.held_ahead() == before + 2 * size
        assert [image._future is not None for image in images] == [True, True] + [False] * 3
        assert c.prefetch(needed=True)  # wanted now: made whatever the budget
        c.check()  # decodes; kept only within the budget
        assert (c._pixels is not None) == (before + 3 * size <= budget)
        c.release()
        assert a.pixels() is not None
        a.release()  # frees room: the soonest waiting starts
        assert handle.held_ahead() == before + 2 * size
        assert e._future is not None and d._future is None
        # Both made (a job's end starts waiting images: once e's has run, a budget freed
        # later by a dropped handle starts nothing until the next release or prefetch).
        e._future[1].result()
        b._future[1].result()  # made; then dropped without a release
        del images, b
        for _ in range(100):  # (the pool thread lets go of the job)
            gc.collect()
            if handle.held_ahead() == before + size:
                break
            time.sleep(0.01)
        assert handle.held_ahead() == before + size  # (no release: nothing started)
        d.release()  # no longer wanted: never made
        e.pixels()
        e.release()
        assert handle.held_ahead() == before and d._future is None
        images = [a, c, d]
        assert [image.prefetch() for image in images[1:]] == [True, True]
        pixels = [image.pixels() for image in images]
        assert all(np.array_equal(p, handle_of(d).pixels()) for p, d in zip(pixels, (0, 2, 3)))
    finally:
        handle.set_pixel_budget(old)
        handle.set_decode_threads(threads)


def test_an_idle_pool_thread_keeps_no_reference_to_its_last_job():
    # Each idle thread used to keep its last job's callable -- a bound method of an image
    # handle with the stored bytes -- alive until its next job.
    from mixer.images.pool import PriorityPool

    class Job:
        def run(self) -> int:
            return 1

    pool = PriorityPool(2)
    try:
        jobs = [Job() for _ in range(4)]
        refs = [weakref.ref(job) for job in jobs]
        futures = [pool.submit(i, job.run) for i, job in enumerate(jobs)]
        assert [f.result(timeout=10) for f in futures] == [1] * 4
        del jobs, futures
        for _ in range(100):
            gc.collect()
            if all(ref() is None for ref in refs):
                break
            time.sleep(0.01)
        assert all(ref() is None for ref in refs)
    finally:
        pool.shutdown()
