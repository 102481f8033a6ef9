"""Importing one pack module as ComfyUI does, shared with the benchmarks: ``support.pack`` is the module
``jensen_testing.pack`` itself (one module object)."""

import sys

import jensen_testing.pack

sys.modules[__name__] = jensen_testing.pack
