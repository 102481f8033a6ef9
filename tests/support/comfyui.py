"""Finding and starting ComfyUI, shared with the benchmarks: ``support.comfyui`` is the module
``jensen_testing.comfyui`` itself (one module object, so a patch through either name is seen by both)."""

import sys

import jensen_testing.comfyui

sys.modules[__name__] = jensen_testing.comfyui
