"""Images and videos: from stored bytes to the model's pixels and the tokens that stand for them.

decode.py      header probe (size, bomb check) and decoding to RGB the way transformers
               does (transparency composited on white; no draft mode, no EXIF rotation)
processing.py  per layout: the plan of an image (resized size, patch grid, tokens) from
               its header alone, and its pixels (PIL bicubic on uint8, then normalize;
               or resize.py's under `images.resize: torchvision`)
resize.py      torch's bicubic antialiased resize and the fused rescale/normalize tables
               of transformers' torchvision processors (images there, videos always)
handle.py      LazyImage: a document's image, its cost known before decoding; pixels
               decoded ahead of need on a small per-process thread pool
documents.py   records -> documents: markers, placeholder spans, fitting a row (oversize)
rope.py        Qwen2-VL M-RoPE positions of one document, as the model computes them
layouts.py     the qwen2_vl, qwen2_5_vl and llava batch layouts (keys, M-RoPE positions,
               pixels)
select.py      which layout a recipe's batches have (text or one of those)
video_decode.py  videos (PyAV): header facts (size, rate, frames; limits) and the RGB
               frames at sampled indices, seeking to keyframes
video.py       frame sampling, VideoPlan, VideoProcessing (the processor's resize,
               normalize and patches) and LazyVideo
qwen3_vl.py    the qwen3_vl layout: Qwen3-VL's video sampling, volume resize, timestamped
               temporal patches and M-RoPE grids, on top of qwen2_vl's
"""
