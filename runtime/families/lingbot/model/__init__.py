"""LingBot-World's parts in pure torch: no ComfyUI, nothing of the pack outside this folder.

- ``camera.py``: camera paths (a pose folder's ``poses.npy`` / ``intrinsics.npy``, or a typed key path) -> the
  per-latent relative poses and the 6-channel ray map folded into the tokens' camera features;
- ``schedule.py``: the causal-fast DMD schedule (integer timesteps, the two sigma tables, x0 and re-noise);
- ``window.py``: the reference's window and sink in latent frames -> cache entries the pack's chunk cache keeps,
  and the reference's own full-precision rolling cache (:class:`ReferenceKV`);
- ``keys.py``: the checkpoint's key names (the camera keys ComfyUI's Wan loader drops) and its shape.
"""
