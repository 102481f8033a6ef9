"""The tiny causal Wan builders, shared with the benchmarks: ``support.causal_wan`` is the module
``jensen_testing.causal_wan`` itself (one module object, so a patch through either name is seen by both)."""

import sys

import jensen_testing.causal_wan

sys.modules[__name__] = jensen_testing.causal_wan
