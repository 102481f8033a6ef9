"""A tiny Wan 2.1 written as a GGUF file the way ComfyUI-GGUF's converter writes real Wan GGUFs, and where to find
ComfyUI-GGUF.

The layout follows ComfyUI-GGUF ``tools/convert.py`` (``ModelWan``) and what its ``loader.py`` reads back:
architecture string ``"wan"`` in ``general.architecture``, ComfyUI's own key names (no prefix),
numpy arrays in the original (PyTorch) axis order; 1-D tensors and the ``.modulation`` parameters
in F32, the rest in F16; ``quantize`` names tensors to store as Q8_0 instead (dequantized on the
fly by GGMLOps' Linear layers). The 5-D ``patch_embedding.weight`` is written as it is (what
ComfyUI-GGUF's ``fix_5d_tensors.py`` adds back to real files).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from .comfyui import LAY_OUT_HINT, find_comfyui, trees_dir

GGUF_DIRNAME = "ComfyUI-GGUF"


def _is_gguf_pack(p: Path) -> bool:
    return (p / "loader.py").is_file() and (p / "nodes.py").is_file() and (p / "ops.py").is_file()


def locate_comfyui_gguf() -> Path | None:
    """``COMFYUI_GGUF_PATH``, ComfyUI's ``custom_nodes/ComfyUI-GGUF``, or the tree lay-out.sh puts under
    ``/opt/comfyui`` (the order ``.ci/run`` looks in)."""
    candidates = [os.environ.get("COMFYUI_GGUF_PATH")]
    comfy = find_comfyui()
    if comfy is not None:
        candidates.append(comfy / "custom_nodes" / GGUF_DIRNAME)
    candidates.append(trees_dir() / GGUF_DIRNAME)
    for c in candidates:
        if c and _is_gguf_pack(Path(c)):
            return Path(c).resolve()
    return None


def gguf_skip_reason() -> str | None:
    """Why the GGUF test cannot run here (None when it can)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return 'the gguf package is not installed: pip install "gguf>=0.13" (it is in the pack\'s test extra)'
    if locate_comfyui_gguf() is None:
        return (
            "ComfyUI-GGUF not found: set COMFYUI_GGUF_PATH, install city96/ComfyUI-GGUF in ComfyUI's custom_nodes, "
            f"or lay it out under {trees_dir()} with {LAY_OUT_HINT}"
        )
    return None


def tensor_types(sd: dict[str, torch.Tensor], quantize: tuple[str, ...] = ()) -> dict[str, str]:
    """The GGML type each tensor is written as: F32, F16 or Q8_0."""
    out = {}
    for k, v in sd.items():
        if k in quantize:
            out[k] = "Q8_0"
        elif v.ndim <= 1 or k.endswith(".modulation"):
            out[k] = "F32"
        else:
            out[k] = "F16"
    return out


def write_wan_gguf(sd: dict[str, torch.Tensor], path: str | os.PathLike, quantize: tuple[str, ...] = ()) -> dict:
    """Write ``sd`` as a ComfyUI-GGUF Wan file; returns the state dict as it reads back (dequantized, float32).

    The returned values are exactly the weights ComfyUI-GGUF computes with (F16 rounding, Q8_0
    dequantized as it does by default), so a safetensors file of them is the same model in a format
    UNETLoader reads (float16 holds them all when ``sd`` was float16-exact to begin with).
    """
    import gguf

    types = tensor_types(sd, quantize)
    writer = gguf.GGUFWriter(path=None, arch="wan")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    exact: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        data = v.detach().to(torch.float32).cpu().numpy()
        qtype = getattr(gguf.GGMLQuantizationType, types[k])
        if types[k] == "F32":
            raw = data.astype(np.float32)
            back = raw
        elif types[k] == "F16":
            raw = data.astype(np.float16)
            back = raw.astype(np.float32)
        else:
            raw = gguf.quants.quantize(data, qtype)
            # ComfyUI-GGUF dequantizes Q8_0 as float16 scale x int8 in float16 (dequant_dtype "default")
            back = gguf.quants.dequantize(raw, qtype).reshape(data.shape).astype(np.float16).astype(np.float32)
        writer.add_tensor(k, raw, raw_dtype=qtype)
        exact[k] = torch.from_numpy(np.ascontiguousarray(back)).clone()
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return exact
