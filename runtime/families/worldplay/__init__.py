"""HY-WorldPlay in ComfyUI: its model built from core's HunyuanVideo 1.5 classes, its checkpoint loader, its family
adapter and its recipe.

``model.py`` (the transformer, its model_base and model config, composed on core's classes; the
``WorldPlayCall`` a caller puts in ``transformer_options``), ``loader.py`` (the official checkpoint
-> a ModelPatcher), ``family.py`` (``WorldPlayFamily``: both vision streams through the run's caches, the
route on a clone) and ``recipe.py`` (its own loop: the context rebuilt before every chunk, on ComfyUI's
sampler; HY-WorldPlay AR Sampler runs it). They import ComfyUI only inside functions; this package imports
none of them, so it imports without ComfyUI. The pure-torch parts (PRoPE, trajectories, context selection,
the injectable attention, the key names) are the top-level ``worldplay/`` room.
"""
