"""MAGI-1 in ComfyUI: the MODEL (``model.py``), its files (``files.py``), its VAE (``vae.py``) and its caption
glue (``text.py``), around the pure-torch model in ``magi1/``. ComfyUI is imported lazily, inside functions.

The pack's cache integration (a ``ModelFamily`` adapter and the multi-noise recipe on the pack's sampler)
is not here yet; the reference-faithful sampler (``magi1.sampler``) runs on ``model.diffusion_model(patcher)``.
"""
