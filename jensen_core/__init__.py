"""jensen_core: quantized, bit-packed chunk KV cache with Jensen-bias-corrected attention.

Pure torch (plus einops and safetensors); never imports ComfyUI. Paper: "Quantized Keys Steal
Attention: Bias Correction for KV-Cache Compression in Video Diffusion".
"""

from ._version import __version__ as __version__
from .attention import CacheEntry, cached_attention
from .bias import MODES, jensen_bias, log_sinhc
from .cache import ChunkCache, window_bytes
from .cache_values import CachePrecision, CacheShape
from .hadamard import fwht, rotate, unrotate
from .methods import method_of
from .packing import pack_codes, unpack_codes
from .quant import QuantizedTensor, StoredTensor, quantize
from .qvg import QVGTensor, kmeans
from .retention import Retained, Retention
from .spec import QuantSpec

__all__ = [
    "MODES",
    "CacheEntry",
    "CachePrecision",
    "CacheShape",
    "ChunkCache",
    "QuantSpec",
    "QuantizedTensor",
    "QVGTensor",
    "Retained",
    "Retention",
    "StoredTensor",
    "cached_attention",
    "fwht",
    "jensen_bias",
    "kmeans",
    "log_sinhc",
    "method_of",
    "pack_codes",
    "quantize",
    "rotate",
    "unpack_codes",
    "unrotate",
    "window_bytes",
]
