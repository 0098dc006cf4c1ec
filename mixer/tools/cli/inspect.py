"""`mixer inspect`: per-source files, splits, sizes, estimates, repeats (and images)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mixer.tools.cli.args import TOKENS
from mixer.tools.cli.common import load
from mixer.tools.tables import format_table


def run(args: argparse.Namespace) -> int:
    from mixer.tools.inspect_report import inspect_recipe

    recipe = load(args.recipe)
    report = inspect_recipe(recipe, training_tokens=args.tokens)
    if recipe.token_cache is not None:
        report["token_cache"] = _cache_rows(recipe)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"tokenizer backend: {report['tokenizer']['backend_verdict']}\n")
    print(
        format_table(
            report["sources"],
            [
                ("name", "source"),
                ("files", "files"),
                ("splits", "splits"),
                ("bytes", "bytes"),
                ("est_documents", "~docs"),
                ("est_tokens", "~tokens"),
                ("weight", "weight"),
                ("repeats_per_training_tokens", f"repeats/{args.tokens:.0e} tok"),
                ("read_amplification", "read amp."),
                ("worst_resume_bytes", "worst resume B"),
                ("skipped_at_listing", "skipped"),
                ("skipped_in_sample", "bad in sample"),
            ],
        )
    )
    for row in report["sources"]:
        if row["read_amplification"] > 1:
            print(
                f"note: source {row['name']!r} has fewer splits than lanes; each byte is read "
                f"{row['read_amplification']:.2g}x per epoch (re-shard it into more files)"
            )
        if row["lanes_without_documents"]:
            print(
                f"warning: source {row['name']!r} has fewer documents per split than the "
                f"lanes sharing it: {row['lanes_without_documents']} of {report['lanes']} "
                "lanes get none of it, so it gets less than its weight (give it at least as "
                "many files as lanes)"
            )
        if row["skipped_in_sample"]:
            print(
                f"warning: source {row['name']!r}: {row['skipped_in_sample']} bad input(s) in "
                f"the sample, skipped (on_error: skip) and left out of its estimates; the "
                f"first: {row['first_skipped']}"
            )
        if row["worst_resume_bytes"]:
            print(
                f"note: source {row['name']!r} has compressed splits; resuming "
                f"inside one decompresses up to {row['worst_resume_bytes']:,} stored bytes"
            )
    if report["sources"] and "clips_per_doc" in report["sources"][0]:
        _print_audio(report)
    elif report["layout"] != "text":
        _print_images(report)
    if recipe.token_cache is not None:
        _print_cache(recipe, report["token_cache"])
    return 0


def _cache_rows(recipe: Any) -> list[dict[str, Any]]:
    """Per source: cached splits / splits and bytes of the recipe's token cache."""
    from mixer.cache.fill import cache_summary
    from mixer.cache.tokenizer_setup import recipe_tokenizer
    from mixer.sources.manifest import list_sources

    info = recipe_tokenizer(recipe)
    return cache_summary(recipe, list_sources(recipe), info)


def _print_cache(recipe: Any, rows: list[dict[str, Any]]) -> None:
    where = recipe.resolve(recipe.token_cache)
    if recipe.images is not None:
        print(f"\ntoken cache {where}: not used (image recipes bypass the token cache)")
        return
    for row in rows:
        row.setdefault("fraction", f"{row['cached_splits']}/{row['splits']}")
    print(f"\ntoken cache {where}:")
    print(
        format_table(
            rows,
            [("name", "source"), ("fraction", "cached splits"), ("cached_bytes", "cached bytes")],
        )
    )


def _print_images(report: dict[str, Any]) -> None:
    """The image table of `inspect` under an image layout."""
    print(
        f"\nimages under the {report['layout']} layout (sampled from up to 8 splits of each "
        "source; sizes from image headers,\nnothing decoded; image tokens are placeholder "
        "tokens; ~tokens above include them):"
    )
    print(
        format_table(
            report["sources"],
            [
                ("name", "source"),
                ("sampled_documents", "sampled docs"),
                ("images_per_doc", "images/doc"),
                ("image_tokens_per_doc", "image tok/doc"),
                ("est_images", "~images"),
                ("est_image_tokens", "~image tokens"),
                ("image_token_share", "image tok share"),
                ("sampled_oversize", "oversize"),
                ("sampled_rejected", "rejected"),
            ],
        )
    )
    if "videos_per_doc" in report["sources"][0]:
        print(
            "\nvideos (frame counts and sizes from container headers, nothing decoded; "
            "frames are the sampled ones):"
        )
        print(
            format_table(
                report["sources"],
                [
                    ("name", "source"),
                    ("videos_per_doc", "videos/doc"),
                    ("frames_per_video", "frames/video"),
                    ("video_tokens_per_doc", "video tok/doc"),
                    ("est_videos", "~videos"),
                    ("est_video_tokens", "~video tokens"),
                    ("video_token_share", "video tok share"),
                ],
            )
        )
    for row in report["sources"]:
        if row["sampled_oversize"]:
            print(
                f"note: source {row['name']!r}: {row['sampled_oversize']} of "
                f"{row['sampled_documents']} sampled documents do not fit seq_len "
                f"{report['seq_len']} even at the lowest resolution (or the per-batch image "
                "caps); they are skipped and counted in metrics()['oversize']"
            )
        if row["sampled_rejected"]:
            print(
                f"note: source {row['name']!r}: {row['sampled_rejected']} of "
                f"{row['sampled_documents']} sampled documents are bad input (errors, or "
                "skipped with on_error: skip)"
            )


def _print_audio(report: dict[str, Any]) -> None:
    """The audio table of `inspect` under the audio layout."""
    print(
        f"\naudio under the {report['layout']} layout (sampled from up to 8 splits of each "
        "source; each sampled clip decoded\nonce for its length; audio tokens are <|AUDIO|> "
        "tokens; ~tokens above include them):"
    )
    print(
        format_table(
            report["sources"],
            [
                ("name", "source"),
                ("sampled_documents", "sampled docs"),
                ("clips_per_doc", "clips/doc"),
                ("audio_tokens_per_doc", "audio tok/doc"),
                ("est_clips", "~clips"),
                ("est_audio_tokens", "~audio tokens"),
                ("audio_token_share", "audio tok share"),
                ("sampled_oversize", "oversize"),
                ("sampled_rejected", "rejected"),
            ],
        )
    )
    for row in report["sources"]:
        if row["sampled_oversize"]:
            print(
                f"note: source {row['name']!r}: {row['sampled_oversize']} of "
                f"{row['sampled_documents']} sampled documents do not fit seq_len "
                f"{report['seq_len']} (or audio.max_audio_per_batch); they are skipped and "
                "counted in metrics()['oversize']"
            )
        if row["sampled_rejected"]:
            print(
                f"note: source {row['name']!r}: {row['sampled_rejected']} of "
                f"{row['sampled_documents']} sampled documents are bad input (errors, or "
                "skipped with on_error: skip)"
            )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "inspect",
        help="per-source files, splits, sizes, estimates, repeats; "
        "under an image layout also images and image tokens per document",
    )
    p.add_argument("recipe")
    p.add_argument(
        "--tokens",
        type=TOKENS,
        default=10**9,
        help="training tokens for the repeats column (default 1e9)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)
