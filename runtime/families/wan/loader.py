"""Load AR Video Checkpoint's load: a Wan 2.1 T2V training checkpoint as its authors publish it, converted in memory
(ComfyUI imported lazily).

Self-Forcing / Causal Forcing (``generator`` + ``generator_ema``), CausVid (``generator``), LongLive (a base plus a
PEFT LoRA) and Krea Realtime 14B (one safetensors file with ``model.`` in front of every key) go through the checks
and the conversion of ``tools/convert_checkpoint.py`` (:mod:`.model.checkpoint`, the same functions), then through
``comfy.sd.load_diffusion_model_state_dict`` as UNETLoader would load the converted file: the same tensors, the same
metadata, so the MODEL is the one UNETLoader gives on the file the tool writes.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import torch

from .model import checkpoint as ck

logger = logging.getLogger("jensen_kv")

#: the weights widget: auto is the converter's order (generator_ema, else generator; with a LoRA, generator)
WEIGHTS = ("auto", "generator_ema", "generator")
#: core's UNETLoader's weight_dtype choices and the model_options each gives (the same in v0.3.64, v0.27 and 0.33)
WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")
#: the dtype the published fp32 weights are converted to in memory (the converter's default)
CONVERT_DTYPE = "bf16"
#: what every refusal of a file ends with
FIX = (
    "Load AR Video Checkpoint reads the Wan 2.1 T2V checkpoints Self-Forcing, CausVid, LongLive, Causal Forcing and "
    "Krea publish, as they publish them: pick one of those, downloaded whole from its official source"
)
#: what the Note and errors call the ComfyUI versions with core's causal AR model class
CAUSAL_COMFYUI = "ComfyUI v0.27 or newer"


def model_options(weight_dtype: str) -> dict:
    """``model_options`` for ``weight_dtype``, as core's UNETLoader maps its widget."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ck.ConversionError(f"weight_dtype {weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
    if weight_dtype == "fp8_e4m3fn":
        return {"dtype": torch.float8_e4m3fn}
    if weight_dtype == "fp8_e4m3fn_fast":
        return {"dtype": torch.float8_e4m3fn, "fp8_optimizations": True}
    if weight_dtype == "fp8_e5m2":
        return {"dtype": torch.float8_e5m2}
    return {}


def takes_metadata() -> bool:
    """Whether this ComfyUI's ``load_diffusion_model_state_dict`` takes the file's metadata (v0.27+; v0.3.64 does
    not, and has no causal AR model class to pick from it)."""
    import comfy.sd

    return "metadata" in inspect.signature(comfy.sd.load_diffusion_model_state_dict).parameters


def comfyui_version() -> str:
    try:
        import comfyui_version

        return f"ComfyUI {comfyui_version.__version__}"
    except Exception:  # noqa: BLE001 - a tree without the file is an old one
        return "this ComfyUI"


def converted_state_dict(
    path: str | Path, weights: str = "auto", lora_path: str | Path | None = None, causal: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, str], str]:
    """``(state dict, metadata, what)`` of a published checkpoint: what ``tools/convert_checkpoint.py`` would write
    (``--key`` from ``weights``, ``--lora``, ``--causal``; bf16 for a ``.pt``, a safetensors file's tensors as they
    are), with the same metadata. ConversionError naming the file and the fix."""
    path = Path(path)
    if weights not in WEIGHTS:
        raise ck.ConversionError(f"weights {weights!r} is not one of {', '.join(WEIGHTS)}")
    key = None if weights == "auto" else weights
    try:
        if path.suffix.lower() in ck.SAFETENSORS_SUFFIXES:
            if key is not None or lora_path is not None:
                raise ck.ConversionError(
                    "weights and lora_name apply to .pt training checkpoints; a .safetensors file holds one model: "
                    "set weights to auto and lora_name to none"
                )
            sd, metadata, what = _safetensors(path)
        else:
            sd, metadata, what = _training_checkpoint(path, key, lora_path)
        if causal:
            metadata = ck.with_causal_config(metadata)
    except ck.ConversionError as e:
        raise ck.ConversionError(f"{path.name}: {e}. {FIX}") from None
    return sd, metadata, what


def _safetensors(path: Path):
    from safetensors.torch import load_file

    header, data_start = ck.read_safetensors_header(path)
    names = [k for k in header if k != "__metadata__"]
    prefixes = [p for p in ck.check_prefixes(names) if p]
    ck.check_extents(header, data_start, path.stat().st_size)
    ck.check_recorded_dtype(header)
    ck.check_wan_t2v(ck.strip_wrappers(ck.meta_state_dict(header)))
    sd = ck.strip_wrappers(load_file(str(path)))
    info = ck.check_wan_t2v(sd)
    metadata = dict(header.get("__metadata__") or {})
    if prefixes:
        metadata.update(ck.stripped_metadata(path.name, prefixes))
    stripped = f", prefixes {', '.join(prefixes)} stripped" if prefixes else ""
    return sd, metadata, f"{info}, tensors as stored{stripped}"


def _training_checkpoint(path: Path, key: str | None, lora_path):
    lora = ck.read_lora(ck.load_checkpoint(lora_path)) if lora_path is not None else None
    state = ck.load_checkpoint(path)
    if key is not None and isinstance(state, dict) and key not in state:  # the widget's words, not the tool's --key
        entries = ", ".join(repr(k) for k in list(state)[:10])
        raise ck.ConversionError(
            f"weights {key!r}: the checkpoint has no such entry (it has {entries}); set weights to auto"
        )
    used, _ = ck.select_state_dict(state, key, lora=lora is not None)
    sd = ck.convert(
        state,
        key=used,
        dtype=CONVERT_DTYPE,
        max_output_bytes=ck.OUTPUT_FACTOR * path.stat().st_size + ck.OUTPUT_SLACK,
        lora=lora,
    )
    del state
    info = ck.check_wan_t2v(sd)
    metadata = ck.conversion_metadata(path.name, used, CONVERT_DTYPE)
    if lora is not None:
        metadata.update(ck.lora_metadata(Path(lora_path), lora, None))
    merged = f", LoRA {Path(lora_path).name} merged ({len(lora.pairs)} modules)" if lora is not None else ""
    return sd, metadata, f"{info}, {used or 'bare state dict'} in {CONVERT_DTYPE}{merged}"


def load_ar_checkpoint(
    path: str | Path,
    weights: str = "auto",
    weight_dtype: str = "default",
    lora_path: str | Path | None = None,
    causal: bool = False,
    disable_dynamic: bool = False,
):
    """``(ModelPatcher, what)``: the published checkpoint at ``path`` converted in memory
    (:func:`converted_state_dict`) and loaded by ``comfy.sd.load_diffusion_model_state_dict`` with UNETLoader's
    ``model_options`` for ``weight_dtype``. ``causal`` asks for core's WAN21_CausalAR (v0.27+); on a ComfyUI without
    it, a ConversionError that says so and what to do."""
    import comfy.sd

    options = model_options(weight_dtype)
    with_metadata = takes_metadata()
    if causal and not with_metadata:
        raise ck.ConversionError(
            f"{Path(path).name}: causal needs {CAUSAL_COMFYUI} ({comfyui_version()} has no causal AR model class: its "
            "load_diffusion_model_state_dict takes no metadata). Set causal to false (the pack's Chunked AR "
            "samplers run the plain Wan 2.1 model) or update ComfyUI for core's SamplerARVideo"
        )
    sd, metadata, what = converted_state_dict(path, weights, lora_path, causal)
    kwargs = {"model_options": options}
    params = inspect.signature(comfy.sd.load_diffusion_model_state_dict).parameters
    if with_metadata:
        kwargs["metadata"] = metadata
    if disable_dynamic and "disable_dynamic" in params:
        kwargs["disable_dynamic"] = True
    model = comfy.sd.load_diffusion_model_state_dict(sd, **kwargs)
    if model is None:
        raise ck.ConversionError(
            f"{Path(path).name}: ComfyUI's model detection recognises no model in the converted weights; it would not "
            "load as Wan 2.1 T2V"
        )
    if hasattr(model, "cached_patcher_init"):  # 0.33: how ComfyUI reloads a model for another device
        model.cached_patcher_init = (
            _reload,
            (str(path), weights, weight_dtype, None if lora_path is None else str(lora_path), causal),
        )
    kind = type(model.model).__name__
    logger.info("jensen_kv: %s loaded as %s: %s", Path(path).name, kind, what)
    return model, f"{Path(path).name}: {kind}, {what}"


def _reload(path, weights, weight_dtype, lora_path, causal, disable_dynamic=False):
    return load_ar_checkpoint(path, weights, weight_dtype, lora_path, causal, disable_dynamic)[0]


__all__ = ["WEIGHTS", "WEIGHT_DTYPES", "converted_state_dict", "load_ar_checkpoint", "model_options", "takes_metadata"]
