"""Model families the Chunked AR sampler can drive, chosen by probing the MODEL (one file per family)."""

from __future__ import annotations

from types import SimpleNamespace

from .base import (
    CHUNKED_AR_SAMPLER,
    AttentionShape,
    ModelFamily,
    ModelPreset,
    PlannerFieldError,
    Probe,
    UnsupportedModelError,
    UnusedSettingsError,
    attention_override_notice,
)
from .magi1 import files as _magi1_files
from .magi1 import model as _magi1_model
from .magi1 import recipe as _magi1_recipe
from .magi1 import text as _magi1_text
from .magi1 import vae as _magi1_vae
from .magi1 import window as _magi1_window
from .magi1.family import Magi1Family
from .wan import WanFamily
from .worldplay import loader as _worldplay_loader
from .worldplay import recipe as _worldplay_recipe
from .worldplay.family import WorldPlayFamily

#: what the MAGI-1 and HY-WorldPlay nodes call (their loaders, files, text glue and their own samplers' recipes):
#: nodes ask the registry, never a family's module (tests/test_layout.py).
MAGI1 = SimpleNamespace(
    family=Magi1Family,
    Request=_magi1_recipe.Magi1Request.from_options,
    run=_magi1_recipe.run,
    report_text=_magi1_recipe.report_text,
    parse_kv_ranges=_magi1_window.parse_kv_ranges,
    default_steps=_magi1_window.DEFAULT_STEPS,
    window_sizes=_magi1_window.WINDOW_SIZES,
    chunk_frames=_magi1_model.CHUNK_FRAMES,
    vae_time_stride=Magi1Family.geometry.vae_time_stride,
    vae_space_stride=Magi1Family.geometry.vae_space_stride,
    files=_magi1_files,
    variants=_magi1_model.VARIANTS,
    weight_dtypes=_magi1_model.WEIGHT_DTYPES,
    load=_magi1_model.load_magi1,
    vae_dtypes=_magi1_vae.VAE_DTYPES,
    load_vae=_magi1_vae.load_magi1_vae,
    encode=_magi1_text.encode,
)


WORLDPLAY = SimpleNamespace(
    weight_dtypes=_worldplay_loader.WEIGHT_DTYPES,
    load=_worldplay_loader.load_worldplay,
    from_state_dict=_worldplay_loader.worldplay_from_state_dict,
    describe=_worldplay_loader.describe,
    family=WorldPlayFamily,
    request=_worldplay_recipe.WorldPlayRequest.from_options,
    run=_worldplay_recipe.run,
    report_text=_worldplay_recipe.report_text,
)

#: every family the pack supports, probed in this order
FAMILIES: tuple[type[ModelFamily], ...] = (WanFamily, WorldPlayFamily, Magi1Family)


def planner_presets() -> dict[str, tuple[type[ModelFamily], ModelPreset]]:
    """Every family's planner presets by name (the web planner's model list), in family order."""
    out: dict[str, tuple[type[ModelFamily], ModelPreset]] = {}
    for family in FAMILIES:
        for name, preset in family.presets.items():
            if name in out:
                raise RuntimeError(f"two families name a planner preset {name!r}: {out[name][0].name}, {family.name}")
            out[name] = (family, preset)
    return out


def family_named(name: str) -> type[ModelFamily] | None:
    """The family whose ``name`` or short key (``key``) is ``name`` (case-insensitive), else None."""
    for family in FAMILIES:
        if name.lower() in (family.name.lower(), family.key.lower()):
            return family
    return None


def is_pack_loop(model_patcher) -> bool:
    """Whether the pack's own Chunked AR sampler patched this clone (asked of every family)."""
    patches = getattr(model_patcher, "object_patches", {}) or {}
    return any(family.is_loop_patch(p) for p in patches.values() for family in FAMILIES)


def core_ar_family(model_patcher) -> type[ModelFamily] | None:
    """The family that serves ComfyUI's own AR sampler on this MODEL (it applies and has a causal model core's
    ``sample_ar_video`` drives), else None."""
    for family in FAMILIES:
        if family.probe(model_patcher).applies and family.core_ar_model(model_patcher) is not None:
            return family
    return None


def describe_model(model_patcher) -> str:
    """What the MODEL is, for error messages: ``WAN21 (WanModel, model_type 't2v')``."""
    base = getattr(model_patcher, "model", None)
    name = type(base).__name__
    dm = getattr(base, "diffusion_model", None)
    extra = []
    if dm is not None:
        extra.append(type(dm).__name__)
        mt = getattr(dm, "model_type", None)
        if mt is not None:
            extra.append(f"model_type {mt!r}")
    return name + (f" ({', '.join(extra)})" if extra else "")


def attention_shape(model_patcher) -> AttentionShape | None:
    """Layers, heads and head_dim of the MODEL as the family that applies to it reads them (for nodes that check
    settings before a run), or None when no family applies or the model lacks those parts; never raises for an
    unsupported model (the sampler says why when it runs)."""
    for family in FAMILIES:
        if family.probe(model_patcher).applies:
            return family.attention_shape(model_patcher)
    return None


def detect(model_patcher) -> ModelFamily:
    """The family adapter for ``model_patcher``, or an :class:`UnsupportedModelError` that says why not."""
    for family in FAMILIES:
        found = family.probe(model_patcher)
        if found.supported:
            return family(model_patcher)
        if found.applies:
            raise UnsupportedModelError(
                f"{family.sampler_node} supports {family.supported}. This MODEL ({describe_model(model_patcher)}) "
                f"{found.problem}."
            )
    names = "; ".join(f"{f.supported} (node: {f.sampler_node})" for f in FAMILIES)
    raise UnsupportedModelError(
        f"The pack supports {names}. This MODEL ({describe_model(model_patcher)}) is not one of them; "
        "load a supported checkpoint with the loader each names instead."
    )


__all__ = [
    "CHUNKED_AR_SAMPLER",
    "FAMILIES",
    "MAGI1",
    "Magi1Family",
    "WORLDPLAY",
    "AttentionShape",
    "ModelFamily",
    "ModelPreset",
    "PlannerFieldError",
    "Probe",
    "UnusedSettingsError",
    "core_ar_family",
    "family_named",
    "is_pack_loop",
    "planner_presets",
    "attention_override_notice",
    "attention_shape",
    "UnsupportedModelError",
    "WanFamily",
    "WorldPlayFamily",
    "describe_model",
    "detect",
]
