"""The tiny Wan builders, shared with the benchmarks: ``support.wan_tiny`` is the module
``jensen_testing.wan_tiny`` itself (one module object, so a patch through either name is seen by both)."""

import sys

import jensen_testing.wan_tiny

sys.modules[__name__] = jensen_testing.wan_tiny
