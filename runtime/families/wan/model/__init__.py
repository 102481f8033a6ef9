"""Wan 2.1's pure-torch parts of the pack (no ComfyUI; the model itself is ComfyUI's WanModel): ``checkpoint``, reading
the training checkpoints as published."""
