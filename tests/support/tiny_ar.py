"""The bundled tiny AR model's helpers, shared with the benchmarks: ``support.tiny_ar`` is the module
``jensen_testing.tiny_ar`` itself (one module object, so a patch through either name is seen by both)."""

import sys

import jensen_testing.tiny_ar

sys.modules[__name__] = jensen_testing.tiny_ar
