"""Wan 2.1 as a model family: ComfyUI's own WanModel (no model of the pack's own), sampled by the Chunked AR loop
(``runtime/chunk_loop.py``, the recipes of ``runtime/recipes/``) and by core's AR path. ``family.py``: the probe,
geometry, presets, the self-attention patch and core's path, and the family's registration; ``raylight.py``: the
same patch composed over Raylight's sequence-parallel forward; ``model/checkpoint.py``: the training checkpoints read as
published (pure torch, shared with tools/convert_checkpoint.py); ``loader.py``: Load AR Video Checkpoint's load."""
