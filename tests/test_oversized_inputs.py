"""Oversized and hostile inputs cost bounded memory and fail by name: a huge single-line
document in every text format, a zstd bomb, an elongated image.

Memory is measured in one child process (this file run as a script): per case, the peak
resident size above the size before it (the peak is reset between cases through
/proc/self/clear_refs; where that is refused, each case gets its own child).
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from helpers import (
    doc_text,
    make_tokenizer,
    token_counts,
    word_id,
)
from image_data import make_vlm_tokenizer
from PIL import Image

import mixer
from mixer.sources.formats.zstd_frames import BLOCK_MAX, ZstdStream

MB = 1 << 20
BIG = 200 * MB  # the single-line document
SMALL_LIMIT = 1 * MB  # max_document_bytes of most cases
PIECE = b"w1 " * (MB // 3)


# -- the child process: one measurement per case ------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Reset this process's peak resident size (Linux); False where it cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    """The peak resident size of this process's memory (VmHWM; not ru_maxrss, which also
    counts the parent's size at the fork before exec)."""
    return _status("VmHWM")


def _patch_zstd(bounded: bool) -> None:
    """Read .zst jsonl through `ZstdStream` (the change proposed for jsonl.py) or as shipped."""
    from mixer.sources.formats import jsonl

    original = jsonl.__dict__.setdefault("_shipped_zstd", jsonl._zstd)
    jsonl._zstd = (
        (lambda raw: io.BufferedReader(ZstdStream(raw), buffer_size=64 << 10))
        if bounded
        else original
    )


def _run_loader(case: dict) -> dict:
    recipe = {
        "tokenizer": case["tokenizer"],
        "seq_len": case.get("seq_len", 8),
        "batch_size": 1,
        "lanes": 1,
        "max_document_bytes": case["max_bytes"],
        "sources": [
            {
                "name": "big",
                "path": case["path"],
                "weight": 1,
                "epochs": 1,
                "on_error": case["on_error"],
                **({"text_field": case["text_field"]} if "text_field" in case else {}),
            }
        ],
    }
    if "images" in case:
        recipe["images"] = case["images"]
    loader = mixer.build_loader(recipe)
    out: dict[str, Any] = {"error": None, "pixels": []}
    try:
        for batch in loader:
            if "pixel_values" in batch and len(batch["pixel_values"]):
                out["pixels"].append(list(batch["pixel_values"].shape))
    except mixer.DataError as exc:
        out["error"] = {
            "source": exc.source,
            "file": exc.file,
            "location": exc.location,
            "message": str(exc),
        }
    metrics = loader.metrics()
    out["reasons"] = metrics["skipped_by_reason"]["big"]
    out["documents"] = metrics["documents"]["big"]
    return out


def _read_whole(case: dict) -> dict:
    """One record through the format's reader, held: (resident size while it is held)."""
    from mixer.core.records import FileEntry, Split
    from mixer.sources import Storage, read_split

    stat = os.stat(case["path"])
    entry = FileEntry(case["path"], "x", stat.st_size, case["format"], mtime_ns=stat.st_mtime_ns)
    split = Split(0, 0, stat.st_size, -1)
    before = _rss()
    records = read_split(
        storage=Storage("big", {}),
        entry=entry,
        split=split,
        source="big",
        text_field=None,
        max_bytes=case["max_bytes"],
        index=0,
        offset=0,
    )
    record = next(records)
    held = _rss() - before
    chars = len(record.text or "")
    del record
    records.close()
    return {"held": held, "chars": chars}


def _measure(case: dict) -> dict:
    _patch_zstd(case.get("bounded_zstd", False))
    resettable = _reset_peak()
    before, start = _rss(), time.monotonic()
    try:
        result = _read_whole(case) if case["kind"] == "reader" else _run_loader(case)
    except Exception as exc:  # (MemoryError included): this case fails, not the others
        result = {"crash": f"{type(exc).__name__}: {exc}"}
    result.update(growth=_peak() - before, seconds=time.monotonic() - start, resettable=resettable)
    return result


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _child(cases: list[dict]) -> None:
    """Measure each case; a case that would be ruinous fails with MemoryError, not the host."""
    import mixer.images.documents  # noqa: F401  (imported before the limit and the baseline:
    import mixer.runtime.loader  # noqa: F401   `import mixer` no longer imports torch,

    try:  # and tokenizer_backend: auto imports fastokens when it
        import fastokens  # noqa: F401  tries it)
    except ImportError:
        pass
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _status("VmData") + (6 << 30)
    if soft == resource.RLIM_INFINITY or soft > limit:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    for case in cases:
        print(json.dumps({"name": case["name"], **_measure(case)}), flush=True)


def measure_in_children(cases: list[dict], timeout: float = 240) -> dict[str, dict]:
    """Results by case name, from one child (or one per case where the peak cannot reset)."""
    groups = [cases] if _reset_peak() else [[case] for case in cases]
    results: dict[str, dict] = {}
    for group in groups:
        done = subprocess.run(
            [sys.executable, __file__, json.dumps(group)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                results[row["name"]] = row
    return results


# -- big files, made cheaply -------------------------------------------------------------------


def _line_pieces(size: int) -> Any:
    yield b'{"text": "'
    for _ in range(size // len(PIECE)):
        yield PIECE
    yield b'w1"}\n'
    yield json.dumps({"text": doc_text(2, 2)}).encode() + b"\n"  # a good record after it


def _write(path: Path, pieces: Any, codec: str = "") -> Path:
    with open(path, "wb") as raw:
        if codec == "zst":
            with zstandard.ZstdCompressor(level=1).stream_writer(raw, closefd=False) as out:
                for piece in pieces:
                    out.write(piece)
        elif codec == "gz":
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as out:
                for piece in pieces:
                    out.write(piece)
        else:
            for piece in pieces:
                raw.write(piece)
    return path


def _bomb(path: Path, size: int) -> Path:
    """A zstd file of `size` bytes of one character, no newline, then one good record."""
    chunk = b"a" * (64 * MB)
    return _write(
        path,
        itertools.chain(
            itertools.repeat(chunk, size // len(chunk)),
            [b"\n", json.dumps({"text": "w2 w2"}).encode() + b"\n"],
        ),
        "zst",
    )


def _sparse_text(path: Path, size: int) -> Path:
    """A text file of `size` bytes that occupies no disk (never read: refused by its size)."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def _sparse_tar(path: Path, member: str, size: int) -> Path:
    """A tar whose first sample's `member` has `size` bytes (a hole), then a good sample."""
    with open(path, "wb") as f:
        info = tarfile.TarInfo(member)
        info.size = size
        f.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        f.seek(f.tell() + (size + 511) // 512 * 512)
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            good = doc_text(2, 2).encode()
            info = tarfile.TarInfo("s2.txt")
            info.size = len(good)
            tar.addfile(info, io.BytesIO(good))
    return path


def _member_tar(path: Path, name: str, data: bytes) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def _png(width: int, height: int, *, truncated: bool = False) -> bytes:
    rng = np.random.default_rng([width, height])
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, "PNG")
    data = out.getvalue()
    return data[: len(data) // 2] if truncated else data


def _image_tar(path: Path, image: bytes) -> Path:
    members = [("s1.png", image), ("s1.txt", b"w1 w1"), ("s2.txt", b"w2 w2")]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _cases(folder: Path) -> list[dict]:
    tok = str(make_tokenizer(folder / "tokenizer.json"))
    vlm = str(make_vlm_tokenizer(folder / "vlm.json"))
    jsonl = _write(folder / "big.jsonl", _line_pieces(BIG))
    zst = _write(folder / "big.jsonl.zst", _line_pieces(BIG), "zst")
    gz = _write(folder / "big.jsonl.gz", _line_pieces(BIG), "gz")
    text = _sparse_text(folder / "big.txt", BIG)
    whole = _write(folder / "whole.txt", itertools.repeat(PIECE, 48))
    whole_tar = _member_tar(folder / "whole.tar", "s1.txt", PIECE * 48)
    wds_txt = _sparse_tar(folder / "txt.tar", "s1.txt", BIG)
    wds_json = _sparse_tar(folder / "json.tar", "s1.json", BIG)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"text": [(PIECE * 32).decode(), doc_text(2, 2)]}), folder / "big.parquet"
    )
    bomb = _bomb(folder / "bomb.jsonl.zst", 2 << 30)
    small_bomb = _bomb(folder / "small-bomb.jsonl.zst", 256 * MB)
    long_image = _image_tar(folder / "long.tar", _png(1, 100_000))
    base = {"kind": "loader", "tokenizer": tok, "max_bytes": SMALL_LIMIT}
    cases = []
    for name, path, extra in (
        ("jsonl", jsonl, {}),
        ("gz", gz, {}),
        ("zst", zst, {"bounded_zstd": True}),
        ("text", text, {}),
        ("wds_txt", wds_txt, {}),
        ("wds_json", wds_json, {}),
        ("bomb", bomb, {"bounded_zstd": True}),
        ("parquet", folder / "big.parquet", {}),
    ):
        for on_error in ("skip", "raise"):
            cases.append(
                {
                    **base,
                    **extra,
                    "name": f"{name}-{on_error}",
                    "path": str(path),
                    "on_error": on_error,
                }
            )
    # parquet last: pyarrow's pool keeps its pages, which later baselines would include
    cases[-2:-2] = [
        {
            **base,
            "name": "jsonl-default-limit",
            "path": str(jsonl),
            "on_error": "skip",
            "max_bytes": 64 * MB,
        },
        {**base, "name": "zst-as-shipped", "path": str(zst), "on_error": "skip"},
        {**base, "name": "bomb-as-shipped", "path": str(small_bomb), "on_error": "skip"},
        {
            "kind": "reader",
            "name": "text-within-limit",
            "path": str(whole),
            "format": "text",
            "max_bytes": 64 * MB,
        },
        {
            "kind": "reader",
            "name": "wds-within-limit",
            "path": str(whole_tar),
            "format": "webdataset",
            "max_bytes": 64 * MB,
        },
        {
            **base,
            "name": "llava-long",
            "path": str(long_image),
            "on_error": "raise",
            "tokenizer": vlm,
            "seq_len": 640,
            "images": {"layout": "llava"},
        },
        {
            **base,
            "name": "qwen-long",
            "path": str(long_image),
            "on_error": "skip",
            "tokenizer": vlm,
            "seq_len": 64,
            "images": {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 3136},
        },
    ]
    return cases


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, dict]:
    """Every case measured in its own child process (about 15 s): its tests are slow."""
    return measure_in_children(_cases(tmp_path_factory.mktemp("big")))


# -- a huge single-line document in every text format -------------------------------------

STREAMED = ["jsonl", "gz", "zst", "text", "wds_txt", "wds_json", "bomb"]
LOCATIONS = {
    "jsonl": "byte offset 0",
    "gz": "line 1 (decompressed byte offset 0)",
    "zst": "line 1 (decompressed byte offset 0)",
    "text": "byte offset 0",
    "wds_txt": "sample s1 (member s1.txt at byte offset 0)",
    "wds_json": "sample s1 (member s1.json at byte offset 0)",
    "parquet": "row group 0, row 0",
    "bomb": "line 1 (decompressed byte offset 0)",
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", STREAMED + ["parquet"])
def test_an_over_long_document_is_a_named_too_long_skip(measured, fmt):
    got = measured[f"{fmt}-skip"]
    assert got["error"] is None
    assert got["reasons"] == {"too_long": 1}
    # the record after it is read (text files hold one document only)
    assert got["documents"] == (0 if fmt == "text" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", STREAMED + ["parquet"])
def test_an_over_long_document_raises_naming_source_file_and_offset(measured, fmt):
    error = measured[f"{fmt}-raise"]["error"]
    assert error is not None and error["source"] == "big"
    assert error["file"].endswith((".jsonl", ".gz", ".zst", ".txt", ".tar", ".parquet"))
    assert error["location"] == LOCATIONS[fmt]
    assert "max_document_bytes" in error["message"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", STREAMED)
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_memory_stays_far_below_the_document_where_the_format_streams(measured, fmt, on_error):
    # Documents far over a small max_document_bytes: what is held is bounded by the limit
    # and the readers' buffers, never by the document.
    got = measured[f"{fmt}-{on_error}"]
    assert got["growth"] < 40 * MB, got


@pytest.mark.slow
def test_the_bound_at_the_default_limit_is_under_the_document(measured):
    # At the default limit: readline keeps up to the limit, and its join a copy of that
    assert measured["jsonl-default-limit"]["growth"] < 0.75 * BIG


@pytest.mark.slow
def test_an_over_long_jsonl_line_is_held_once_at_most(measured):
    assert measured["jsonl-default-limit"]["growth"] < 1.5 * 64 * MB


@pytest.mark.slow
def test_parquet_holds_the_value_as_pyarrow_decodes_it_and_no_more_copies(measured):
    # Parquet needs the value in memory (its page and its decoded array), never as Python
    # text: the lengths are checked before anything is converted.
    assert measured["parquet-skip"]["growth"] < 5.5 * 32 * MB


@pytest.mark.slow
def test_parquet_makes_no_copy_of_a_too_long_value_beyond_pyarrows_decoding(measured):
    assert measured["parquet-skip"]["growth"] < 3.6 * 32 * MB


@pytest.mark.slow
@pytest.mark.parametrize("case", ["text-within-limit", "wds-within-limit"])
def test_a_document_within_the_limit_is_held_once_not_with_its_bytes(measured, case):
    # Text files and webdataset members are read whole (no record to stream): once decoded,
    # the reader keeps the text only, while its record is in use.
    got = measured[case]
    assert got["chars"] == 48 * len(PIECE)
    assert got["held"] < 1.4 * got["chars"], got


@pytest.mark.slow
@pytest.mark.parametrize("case", ["zst-as-shipped", "bomb-as-shipped"])
def test_zstd_jsonl_holds_little_however_well_it_compresses(measured, case):
    assert measured[case]["growth"] < 40 * MB, measured[case]


# -- a zstd bomb ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_zstd_bomb_costs_the_time_of_decompressing_it_not_more(measured):
    # Gigabytes of one character with no newline: drained at decompression speed in bounded
    # memory (above), then the next line is read. Stopping the file there would lose it.
    got = measured["bomb-skip"]
    assert got["documents"] == 1
    assert got["seconds"] < 60


def test_zstd_stream_output_per_read_is_bounded_for_any_ratio():
    data = zstandard.ZstdCompressor(level=1).compress(b"a" * (64 * MB))
    assert len(data) < 64 << 10  # one input read of the shipped stream: all of it at once
    stream = ZstdStream(io.BytesIO(data), max_output=256 << 10)
    total = 0
    while chunk := stream.read(1 << 20):
        total += len(chunk)
        assert len(stream._out) <= (256 << 10) + BLOCK_MAX
    assert total == 64 * MB


@pytest.mark.parametrize(
    "case", ["frames", "skippable", "checksum", "truncated", "garbage", "empty"]
)
def test_zstd_stream_decompresses_as_zstandard_and_refuses_truncated_files(case):
    payload = b"".join(json.dumps({"text": doc_text(d, 20)}).encode() + b"\n" for d in range(3000))
    frames = [
        zstandard.ZstdCompressor(level=3, write_checksum=case == "checksum").compress(
            payload[i : i + 40_000]
        )
        for i in range(0, len(payload), 40_000)
    ]
    data = b"".join(frames)
    if case == "skippable":
        data = frames[0] + b"\x50\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc" + data
        payload = payload[:40_000] + payload
    stored = {"truncated": data[:-3], "garbage": data + b"junk", "empty": b""}.get(case, data)
    for kw in ({}, {"max_output": 1, "read_size": 7}):  # and one block, one byte at a time
        stream = io.BufferedReader(ZstdStream(io.BytesIO(stored), **kw))
        if case in ("truncated", "garbage"):
            with pytest.raises(zstandard.ZstdError):
                stream.read()
        else:
            assert stream.read() == (b"" if case == "empty" else payload)


# -- an elongated image ------------------------------------------------------------------------


@pytest.fixture
def vlm(tmp_path) -> Path:
    return make_vlm_tokenizer(tmp_path / "vlm.json")


IMAGE_LAYOUTS = {
    "llava": {"layout": "llava", "image_size": 28},
    "qwen2_vl": {"layout": "qwen2_vl", "min_pixels": 784, "max_pixels": 3136},
}


def _image_recipe(vlm: Path, path: Path, layout: str, on_error: str, **images) -> dict:
    return {
        "tokenizer": str(vlm),
        "seq_len": 64,
        "batch_size": 1,
        "lanes": 1,
        "images": {**IMAGE_LAYOUTS[layout], **images},
        "sources": [
            {"name": "src", "path": str(path), "weight": 1, "epochs": 1, "on_error": on_error}
        ],
    }


@pytest.mark.parametrize("layout", ["llava", "qwen2_vl"])
def test_an_image_over_max_source_pixels_is_refused_before_decoding(tmp_path, vlm, layout):
    # Its pixel data is cut short: decoding it would fail otherwise than by its size.
    path = _image_tar(tmp_path / "a.tar", _png(1, 100_000, truncated=True))
    recipe = _image_recipe(vlm, path, layout, "raise", max_source_pixels=50_000)
    with pytest.raises(mixer.DataError, match="max_source_pixels") as err:
        list(mixer.build_loader(recipe))
    assert (err.value.source, err.value.location) == ("src", "member s1.png at byte offset 0")
    loader = mixer.build_loader(_image_recipe(vlm, path, layout, "skip", max_source_pixels=50_000))
    assert token_counts(loader)[word_id(2)] == 2
    assert loader.metrics()["skipped_by_reason"]["src"] == {"bad_image": 1}


@pytest.mark.slow
def test_an_elongated_image_under_the_limit_costs_its_crop_not_its_resized_size(measured):
    # llava's shortest-edge resize of a one-pixel-wide strip would take gigabytes; only the
    # crop is resampled.
    got = measured["llava-long"]
    assert got["error"] is None and got["pixels"] == [[1, 3, 336, 336]]
    assert got["growth"] < 64 * MB, got


@pytest.mark.slow
def test_qwen2_vl_refuses_an_elongated_image_by_its_aspect_ratio(measured):
    got = measured["qwen-long"]
    assert got["reasons"] == {"bad_image": 1} and got["documents"] == 1
    assert got["growth"] < 64 * MB


@pytest.mark.parametrize("size", [(20, 2000), (2000, 20), (7, 900), (150, 4000), (2, 300)])
def test_the_crop_of_an_elongated_image_is_the_whole_resizes_crop(size):
    from mixer.config.images import ImageSettings
    from mixer.images.processing import LlavaProcessing

    processing = LlavaProcessing(ImageSettings(layout="llava"))
    w, h = size
    image = Image.fromarray(
        np.random.default_rng(list(size)).integers(0, 256, (h, w, 3), dtype=np.uint8)
    )
    width, height = processing.resized_size(w, h)
    whole = image.resize((width, height), Image.Resampling.BICUBIC)
    left, top = (width - 336) // 2, (height - 336) // 2
    expected = whole.crop((left, top, left + 336, top + 336))
    want = np.stack(
        [np.asarray(b.point(t, "F")) for b, t in zip(expected.split(), processing._tables)]
    )
    got = processing.pixels(image, processing.plan(w, h))
    levels = np.abs(got - want) * np.array(processing.settings.image_std)[:, None, None] * 255
    assert got.shape == (3, 336, 336) and levels.max() < 1.01  # float32 box: a level at most


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
