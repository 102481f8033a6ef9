"""HY-WorldPlay's own parts, in pure torch (never imports ComfyUI, nor anything of the pack outside itself).

HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay) is HunyuanVideo 1.5's 480p I2V transformer with an
action embedding and a second, camera-projective attention stream, run chunk-wise autoregressively
with a re-encoded context. Its parts that need no ComfyUI live here:

- ``prope``: the PRoPE transform of q, k, v from each frame's camera;
- ``trajectory``: pose strings and pose JSON -> a checked :class:`~.trajectory.Trajectory`
  (poses, intrinsics, action labels);
- ``context``: which past frames are re-encoded before a chunk (view overlap, seeded) and their RoPE
  positions;
- ``condition``: the image condition cut to a call's frames;
- ``attention``: the one injectable attention both vision streams go through;
- ``keys``: the checkpoint's key names and shape.

The model itself, built from ComfyUI's HunyuanVideo classes, is ``../comfy_model.py``.
"""
