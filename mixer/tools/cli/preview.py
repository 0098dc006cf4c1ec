"""`mixer preview`: the first sequences, decoded, with their sources and images."""

from __future__ import annotations

import argparse
from pathlib import Path

from mixer.tools.cli.args import count, output_folder
from mixer.tools.cli.common import load


def run(args: argparse.Namespace) -> int:
    from mixer.runtime.loader import build_loader
    from mixer.tokenize import Encoder
    from mixer.tools.preview import (
        AudioRef,
        ImageRef,
        RowRenderer,
        VideoRef,
        batch_images,
        join,
        save_images,
    )

    recipe = load(args.recipe)
    loader = build_loader(recipe, num_workers=0)
    encoder = Encoder(loader.tokenizer)
    names = [s.name for s in recipe.sources]
    folder = Path(args.save_images) if args.save_images else None
    shown = saved = 0
    with loader:
        for b, batch in enumerate(loader):
            renderer = RowRenderer(loader.layout, encoder, batch)
            images = batch_images(batch, loader.layout) if folder is not None else []
            for r, (ids, sources) in enumerate(
                zip(batch["input_ids"].tolist(), batch["source_ids"].tolist())
            ):
                if shown >= args.n:
                    break
                real = [i for i, s in zip(ids, sources) if s >= 0]
                label = names[max(sources)] if real else "padding"
                pieces, image_tokens = renderer.render(real)
                refs = [p for p in pieces if isinstance(p, ImageRef)]
                videos = sum(isinstance(p, VideoRef) for p in pieces)
                clips = sum(isinstance(p, AudioRef) for p in pieces)
                media = ([f"{len(refs)} image(s)"] if refs else []) + (
                    [f"{videos} video(s)"] if videos else []
                )
                media += [f"{clips} audio clip(s)"] if clips else []
                extra = f", {' and '.join(media)} of {image_tokens} tokens" if media else ""
                print(f"--- sequence {shown} [{label}] {len(real)} tokens{extra}")
                print(join(pieces, args.chars))
                if folder is not None and refs:
                    saved += len(save_images(images, refs, folder, batch=b, row=r, source=label))
                shown += 1
            if shown >= args.n:
                break
    if folder is not None:
        print(f"saved {saved} image(s) to {folder}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the command and its flags."""
    p = sub.add_parser(
        "preview",
        help="print the first sequences, decoded, with sources; "
        "images as <image WxH → N tokens>, videos as "
        "<video F×W×H @R fps → N tokens>, audio as <audio S s → N tokens>",
    )
    p.add_argument("recipe")
    p.add_argument(
        "-n", type=count("sequences", 1), default=4, help="number of sequences (default 4)"
    )
    p.add_argument(
        "--chars", type=count("chars", 0), default=400, help="cut each text here (0: no cut)"
    )
    p.add_argument(
        "--save-images",
        metavar="DIR",
        type=output_folder,
        help="write the images of the shown sequences to DIR as PNG "
        "(batchB-rowR-imageI-SOURCE.png; I: index in the batch's pixel_values), "
        "rebuilt from pixel_values: what the model sees, after resizing",
    )
    p.set_defaults(func=run)
