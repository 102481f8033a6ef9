"""MAGI-1 in ComfyUI: the MODEL (``model.py``), its files (``files.py``), its VAE (``vae.py``) and its caption
glue (``text.py``), around the pure-torch model in ``magi1/``; its ``ModelFamily`` (``family.py``: probe, geometry,
presets and the patch that routes the DiT's self-attention through the pack's cache) and the reference's
multi-noise pipeline on that cache (``recipe.py``, what MAGI-1 AR Sampler runs). ComfyUI is imported lazily,
inside functions.
"""
