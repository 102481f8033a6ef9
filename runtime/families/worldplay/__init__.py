"""HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay) as a model family: one package.

- ``model/``: its parts in pure torch (PRoPE, trajectories, context selection, the image condition, the injectable
  attention, the checkpoint's key names); no ComfyUI, and nothing of the pack outside itself;
- ``comfy_model.py``: the transformer, its model_base and model config, composed on ComfyUI's HunyuanVideo 1.5
  classes (the ``WorldPlayCall`` a caller puts in ``transformer_options``); ``loader.py``: the official checkpoint
  -> a ModelPatcher;
- ``family.py``: ``WorldPlayFamily`` (both vision streams through the run's caches, the route on a clone, its
  planner rule) and its registration;
- ``recipe.py``: its own loop (the context rebuilt before every chunk, on ComfyUI's sampler), what HY-WorldPlay AR
  Sampler (``nodes/worldplay.py``) runs.

ComfyUI is imported only inside functions. This file imports nothing, so ``model/`` imports on its own.
"""
