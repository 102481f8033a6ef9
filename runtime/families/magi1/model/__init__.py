"""MAGI-1 (Sand AI) in pure torch: the DiT, its chunk pipeline and sampler, its caption glue and its ViT VAE.

The family's pure-torch model: imports torch, einops and safetensors, never ComfyUI (whose op classes are injected:
:class:`.dit.MagiDiT` takes ``operations``) and nothing of the pack outside itself, so it imports both inside the
pack and on its own (``runtime.families.magi1.model``). The ComfyUI glue is the rest of ``runtime/families/magi1/``.
"""
