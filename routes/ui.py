"""HTTP routes the web extension asks for every number it shows.

One source for the formula: the web extension (``web/jensen_kv.js``) only displays what these
handlers return; the numbers come from :mod:`jensen_core` (``QuantSpec.effective_bits``, the method
object's ``bits_breakdown``, ``planner.plan_cache``; the model presets and each one's latent geometry from the family registry,
``runtime.families``), the defaults from the nodes' own (:mod:`runtime.config`).

Routes (also under ``/api/...``, as ComfyUI mirrors every route there):

- ``GET /jensen_kv/options`` - choices, defaults, model presets and each family's own sampler node for the UI;
- ``GET /jensen_kv/spec?key_bits=2&value_bits=2&group_size=32&...`` - effective bits of a key / value
  spec and its compression against BF16 (``head_dim`` optional: adds the divisibility check; with
  ``method=qvg`` the bits depend on the tokens per chunk too: give ``head_dim`` and ``chunk_tokens``
  for the exact figure, else the answer says which part it leaves out);
- ``GET /jensen_kv/plan?width=832&height=480&frames=81&chunk_frames=3&...`` - the projected peak cache
  size of a run at BF16 and at the chosen setting, with warnings; its ``spec`` is the spec summary
  at the run's head_dim and tokens per chunk (exact for QVG as well). A family's own sampler may add fields
  (``ModelFamily.planner_fields``: MAGI-1 AR Sampler's ``window_size``, ``kv_ranges``, ``steps``, which decide
  what its window 0 keeps); the chunk, window and sink planned are the family's rule
  (``ModelFamily.plan_chunks``: MAGI-1's fixed chunk of 6, HY-WorldPlay's rebuilt context), which its own
  sampler's loop asks too.

A bad query value answers HTTP 400 with ``{"error": ..., "param": ..., "value": ..., "fix": ...}``.
The pure functions :func:`options`, :func:`spec_summary` and :func:`plan_summary` do the work and
import without ComfyUI; :func:`register` attaches them to ``PromptServer.instance.routes`` (called by the
extension's ``on_load``; importing this module registers nothing).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping

from ..jensen_core.cache_values import CachePrecision, CacheShape
from ..jensen_core.methods import method_of
from ..jensen_core.planner import head_dim_problems, plan_cache
from ..jensen_core.spec import METHOD_KNOBS, QuantSpec
from ..runtime.config import (
    BITS_CHOICES,
    CHUNK_DEFAULTS,
    GROUP_SIZE_CHOICES,
    HEAD_BITS_CHOICES,
    HEAD_FRACTION_RANGE,
    METHOD_CHOICES,
    QUANTIZE_DEFAULTS,
    QVG_CENTROIDS_RANGE,
    QVG_ITERS_RANGE,
    QVG_STAGES_RANGE,
    RECENT_CHUNKS_RANGE,
    RECENT_KEY_BITS_CHOICES,
    ROTATION_CHOICES,
    SCALE_FORMAT_CHOICES,
    TIER_BITS_CHOICES,
    parse_head_bits,
    parse_tiers,
)
from ..runtime.families import FAMILIES, ModelPreset, PlannerFieldError, family_named, planner_presets
from ..runtime.model_loading import HeaderError, is_model_folder, read_shapes
from ..runtime.options import Chunking

logger = logging.getLogger("jensen_kv")

ROUTE_PREFIX = "/jensen_kv"

# The node's own widget choices (runtime/config.py), so the planner accepts exactly what the node does.
GROUP_CHOICES: tuple[int, ...] = tuple(int(g) for g in GROUP_SIZE_CHOICES)
SCALE_CHOICES: tuple[str, ...] = tuple(SCALE_FORMAT_CHOICES)
CUSTOM_PRESET = "custom"
#: every family's planner presets (name -> (family, preset)), as the registry lists them
MODEL_PRESETS = planner_presets()

# The nodes' defaults (Quantize KV Cache, the Chunked AR sampler), then the video the planner starts with.
DEFAULTS: dict[str, object] = {
    **QUANTIZE_DEFAULTS,
    "group_size": int(QUANTIZE_DEFAULTS["group_size"]),
    "qvg_stages": QVG_STAGES_RANGE[0],
    "qvg_centroids": QVG_CENTROIDS_RANGE[0],
    "qvg_iters": QVG_ITERS_RANGE[0],
    "recent_chunks": RECENT_CHUNKS_RANGE[0],
    "width": 832,
    "height": 480,
    "frames": 81,
    "batch": 1,
    **CHUNK_DEFAULTS,
    "cfg_branches": 1,
    "ranks": 1,
    "preset": "wan2.1-1.3b",
    "family": FAMILIES[0].key,
}

# name -> (min, max, what it is / how to fix it)
_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "width": (16, 16384, "the video width in pixels, e.g. width=832"),
    "height": (16, 16384, "the video height in pixels, e.g. height=480"),
    "frames": (1, 16384, "the number of video frames, e.g. frames=81 (Wan: 4k+1)"),
    "batch": (1, 4096, "the latent batch size, e.g. batch=1"),
    "chunk_frames": (1, 1024, "latent frames per chunk, e.g. chunk_frames=3"),
    "window_chunks": (0, 4096, "chunks kept in the cache, 0 = all, e.g. window_chunks=0"),
    "sink_chunks": (0, 4096, "first chunks kept for good with a window (attention sink), e.g. sink_chunks=1"),
    "cfg_branches": (1, 2, "1 when cfg is 1, 2 when cfg > 1 (cond and uncond are both cached)"),
    "ranks": (1, 1024, "GPUs sharing every layer's heads (Raylight's Ulysses degree), 1 without it, e.g. ranks=4"),
    "layers": (1, 1000, "transformer blocks of the model, e.g. layers=30 for Wan 1.3B"),
    "heads": (1, 1024, "attention heads per block, e.g. heads=12 for Wan 1.3B"),
    "head_dim": (1, 4096, "channels per attention head, e.g. head_dim=128 for Wan"),
    "kv_heads": (1, 1024, "K/V heads per block (grouped-query attention; default: heads), e.g. kv_heads=8 for MAGI-1"),
    "group_size": (1, 4096, "one of 8, 16, 32, 64, 128, 256"),
    "qvg_stages": (*QVG_STAGES_RANGE[1:], "QVG's k-means stages S, e.g. qvg_stages=1"),
    "qvg_centroids": (
        *QVG_CENTROIDS_RANGE[1:],
        "QVG's centroids per stage and chunk K, 0 = auto (from the tokens per chunk), e.g. qvg_centroids=0",
    ),
    "qvg_iters": (*QVG_ITERS_RANGE[1:], "QVG's k-means iterations, e.g. qvg_iters=2"),
    "recent_chunks": (
        0,
        RECENT_CHUNKS_RANGE[2],
        "newest cached chunks kept at recent_chunks_bits (with it on), e.g. recent_chunks=2",
    ),
    "chunk_tokens": (1, 10**8, "tokens per cached chunk (latent frames per chunk x tokens per latent frame)"),
}

METHOD_PARAMS = ("method", "qvg_stages", "qvg_centroids", "qvg_iters")
SPEC_PARAMS = (
    "key_bits",
    "value_bits",
    "group_size",
    "rotation",
    "scale_format",
    *METHOD_PARAMS,
    "head_dim",
    "chunk_tokens",
)
TIER_PARAMS = ("recent_chunks_bits", "recent_chunks", "sink_bits", "recent_chunks_key_bits")
#: precision by head (Quantize KV Cache's head_bits, head_fraction): only the plan takes them
HEAD_PARAMS = ("head_bits", "head_fraction")
PLAN_PARAMS = (
    *(p for p in SPEC_PARAMS if p != "chunk_tokens"),
    *TIER_PARAMS,
    *HEAD_PARAMS,
    "width",
    "height",
    "frames",
    "batch",
    "chunk_frames",
    "window_chunks",
    "sink_chunks",
    "cfg_branches",
    "ranks",
    "preset",
    "family",
    "layers",
    "heads",
    "kv_heads",
    "model_file",
    "model_folder",
)
#: the ComfyUI model folders a loader's file may be read from for the plan (``model_file``, ``model_folder``)
MODEL_FOLDERS = ("diffusion_models", "unet", "checkpoints")
#: inputs of a family's own sampler the plan takes (MAGI-1 AR Sampler's window_size, kv_ranges, steps)
FAMILY_PLAN_PARAMS = tuple(dict.fromkeys(name for f in FAMILIES for name in f.planner_fields))


class ParamError(ValueError):
    """A query value the routes cannot use; ``to_json()`` is the HTTP 400 body."""

    def __init__(self, param: str, value: object, problem: str, fix: str):
        self.param, self.value, self.problem, self.fix = param, value, problem, fix
        shown = param if value is None else f"{param}={value!r}"
        super().__init__(f"{shown} {problem}; {fix}")

    def to_json(self) -> dict:
        return {"error": str(self), "param": self.param, "value": self.value, "fix": self.fix}


def _check_known(params: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    for name in params:
        if name not in allowed:
            raise ParamError(name, params[name], "is not a known parameter", "use only " + ", ".join(allowed))


def _get(params: Mapping[str, str], name: str) -> object:
    v = params.get(name)
    return DEFAULTS.get(name) if v is None or str(v).strip() == "" else str(v).strip()


def _int(params: Mapping[str, str], name: str, default: object = None) -> int:
    raw = params.get(name)
    raw = default if raw is None or str(raw).strip() == "" else str(raw).strip()
    lo, hi, what = _INT_RANGES[name]
    if raw is None:
        raise ParamError(name, None, "is missing", f"give {what}")
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise ParamError(name, raw, "is not an integer", f"give {what}") from None
    if not lo <= v <= hi:
        raise ParamError(name, v, f"is out of range {lo}..{hi}", f"give {what}")
    return v


def _choice(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    v = str(_get(params, name))
    if v not in choices:
        raise ParamError(name, v, "is not supported", "use one of " + ", ".join(choices))
    return v


def _side_spec(params: Mapping[str, str], side: str) -> QuantSpec | None:
    bits = _choice(params, f"{side}_bits", BITS_CHOICES)
    if bits == "off":
        return None
    group = _int(params, "group_size", DEFAULTS["group_size"])
    if group not in GROUP_CHOICES:
        raise ParamError(
            "group_size",
            group,
            "is not supported",
            "use one of " + ", ".join(map(str, GROUP_CHOICES)) + " (it must divide head_dim)",
        )
    method = _choice(params, "method", METHOD_CHOICES)
    # the node always sends every method's widgets; each counts only with its own method
    extra = {"method": method, **{name: _int(params, name, DEFAULTS[name]) for name in METHOD_KNOBS[method]}}
    return QuantSpec(
        bits=int(bits),
        group_size=group,
        rotation=_choice(params, "rotation", ROTATION_CHOICES),
        scale_format=_choice(params, "scale_format", SCALE_CHOICES),
        **extra,
    )


def _tiers(params: Mapping[str, str], spec_k: QuantSpec | None, spec_v: QuantSpec | None):
    """The age tiers of Quantize KV Cache's tier widgets (None when off), with the node's own checks."""
    bits = {name: _choice(params, name, TIER_BITS_CHOICES) for name in ("recent_chunks_bits", "sink_bits")}
    key_bits = _choice(params, "recent_chunks_key_bits", RECENT_KEY_BITS_CHOICES)
    recent = _int(params, "recent_chunks", DEFAULTS["recent_chunks"])
    try:
        return parse_tiers(spec_k, spec_v, bits["recent_chunks_bits"], recent, bits["sink_bits"], key_bits)
    except ValueError as exc:
        text = str(exc)
        if text.startswith("recent_chunks="):
            name, value = "recent_chunks", recent
        else:
            name = "recent_chunks_bits" if bits["recent_chunks_bits"] != "off" else "sink_bits"
            value = bits[name]
        raise ParamError(name, value, "does not fit the other settings", text) from None


def _head_bits(params: Mapping[str, str], spec_k: QuantSpec | None, tiers):
    """Precision by head from Quantize KV Cache's head_bits / head_fraction (None when off), with the node's checks."""
    bits = _choice(params, "head_bits", HEAD_BITS_CHOICES)
    if bits == "off":
        return None
    raw = params.get("head_fraction")
    fraction = HEAD_FRACTION_RANGE[0] if raw is None or str(raw).strip() == "" else str(raw).strip()
    try:
        return parse_head_bits(spec_k, bits, fraction, tiers)
    except ValueError as exc:
        text = str(exc)
        name, value = ("head_fraction", fraction) if text.startswith("head_fraction=") else ("head_bits", bits)
        raise ParamError(name, value, "does not fit the other settings", text) from None


def _side_summary(spec: QuantSpec | None, head_dim: int | None = None, chunk_tokens: int | None = None) -> dict:
    if spec is None:
        return {
            "quantized": False,
            "bits": None,
            "effective_bits": 16.0,
            "note": "kept at the model's precision (counted as BF16)",
        }
    out = {
        "quantized": True,
        "method": spec.method,
        "bits": spec.bits,
        "effective_bits": spec.effective_bits,
        "scale_bits": spec.scale_bits,
        "zero_bits": spec.zero_bits,
        "group_size": spec.group_size,
    }
    method = method_of(spec)
    if method.exact_spec_bits:
        return out
    # the method's own knobs, then its parts of the stored bits (QVG: residual, cluster ids, centroids)
    out.update({name: getattr(spec, name) for name in METHOD_KNOBS[spec.method]})
    out.update(method.bits_breakdown(spec, head_dim, chunk_tokens))
    if out["exact"]:
        out["chunk_tokens"] = chunk_tokens
    return out


def options(params: Mapping[str, str] | None = None) -> dict:
    """Choices, defaults and model presets, so the UI hard-codes none of them."""
    _check_known(params or {}, ())
    presets = {
        name: {
            "layers": p.layers,
            "heads": p.heads,
            "head_dim": p.head_dim,
            "kv_heads": p.kv_heads or p.heads,
            "streams": p.streams,
            "chunk_frames": p.chunk_frames,
            "context_frames": p.context_frames,
            "label": p.label,
            "family": family.key,
            "files": list(p.files),
        }
        for name, (family, p) in MODEL_PRESETS.items()
    }
    return {
        "bits": list(BITS_CHOICES),
        "group_size": list(GROUP_CHOICES),
        "rotation": list(ROTATION_CHOICES),
        "scale_format": list(SCALE_CHOICES),
        "method": list(METHOD_CHOICES),
        "tier_bits": list(TIER_BITS_CHOICES),
        "recent_key_bits": list(RECENT_KEY_BITS_CHOICES),
        "presets": presets,
        "custom_preset": CUSTOM_PRESET,
        "families": {f.key: f.name for f in FAMILIES},
        "samplers": samplers(),
        "defaults": dict(DEFAULTS),
        "ranges": {k: {"min": lo, "max": hi, "hint": what} for k, (lo, hi, what) in _INT_RANGES.items()},
    }


def samplers() -> dict:
    """Each family's own sampler node, as the web planner follows it (by node id): its family, the planner fields
    read from its widgets (``inputs``) and those it fixes (``fixed``), and the fields of its own the plan takes
    (``fields``: ``ModelFamily.planner_fields``). Families sampled by the Chunked AR sampler have none."""
    return {
        f.sampler_node_id: {
            "family": f.key,
            "node": f.sampler_node,
            "inputs": list(f.planner_inputs),
            "fixed": dict(f.planner_fixed),
            "fields": list(f.planner_fields),
        }
        for f in FAMILIES
        if f.sampler_node_id is not None
    }


def spec_summary(params: Mapping[str, str]) -> dict:
    """Effective bits of the key and value specs and their compression against BF16.

    ``head_dim`` is optional; when given, a group size (or rotation) that cannot quantize it comes
    back in ``errors`` (the sampler would stop with the same message). A QVG side's bits are exact
    with ``head_dim`` and ``chunk_tokens`` (``exact: true``); without them they leave out the parts
    the answer names in ``note``.
    """
    _check_known(params, SPEC_PARAMS)
    spec_k, spec_v = _side_spec(params, "key"), _side_spec(params, "value")
    head_dim = _int(params, "head_dim") if params.get("head_dim") not in (None, "") else None
    chunk_tokens = _int(params, "chunk_tokens") if params.get("chunk_tokens") not in (None, "") else None
    errors = head_dim_problems(spec_k, spec_v, head_dim) if head_dim is not None else []
    dims = (head_dim, chunk_tokens) if not errors else (None, None)
    k, v = _side_summary(spec_k, *dims), _side_summary(spec_v, *dims)
    eb = (k["effective_bits"] + v["effective_bits"]) / 2
    return {
        "key": k,
        "value": v,
        "effective_bits": eb,
        # no ratio for a setting that cannot run (the planner's top line shows none)
        "compression": None if errors else 16.0 / eb,
        "head_dim": head_dim,
        "errors": errors,
    }


def _resolve_model(params: Mapping[str, str]):
    """(preset name, family, layers, heads, head_dim, kv_heads) of the query: a preset's, overridden by any
    dimension given; ``preset=custom`` takes the family from ``family`` and needs every dimension."""
    preset = str(_get(params, "preset"))
    if preset != CUSTOM_PRESET and preset not in MODEL_PRESETS:
        raise ParamError(
            "preset", preset, "is not a known model preset", "use one of " + ", ".join((*MODEL_PRESETS, CUSTOM_PRESET))
        )
    if preset != CUSTOM_PRESET:
        family, base = MODEL_PRESETS[preset]
        base_dims = (*base.dims, base.kv_heads or base.heads)
    else:
        key = str(_get(params, "family"))
        family, base_dims = family_named(key), None
        if family is None:
            raise ParamError(
                "family",
                key,
                "is not a model family the pack supports",
                "use one of " + ", ".join(f.key for f in FAMILIES),
            )
    dims = []
    for i, name in enumerate(("layers", "heads", "head_dim", "kv_heads")):
        given = params.get(name)
        if given is None or str(given).strip() == "":
            if name == "kv_heads":
                # the preset's K/V heads while the query heads are the preset's (the web planner always sends them);
                # as many as the query heads otherwise
                dims.append(base_dims[3] if base_dims is not None and dims[1] == base_dims[1] else dims[1])
                continue
            if base_dims is None:
                raise ParamError(
                    name,
                    None,
                    "is missing",
                    f"preset=custom needs layers, heads and head_dim: give {_INT_RANGES[name][2]}",
                )
            dims.append(base_dims[i])
        else:
            dims.append(_int(params, name))
    layers, heads, head_dim, kv_heads = dims
    if heads % kv_heads:
        raise ParamError(
            "kv_heads", kv_heads, f"does not divide heads={heads}", "give a K/V head count that divides the query heads"
        )
    # name the preset the dimensions really are (explicit values override the preset)
    match = next(
        (
            n
            for n, (f, p) in MODEL_PRESETS.items()
            if f is family and (*p.dims, p.kv_heads or p.heads) == (layers, heads, head_dim, kv_heads)
        ),
        CUSTOM_PRESET,
    )
    return match, family, layers, heads, head_dim, kv_heads


def _file_path(folder: str, name: str) -> str | None:
    """The full path of ``name`` in ComfyUI's model folder ``folder`` (None: not found, or no ComfyUI here)."""
    try:
        import folder_paths
    except ImportError:
        return None
    try:
        if name.endswith("/"):  # a diffusers folder as its loader lists it (LingBot-World's release)
            for base in folder_paths.get_folder_paths(folder):
                base = os.path.realpath(base)
                path = os.path.realpath(os.path.join(base, name))
                if os.path.commonpath((base, path)) == base and is_model_folder(path):
                    return path
            return None
        return folder_paths.get_full_path(folder, name)
    except Exception:  # noqa: BLE001 - a folder ComfyUI does not know: not found
        return None


@functools.lru_cache(maxsize=32)
def _header_of(path: str, mtime_ns: int, size: int) -> tuple[dict, dict]:
    return read_shapes(path)


def model_of_file(params: Mapping[str, str], resolve=None):
    """``(family, preset name, ModelPreset, note)`` of the query's ``model_file`` (a file name in ComfyUI's
    ``model_folder``, default ``diffusion_models``), read from its safetensors header alone: the family that
    recognises its tensors and the dimensions its loader would build. None (with a note saying why) where the
    file is not found, not a safetensors file, or no family's; the plan then takes the preset."""
    name = str(params.get("model_file") or "").strip()
    if not name:
        return None
    folder = str(params.get("model_folder") or "diffusion_models")
    if folder not in MODEL_FOLDERS:
        raise ParamError(
            "model_folder", folder, "is not a model folder the planner reads", "use " + ", ".join(MODEL_FOLDERS)
        )
    path = (resolve or _file_path)(folder, name)
    if path is None:
        return None, None, None, f"{name} is not in models/{folder}"
    try:
        st = os.stat(path)
        shapes, meta = _header_of(str(path), st.st_mtime_ns, st.st_size)
    except (OSError, HeaderError) as exc:
        return None, None, None, str(exc)
    for family in sorted(FAMILIES, key=lambda f: -f.order):  # the specific families before Wan 2.1's
        found = family.preset_from_shapes(shapes, meta)
        if found is not None:
            key = next((n for n, (f, q) in MODEL_PRESETS.items() if f is family and q is found), CUSTOM_PRESET)
            return family, key, found, None
    return (
        None,
        None,
        None,
        f"{name} is no model the pack's families run (read from its header)",
    )


def _recipe_shape(preset: str, family) -> ModelPreset | None:
    """The preset whose streams and rebuilt context the plan takes: the named one, or for ``preset=custom`` the
    family's first (every preset of a family shares its attention streams and recipe)."""
    if preset != CUSTOM_PRESET:
        return MODEL_PRESETS[preset][1]
    return next(iter(family.presets.values()), None)


def plan_summary(params: Mapping[str, str]) -> dict:
    """Projected peak cache size of a chunk-wise AR run, at BF16 and at the chosen setting.

    The bytes come from :func:`jensen_core.planner.plan_cache`; this function only parses and
    validates the query and adds what the UI needs to display (MiB, savings, the errors that would
    stop the run as distinct from warnings).
    """
    _check_known(params, PLAN_PARAMS + FAMILY_PLAN_PARAMS)
    spec_k, spec_v = _side_spec(params, "key"), _side_spec(params, "value")
    tiers = _tiers(params, spec_k, spec_v)
    head_bits = _head_bits(params, spec_k, tiers)
    file_family, file_preset, file_shape, file_note = model_of_file(params) or (None, None, None, None)
    if file_family is not None:  # the loader's file: the model the run will really have
        family, preset, shape = file_family, file_preset, file_shape
        layers, heads, head_dim = shape.dims
        kv_heads = shape.kv_heads or heads
    else:
        preset, family, layers, heads, head_dim, kv_heads = _resolve_model(params)
        shape = _recipe_shape(preset, family)
    for name in FAMILY_PLAN_PARAMS:
        if name in params and name not in family.planner_fields:
            owner = next(f for f in FAMILIES if name in f.planner_fields)
            raise ParamError(
                name,
                params[name],
                f"is an input of {owner.sampler_node}, not of the {family.name} plan asked for",
                f"leave it out, or plan a {owner.name} model (preset={next(iter(owner.presets), CUSTOM_PRESET)})",
            )
    geometry = family.geometry
    width, height = _int(params, "width", DEFAULTS["width"]), _int(params, "height", DEFAULTS["height"])
    frames = _int(params, "frames", DEFAULTS["frames"])
    chunk_frames = _int(params, "chunk_frames", DEFAULTS["chunk_frames"])
    window = _int(params, "window_chunks", DEFAULTS["window_chunks"])
    sink = _int(params, "sink_chunks", DEFAULTS["sink_chunks"])
    cfg_branches = _int(params, "cfg_branches", DEFAULTS["cfg_branches"])
    batch = _int(params, "batch", DEFAULTS["batch"])
    ranks = _int(params, "ranks", DEFAULTS["ranks"])

    latent_frames, latent_h, latent_w = geometry.latent_shape(width, height, frames)
    streams = shape.streams if shape is not None else 1
    # the family's planner rule (HY-WorldPlay's rebuilt context, MAGI-1's chunk and what its window 0 keeps); a chunk
    # not given starts from the one the preset's sampler fixes
    if shape is not None and shape.chunk_frames and not str(params.get("chunk_frames") or "").strip():
        chunk_frames = shape.chunk_frames
    try:
        chunking, rule_notes = family.plan_chunks(Chunking(chunk_frames, window, sink), latent_frames, params, shape)
    except PlannerFieldError as exc:
        raise ParamError(exc.param, exc.value, exc.problem, exc.fix) from None
    chunk_frames, window, sink = chunking.chunk_frames, chunking.window_chunks, chunking.sink_chunks
    notes = list(rule_notes)
    step = geometry.vae_space_stride * max(geometry.patch[1], geometry.patch[2])  # pixels per whole patch (Wan: 16)
    short = family.name.split()[0]  # "Wan"
    if width % step or height % step:
        notes.append(
            f"{width}x{height} is not a multiple of {step}: {short} works on "
            f"{latent_w // geometry.patch[2] * step}x{latent_h // geometry.patch[1] * step} "
            f"(use multiples of {step}, e.g. 832x480)"
        )
    t = geometry.vae_time_stride
    if geometry.causal_first_frame and (frames - 1) % t:
        notes.append(
            f"{frames} frames: {short}'s VAE keeps {t}k+1 frames, so this is {latent_frames} latent frames "
            f"({(latent_frames - 1) * t + 1} video frames)"
        )
    elif not geometry.causal_first_frame and frames % t:
        notes.append(
            f"{frames} frames: {short}'s VAE makes {t} frames of every latent frame, so this is {latent_frames} "
            f"latent frames ({latent_frames * t} video frames)"
        )
    if latent_h < geometry.patch[1] or latent_w < geometry.patch[2]:
        raise ParamError(
            "width" if latent_w < geometry.patch[2] else "height",
            width if latent_w < geometry.patch[2] else height,
            f"is too small for one {short} patch",
            f"use at least {step} pixels",
        )

    chunk_tokens = chunk_frames * geometry.tokens_per_frame(latent_h, latent_w)
    spec = spec_summary(
        {
            **{k: v for k, v in params.items() if k in SPEC_PARAMS and k not in TIER_PARAMS + HEAD_PARAMS},
            "head_dim": str(head_dim),
            "chunk_tokens": str(chunk_tokens),
        }
    )
    plan = plan_cache(
        latent_frames=latent_frames,
        latent_height=latent_h,
        latent_width=latent_w,
        chunk_frames=chunk_frames,
        window_chunks=window,
        shape=CacheShape(
            layers * streams,
            heads,
            head_dim,
            geometry,
            kv_heads=kv_heads,
            cfg_branches=cfg_branches,
            batch=batch,
            ranks=ranks,
        ),
        precision=CachePrecision(spec_k, spec_v, tiers, head_bits),
        sink_chunks=sink,
    )
    d = plan.to_dict()
    if not family.saves_runs:  # MAGI-1, HY-WorldPlay: no Save KV Cache file to size
        d["state_file_bytes"] = d["state_file_mib"] = None
    runnable, quant_bytes = plan.runnable, plan.quantized_bytes
    d.update(
        spec=spec,
        warnings=d["warnings"] + notes,
        saved_bytes=(d["bf16_bytes"] - quant_bytes) if runnable else None,
        bytes_ratio=(d["bf16_bytes"] / quant_bytes) if runnable and quant_bytes else None,
        model={
            "preset": preset,
            # the loader's file, read from its header: the model's label and where its dimensions come from
            **({"label": shape.label, "source": f"{params['model_file']}'s header"} if file_family is not None else {}),
            # a loader's file the planner could not read (missing, a GGUF, another model): why; the preset stays
            **({"file_note": file_note} if file_note else {}),
            "family": family.key,
            "layers": layers,
            "heads": heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            # a model whose blocks keep several K/V streams, or whose recipe rebuilds a context (HY-WorldPlay)
            **(
                {"streams": streams, "cache_layers": layers * streams, "context_frames": shape.context_frames}
                if shape is not None and (streams > 1 or shape.context_frames)
                else {}
            ),
        },
        video={
            "width": width,
            "height": height,
            "frames": frames,
            "batch": batch,
            "latent_height": latent_h,
            "latent_width": latent_w,
        },
        chunk_frames=chunk_frames,
        window_chunks=window,
        sink_chunks=sink,
        cfg_branches=cfg_branches,
    )
    return d


# ---------------------------------------------------------------------------------------- server glue
def _json_handler(fn):
    async def handler(request):
        from aiohttp import web

        try:
            body = fn(request.rel_url.query)
        except ParamError as exc:
            return web.json_response(exc.to_json(), status=400)
        except ValueError as exc:  # a check in jensen_core the parsing above did not anticipate
            return web.json_response(
                {"error": str(exc), "param": None, "value": None, "fix": "change the value the message names"},
                status=400,
            )
        return web.json_response(body)

    handler.__name__ = f"jensen_kv_{fn.__name__}"
    return handler


ROUTES = {"options": options, "spec": spec_summary, "plan": plan_summary}


def register(route_table=None) -> bool:
    """Attach the routes to ``PromptServer.instance.routes`` (or ``route_table``); idempotent."""
    if route_table is None:
        # ComfyUI's main.py imports its ``server`` module before it loads custom nodes; anywhere else
        # (pytest, scripts) there is no server to attach to, and importing one would start ComfyUI.
        server = sys.modules.get("server")
        instance = getattr(getattr(server, "PromptServer", None), "instance", None)
        if instance is None:
            logger.debug("jensen_kv: no running ComfyUI server; web routes not registered")
            return False
        route_table = instance.routes
    existing = {getattr(r, "path", None) for r in route_table}
    for name, fn in ROUTES.items():
        path = f"{ROUTE_PREFIX}/{name}"
        if path not in existing:
            route_table.get(path)(_json_handler(fn))
    return True
