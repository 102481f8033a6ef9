"""Convert a Self-Forcing / CausVid training checkpoint (``.pt``) to a safetensors file UNETLoader loads as Wan 2.1 T2V.

    python tools/convert_checkpoint.py self_forcing_dmd.pt ComfyUI/models/diffusion_models/self_forcing_dmd.safetensors
    python tools/convert_checkpoint.py model.pt causvid.safetensors --key generator --dtype fp16
    python tools/convert_checkpoint.py self_forcing_dmd.pt self_forcing_causal.safetensors --causal
    python tools/convert_checkpoint.py models/tiny_ar/jensen-kv-tiny-ar.safetensors tiny-causal.safetensors --causal

Self-Forcing saves ``{"generator": ..., "generator_ema": ..., "critic": ...}`` and CausVid
``{"generator": ...}``: Wan 2.1 state dicts in fp32 whose keys carry the training wrappers'
prefixes (``model.blocks.0...``, ``model._fsdp_wrapped_module.blocks.0...``). ComfyUI's UNETLoader
lists ``.pt`` files but finds no model in that nesting. This tool:

1. loads the file with ``torch.load(..., map_location="cpu", weights_only=True)``: tensors and plain
   containers only, a pickle that holds anything else is refused, never executed (``mmap`` when the
   file allows it, so a 17 GB checkpoint is not read whole);
2. takes the sub-dict: ``--key``, else ``generator_ema`` (the EMA weights Self-Forcing samples with),
   else ``generator``, else the file itself when it is a bare state dict;
3. strips the wrappers' path components: leading ``model.`` / ``module.`` / ``diffusion_model.``,
   and ``_fsdp_wrapped_module.`` / ``_checkpoint_wrapped_module.`` / ``_orig_mod.`` anywhere;
4. makes every tensor contiguous and casts floating tensors to ``--dtype`` (default bf16);
5. checks that the result is a Wan 2.1 text-to-video model (the keys ComfyUI's detection reads:
   ``head.modulation``, ``patch_embedding.weight`` with 16 input channels,
   ``blocks.0.self_attn.q.weight``, no image-embedding ``img_emb.`` keys) and, where ComfyUI is
   importable (``--comfyui PATH``, ``COMFYUI_PATH``, already on ``sys.path``, or a folder above this
   pack), runs ComfyUI's own ``model_detection.model_config_from_unet`` on it and requires WAN21 T2V;
6. only then writes OUT atomically (a temporary file in OUT's folder, renamed at the end): a failed
   run leaves no half-written file.

``--causal`` adds the safetensors metadata ``config`` = ``{"transformer": {"causal_ar": true}}`` (JSON,
merged into any ``config`` already there). ComfyUI v0.27 and later read it in ``model_detection`` and
load the file as ``WAN21_CausalAR`` (``CausalWanModel``, the model of core's own AR video sampler,
``SamplerARVideo``; default sampling shift 5 instead of Wan's 8); ComfyUI versions without that path
(v0.3.64) ignore it and load plain ``WAN21``. The weights are the same either way, and the pack's
Chunked AR sampler runs both.

A ``.safetensors`` INPUT (a file already in ComfyUI's layout, e.g. the pack's tiny model) is copied
instead of converted: its tensor bytes unchanged, its metadata kept, ``config`` merged as above
(``--causal`` is required then, ``--key`` and ``--dtype`` do not apply; the input file is never
modified). The same key check and ComfyUI detection run on it first.

``convert()`` is the pure part (no ComfyUI needed); ``main(argv)`` is the command line.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import pickle
import re
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: sub-dicts tried in this order when --key is not given
AUTO_KEYS = ("generator_ema", "generator")
#: wrapper path components dropped at the start of a key
LEADING_WRAPPERS = ("model", "module", "diffusion_model")
#: wrapper path components dropped wherever they occur (FSDP, activation checkpointing, torch.compile)
ANYWHERE_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")
#: key prefixes of Wan variants that are not plain text-to-video (image embedding, VACE, control, reference)
NON_T2V_PREFIXES = ("img_emb.", "vace_blocks.", "vace_patch_embedding.", "control_adapter.", "ref_conv.")
WAN_LATENT_CHANNELS = 16
#: what ComfyUI (v0.27+) reads from the safetensors metadata ``config`` to load a Wan as WAN21_CausalAR
CAUSAL_AR = {"transformer": {"causal_ar": True}}
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
#: safetensors dtype names -> torch (for the meta tensors the checks read from a header)
_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class ConversionError(ValueError):
    """The input is not a checkpoint this tool can turn into a Wan 2.1 T2V file (the message says why)."""


@dataclass(frozen=True)
class WanInfo:
    dim: int
    layers: int
    ffn_dim: int
    in_channels: int

    def __str__(self) -> str:
        return f"Wan 2.1 T2V, dim {self.dim}, {self.layers} blocks, ffn {self.ffn_dim}"


# ----------------------------------------------------------------------------- loading and picking
def load_checkpoint(path: str | os.PathLike):
    """``torch.load`` with ``weights_only=True`` (and mmap where the file format allows it)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path} does not exist or is not a file")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except pickle.UnpicklingError as e:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        if "Weights only load failed" not in text:
            raise ConversionError(f"could not read {path} as a torch checkpoint ({text.strip()[:200]})") from None
        why = re.search(r"WeightsUnpickler error: ([^\n]*?)(?: Please use|$)", text, re.MULTILINE)
        raise ConversionError(
            f"{path} holds Python objects other than tensors and plain containers, so it was not loaded: unpickling "
            f"them could run arbitrary code ({why.group(1).strip() if why else 'weights_only refused it'}). "
            "Self-Forcing and CausVid checkpoints hold only tensors; get the file from its official source"
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as e:
        raise ConversionError(f"could not read {path} as a torch checkpoint ({type(e).__name__}: "
                              f"{str(e).strip()[:200]})") from None


def _describe(value) -> str:
    if isinstance(value, dict):
        n = sum(isinstance(v, torch.Tensor) for v in value.values())
        return f"dict of {len(value)} entries, {n} tensors"
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)}"
    return type(value).__name__


def _listing(obj: dict, limit: int = 20) -> str:
    items = [f"{k!r} ({_describe(v)})" for k, v in list(obj.items())[:limit]]
    more = f", ... {len(obj) - limit} more" if len(obj) > limit else ""
    return ", ".join(items) + more


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())


def select_state_dict(state, key: str | None = None) -> tuple[str | None, dict[str, torch.Tensor]]:
    """(the key used or None for a bare state dict, the state dict) of a loaded checkpoint."""
    if not isinstance(state, dict):
        raise ConversionError(f"the checkpoint holds a {type(state).__name__}, not a dict of weights")
    if key is not None:
        if key not in state:
            raise ConversionError(f"--key {key!r} is not in the checkpoint; it has: {_listing(state)}")
        if not _is_state_dict(state[key]):
            raise ConversionError(f"--key {key!r} is not a state dict of tensors ({_describe(state[key])}); "
                                  f"the checkpoint has: {_listing(state)}")
        return key, state[key]
    for k in AUTO_KEYS:
        if k in state and _is_state_dict(state[k]):
            return k, state[k]
    if _is_state_dict(state):
        return None, state
    raise ConversionError(
        "unknown checkpoint structure: expected a 'generator_ema' (Self-Forcing) or 'generator' (CausVid) entry "
        f"holding a state dict, or a bare state dict of tensors; found top-level keys: {_listing(state)}. "
        "Name the entry that holds the Wan weights with --key"
    )


def strip_wrappers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys without training-wrapper path components (``model._fsdp_wrapped_module.blocks.0.x`` -> ``blocks.0.x``)."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, value in sd.items():
        parts = [p for p in key.split(".") if p not in ANYWHERE_WRAPPERS]
        while len(parts) > 1 and parts[0] in LEADING_WRAPPERS:
            parts = parts[1:]
        new = ".".join(parts)
        if new in out:
            raise ConversionError(f"{origin[new]!r} and {key!r} both become {new!r} once the wrapper prefixes are "
                                  "stripped; this is not one model's state dict")
        out[new], origin[new] = value, key
    return out


def check_wan_t2v(sd: dict[str, torch.Tensor]) -> WanInfo:
    """The key check ComfyUI's detection relies on; raises :class:`ConversionError` naming what is wrong."""
    sample = ", ".join(sorted(sd)[:6])
    missing = [k for k in ("head.modulation", "patch_embedding.weight", "blocks.0.self_attn.q.weight") if k not in sd]
    if missing:
        raise ConversionError(f"not a Wan 2.1 diffusion model: {', '.join(missing)} missing (keys start: {sample} ...)")
    foreign = sorted({p for k in sd for p in NON_T2V_PREFIXES if k.startswith(p)})
    if foreign:
        raise ConversionError(f"a Wan variant that is not text-to-video (it has {', '.join(foreign)} keys: image-to-"
                              "video, VACE, control or reference input); the Chunked AR sampler supports Wan 2.1 T2V")
    patch = sd["patch_embedding.weight"]
    if patch.ndim != 5 or patch.shape[1] != WAN_LATENT_CHANNELS:
        raise ConversionError(f"patch_embedding.weight has shape {tuple(patch.shape)}: {patch.shape[1]} input channels "
                              f"where Wan 2.1 T2V has {WAN_LATENT_CHANNELS} (an image-to-video, control or Fun variant)")
    layers = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    ffn = sd.get("blocks.0.ffn.0.weight")
    return WanInfo(dim=int(sd["head.modulation"].shape[-1]), layers=layers,
                   ffn_dim=int(ffn.shape[0]) if ffn is not None else 0, in_channels=int(patch.shape[1]))


def convert(state, key: str | None = None, dtype: str | torch.dtype = "bf16") -> dict[str, torch.Tensor]:
    """A loaded checkpoint -> a Wan 2.1 T2V state dict with ComfyUI's key names, contiguous, cast to ``dtype``.

    Pure torch (no ComfyUI); raises :class:`ConversionError` for anything it cannot convert.
    """
    target = DTYPES[dtype] if isinstance(dtype, str) else dtype
    if target not in DTYPES.values():
        raise ConversionError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    _, sd = select_state_dict(state, key)
    sd = strip_wrappers(sd)
    check_wan_t2v(sd)
    return {k: (v.to(target) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}


# ----------------------------------------------------------------------------- the causal AR flag
def with_causal_config(metadata: dict[str, str] | None) -> dict[str, str]:
    """``metadata`` (safetensors: str -> str) with ``config`` = its JSON plus ``{"transformer": {"causal_ar": true}}``.

    Other keys of ``config`` (e.g. ``vae``) and of its ``transformer`` object are kept; ComfyUI reads it
    with ``json.loads(metadata["config"]).get("transformer", {})`` and merges that into the model config.
    """
    out = dict(metadata or {})
    config: dict = {}
    if out.get("config"):
        try:
            config = json.loads(out["config"])
        except ValueError as e:
            raise ConversionError(f"the metadata 'config' is not valid JSON ({e}); ComfyUI could not read it either") \
                from None
        if not isinstance(config, dict) or not isinstance(config.get("transformer", {}), dict):
            raise ConversionError(f"the metadata 'config' is {out['config'][:200]!r}: not a JSON object with an object "
                                  "'transformer', which is what ComfyUI reads")
    config = {**config, "transformer": {**config.get("transformer", {}), **CAUSAL_AR["transformer"]}}
    out["config"] = json.dumps(config, sort_keys=True)
    return out


def is_causal(metadata: dict[str, str] | None) -> bool:
    """Whether ComfyUI v0.27+ would read ``causal_ar: true`` from this metadata (as its model_detection does)."""
    try:
        transformer = json.loads((metadata or {}).get("config") or "{}").get("transformer", {})
    except (ValueError, AttributeError):
        return False
    return isinstance(transformer, dict) and transformer.get("causal_ar") is True


# ----------------------------------------------------------------------------- safetensors input (copy + flag)
def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(the JSON header, the byte offset where the tensor data starts) of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path} does not exist or is not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if n < 2 or 8 + n > size or n > 100 * 2**20:
            raise ConversionError(f"{path} is not a safetensors file (header length {n}, file size {size})")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ConversionError(f"{path} is not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path} is not a safetensors file (its header is no JSON object)")
    return header, 8 + n


def meta_state_dict(header: dict) -> dict[str, torch.Tensor]:
    """Shape-only (``device="meta"``) tensors for a header's entries: what the key check and detection read."""
    sd = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ConversionError(f"{name}: safetensors dtype {info.get('dtype')!r} is not one this tool knows")
        sd[name] = torch.empty(info["shape"], dtype=dtype, device="meta")
    return sd


def _write_atomic(out: Path, write) -> None:
    """``write(tmp_path)`` to a temporary file next to ``out``, fsynced and renamed onto it once complete."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_safetensors_with_metadata(src: Path, out: Path, metadata: dict[str, str]) -> None:
    """``src`` to ``out`` (atomically) with ``metadata`` as its ``__metadata__``; tensor bytes copied unchanged.

    Only the JSON header is rewritten (padded with spaces to 8 bytes, as the safetensors library
    does); the data offsets are relative to the end of the header, so they stay valid.
    """
    header, data_start = read_safetensors_header(src)
    header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()},
              **{k: v for k, v in header.items() if k != "__metadata__"}}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)

    def write(tmp):
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            fout.write(struct.pack("<Q", len(blob)))
            fout.write(blob)
            fin.seek(data_start)
            shutil.copyfileobj(fin, fout, 16 * 2**20)

    _write_atomic(out, write)


# ----------------------------------------------------------------------------- ComfyUI's own detection
def _is_comfyui(p: Path) -> bool:
    return (p / "comfy" / "model_detection.py").is_file() and (p / "main.py").is_file()


def find_comfyui(explicit: str | None = None) -> Path | None:
    """--comfyui, COMFYUI_PATH, a ComfyUI already importable, or a folder above this pack (custom_nodes layout)."""
    for c in (explicit, os.environ.get("COMFYUI_PATH")):
        if c and _is_comfyui(Path(c)):
            return Path(c).resolve()
    if explicit:
        raise ConversionError(f"--comfyui {explicit}: no ComfyUI checkout there (comfy/model_detection.py, main.py)")
    spec = importlib.util.find_spec("comfy")
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0]).parent
        if _is_comfyui(root):
            return root
    for parent in Path(__file__).resolve().parents:
        if _is_comfyui(parent):
            return parent
    return None


def comfyui_detect(sd: dict[str, torch.Tensor], comfy_dir: Path, metadata: dict[str, str] | None = None) -> str:
    """Run ComfyUI's ``model_config_from_unet`` on ``sd`` (with the file's ``metadata``, as UNETLoader reads it
    where ComfyUI takes metadata); the model class it finds, or ConversionError."""
    if str(comfy_dir) not in sys.path:
        sys.path.insert(0, str(comfy_dir))
    if "comfy.model_management" not in sys.modules:
        import comfy.cli_args

        if not torch.cuda.is_available():
            comfy.cli_args.args.cpu = True  # model_management refuses to import on a CPU-only torch otherwise
    import comfy.model_detection

    meta = {}
    if metadata is not None and "metadata" in inspect.signature(comfy.model_detection.model_config_from_unet).parameters:
        meta = {"metadata": metadata}
    unet = comfy.model_detection.detect_unet_config(sd, "", **meta) or {}
    config = comfy.model_detection.model_config_from_unet(dict(sd), "", **meta)
    what = f"image_model {unet.get('image_model')!r}, model_type {unet.get('model_type')!r}"
    if config is None:
        raise ConversionError(f"ComfyUI's model detection recognises no model in the converted weights ({what}); "
                              "it would not load as Wan 2.1 T2V")
    unet = getattr(config, "unet_config", unet)
    found = f"{type(config).__name__} (image_model {unet.get('image_model')!r}, model_type {unet.get('model_type')!r})"
    if unet.get("image_model") != "wan2.1" or unet.get("model_type") != "t2v":
        raise ConversionError(f"ComfyUI detects the converted weights as {found}, not Wan 2.1 T2V")
    return found


# ----------------------------------------------------------------------------- writing
def save_atomic(sd: dict[str, torch.Tensor], out: Path, metadata: dict[str, str]) -> None:
    """safetensors to a temporary file next to ``out``, renamed onto it once complete."""
    from safetensors.torch import save_file

    _write_atomic(out, lambda tmp: save_file(sd, tmp, metadata=metadata))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert a Self-Forcing / CausVid .pt checkpoint to a Wan 2.1 T2V safetensors file for UNETLoader "
                    "(--causal: flagged for ComfyUI's causal AR model class; a .safetensors input is copied with the "
                    "flag added).")
    p.add_argument("input", help="the .pt checkpoint (loaded with weights_only=True), or a .safetensors Wan 2.1 T2V "
                                 "file to copy with --causal (left unchanged)")
    p.add_argument("output", help="the .safetensors file to write (e.g. ComfyUI/models/diffusion_models/x.safetensors)")
    p.add_argument("--key", help="the entry holding the weights (default: generator_ema, then generator, then the "
                                 "file itself when it is a bare state dict); .pt input only")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="dtype of the written weights (default bf16); .pt input only (a .safetensors input keeps its "
                        "tensors as they are)")
    p.add_argument("--causal", action="store_true",
                   help='write the metadata config = {"transformer": {"causal_ar": true}} (merged into an existing '
                        "config): ComfyUI v0.27+ then loads the file as WAN21_CausalAR (CausalWanModel, for its "
                        "SamplerARVideo; default shift 5), older ComfyUI as plain WAN21. The pack's Chunked AR "
                        "sampler runs either. Required for a .safetensors input")
    p.add_argument("--comfyui", metavar="PATH", help="a ComfyUI checkout whose model detection checks the result "
                                                     "(default: COMFYUI_PATH, an importable ComfyUI, or a folder above "
                                                     "this pack; without one only the key check runs)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    return p


def _detection(sd, args, metadata) -> str:
    comfy_dir = find_comfyui(args.comfyui)
    if comfy_dir is None:
        return "skipped (no ComfyUI found: pass --comfyui PATH or set COMFYUI_PATH); the key check passed"
    found = comfyui_detect(sd, comfy_dir, metadata)
    if args.causal and not found.startswith("WAN21_CausalAR"):
        found += ("; this ComfyUI has no causal AR model class for the flag (ComfyUI v0.27+ loads the file as "
                  "WAN21_CausalAR)")
    return f"{found} [{comfy_dir}]"


def _copy_safetensors(args, src: Path, out: Path) -> int:
    if not args.causal:
        raise ConversionError(f"{src} is already a safetensors file: pass --causal to copy it with the causal AR "
                              "flag (there is nothing to convert otherwise)")
    if args.key is not None or args.dtype is not None:
        raise ConversionError("--key and --dtype apply to .pt checkpoints; a .safetensors input is copied as it is")
    header, _ = read_safetensors_header(src)
    sd = meta_state_dict(header)
    info = check_wan_t2v(sd)
    metadata = with_causal_config(header.get("__metadata__"))
    detection = _detection(sd, args, metadata)
    copy_safetensors_with_metadata(src, out, metadata)
    print(f"wrote {out}: {len(sd)} tensors copied unchanged from {src.name}, metadata config {metadata['config']}")
    print(f"model: {info}")
    print(f"ComfyUI detection: {detection}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    src, out = Path(args.input), Path(args.output)
    try:
        if out.suffix.lower() not in SAFETENSORS_SUFFIXES:
            raise ConversionError(f"{out}: the output must be a .safetensors file")
        if out.exists() and out.resolve() == src.resolve():
            raise ConversionError("the output would replace the input")
        if out.exists() and not args.overwrite:
            raise ConversionError(f"{out} exists; pass --overwrite to replace it")
        if src.suffix.lower() in SAFETENSORS_SUFFIXES:
            return _copy_safetensors(args, src, out)
        dtype = args.dtype or "bf16"
        state = load_checkpoint(src)
        used, _ = select_state_dict(state, args.key)
        sd = convert(state, key=used, dtype=dtype)
        info = check_wan_t2v(sd)
        del state
        metadata = {"format": "pt", "converted_from": src.name, "source_key": used or "(bare state dict)",
                    "dtype": dtype, "converted_by": "comfyui-jensen-kv tools/convert_checkpoint.py"}
        if args.causal:
            metadata = with_causal_config(metadata)
        detection = _detection(sd, args, metadata)
        save_atomic(sd, out, metadata)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(v.numel() * v.element_size() for v in sd.values())
    shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    print(f"wrote {out}: {len(sd)} tensors, {shown} {dtype}, from "
          f"{repr(used) if used else 'a bare state dict'} of {src.name}"
          f"{', flagged causal_ar (metadata config)' if args.causal else ''}")
    print(f"model: {info}")
    print(f"ComfyUI detection: {detection}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
