"""Helpers shared by the tests and the benchmarks / tools: finding ComfyUI and importing it in-process
(``comfyui``), tiny Wan and causal Wan models built from ComfyUI's own classes (``wan_tiny``, ``causal_wan``),
the bundled tiny AR model (``tiny_ar``), a float64 reference attention (``reference``) and importing one
pack module as ComfyUI does, without ComfyUI (``pack``).

Not part of what ComfyUI loads: no room of the pack imports it. Scripts reach it with the pack's folder
appended to ``sys.path`` (after ComfyUI's, which ``comfyui.setup_inprocess_comfyui`` puts first, so ComfyUI's
top-level ``nodes`` module is never shadowed by the pack's ``nodes`` package).
"""
