"""HY-WorldPlay in ComfyUI: its model built from core's HunyuanVideo 1.5 classes, and its checkpoint loader.

``model.py`` (the transformer, its model_base and model config, composed on core's classes; the
``WorldPlayCall`` a caller puts in ``transformer_options``) and ``loader.py`` (the official checkpoint
-> a ModelPatcher). Both import ComfyUI only inside functions; this package imports neither, so it
imports without ComfyUI. The pure-torch parts (PRoPE, trajectories, context selection, the
injectable attention, the key names) are the top-level ``worldplay/`` room.

The family adapter (the pack's cache on WorldPlay's two vision streams) comes with the recipe
interface; until then the sampler's family list does not include WorldPlay.
"""
