"""WebDataset tar shards: grouping (checked against webdataset's own), text choice, cursors,
errors, S3, listing, and the whole loader over a text-only source."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import boto3
import pytest
from conftest import s3_options
from helpers import batch_digest, byte_mutations, corpus, doc_text, expected_counts, token_counts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webdataset.tariterators import group_by_keys, tar_file_iterator

import mixer
from mixer.sources import FORMATS, FileEntry, Split, Storage, infer_format, list_source, read_split
from mixer.sources.formats.webdataset import read_webdataset

JPEG = b"\xff\xd8\xff\xe0fake-jpeg"
PNG = b"\x89PNG\r\n\x1a\nfake-png"
LONG = "shards/" + "a-very-long-folder-name-" * 6  # > 100 characters with the key


def write_tar(
    path: Path, members: list[tuple[str, bytes | None]], fmt: int = tarfile.PAX_FORMAT
) -> dict[str, int]:
    """Write (name, data) members (data None: a directory); return each name's offset."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def entry_of(path: Path) -> FileEntry:
    return FileEntry(str(path), path.name, path.stat().st_size, "webdataset")


def read(
    path: Path,
    *,
    text_field: str | None = None,
    max_bytes: int = 1 << 20,
    index: int = 0,
    offset: int = 0,
    storage=None,
) -> list[mixer.sources.Record]:
    entry = entry_of(path)
    return list(
        read_split(
            storage=storage or Storage("wds", {}),
            entry=entry,
            split=Split(0, 0, entry.size),
            source="wds",
            text_field=text_field,
            max_bytes=max_bytes,
            index=index,
            offset=offset,
        )
    )


def wds_samples(path: Path) -> list[dict]:
    """The samples webdataset's own tar iterator and grouping make of the tar."""
    with open(path, "rb") as f:
        return list(group_by_keys({**m, "__url__": str(path)} for m in tar_file_iterator(f)))


def oracle(path: Path) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    """(text, ((member, data), ...)) per sample as webdataset groups the tar."""
    out = []
    for sample in wds_samples(path):
        text = sample["txt"].decode() if "txt" in sample else json.loads(sample["json"])["txt"]
        images = [
            s
            for s in sample
            if s.rsplit(".", 1)[-1] in ("jpg", "jpeg", "png", "webp")
            and (s.count(".") == 0 or s.split(".")[0].isdigit())
        ]
        images.sort(key=lambda s: int(s.split(".")[0]) if "." in s else -1)
        out.append((text, tuple((sample["__key__"] + "." + s, sample[s]) for s in images)))
    return out


def ours(records) -> list[tuple[str, tuple[tuple[str, bytes], ...]]]:
    assert all(r.error is None for r in records), [str(r.error) for r in records if r.error]
    return [(r.text, tuple((i.member.lower(), i.data) for i in r.images)) for r in records]


# -- grouping --------------------------------------------------------------------------------


def mixed_members(long: bool) -> list[tuple[str, bytes | None]]:
    deep = LONG if long else "shards/x"
    return [
        ("shards/", None),
        ("shards/000.cls", b"3"),
        ("shards/000.jpg", JPEG + b"0"),
        ("shards/000.txt", b"a single image"),
        ("shards/001.0.jpg", JPEG + b"1.0"),
        ("shards/001.1.png", PNG + b"1.1"),
        ("shards/001.10.jpg", JPEG + b"1.10"),  # sorts before 2 as text, after it as n
        ("shards/001.2.webp", b"RIFF1.2"),
        ("shards/001.json", json.dumps({"txt": "not this one", "id": 1}).encode()),
        ("shards/001.txt", b"four images"),
        ("shards/002.json", json.dumps({"txt": "from json \u00e9"}).encode()),
        ("shards/003.JPEG", JPEG + b"3"),
        ("shards/003.seg.png", PNG + b"not an image of the sample"),
        ("shards/003.txt", b""),
        ("README", b"no suffix: in no sample"),
        ("__index__", b"metadata"),
        (f"{deep}/004.jpg", JPEG + b"4"),
        (f"{deep}/004.txt", "long names \u2603".encode()),
        ("v1.2/005.txt", b"dots in folders"),
        ("shards/006-\u00fc\u00df.txt", b"non-ASCII name"),
    ]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_samples_are_grouped_as_webdataset_groups_them(tmp_path, fmt):
    long = fmt != tarfile.USTAR_FORMAT
    members = mixed_members(long)
    offsets = write_tar(tmp_path / "a.tar", members, fmt)
    records = read(tmp_path / "a.tar")
    assert ours(records) == oracle(tmp_path / "a.tar")
    assert [r.text for r in records] == [
        "a single image",
        "four images",
        "from json \u00e9",
        "",
        "long names \u2603",
        "dots in folders",
        "non-ASCII name",
    ]
    assert [i.member for i in records[1].images] == [
        "shards/001.0.jpg",
        "shards/001.1.png",
        "shards/001.2.webp",
        "shards/001.10.jpg",
    ]
    assert [r.index for r in records] == list(range(7))
    first = [
        "shards/000.cls",
        "shards/001.0.jpg",
        "shards/002.json",
        "shards/003.JPEG",
        f"{LONG if long else 'shards/x'}/004.jpg",
        "v1.2/005.txt",
        "shards/006-\u00fc\u00df.txt",
    ]
    assert [r.offset for r in records] == [offsets[name] for name in first]
    for record in records:
        for image in record.images:
            assert image.offset == offsets[image.member]
    if long:  # the offset is that of the extension header, where a cursor must seek
        header = (tmp_path / "a.tar").read_bytes()[records[4].offset :][:512]
        assert len(first[4]) > 100 and header[156:157] in (b"L", b"x")


def test_text_field_chooses_the_txt_member_or_a_json_key(tmp_path):
    path = tmp_path / "t.tar"
    write_tar(
        path,
        [
            ("0.json", json.dumps({"txt": "json txt", "caption": "json caption"}).encode()),
            ("0.txt", b"txt member"),
            ("1.json", json.dumps({"txt": "json txt only"}).encode()),
            ("2.caption", b"caption member"),
            ("2.txt", b"txt 2"),
        ],
    )
    assert [r.text for r in read(path)[:2]] == ["txt member", "json txt only"]  # default: txt
    assert [r.text for r in read(path, text_field="txt")[:2]] == ["txt member", "json txt only"]
    caption = read(path, text_field="caption")
    assert caption[0].text == "json caption"  # another field: the json key first,
    assert caption[1].error is not None and "sample without text" in str(caption[1].error)
    assert caption[2].text == "caption member"  # else the member with that suffix
    assert read(path)[2].text == "txt 2"
    no_text = tmp_path / "n.tar"
    write_tar(no_text, [("0.json", b'{"caption": "x"}'), ("0.jpg", JPEG)])
    err = read(no_text)[0].error
    assert "sample without text (no txt member and no 'txt' key in a json member)" in str(err)


# -- cursors ---------------------------------------------------------------------------------


@st.composite
def tar_samples(draw):
    samples = []
    for n in range(draw(st.integers(1, 10))):
        images = draw(st.integers(0, 3))
        numbered = images > 1 or draw(st.booleans())
        text = draw(st.sampled_from(["txt", "json", "both", "none", "bad"]))
        members = []
        key = f"{'k' * draw(st.sampled_from([1, 120]))}/{n:04d}"
        for i in draw(st.permutations(range(images))):
            members.append((f"{key}.{i}.png" if numbered else f"{key}.jpg", PNG + bytes([i])))
        if text in ("json", "both"):
            members.append((f"{key}.json", json.dumps({"txt": f"json {n}"}).encode()))
        if text in ("txt", "both"):
            members.append((f"{key}.txt", f"text {n}".encode()))
        if text == "bad":
            members.append((f"{key}.txt", b"\xff\xfe"))
        if draw(st.booleans()):
            members.append((f"{key}.cls", b"7"))
        samples.extend(sorted(members) if draw(st.booleans()) else members)
    return samples


def oracle_or_none(path: Path) -> list:
    """webdataset's samples, with None for those that have no text or bad UTF-8."""
    out = []
    for sample in wds_samples(path):
        text = None
        if "txt" in sample:
            try:
                text = sample["txt"].decode()
            except UnicodeDecodeError:
                text = None
        elif "json" in sample:
            text = json.loads(sample["json"])["txt"]
        images = sorted(
            (s for s in sample if s.endswith(("png", "jpg"))),
            key=lambda s: int(s.split(".")[0]) if "." in s else -1,
        )
        out.append((text, tuple((sample["__key__"] + "." + s, sample[s]) for s in images)))
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(members=tar_samples(), fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_resuming_at_any_record_yields_exactly_the_rest(tmp_path_factory, members, fmt):
    folder = tmp_path_factory.mktemp("resume")
    path = folder / "r.tar"
    write_tar(path, members, fmt)
    full = read(path)
    expected = oracle_or_none(path)
    assert len(full) == len(expected)
    assert [
        (r.text, tuple((i.member, i.data) for i in r.images)) if r.error is None else (None, ())
        for r in full
    ] == [(text, images if text is not None else ()) for text, images in expected]
    data = path.read_bytes()
    for record in full:
        # the bytes before the cursor are garbage: the reader must seek, not re-read them
        cut = folder / "cut.tar"
        cut.write_bytes(b"\xa5" * record.offset + data[record.offset :])
        rest = read(cut, index=record.index, offset=record.offset)
        assert [
            (r.index, r.offset, r.text, r.images, str(r.error).replace(str(cut), "")) for r in rest
        ] == [
            (r.index, r.offset, r.text, r.images, str(r.error).replace(str(path), ""))
            for r in full[record.index :]
        ]


# -- errors ----------------------------------------------------------------------------------


def test_bad_samples_are_errors_naming_the_member_and_reading_goes_on(tmp_path):
    path = tmp_path / "bad.tar"
    big = b"x" * 300_000
    offsets = write_tar(
        path,
        [
            ("s0.txt", b"good"),
            ("s1.jpg", b""),
            ("s1.txt", b"empty image"),
            ("s2.0.jpg", JPEG),
            ("s2.cls", b"1"),
            ("s3.txt", b"caf\xe9"),
            ("s4.json", b'{"txt": "unterminated'),
            ("s5.txt", b"y" * 300),
            ("s6.jpg", big),
            ("s6.txt", b"image too big"),
            ("s7.json", b'{"txt": 5}'),
            ("s8.jpg", JPEG),
            ("s8.txt", b""),
            ("s9.txt", b"one"),
            ("s9.txt", b"two"),
            ("s10.txt", b"good again"),
        ],
    )

    class Counting(Storage):
        read_bytes = 0

        def open(self, entry, **kw):
            f = super().open(entry, **kw)
            outer = self
            real = f.read

            def counted(n=-1):
                data = real(n)
                outer.read_bytes += len(data)
                return data

            f.read = counted
            return f

    storage = Counting("wds", {})
    records = read(path, max_bytes=256, storage=storage)
    assert storage.read_bytes < len(big), "the oversized image was seeked past, not read"
    assert [r.index for r in records] == list(range(11))
    assert records[0].text == "good" and records[10].text == "good again"
    assert records[8].text == "" and records[8].images[0].data == JPEG
    expected = {
        1: ("s1.jpg", "empty image member"),
        2: ("s2.0.jpg", "sample without text"),
        3: ("s3.txt", "not valid UTF-8"),
        4: ("s4.json", "malformed JSON"),
        5: ("s5.txt", "longer than max_document_bytes (256)"),
        6: ("s6.jpg", "longer than max_document_bytes (256)"),
        7: ("s7.json", "'txt' is int, not a string"),
        9: ("s9.txt", "repeated member"),
    }
    for i, (member, why) in expected.items():
        err = records[i].error
        assert isinstance(err, mixer.DataError), i
        assert err.source == "wds" and err.file == str(path)
        assert f"member {member} at byte offset {offsets[member]}" in err.location, err
        assert why in str(err)
        assert records[i].text is None


def good_tar(path: Path, n: int = 6) -> dict[str, int]:
    members = []
    for i in range(n):
        members += [(f"{i:03d}.jpg", JPEG * 40), (f"{i:03d}.txt", f"text {i}".encode())]
    return write_tar(path, members, tarfile.GNU_FORMAT)


def test_truncated_member_ends_the_split_with_an_error(tmp_path):
    path = tmp_path / "t.tar"
    offsets = good_tar(path)
    data = path.read_bytes()
    path.write_bytes(data[: offsets["003.jpg"] + 700])  # inside 003.jpg's data
    records = read(path)
    assert [r.text for r in records[:3]] == ["text 0", "text 1", "text 2"]
    assert len(records) == 4 and records[3].index == 3
    err = records[3].error
    assert err.file == str(path) and "past the end of the file" in str(err)
    assert f"member 003.jpg at byte offset {offsets['003.jpg']}" in err.location
    # cut inside the second member of a sample: the sample is the error (it is incomplete)
    path.write_bytes(data[: offsets["003.txt"] + 515])
    records = read(path)
    assert len(records) == 4 and records[3].offset == offsets["003.jpg"]
    assert f"member 003.txt at byte offset {offsets['003.txt']}" in records[3].error.location


def test_corrupt_or_truncated_header_ends_the_split(tmp_path):
    path = tmp_path / "c.tar"
    offsets = good_tar(path)
    data = bytearray(path.read_bytes())
    at = offsets["002.txt"]
    data[at + 10] ^= 0x55  # the header's name: its checksum no longer matches
    path.write_bytes(bytes(data))
    records = read(path)
    assert [r.text for r in records[:2]] == ["text 0", "text 1"]
    assert len(records) == 3 and records[2].offset == offsets["002.jpg"]
    assert "corrupt tar header" in str(records[2].error)
    assert f"sample 002 (tar header at byte offset {at})" in records[2].error.location
    data[at + 10] ^= 0x55
    first = offsets["003.jpg"]  # the first header of a sample: the samples before are whole
    path.write_bytes(bytes(data[:first] + b"\xff" * 512 + data[first + 512 :]))
    records = read(path)
    assert [r.text for r in records[:3]] == ["text 0", "text 1", "text 2"]
    assert len(records) == 4 and (records[3].index, records[3].offset) == (3, first)
    assert f"tar header at byte offset {first}" in records[3].error.location
    path.write_bytes(bytes(data[: offsets["004.jpg"] + 100]))  # inside a header
    records = read(path)
    assert [r.text for r in records[:4]] == [f"text {i}" for i in range(4)]
    assert len(records) == 5 and "truncated tar header" in str(records[4].error)
    assert f"byte offset {offsets['004.jpg']}" in records[4].error.location
    # a tar without its end-of-archive blocks is whole
    path.write_bytes(bytes(data[: offsets["004.jpg"]]))
    assert [r.text for r in read(path)] == [f"text {i}" for i in range(4)]


FUZZ_MEMBERS = [
    ("a/0.json", b'{"txt": "zero", "n": [1, 2]}'),
    ("a/0.jpg", JPEG),
    ("a/1.0.png", PNG),
    ("a/1.1.png", PNG),
    ("a/1.txt", b"one"),
    (LONG + "/2.txt", b"two"),
    (LONG + "/2.cls", b"2"),
    ("a/3.txt", b"three"),
]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_damaged_tars_give_records_or_named_errors_and_cursors_still_resume(
    tmp_path_factory, fmt, data
):
    folder = tmp_path_factory.mktemp("fuzz")
    clean = folder / "clean.tar"
    write_tar(clean, FUZZ_MEMBERS, fmt)
    path = folder / "x.tar"
    path.write_bytes(data.draw(byte_mutations(clean.read_bytes())))
    entry = entry_of(path)

    def records(index: int, offset: int) -> list:  # the reader itself, not the boundary
        return list(
            read_webdataset(
                storage=Storage("wds", {}),
                entry=entry,
                split=Split(0, 0, entry.size),
                source="wds",
                text_field="txt",
                max_bytes=1 << 16,
                index=index,
                offset=offset,
            )
        )

    full = records(0, 0)
    assert [r.index for r in full] == list(range(len(full)))
    for record in full:
        assert (record.text is None) != (record.error is None)
        if record.error is not None:
            assert (record.error.source, record.error.file) == ("wds", str(path))
            assert "byte offset" in record.error.location
    for record in full[1:]:
        assert plain(records(record.index, record.offset)) == plain(full[record.index :])


def plain(records) -> list[tuple]:
    return [(r.index, r.offset, r.text, r.images, str(r.error)) for r in records]


# -- storage, listing, the loader ------------------------------------------------------------


def test_listing_infers_webdataset_and_makes_one_split_per_tar(tmp_path, tokenizer_path):
    (tmp_path / "wds").mkdir()
    for name in ("b.tar", "a.tar"):
        good_tar(tmp_path / "wds" / name)
    assert infer_format("x/shard-000.TAR") == "webdataset"
    assert FORMATS["webdataset"].default_text_field == "txt"
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 4,
            "batch_size": 1,
            "sources": [{"name": "w", "path": str(tmp_path / "wds/*.tar"), "weight": 1}],
        }
    )
    table = list_source(recipe, recipe.sources[0])
    assert [f.key for f in table.files] == ["a.tar", "b.tar"]
    assert [f.format for f in table.files] == ["webdataset"] * 2
    assert table.splits == [
        Split(0, 0, table.files[0].size, -1, True),
        Split(1, 0, table.files[1].size, -1, True),
    ]


def test_s3_reads_the_same_records_as_local_disk(tmp_path, s3_endpoint, tokenizer_path):
    path = tmp_path / "s.tar"
    write_tar(path, mixed_members(True))
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
    )
    client.create_bucket(Bucket="wds")
    client.put_object(Bucket="wds", Key="shards/s.tar", Body=path.read_bytes())
    recipe = mixer.load_recipe(
        {
            "tokenizer": str(tokenizer_path),
            "seq_len": 4,
            "batch_size": 1,
            "sources": [
                {
                    "name": "wds",
                    "path": "s3://wds/shards/*.tar",
                    "weight": 1,
                    "storage_options": s3_options(s3_endpoint),
                }
            ],
        }
    )
    table = list_source(recipe, recipe.sources[0])
    assert table.files[0].format == "webdataset"
    storage = Storage("wds", s3_options(s3_endpoint), block_size=4096)  # several requests
    remote = list(
        read_split(
            storage=storage,
            entry=table.files[0],
            split=table.splits[0],
            source="wds",
            text_field=None,
            max_bytes=1 << 20,
            index=0,
            offset=0,
        )
    )
    local = read(path)
    assert [(r.index, r.offset, r.text, r.images) for r in remote] == [
        (r.index, r.offset, r.text, r.images) for r in local
    ]
    resumed = list(
        read_split(
            storage=storage,
            entry=table.files[0],
            split=table.splits[0],
            source="wds",
            text_field=None,
            max_bytes=1 << 20,
            index=3,
            offset=local[3].offset,
        )
    )
    assert [r.text for r in resumed] == [r.text for r in local[3:]]


@pytest.mark.slow
def test_loader_over_a_text_only_webdataset_source_resumes_exactly(tmp_path, tokenizer_path):
    docs = corpus(0, 150, max_len=20)
    (tmp_path / "wds").mkdir()
    for part in range(3):
        write_tar(
            tmp_path / "wds" / f"part-{part}.tar",
            [(f"{d:05d}.txt", doc_text(d, n).encode()) for d, n in docs[part::3]],
        )
    recipe = {
        "seed": 3,
        "tokenizer": str(tokenizer_path),
        "seq_len": 16,
        "batch_size": 2,
        "lanes": 2,
        "shuffle_window": 8,
        "sources": [
            {"name": "wds", "path": str(tmp_path / "wds" / "*.tar"), "weight": 1, "epochs": 1}
        ],
    }
    with mixer.build_loader(recipe) as loader:
        full = list(loader)
    assert token_counts(full) == expected_counts(docs)
    reference = [batch_digest(b) for b in full]
    loader = mixer.build_loader(recipe, num_workers=2)
    head = []
    for batch in loader:
        head.append(batch_digest(batch))
        if len(head) == len(reference) // 2:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    resumed = mixer.build_loader(recipe, num_workers=1)
    resumed.load_state_dict(state)
    with resumed:
        assert head + [batch_digest(b) for b in resumed] == reference
