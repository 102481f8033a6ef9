"""LingBot-World 2.0 (Robbyant) as a model family: one package.

- ``model/``: its parts in pure torch (the camera map from poses and intrinsics, the causal-fast DMD schedule, the
  cache rule of its window and sink, the checkpoint's key names, the reference's full-precision rolling cache); no
  ComfyUI, and nothing of the pack outside itself;
- ``comfy_model.py``: the transformer, composed from ComfyUI's Wan 2.1 classes (its blocks, head, RoPE, unpatchify)
  plus the camera layers; its model_base and model config; ``loader.py``: the checkpoint -> a ModelPatcher;
- ``family.py``: ``LingBotFamily`` (every block's self-attention through the run's caches, its planner rule) and its
  registration;
- ``recipe.py``: its own loop (the reference's causal-fast rollout: 4 DMD steps per chunk, re-noise between steps, a
  t = 0 pass that writes the chunk's clean K/V), what LingBot-World AR Sampler (``nodes/lingbot.py``) runs.

ComfyUI is imported only inside functions. This file imports nothing, so ``model/`` imports on its own.
"""
