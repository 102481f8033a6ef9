"""The registry of model families: every family package under ``runtime/families/`` registers its ModelFamily in
one line (``register(...)`` at the end of its ``family.py``); the rest of the pack asks here (``detect``,
``attention_shape``, ``planner_presets``, ``core_ar_family``, ``is_pack_loop``, ``family_named``) and never imports a
family.

The registry names no family: :func:`_discover` imports the ``family`` module of every package it finds in this
folder (a new family is found by being there), and :data:`FAMILIES` lists the registered ones in their ``order``.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from .base import (
    CHUNKED_AR_SAMPLER,
    REGISTERED,
    AttentionShape,
    ModelFamily,
    ModelPreset,
    PlannerFieldError,
    Probe,
    UnsupportedModelError,
    UnusedSettingsError,
    attention_override_notice,
    register,
)

#: the module of a family package that registers its ModelFamily
FAMILY_MODULE = "family"


def _discover() -> tuple[type[ModelFamily], ...]:
    """Import every family package's ``family`` module (each registers its class), and list the registered families
    in their ``order`` (then by key)."""
    folder = Path(__file__).resolve().parent
    for found in pkgutil.iter_modules([str(folder)]):
        if found.ispkg and (folder / found.name / f"{FAMILY_MODULE}.py").is_file():
            importlib.import_module(f"{__package__}.{found.name}.{FAMILY_MODULE}")
    return tuple(sorted(REGISTERED, key=lambda f: (f.order, f.key)))


#: every family the pack supports, probed in this order
FAMILIES: tuple[type[ModelFamily], ...] = _discover()


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
    "AttentionShape",
    "ModelFamily",
    "ModelPreset",
    "PlannerFieldError",
    "Probe",
    "UnusedSettingsError",
    "core_ar_family",
    "register",
    "family_named",
    "is_pack_loop",
    "planner_presets",
    "attention_override_notice",
    "attention_shape",
    "UnsupportedModelError",
    "describe_model",
    "detect",
]
