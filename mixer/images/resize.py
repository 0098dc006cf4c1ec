"""`images.resize: torchvision`: the resampling and normalisation of transformers' torchvision
image processors (`Qwen2VLImageProcessor`, `CLIPImageProcessor`; what `AutoImageProcessor`
picks where torchvision is installed), without importing torchvision.

On CPU those processors hand a uint8 image (contiguous, channels first) to torchvision's
`resize`, which calls torch's own `interpolate(mode="bicubic", antialias=True,
align_corners=False)` on the uint8 tensor; then they rescale and normalize in one step,
(x - 255·mean) / (255·std) in float32. Both are done here with the same operations (the
second as a 256-entry table per channel, or in torch for qwen patches), so the values are bit
for bit the processor's.
(`images.resize: pil`, the default, is `processing`'s PIL resampling, that of the `...Pil`
processors.)
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from mixer.config.images import ImageSettings
from mixer.images.decode import to_rgb


def fused_tables(settings: ImageSettings) -> np.ndarray:
    """(3, 256) float32: per channel, the normalized value of each uint8 level, computed as
    the torchvision processors' fused rescale and normalize."""
    levels = np.arange(256, dtype=np.float32)
    mean = np.array(settings.image_mean, dtype=np.float32) * np.float32(255.0)
    std = np.array(settings.image_std, dtype=np.float32) * np.float32(255.0)
    return (levels[None, :] - mean[:, None]) / std[:, None]


def resized_array(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """An (H, W, 3) uint8 array at width×height, (3, height, width) uint8, as torchvision's
    bicubic antialiased resize makes it on CPU (unchanged where the size already is that)."""
    import torch  # (only where pixels are made)

    tensor = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None]
    if tensor.shape[-2:] != (height, width):
        tensor = torch.nn.functional.interpolate(
            tensor, size=(height, width), mode="bicubic", align_corners=False, antialias=True
        )
    return tensor[0].numpy()


def torch_resized(image: Image.Image, width: int, height: int) -> np.ndarray:
    """The image (any mode, converted as `decode.to_rgb` does) at width×height, (3, height,
    width) uint8 (`resized_array`)."""
    return resized_array(np.array(to_rgb(image)), width, height)  # (writable: torch warns)


def qwen_patches(
    image: Image.Image, width: int, height: int, settings: ImageSettings
) -> np.ndarray:
    """(grid_h · grid_w, 3 · temporal · patch²) float32: the image resized (`torch_resized`),
    normalized as `fused_tables` computes it, and cut into patches in `Qwen2VLImageProcessor`'s
    order (merge windows row by row; in a patch, channel, temporal copy, row, column)."""
    import torch

    patch, merge = settings.patch_size, settings.merge_size
    temporal = settings.temporal_patch_size
    resized = torch.from_numpy(torch_resized(image, width, height))
    gh, gw = height // patch, width // patch
    # uint8 into patch order first (a quarter of the bytes a float copy moves), then normalize
    # with the fused step's float32 operations, then repeat along the temporal axis
    windows = resized.reshape(3, gh // merge, merge, patch, gw // merge, merge, patch)
    ordered = windows.permute(1, 4, 2, 5, 0, 3, 6).contiguous()  # (gh/m, gw/m, m, m, 3, p, p)
    mean = torch.tensor(settings.image_mean, dtype=torch.float32).mul(255.0).view(3, 1, 1)
    std = torch.tensor(settings.image_std, dtype=torch.float32).mul(255.0).view(3, 1, 1)
    normalized = (ordered.float() - mean) / std
    shape = (gh // merge, gw // merge, merge, merge, 3, temporal, patch, patch)
    return normalized.unsqueeze(5).expand(shape).reshape(gh * gw, -1).numpy()
