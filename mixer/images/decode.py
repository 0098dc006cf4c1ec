"""Stored image bytes: their size from the header alone, and their pixels in RGB.

The conversion to RGB is transformers 5's (`image_transforms.convert_to_rgb`, which its image
processors apply to every PIL image): an image with an alpha band, or with transparency info
(a palette or grey image with a transparent index, an RGB PNG with a tRNS colour), is converted
to RGBA and composited on opaque white; any other mode is `convert("RGB")`. No JPEG draft mode
and no EXIF rotation, as there.

Only the formats an image member may hold are opened: JPEG (and its multi-picture variant),
PNG (APNG included), WebP, and GIF and BMP (often found under a .jpg or .png name in crawled
data). PIL knows some forty more, and some of them hand the bytes to other programs or to
rarely used decoders (EPS runs Ghostscript on the PostScript it holds): bytes in any other
format are "not an image", like random bytes. Animated images give their first frame, as
transformers' processors do.

PIL's own decompression-bomb check reads the global `PIL.Image.MAX_IMAGE_PIXELS`, warns past it
and raises at twice it. We leave that global alone and open images the way `PIL.Image.open`
does minus that check (`_open`), checking `max_source_pixels` from the recipe instead, so no
`DecompressionBombWarning` is printed and the recipe alone decides. (A few PIL plugins repeat
PIL's check inside: a GIF frame that grows its canvas, MPO frames, TIFF tiles. Past PIL's limit,
which is above our default max_source_pixels, those still warn, or raise an error that becomes a
`DataError` like any other.)
"""

from __future__ import annotations

import io
import struct

from PIL import Image, ImageFile

from mixer.core.errors import DataError
from mixer.core.records import EncodedImage

# PIL plugins (`Image.ID`) tried on an image member's bytes; no other format is opened.
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# What a PIL plugin raises when the bytes are not its format (PIL.Image.open skips to the next).
_NOT_THIS_FORMAT = (SyntaxError, IndexError, TypeError, struct.error)
# What decoding bad bytes raises (truncated data: OSError "image file is truncated").
_DECODE_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    TypeError,
    struct.error,
    Image.DecompressionBombError,
)


def where(encoded: EncodedImage) -> str:
    """The location part of an image's errors: its member and the member's byte offset."""
    return f"member {encoded.member} at byte offset {encoded.offset}"


def _open(data: bytes) -> ImageFile.ImageFile | None:
    """`PIL.Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)` without PIL's global bomb
    check; None when none of those formats accepts the bytes. Lazy: only the header is read."""
    fp = io.BytesIO(data)
    prefix = data[:16]
    if any(fmt not in Image.OPEN for fmt in IMAGE_FORMATS):
        Image.init()  # registers the plugins (WebP is not among PIL's preinit ones)
    for fmt in IMAGE_FORMATS:
        if fmt not in Image.OPEN:
            continue  # a PIL built without it
        factory, accept = Image.OPEN[fmt]
        accepted = not accept or accept(prefix)
        if not accepted or isinstance(accepted, str):  # a str: known but unsupported
            continue
        fp.seek(0)
        try:
            return factory(fp, "")
        except _NOT_THIS_FORMAT:
            continue
    return None


def _opened(
    encoded: EncodedImage, *, source: str, file: str, max_source_pixels: int
) -> ImageFile.ImageFile:
    def error(message: str) -> DataError:
        return DataError(
            message, source=source, file=file, location=where(encoded), reason="bad_image"
        )

    if not encoded.data:
        raise error("empty image (0 bytes)")
    try:
        image = _open(encoded.data)
    except _DECODE_ERRORS as exc:
        raise error(f"cannot read the image header: {exc}") from exc
    if image is None:
        raise error(
            f"not an image in a format an image member may hold "
            f"({', '.join(IMAGE_FORMATS)}; {len(encoded.data)} bytes, starting "
            f"{encoded.data[:8]!r})"
        )
    width, height = image.size
    if width <= 0 or height <= 0:
        raise error(f"image of size {width}x{height} has no pixels")
    if width * height > max_source_pixels:
        raise error(
            f"image of {width}x{height} = {width * height:,} pixels is more than "
            f"images.max_source_pixels ({max_source_pixels:,}): refused as a "
            "possible decompression bomb"
        )
    return image


def probe(
    encoded: EncodedImage, *, source: str, file: str, max_source_pixels: int
) -> tuple[int, int]:
    """(width, height) of a stored image, read from its header without decoding pixels.

    Raises `DataError` (naming source, file, member and byte offset) for an empty member,
    bytes that are no image, and images of more than `max_source_pixels` pixels.
    """
    return _opened(encoded, source=source, file=file, max_source_pixels=max_source_pixels).size


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` in RGB as transformers 5 converts it: transparency composited on white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_rgb(
    encoded: EncodedImage, *, source: str, file: str, max_source_pixels: int
) -> Image.Image:
    """The stored image decoded to RGB (see `to_rgb`); truncated or corrupt data, and
    everything `probe` refuses, raise `DataError`."""
    image = _opened(encoded, source=source, file=file, max_source_pixels=max_source_pixels)
    try:
        image.load()
        return to_rgb(image)
    except _DECODE_ERRORS as exc:
        raise DataError(
            f"cannot decode the image: {exc}",
            source=source,
            file=file,
            location=where(encoded),
            reason="bad_image",
        ) from exc
