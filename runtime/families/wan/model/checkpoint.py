"""Reading Wan 2.1 T2V training checkpoints as their authors publish them: pure torch, no ComfyUI.

Self-Forcing saves ``{"generator": ..., "generator_ema": ..., "critic": ...}``, CausVid ``{"generator": ...}``,
LongLive a base plus a PEFT LoRA (``lora.pt``), Causal Forcing the Self-Forcing layout: Wan 2.1 state dicts in fp32
whose keys carry the training wrappers' prefixes (``model.blocks.0...``, ``model._fsdp_wrapped_module.blocks.0...``).
Krea Realtime 14B is one safetensors file with a ``model.`` in front of every key.

This module holds the checks and the in-memory conversion both users share: ``tools/convert_checkpoint.py`` (the
command line that writes a safetensors file once) and Load AR Video Checkpoint (``nodes/wan.py``, which converts
at load time). :func:`load_checkpoint` (zip checks, then ``torch.load(weights_only=True)``, mmap where it can),
:func:`select_state_dict`, :func:`strip_wrappers`, :func:`check_storage`, :func:`check_wan_t2v`,
:func:`read_lora` / :func:`merge_lora`, :func:`convert` and :func:`with_causal_config`; every refusal is a
:class:`ConversionError` naming what is wrong. It imports nothing of the pack (it imports on its own, as
``runtime.families.wan.model.checkpoint`` with the pack root on ``sys.path``, as the tool imports it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: sub-dicts tried in this order when --key is not given
AUTO_KEYS = ("generator_ema", "generator")
#: the entry a LoRA is merged into when --key is not given (LongLive: ``longlive_base.pt``'s ``generator``)
LORA_BASE_KEY = "generator"
#: wrapper path components dropped at the start of a key
LEADING_WRAPPERS = ("model", "module", "diffusion_model")
#: wrapper path components dropped wherever they occur (FSDP, activation checkpointing, torch.compile)
ANYWHERE_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")
#: the top-level modules of a Wan diffusion model (what a key starts with once the wrappers are gone)
WAN_ROOTS = (
    "patch_embedding",
    "text_embedding",
    "time_embedding",
    "time_projection",
    "blocks",
    "head",
    "img_emb",
    "vace_blocks",
    "vace_patch_embedding",
    "ref_conv",
    "control_adapter",
)
#: key prefixes of Wan variants that are not plain text-to-video (image embedding, VACE, control, reference)
NON_T2V_PREFIXES = ("img_emb.", "vace_blocks.", "vace_patch_embedding.", "control_adapter.", "ref_conv.")
WAN_LATENT_CHANNELS = 16
#: what ComfyUI's Wan detection assumes (patch_size (1, 2, 2), freq_dim 256, the default text_dim 4096, out_dim 16)
WAN_PATCH = (1, 2, 2)
WAN_FREQ_DIM = 256
WAN_TEXT_DIM = 4096
WAN_OUT_DIM = 16
#: the largest Wan 2.1 text-to-video model (14B): no converted model is bigger
WAN_MAX_DIM, WAN_MAX_FFN_DIM, WAN_MAX_LAYERS = 5120, 13824, 40
#: keys no Wan has may add at most this fraction of the model's elements (or 65,536 elements, if more)
EXTRA_FRACTION = 0.01
#: the written file may be at most this many times the input file, plus 1 MiB (a half-precision checkpoint
#: written as fp32 is 2x)
OUTPUT_FACTOR = 2
OUTPUT_SLACK = 1 << 20
#: the largest pickle (``data.pkl``) a checkpoint's zip may hold: a real one is ~200 bytes per tensor
MAX_PICKLE_BYTES = 16 << 20
#: the most members a checkpoint's zip may hold (one per storage)
MAX_ZIP_MEMBERS = 200_000
#: what ComfyUI (v0.27+) reads from the safetensors metadata ``config`` to load a Wan as WAN21_CausalAR
CAUSAL_AR = {"transformer": {"causal_ar": True}}
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
#: the entry of a LongLive training checkpoint that holds the generator's LoRA (else the file is the bare PEFT dict)
LORA_KEY = "generator_lora"
#: safetensors dtype names -> torch (for the meta tensors the checks read from a header)
_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


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
def check_zip_members(path: str | os.PathLike) -> None:
    """Refuse a zip checkpoint whose members ``torch.save`` would not have written, before anything is unpickled.

    ``torch.save`` stores every member uncompressed; ``torch.load`` would still inflate a compressed one, so
    a few hundred KB could unpickle for minutes into gigabytes. Refused: compressed members, members (or all
    of them together) larger than the archive, a pickle over :data:`MAX_PICKLE_BYTES`, more than
    :data:`MAX_ZIP_MEMBERS` members. A file that is no zip (torch's legacy format) is left to ``torch.load``."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as e:
        raise ConversionError(
            f"{path} is a damaged zip ({type(e).__name__}: {str(e)[:200]}); not a torch checkpoint torch.save wrote"
        ) from None
    if len(members) > MAX_ZIP_MEMBERS:
        raise ConversionError(
            f"{path} holds {len(members)} zip members (at most {MAX_ZIP_MEMBERS}: one per tensor "
            "storage); refused before loading"
        )
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED:
            raise ConversionError(
                f"{path}: the member {m.filename!r} is compressed ({m.compress_size} bytes that unpack to "
                f"{m.file_size}); torch.save never compresses, and unpacking it could take minutes and gigabytes: "
                "refused before loading (get the checkpoint from its official source)"
            )
        if m.file_size > size or m.header_offset + m.file_size > size:
            raise ConversionError(
                f"{path}: the member {m.filename!r} claims {m.file_size} bytes, more than the "
                f"{size}-byte file holds; refused before loading"
            )
        if m.filename.endswith(".pkl") and m.file_size > MAX_PICKLE_BYTES:
            raise ConversionError(
                f"{path}: the pickle {m.filename!r} is {m.file_size / 2**20:.1f} MiB (at most "
                f"{MAX_PICKLE_BYTES / 2**20:.0f} MiB: a checkpoint's pickle holds ~200 bytes per tensor, its data "
                "are separate members); refused before loading"
            )
    total = sum(m.file_size for m in members)
    if total > size:
        raise ConversionError(
            f"{path}: its members claim {total} bytes together, more than the {size}-byte file "
            "holds uncompressed; refused before loading"
        )


def load_checkpoint(path: str | os.PathLike):
    """:func:`check_zip_members`, then ``torch.load`` with ``weights_only=True`` (and mmap where the file format
    allows it)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"{path} does not exist or is not a file")
    check_zip_members(path)
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
        raise ConversionError(
            f"could not read {path} as a torch checkpoint ({type(e).__name__}: {str(e).strip()[:200]})"
        ) from None


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
    return (
        isinstance(obj, dict)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def select_state_dict(state, key: str | None = None, lora: bool = False) -> tuple[str | None, dict[str, torch.Tensor]]:
    """(the key used or None for a bare state dict, the state dict) of a loaded checkpoint.

    Without ``key``: ``generator_ema`` (the EMA weights Self-Forcing samples with), else ``generator``. With a LoRA to
    merge (``lora``): ``generator``, the weights LongLive's inference and LoRA training put the LoRA on (its
    checkpoints hold both); a checkpoint with only ``generator_ema`` is refused rather than guessed (``--key``)."""
    if not isinstance(state, dict):
        raise ConversionError(f"the checkpoint holds a {type(state).__name__}, not a dict of weights")
    if key is not None:
        if key not in state:
            raise ConversionError(f"--key {key!r} is not in the checkpoint; it has: {_listing(state)}")
        if not _is_state_dict(state[key]):
            raise ConversionError(
                f"--key {key!r} is not a state dict of tensors ({_describe(state[key])}); "
                f"the checkpoint has: {_listing(state)}"
            )
        return key, state[key]
    if lora:
        if LORA_BASE_KEY in state and _is_state_dict(state[LORA_BASE_KEY]):
            return LORA_BASE_KEY, state[LORA_BASE_KEY]
        if any(k in state for k in AUTO_KEYS):
            raise ConversionError(
                f"--lora merges a LoRA trained on the {LORA_BASE_KEY!r} weights (LongLive's inference and LoRA "
                f"training load {LORA_BASE_KEY!r}), but this checkpoint has no {LORA_BASE_KEY!r} state dict; it has: "
                f"{_listing(state)}. Name the entry to merge it into with --key (e.g. --key generator_ema) if you "
                "mean it"
            )
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


def strip_key(key: str) -> str:
    """``key`` without training-wrapper path components (leading ``model.`` / ``module.`` / ``diffusion_model.``,
    FSDP / checkpointing / compile wrappers anywhere)."""
    parts = [p for p in key.split(".") if p not in ANYWHERE_WRAPPERS]
    while len(parts) > 1 and parts[0] in LEADING_WRAPPERS:
        parts = parts[1:]
    return ".".join(parts)


def strip_wrappers(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys without training-wrapper path components (``model._fsdp_wrapped_module.blocks.0.x`` -> ``blocks.0.x``)."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, value in sd.items():
        new = strip_key(key)
        if new in out:
            raise ConversionError(
                f"{origin[new]!r} and {key!r} both become {new!r} once the wrapper prefixes are "
                "stripped; this is not one model's state dict"
            )
        out[new], origin[new] = value, key
    return out


def key_prefixes(keys) -> dict[str, list[str]]:
    """The path in front of each key's Wan module (``"model."``, ``""`` for none), with the keys under it.

    Keys that name no Wan module at all (buffers, foreign entries) are left out: the key check counts them.
    """
    out: dict[str, list[str]] = {}
    for key in keys:
        parts = key.split(".")
        at = next((i for i, p in enumerate(parts[:-1]) if p in WAN_ROOTS), None)
        if at is not None:
            out.setdefault("".join(p + "." for p in parts[:at]), []).append(key)
    return out


def check_prefixes(keys) -> list[str]:
    """The wrapper prefixes the keys carry (``[""]`` for ComfyUI's own layout); ConversionError listing every
    prefix found when one of them is not made of the known wrappers (:data:`LEADING_WRAPPERS`,
    :data:`ANYWHERE_WRAPPERS`)."""
    found = key_prefixes(keys)
    known = set(LEADING_WRAPPERS) | set(ANYWHERE_WRAPPERS)
    unknown = [p for p in found if any(c not in known for c in p.split(".")[:-1])]
    if unknown:
        listing = "; ".join(
            f"{p or '(none)'!r}: {len(ks)} keys, e.g. {ks[0]}" for p, ks in sorted(found.items(), key=lambda x: x[0])
        )
        raise ConversionError(
            f"unknown key prefix{'es' if len(unknown) > 1 else ''} {', '.join(repr(p) for p in sorted(unknown))} in "
            f"front of the Wan modules. Prefixes found: {listing}. Known wrappers: "
            f"{', '.join(p + '.' for p in (*LEADING_WRAPPERS, *ANYWHERE_WRAPPERS))}; convert the file with the "
            "tool that trained it, or rename its keys"
        )
    return sorted(found)


def _shape(t) -> tuple[int, ...]:
    return tuple(int(x) for x in t.shape)


def wan_t2v_shapes(dim: int, ffn_dim: int, layers: int) -> dict[str, tuple[int, ...]]:
    """Every key of a Wan 2.1 text-to-video model (ComfyUI's names) and its shape."""
    d, patch = dim, WAN_PATCH
    out = WAN_OUT_DIM * patch[0] * patch[1] * patch[2]
    shapes = {
        "patch_embedding.weight": (d, WAN_LATENT_CHANNELS, *patch),
        "patch_embedding.bias": (d,),
        "text_embedding.0.weight": (d, WAN_TEXT_DIM),
        "text_embedding.0.bias": (d,),
        "text_embedding.2.weight": (d, d),
        "text_embedding.2.bias": (d,),
        "time_embedding.0.weight": (d, WAN_FREQ_DIM),
        "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d),
        "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d),
        "time_projection.1.bias": (6 * d,),
        "head.head.weight": (out, d),
        "head.head.bias": (out,),
        "head.modulation": (1, 2, d),
    }
    block = {
        "norm3.weight": (d,),
        "norm3.bias": (d,),
        "ffn.0.weight": (ffn_dim, d),
        "ffn.0.bias": (ffn_dim,),
        "ffn.2.weight": (d, ffn_dim),
        "ffn.2.bias": (d,),
        "modulation": (1, 6, d),
    }
    for attn in ("self_attn", "cross_attn"):
        for p in ("q", "k", "v", "o"):
            block[f"{attn}.{p}.weight"], block[f"{attn}.{p}.bias"] = (d, d), (d,)
        block[f"{attn}.norm_q.weight"] = block[f"{attn}.norm_k.weight"] = (d,)
    for i in range(layers):
        shapes.update({f"blocks.{i}.{k}": v for k, v in block.items()})
    return shapes


def _some(items, n: int = 5) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def check_wan_t2v(sd: dict[str, torch.Tensor]) -> WanInfo:
    """A complete Wan 2.1 T2V of known shapes, or :class:`ConversionError` naming what is wrong.

    The keys ComfyUI's detection reads come first (their messages say which model this is instead); then
    ``dim`` (from ``head.modulation``), ``ffn_dim`` (``blocks.0.ffn.0.weight``) and the block count, each
    at most the largest Wan 2.1 T2V's; then every key of every block, each of its exact shape; keys no Wan
    has may add at most :data:`EXTRA_FRACTION` of the model."""
    sample = ", ".join(sorted(sd)[:6])
    missing = [k for k in ("head.modulation", "patch_embedding.weight", "blocks.0.self_attn.q.weight") if k not in sd]
    if missing:
        raise ConversionError(f"not a Wan 2.1 diffusion model: {', '.join(missing)} missing (keys start: {sample} ...)")
    foreign = sorted({p for k in sd for p in NON_T2V_PREFIXES if k.startswith(p)})
    if foreign:
        raise ConversionError(
            f"a Wan variant that is not text-to-video (it has {', '.join(foreign)} keys: image-to-"
            "video, VACE, control or reference input); the Chunked AR sampler supports Wan 2.1 T2V"
        )
    patch = sd["patch_embedding.weight"]
    if patch.ndim != 5 or patch.shape[1] != WAN_LATENT_CHANNELS:
        in_ch = patch.shape[1] if patch.ndim >= 2 else "no"
        raise ConversionError(
            f"patch_embedding.weight has shape {_shape(patch)}: {in_ch} input channels "
            f"where Wan 2.1 T2V has {WAN_LATENT_CHANNELS} (an image-to-video, control or Fun variant)"
        )
    mod = sd["head.modulation"]
    if mod.ndim != 3 or _shape(mod)[:2] != (1, 2) or mod.shape[2] < 1:
        raise ConversionError(
            f"head.modulation has shape {_shape(mod)} where a Wan 2.1 model has (1, 2, dim); "
            "not a Wan 2.1 diffusion model (or a damaged one)"
        )
    dim = int(mod.shape[2])
    ffn = sd.get("blocks.0.ffn.0.weight")
    ffn_dim = int(ffn.shape[0]) if ffn is not None and ffn.ndim == 2 else 0
    ids = {k.split(".")[1] for k in sd if k.startswith("blocks.") and k.count(".") >= 2}
    bad_ids = sorted(i for i in ids if not (i.isdigit() and i.isascii() and len(i) <= 6))
    if bad_ids:
        raise ConversionError(
            f"block numbers must be integers: found blocks.{bad_ids[0][:20]!r} ...; not one Wan's state dict"
        )
    numbers = {int(i) for i in ids}
    layers = max(numbers) + 1
    for what, value, most in (
        ("dim", dim, WAN_MAX_DIM),
        ("ffn_dim", ffn_dim, WAN_MAX_FFN_DIM),
        ("block count", layers, WAN_MAX_LAYERS),
    ):
        if value > most:
            raise ConversionError(
                f"{what} {value} is larger than any Wan 2.1 T2V's (the largest, 14B, has dim "
                f"{WAN_MAX_DIM}, ffn_dim {WAN_MAX_FFN_DIM}, {WAN_MAX_LAYERS} blocks); refused"
            )
    gaps = sorted(set(range(layers)) - numbers)
    if gaps:
        raise ConversionError(
            f"an incomplete Wan 2.1 T2V: its blocks are numbered up to {layers - 1}, but "
            f"block{'s' if len(gaps) > 1 else ''} {_some(map(str, gaps))} "
            f"{'are' if len(gaps) > 1 else 'is'} missing"
        )
    expected = wan_t2v_shapes(dim, ffn_dim, layers)
    absent = [k for k in expected if k not in sd]
    if absent:
        raise ConversionError(
            f"an incomplete Wan 2.1 T2V (dim {dim}, {layers} blocks): {len(absent)} of its "
            f"{len(expected)} keys are missing: {_some(absent)}"
        )
    wrong = [f"{k} {_shape(sd[k])} (expected {v})" for k, v in expected.items() if _shape(sd[k]) != v]
    if wrong:
        raise ConversionError(
            f"not the shapes of a Wan 2.1 T2V of dim {dim}, ffn_dim {ffn_dim} (head.modulation "
            f"(1, 2, {dim}), blocks.0.ffn.0.weight ({ffn_dim}, {dim})): {_some(wrong, 3)}"
        )
    extra = {k: v for k, v in sd.items() if k not in expected}
    model = sum(math.prod(v) for v in expected.values())
    allowed = max(1 << 16, int(EXTRA_FRACTION * model))
    extra_numel = sum(v.numel() for v in extra.values())
    if extra_numel > allowed:
        biggest = sorted(extra, key=lambda k: -extra[k].numel())
        raise ConversionError(
            f"keys no Wan 2.1 T2V has hold {extra_numel} elements (at most {allowed}: "
            f"{EXTRA_FRACTION:.0%} of this model's {model}): "
            f"{_some(f'{k} {_shape(extra[k])}' for k in biggest)}"
        )
    return WanInfo(dim=dim, layers=layers, ffn_dim=ffn_dim, in_channels=int(patch.shape[1]))


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: a stride of 0, or strides that do not step over the dims
    inside them (taken in stride order); plain, transposed and sliced tensors never do."""
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)
    span = 1
    for st, n in dims:
        if st < span:
            return True
        span = st * n
    return False


def check_storage(sd: dict[str, torch.Tensor]) -> None:
    """Refuse tensors whose storage holds less than their data or whose elements overlap, and storages shared by
    more data than they hold.

    A ``zeros(1).expand(30000, 30000)`` is saved as its 4-byte storage and a view; made contiguous it would
    be 3.6 GB (1.8 GB in bf16). Such views repeat data, so the output could be any multiple of the input:
    refused. Real checkpoints hold each tensor in storage of its own, or as non-overlapping parts of a flat
    buffer (FSDP)."""
    per_storage: dict[tuple[int, int], list[str]] = {}
    used: dict[tuple[int, int], int] = {}
    for name, t in sd.items():
        if t.device.type == "meta" or t.numel() == 0:
            continue
        need = t.numel() * t.element_size()
        storage = t.untyped_storage()
        held = storage.nbytes() - t.storage_offset() * t.element_size()
        if need > held or _overlaps(t):
            raise ConversionError(
                f"{name}: a {_shape(t)} {str(t.dtype).removeprefix('torch.')} tensor (strides {tuple(t.stride())}) "
                f"over a storage of {storage.nbytes()} bytes: a view that repeats its data (e.g. expand), "
                f"{need} bytes once written out; refused (a real checkpoint stores every element)"
            )
        key = (storage.data_ptr(), storage.nbytes())
        per_storage.setdefault(key, []).append(name)
        used[key] = used.get(key, 0) + need
    for key, names in per_storage.items():
        if used[key] > key[1]:
            raise ConversionError(
                f"{_some(names, 4)} share one storage of {key[1]} bytes but hold {used[key]} "
                "bytes between them (the same data under several keys); refused"
            )


def output_bytes(sd: dict[str, torch.Tensor], target: torch.dtype) -> int:
    """Bytes of the tensors once cast to ``target`` (floating ones) and made contiguous."""
    size = torch.empty((), dtype=target).element_size()
    return sum(t.numel() * (size if t.is_floating_point() else t.element_size()) for t in sd.values())


# ----------------------------------------------------------------------------- a PEFT LoRA merged in (LongLive)
@dataclass(frozen=True)
class Lora:
    """A PEFT LoRA read from a checkpoint: for each target weight (the base model's key, wrappers stripped), its
    ``(A, B)`` (``lora_A.weight`` (r, in), ``lora_B.weight`` (out, r))."""

    source_key: str | None
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def ranks(self) -> list[int]:
        """The distinct ranks of its modules (r = ``lora_A.weight.shape[0]``), ascending."""
        return sorted({int(a.shape[0]) for a, _ in self.pairs.values()})


def read_lora(state) -> Lora:
    """The LoRA of a loaded checkpoint: ``generator_lora`` (LongLive's training checkpoints) or the bare PEFT state dict.

    LongLive (NVlabs/LongLive 2462895) wraps ``pipeline.generator.model`` (the ``CausalWanModel``) with
    ``peft.get_peft_model`` (``inference.py`` 107-112, ``utils/lora_utils.py`` 19-69: every ``nn.Linear`` of each
    ``CausalWanAttentionBlock``) and loads ``lora_checkpoint["generator_lora"]`` or the bare dict with
    ``peft.set_peft_model_state_dict`` (``inference.py`` 119-124). PEFT's saved keys are
    ``base_model.model.<module>.lora_A.weight`` / ``.lora_B.weight`` with ``<module>`` a name in that
    model (``blocks.0.self_attn.q``): its weight is ``<module>.weight`` in the base generator once
    :func:`strip_key` has dropped the wrapper prefixes (``model.blocks.0.self_attn.q.weight``).

    Refused, naming them: keys of any other form (DoRA magnitudes, LoRA biases, embeddings), an A without
    its B or a B without its A, tensors that are not 2-D floating, finite, with B's columns = A's rows, and
    (:func:`check_storage`) tensors that repeat their data."""
    if not isinstance(state, dict):
        raise ConversionError(f"the LoRA checkpoint holds a {type(state).__name__}, not a dict of weights")
    if LORA_KEY in state:
        if not _is_state_dict(state[LORA_KEY]):
            raise ConversionError(
                f"the LoRA's {LORA_KEY!r} is not a state dict of tensors ({_describe(state[LORA_KEY])})"
            )
        key, sd = LORA_KEY, state[LORA_KEY]
    elif _is_state_dict(state):
        key, sd = None, state
    else:
        raise ConversionError(
            f"unknown LoRA structure: expected a {LORA_KEY!r} entry (LongLive) or a bare PEFT state dict of tensors; "
            f"found top-level keys: {_listing(state)}"
        )
    check_storage(sd)
    halves: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    foreign = []
    for name, t in sd.items():
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", name)
        if m is None:
            foreign.append(name)
            continue
        half = halves.setdefault(strip_key(f"{m.group(1)}.weight"), {})
        if m.group(2) in half:
            raise ConversionError(
                f"{half[m.group(2)][0]!r} and {name!r} are the same LoRA factor once the wrapper prefixes are "
                "stripped; this is not one model's LoRA"
            )
        half[m.group(2)] = (name, t)
    if foreign:
        raise ConversionError(
            f"{len(foreign)} LoRA key(s) are not PEFT LoRA weights (base_model.model.<module>.lora_A.weight / "
            f".lora_B.weight): {_some(foreign)}; refused (DoRA, LoRA biases and embedding LoRAs are not merged)"
        )
    unpaired = sorted(
        f"{h[next(iter(h))][0]} (no lora_{'B' if 'A' in h else 'A'})" for h in halves.values() if len(h) != 2
    )
    if unpaired:
        raise ConversionError(f"LoRA modules with only one of lora_A / lora_B: {_some(unpaired)}; refused")
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for target, h in halves.items():
        (a_name, a), (b_name, b) = h["A"], h["B"]
        for n, t in ((a_name, a), (b_name, b)):
            if t.ndim != 2 or not t.is_floating_point() or t.numel() == 0:
                raise ConversionError(
                    f"{n}: a {_shape(t)} {str(t.dtype).removeprefix('torch.')} tensor; a LoRA factor is a non-empty "
                    "2-D floating tensor"
                )
        if b.shape[1] != a.shape[0]:
            raise ConversionError(
                f"{a_name} {_shape(a)} and {b_name} {_shape(b)}: A is (r, in) and B (out, r), so B's "
                f"{b.shape[1]} columns should be A's {a.shape[0]} rows"
            )
        for n, t in ((a_name, a), (b_name, b)):
            if not bool(torch.isfinite(t).all()):
                raise ConversionError(f"{n} holds non-finite values (inf or nan); refused")
        pairs[target] = (a, b)
    return Lora(source_key=key, pairs=pairs)


def lora_metadata(path: Path, lora: Lora, alpha: float | None) -> dict[str, str]:
    """What the output's metadata records of a merged LoRA: its file name and SHA-256, entry, modules, rank, alpha."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 * 2**20), b""):
            digest.update(block)
    ranks = ",".join(map(str, lora.ranks))
    return {
        "lora_file": path.name,
        "lora_sha256": digest.hexdigest(),
        "lora_source_key": lora.source_key or "(bare state dict)",
        "lora_modules": str(len(lora.pairs)),
        "lora_rank": ranks,
        "lora_alpha": f"{alpha:g}" if alpha is not None else f"{ranks} (= rank, the default)",
    }


def check_lora_alpha(alpha: float | None) -> None:
    if alpha is not None and (
        isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0
    ):
        raise ConversionError(f"--lora-alpha {alpha!r} must be a finite number above 0 (LongLive's is 256, = rank)")


def merge_lora(sd: dict[str, torch.Tensor], lora: Lora, alpha: float | None = None) -> dict[str, torch.Tensor]:
    """``sd`` with ``W + (alpha / r) · B · A`` in place of each LoRA target weight ``W``, computed in fp32 (the
    result stays fp32; :func:`convert` casts it). ``r`` is each module's ``A.shape[0]``; ``alpha`` defaults to
    ``r`` (a scale of 1, as LongLive's ``adapter`` config has it: rank 256, alpha 256,
    ``configs/longlive_inference.yaml`` 31-33; ``utils/lora_utils.py`` 59-64 passes them to
    ``peft.LoraConfig``, whose scale is ``lora_alpha / r``). LoRA modules with no 2-D weight of
    shape ``(B.shape[0], A.shape[1])`` in ``sd`` are refused, with their names."""
    check_lora_alpha(alpha)
    unmatched = sorted(k.removesuffix(".weight") for k in lora.pairs if k not in sd)
    if unmatched:
        raise ConversionError(
            f"{len(unmatched)} LoRA module(s) match no weight of the base model: {_some(unmatched)} "
            f"(looked for <module>.weight after stripping the wrapper prefixes; the base has e.g. "
            f"{', '.join(sorted(sd)[:3])}); refused"
        )
    wrong = [
        f"{k.removesuffix('.weight')}: B·A is ({b.shape[0]}, {a.shape[1]}), the weight {_shape(sd[k])}"
        for k, (a, b) in lora.pairs.items()
        if sd[k].ndim != 2 or _shape(sd[k]) != (int(b.shape[0]), int(a.shape[1])) or not sd[k].is_floating_point()
    ]
    if wrong:
        raise ConversionError(f"LoRA modules whose B·A is not the shape of their weight: {_some(wrong, 3)}; refused")
    out = dict(sd)
    for k, (a, b) in lora.pairs.items():
        r = int(a.shape[0])
        scale = (float(alpha) if alpha is not None else r) / r
        out[k] = torch.addmm(sd[k].float(), b.float(), a.float(), alpha=scale)
    return out


def convert(
    state,
    key: str | None = None,
    dtype: str | torch.dtype = "bf16",
    max_output_bytes: int | None = None,
    lora: Lora | None = None,
    lora_alpha: float | None = None,
) -> dict[str, torch.Tensor]:
    """A loaded checkpoint -> a Wan 2.1 T2V state dict with ComfyUI's key names, contiguous, cast to ``dtype``.

    Pure torch (no ComfyUI); raises :class:`ConversionError` for anything it cannot convert, before any
    tensor is copied: :func:`check_storage`, the key and shape check, and ``max_output_bytes`` (``main``
    passes :data:`OUTPUT_FACTOR` x the input file + :data:`OUTPUT_SLACK`). ``lora`` (:func:`read_lora`) is merged
    into the checked weights in fp32 (:func:`merge_lora`) before the cast.
    """
    target = DTYPES[dtype] if isinstance(dtype, str) and dtype in DTYPES else dtype
    if target not in DTYPES.values():
        raise ConversionError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    _, sd = select_state_dict(state, key, lora=lora is not None)
    sd = strip_wrappers(sd)
    check_storage(sd)
    check_wan_t2v(sd)
    check_lora_alpha(lora_alpha)
    if lora_alpha is not None and lora is None:
        raise ConversionError("--lora-alpha applies to a --lora; there is none")
    size = output_bytes(sd, target)  # a merged LoRA changes no shape
    if max_output_bytes is not None and size > max_output_bytes:
        raise ConversionError(
            f"the converted weights would take {size} bytes, more than the {max_output_bytes} "
            f"allowed ({OUTPUT_FACTOR} x the input file + {OUTPUT_SLACK} bytes); refused"
        )
    if lora is not None:
        sd = merge_lora(sd, lora, lora_alpha)
    return {k: (v.to(target) if v.is_floating_point() else v).contiguous() for k, v in sd.items()}


#: who wrote a converted file's metadata (the tool's files record it; Load AR Video Checkpoint gives the same record)
CONVERTED_BY = "comfyui-jensen-kv tools/convert_checkpoint.py"


def conversion_metadata(source_name: str, used: str | None, dtype: str) -> dict[str, str]:
    """The metadata of a ``.pt`` checkpoint converted by :func:`convert`: its file name, the entry used, the dtype."""
    return {
        "format": "pt",
        "converted_from": source_name,
        "source_key": used or "(bare state dict)",
        "dtype": dtype,
        "converted_by": CONVERTED_BY,
    }


def stripped_metadata(source_name: str, prefixes: list[str]) -> dict[str, str]:
    """What a safetensors file whose key prefixes were stripped (Krea) adds to its metadata."""
    return {"converted_from": source_name, "stripped_prefixes": ",".join(prefixes), "converted_by": CONVERTED_BY}


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
            raise ConversionError(
                f"the metadata 'config' is not valid JSON ({e}); ComfyUI could not read it either"
            ) from None
        if not isinstance(config, dict) or not isinstance(config.get("transformer", {}), dict):
            raise ConversionError(
                f"the metadata 'config' is {out['config'][:200]!r}: not a JSON object with an object "
                "'transformer', which is what ComfyUI reads"
            )
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
        if not isinstance(info, dict):
            raise ConversionError(f"{name}: the safetensors header entry is {type(info).__name__}, not an object")
        dtype = _ST_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ConversionError(f"{name}: safetensors dtype {info.get('dtype')!r} is not one this tool knows")
        shape = info.get("shape")
        if (
            not isinstance(shape, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**40 for x in shape)
            or len(shape) > 8
        ):
            raise ConversionError(f"{name}: the safetensors shape {str(shape)[:100]} is not a list of sizes")
        sd[name] = torch.empty(shape, dtype=dtype, device="meta")
    return sd


def check_extents(header: dict, data_start: int, file_size: int) -> None:
    """A safetensors header's fields against one another: each tensor's ``data_offsets`` span exactly its dtype x
    shape, and the spans follow one another from the start of the data to the end of the file (what the
    safetensors library itself writes). A header that says otherwise would be copied into a file ComfyUI cannot
    load, or loads as other tensors. Run after :func:`meta_state_dict` (which checks each dtype and shape)."""
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o for o in offsets)
        ):
            raise ConversionError(f"{name}: the safetensors data_offsets {str(offsets)[:100]} are not two byte offsets")
        need = math.prod(info["shape"]) * torch.empty((), dtype=_ST_DTYPES[info["dtype"]]).element_size()
        if offsets[1] - offsets[0] != need:
            raise ConversionError(
                f"{name}: a {info['dtype']} tensor of shape {info['shape']} needs {need} bytes, but its data_offsets "
                f"{offsets} span {offsets[1] - offsets[0]}: the file is damaged (download or save it again)"
            )
        spans.append((offsets[0], offsets[1], name))
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise ConversionError(
                f"{name}: its data starts at byte {begin} of the data, but the tensor before it ends at {pos}: the "
                "tensors' data overlap or leave a gap: the file is damaged (download or save it again)"
            )
        pos = end
    if data_start + pos != file_size:
        raise ConversionError(
            f"the tensors' data end at byte {data_start + pos}, but the file has {file_size} bytes: it is "
            f"{'truncated' if data_start + pos > file_size else 'longer than its header says'} (download or save it "
            "again)"
        )


def check_recorded_dtype(header: dict) -> None:
    """A file this tool converted records its ``dtype``: every floating tensor must be of it (a file whose tensors
    were cast afterwards carries a record that lies, and copying it would pass the lie on)."""
    meta = header.get("__metadata__") or {}
    if not str(meta.get("converted_by", "")).startswith("comfyui-jensen-kv") or "dtype" not in meta:
        return
    want = DTYPES.get(meta["dtype"])
    if want is None:
        raise ConversionError(
            f"the metadata records dtype {str(meta['dtype'])[:40]!r}; this tool writes {', '.join(DTYPES)}"
        )
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES[info["dtype"]]
        if dtype.is_floating_point and dtype != want:
            raise ConversionError(
                f"{name} is {str(dtype).removeprefix('torch.')}, but the file's metadata records dtype "
                f"{meta['dtype']} for every floating tensor: the file was changed after conversion; convert the "
                "original checkpoint again"
            )


__all__ = [
    "CONVERTED_BY",
    "conversion_metadata",
    "stripped_metadata",
    "ANYWHERE_WRAPPERS",
    "AUTO_KEYS",
    "CAUSAL_AR",
    "ConversionError",
    "DTYPES",
    "EXTRA_FRACTION",
    "LEADING_WRAPPERS",
    "LORA_BASE_KEY",
    "LORA_KEY",
    "Lora",
    "MAX_PICKLE_BYTES",
    "MAX_ZIP_MEMBERS",
    "NON_T2V_PREFIXES",
    "OUTPUT_FACTOR",
    "OUTPUT_SLACK",
    "SAFETENSORS_SUFFIXES",
    "WAN_FREQ_DIM",
    "WAN_LATENT_CHANNELS",
    "WAN_OUT_DIM",
    "WAN_PATCH",
    "WAN_ROOTS",
    "WAN_TEXT_DIM",
    "WanInfo",
    "check_extents",
    "check_lora_alpha",
    "check_prefixes",
    "check_recorded_dtype",
    "check_storage",
    "check_wan_t2v",
    "check_zip_members",
    "convert",
    "is_causal",
    "key_prefixes",
    "load_checkpoint",
    "lora_metadata",
    "merge_lora",
    "meta_state_dict",
    "output_bytes",
    "read_lora",
    "read_safetensors_header",
    "select_state_dict",
    "strip_key",
    "strip_wrappers",
    "wan_t2v_shapes",
    "with_causal_config",
]
