"""MAGI-1 (Sand AI) as a model family: one package.

- ``model/``: MAGI-1 in pure torch (the DiT, its chunk pipeline and sampler, caption glue, the ViT VAE, the
  checkpoint reader); no ComfyUI, and nothing of the pack outside itself;
- ``family.py``: :class:`~.family.Magi1Family` (probe, geometry, presets, its planner rule, the patch that routes
  the DiT's self-attention through the pack's cache) and its registration;
- ``recipe.py``: the reference's multi-noise pipeline on that cache (what MAGI-1 AR Sampler runs); ``window.py``:
  its schedule rules (what its window 0 keeps);
- the ComfyUI glue: the MODEL (``comfy_model.py``), its files (``files.py``), its VAE (``vae.py``) and its caption
  (``text.py``), imported by the family's nodes (``nodes/magi1.py``). ComfyUI is imported lazily, inside
  functions. This file imports nothing, so ``model/`` imports on its own.
"""
