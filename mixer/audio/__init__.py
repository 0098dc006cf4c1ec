"""Audio: from stored clips to Whisper log-mel features and the tokens that stand for them.

decode.py     clips (PyAV): 16 kHz mono float32 samples, the header's duration checked first
features.py   the log-mel `input_features` WhisperFeatureExtractor makes, mask frames and
              Qwen2-Audio's token count
handle.py     AudioPlan (samples, frames, tokens) and LazyAudio: a document's clip, its
              features made on demand on the image pool, under the pixel budget
documents.py  records -> documents: markers, `<|audio_bos|>`/`<|AUDIO|>`/`<|audio_eos|>`
              spans, fitting a row (oversize)
layout.py     the qwen2_audio batch layout (input_features, feature_attention_mask)
"""
