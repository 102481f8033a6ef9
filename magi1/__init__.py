"""MAGI-1 (Sand AI) in pure torch: the DiT, its chunk pipeline and sampler, its caption glue and its ViT VAE.

Its own room: imports torch, einops, safetensors and ``jensen_core`` only, never ComfyUI (whose op classes
are injected: :class:`magi1.dit.MagiDiT` takes ``operations``). The ComfyUI glue lives in
``runtime/families/magi1/``.
"""
