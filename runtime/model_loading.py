"""What the families' own checkpoint loaders share (ComfyUI imported lazily): stripping a full checkpoint's prefix,
and building a ModelPatcher from a model config and a state dict whose keys the family has already checked.

A family keeps its own key list, config and error type; this module imports no family.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

from torch import Tensor

#: prefixes a full checkpoint puts before the transformer's keys
PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def strip_prefix(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The transformer's keys of ``sd``: a ``model.diffusion_model.`` (or ``diffusion_model.``) prefix removed."""
    for prefix in PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            return {k[len(prefix) :]: v for k, v in sd.items()}
    return dict(sd)


#: the largest safetensors header read (a header is JSON of names, shapes and offsets: 100 MiB is far above any model's)
MAX_HEADER = 100 * 2**20


class HeaderError(ValueError):
    """A file whose safetensors header cannot be read (not a safetensors file, truncated, not JSON)."""


def read_shapes(path: str | Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """``(shapes, metadata)`` of a safetensors file from its header alone (no tensor is read): every tensor's shape
    by name, with a full checkpoint's prefix stripped (:func:`strip_prefix`), and the header's ``__metadata__``.
    A diffusers folder (:func:`folder_files`): every file's shapes, the metadata its ``config.json``'s scalar fields.
    HeaderError naming the file and what is wrong with it."""
    path = Path(path)
    if path.is_dir():
        shapes: dict[str, tuple[int, ...]] = {}
        for f in folder_files(path):
            shapes.update(read_shapes(f)[0])
        return shapes, {k: str(v) for k, v in folder_config(path).items() if isinstance(v, (int, float, str))}
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            text = f.read(n) if 2 <= n <= min(MAX_HEADER, size - 8) else None
    except OSError as e:
        raise HeaderError(f"{path.name} cannot be read ({type(e).__name__}: {e})") from None
    if text is None:
        raise HeaderError(f"{path.name} is not a safetensors file (header length {n}, file size {size})")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HeaderError(f"{path.name} is not a safetensors file (its header: {e})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name} is not a safetensors file (its header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    try:
        shapes = {str(k): tuple(int(x) for x in v["shape"]) for k, v in header.items()}
    except (TypeError, KeyError, ValueError):
        raise HeaderError(f"{path.name} is not a safetensors file (an entry without a shape)") from None
    return strip_prefix(shapes), {str(k): str(v) for k, v in meta.items()}


class Shaped(NamedTuple):
    """A tensor's shape where a reader of a state dict asks ``sd[name].shape`` (a header has no tensors)."""

    shape: tuple[int, ...]


def shaped(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Shaped]:
    """``shapes`` as a state dict of :class:`Shaped` entries, for the families' readers of a state dict's shapes."""
    return {k: Shaped(tuple(v)) for k, v in shapes.items()}


def count_blocks(shapes: Mapping[str, object], pattern: str) -> int:
    """How many consecutive blocks ``pattern.format(i)`` names are in ``shapes``, from 0."""
    n = 0
    while pattern.format(n) in shapes:
        n += 1
    return n


def check_weight_dtype(weight_dtype: str, weight_dtypes: Mapping) -> None:
    if weight_dtype not in weight_dtypes:
        raise ValueError(f"weight_dtype {weight_dtype!r} is not one of {', '.join(weight_dtypes)}")


def load_strict(
    config,
    sd: Mapping[str, Tensor],
    dtype,
    load_device,
    offload_device,
    mismatch: Callable[[list, list], Exception],
):
    """``(model, load_device, offload_device)``: ComfyUI's model of ``config`` (a ``supported_models`` config) with
    every parameter from ``sd``. ``dtype`` None is what ComfyUI picks for the device; the devices None are
    ComfyUI's. A key the model and ``sd`` disagree on raises ``mismatch(missing, unexpected)``."""
    import comfy.model_management as mm
    import comfy.utils

    load_device = mm.get_torch_device() if load_device is None else load_device
    offload_device = mm.unet_offload_device() if offload_device is None else offload_device
    supported = list(config.supported_inference_dtypes)
    if dtype is None:
        dtype = mm.unet_dtype(
            model_params=comfy.utils.calculate_parameters(sd),
            supported_dtypes=supported,
            weight_dtype=comfy.utils.weight_dtype(sd),
        )
    config.set_inference_dtype(dtype, mm.unet_manual_cast(dtype, load_device, supported))
    model = config.get_model(sd, "")
    dm = model.diffusion_model
    dm.requires_grad_(False).eval()  # v0.27's BaseModel leaves this to the sampler's no_grad; v0.33 does it itself
    missing, unexpected = dm.load_state_dict(sd, strict=False)
    if missing or unexpected:  # the key list and the model disagree: a bug of the pack, said plainly
        raise mismatch(missing, unexpected)
    return model, load_device, offload_device


def model_patcher(model, load_device, offload_device):
    import comfy.model_patcher

    return comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)


__all__ = ["PREFIXES", "check_weight_dtype", "load_strict", "model_patcher", "strip_prefix"]


# ------------------------------------------------------------------------------------------ diffusers folders
#: a diffusers model folder as its authors publish it: ``config.json`` and the weights, one file or an index and shards
FOLDER_CONFIG = "config.json"
FOLDER_WEIGHTS = "diffusion_pytorch_model.safetensors"
FOLDER_INDEX = FOLDER_WEIGHTS + ".index.json"
#: how deep below a model folder a diffusers folder is looked for (<repo>/transformers/)
FOLDER_DEPTH = 4
MAX_FOLDERS = 200


def is_model_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / FOLDER_CONFIG).is_file() and (
        (folder / FOLDER_INDEX).is_file() or (folder / FOLDER_WEIGHTS).is_file()
    )


def folder_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a diffusers folder: the shards its index names (each a file name inside the folder,
    each there) or its one weights file. HeaderError naming what is missing or wrong."""
    folder = Path(folder)
    index = folder / FOLDER_INDEX
    if not index.is_file():
        if (folder / FOLDER_WEIGHTS).is_file():
            return [folder / FOLDER_WEIGHTS]
        raise HeaderError(f"{folder.name}/ holds neither {FOLDER_INDEX} nor {FOLDER_WEIGHTS}: not a diffusers folder")
    try:
        wmap = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise HeaderError(f"{index.name} cannot be read as a safetensors index ({e})") from None
    if not isinstance(wmap, dict) or not wmap:
        raise HeaderError(f"{index.name} has no weight_map (each tensor's shard)")
    shards = sorted({str(v) for v in wmap.values()})
    bad = [s for s in shards if Path(s).name != s or not s.endswith(".safetensors")]
    if bad:
        raise HeaderError(f"{index.name} names {bad[0][:120]!r}: not a .safetensors file inside the folder")
    absent = [s for s in shards if not (folder / s).is_file()]
    if absent:
        raise HeaderError(
            f"{folder.name}/ lacks {len(absent)} of its {len(shards)} shards ({', '.join(absent[:3])}): download the "
            "whole folder again"
        )
    return [folder / s for s in shards]


def folder_config(folder: str | Path) -> dict:
    """The folder's ``config.json`` (a JSON object), HeaderError where it is not one."""
    path = Path(folder) / FOLDER_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise HeaderError(f"{Path(folder).name}/{FOLDER_CONFIG} cannot be read ({e})") from None
    if not isinstance(config, dict):
        raise HeaderError(f"{Path(folder).name}/{FOLDER_CONFIG} is not a JSON object")
    return config


def folder_tensor_names(folder: str | Path) -> set[str]:
    """The tensor names of a diffusers folder, read cheaply (its index's weight_map, or its one file's header)."""
    folder = Path(folder)
    index = folder / FOLDER_INDEX
    if index.is_file():
        try:
            wmap = json.loads(index.read_text()).get("weight_map")
        except (OSError, ValueError, AttributeError):
            return set()
        return {str(k) for k in wmap} if isinstance(wmap, dict) else set()
    try:
        return set(read_shapes(folder / FOLDER_WEIGHTS)[0])
    except HeaderError:
        return set()


def load_folder(folder: str | Path) -> dict[str, Tensor]:
    """Every tensor of a diffusers folder's files (a tensor in two files refused)."""
    from safetensors.torch import load_file

    sd: dict[str, Tensor] = {}
    for f in folder_files(folder):
        part = load_file(str(f))
        twice = sorted(set(part) & set(sd))
        if twice:
            raise HeaderError(f"{twice[0]!r} is in two of {Path(folder).name}/'s shards")
        sd.update(part)
    return sd


def model_folders(bases, accept: Callable[[Path], bool]) -> list[str]:
    """The diffusers folders (:func:`is_model_folder`) under ``bases`` that ``accept`` takes, as names relative to
    their base ending in ``/`` (what a loader's list shows; ComfyUI's lists show each shard as a file)."""
    found: set[str] = set()
    for base in bases:
        base = Path(base).resolve()
        if not base.is_dir():
            continue
        stack = [(base, 0)]
        while stack and len(found) < MAX_FOLDERS:
            folder, depth = stack.pop()
            try:
                subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
            except OSError:
                continue
            if folder != base and is_model_folder(folder):
                try:
                    if accept(folder):
                        found.add(folder.relative_to(base).as_posix() + "/")
                except (OSError, ValueError):
                    pass
                continue
            if depth < FOLDER_DEPTH:
                stack.extend((p, depth + 1) for p in subfolders)
    return sorted(found)


def folder_version(folder: str | Path) -> str:
    """Names, sizes and modification times of a folder's files (a loader's fingerprint)."""
    parts = []
    for p in sorted(Path(folder).iterdir()):
        try:
            st = p.stat()
        except OSError:
            continue
        parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)
