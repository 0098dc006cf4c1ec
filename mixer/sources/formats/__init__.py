"""The format registry: one entry per file format, the only place a format is spelled out.

Each reader lives in a module of its own; this package registers them (see `registry.py` for
what an entry holds).
"""

from mixer.sources.formats.jsonl import read_jsonl, read_jsonl_gz, read_jsonl_zst
from mixer.sources.formats.megatron import index_url, megatron_splits, read_megatron
from mixer.sources.formats.npy import npy_splits, read_npy
from mixer.sources.formats.parquet import read_parquet
from mixer.sources.formats.registry import (
    FORMATS,
    Format,
    SplitRequest,
    byte_ranges,
    infer_format,
    one_document,
    one_tar,
    register,
    row_group_splits,
    whole_file,
    zstd_frame_splits,
)
from mixer.sources.formats.text import read_text
from mixer.sources.formats.webdataset import read_webdataset

register(Format("jsonl", (".jsonl", ".json", ".ndjson"), read_jsonl, byte_ranges))
register(
    Format(
        "jsonl.gz",
        (".jsonl.gz", ".json.gz"),
        read_jsonl_gz,
        whole_file,
        compression="gzip",
        offset_unit="decompressed byte offset",
    )
)
register(
    Format(
        "jsonl.zst",
        (".jsonl.zst", ".json.zst", ".jsonl.zstd"),
        read_jsonl_zst,
        zstd_frame_splits,
        compression="zstd",
        offset_unit="decompressed byte offset",
    )
)
register(Format("parquet", (".parquet", ".pq"), read_parquet, row_group_splits, offset_unit="row"))
register(Format("text", (".txt", ".text", ".md"), read_text, one_document))
register(Format("webdataset", (".tar",), read_webdataset, one_tar, default_text_field="txt"))
register(
    Format(
        "megatron",
        (".bin",),
        read_megatron,
        megatron_splits,
        offset_unit="document",
        pretokenized=True,
        companion=index_url,
    )
)
register(Format("npy", (".npy",), read_npy, npy_splits, pretokenized=True))

__all__ = ["FORMATS", "Format", "SplitRequest", "infer_format", "register"]
