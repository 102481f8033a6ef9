"""Model families the Chunked AR sampler can drive, chosen by probing the MODEL (one file per family)."""

from __future__ import annotations

from .base import AttentionShape, ModelFamily, Probe, UnsupportedModelError, attention_override_notice
from .wan import WanFamily

#: every family the pack supports, probed in this order
FAMILIES: tuple[type[ModelFamily], ...] = (WanFamily,)


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
                f"Chunked AR Video Sampler supports {family.supported}. This MODEL ({describe_model(model_patcher)}) "
                f"{found.problem}."
            )
    names = "; ".join(f.supported for f in FAMILIES)
    raise UnsupportedModelError(
        f"Chunked AR Video Sampler supports {names}. This MODEL ({describe_model(model_patcher)}) is not one of them; "
        "load a supported checkpoint with UNETLoader instead."
    )


__all__ = [
    "FAMILIES",
    "AttentionShape",
    "ModelFamily",
    "Probe",
    "attention_override_notice",
    "attention_shape",
    "UnsupportedModelError",
    "WanFamily",
    "describe_model",
    "detect",
]
