"""Quantize KV Cache: attach a quantized-cache spec to a (cloned) MODEL."""

from __future__ import annotations

from comfy_api.latest import io

from ..jensen_core import QuantSpec
from ..runtime.config import (
    BITS_CHOICES,
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
    JensenKVConfig,
    get_config,
    method_fields,
    parse_bits,
    parse_head_bits,
    parse_tiers,
    set_config,
)
from ..runtime.families import attention_shape
from .common import CATEGORY, Combo, advanced, logger, patched_model


def build_config(
    model,
    key_bits: str,
    value_bits: str,
    group_size: str,
    rotation: str,
    scale_format: str,
    rotation_seed: int,
    method: str = "rtn",
    qvg_stages: int = QVG_STAGES_RANGE[0],
    qvg_centroids: int = QVG_CENTROIDS_RANGE[0],
    qvg_iters: int = QVG_ITERS_RANGE[0],
    recent_chunks_bits: str = QUANTIZE_DEFAULTS["recent_chunks_bits"],
    recent_chunks: int = RECENT_CHUNKS_RANGE[0],
    sink_bits: str = QUANTIZE_DEFAULTS["sink_bits"],
    recent_chunks_key_bits: str = QUANTIZE_DEFAULTS["recent_chunks_key_bits"],
    head_bits: str = QUANTIZE_DEFAULTS["head_bits"],
    head_fraction: float = HEAD_FRACTION_RANGE[0],
) -> JensenKVConfig:
    try:
        g = int(group_size)
    except (TypeError, ValueError):
        g = None
    if g is None or group_size not in GROUP_SIZE_CHOICES:
        raise ValueError(f"group_size={group_size!r} is not supported; use one of {', '.join(GROUP_SIZE_CHOICES)}")
    extra = method_fields(method, qvg_stages, qvg_centroids, qvg_iters)
    specs = []
    for what, bits in (("key_bits", key_bits), ("value_bits", value_bits)):
        b = parse_bits(bits, what)
        specs.append(
            None
            if b is None
            else QuantSpec(
                bits=b, group_size=g, rotation=rotation, scale_format=scale_format, seed=int(rotation_seed), **extra
            )
        )
    tiers = parse_tiers(specs[0], specs[1], recent_chunks_bits, recent_chunks, sink_bits, recent_chunks_key_bits)
    # model None: settings for models elsewhere (Jensen KV Cache (Ray)); their head_dim is checked when they run
    upstream = None if model is None else get_config(model.model_options)
    per_head = parse_head_bits(specs[0], head_bits, head_fraction, tiers)
    config = (upstream or JensenKVConfig()).with_specs(*specs, tiers, per_head)
    shape = None if model is None else attention_shape(model)
    if shape is not None:
        config.check_head_dim(shape.head_dim)
    return config


class JensenKVQuantizeKVCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVQuantizeKVCache",
            display_name="Quantize KV Cache",
            category=CATEGORY,
            description=(
                "Shrinks the video model's memory of past frames (the KV cache): stored in 2-8 bits, about 6x smaller "
                "at 2 bits. Works in the Chunked AR Video Sampler and in ComfyUI's own SamplerARVideo (v0.27+). "
                "Returns a copy of the model; the input model is unchanged. How: group-wise RTN, bit-packed; or QVG "
                "(k-means smoothing per chunk, then RTN of the residual)."
            ),
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="The video model whose memory of past frames (its KV cache) to shrink: Wan 2.1 T2V (Self-Forcing, "
                    "CausVid, SkyReels-V2), or a causal-AR one for SamplerARVideo.",
                ),
                Combo(
                    "key_bits",
                    options=list(BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["key_bits"],
                    tooltip="Stores the keys of past frames in this many bits: 2 = about 6x less memory than BF16, 4 = about "
                    "3.4x; off = full precision. At 2-3 bits add Jensen Bias Correction after this node.",
                ),
                Combo(
                    "value_bits",
                    options=list(BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["value_bits"],
                    tooltip="Stores the values of past frames in this many bits: 2 = about 6x less memory than BF16, 4 = about "
                    "3.4x; off = full precision. Low-bit values do not steal attention as low-bit keys do.",
                ),
                Combo(
                    "group_size",
                    options=list(GROUP_SIZE_CHOICES),
                    default=QUANTIZE_DEFAULTS["group_size"],
                    tooltip="How many numbers share one scale: smaller is more accurate but stores more (32: 2 bits cost 2.75). "
                    "Must divide the model's head size (128 for Wan).",
                ),
                Combo(
                    "rotation",
                    options=list(ROTATION_CHOICES),
                    default=QUANTIZE_DEFAULTS["rotation"],
                    tooltip="hadamard mixes the channels before rounding, so a few large ones do not spoil the rest: usually "
                    "better at 2-3 bits (QuaRot). Needs a power-of-two head size.",
                ),
                advanced(
                    Combo(
                        "scale_format",
                        options=list(SCALE_FORMAT_CHOICES),
                        default=QUANTIZE_DEFAULTS["scale_format"],
                        tooltip="How each group's scale is stored: fp8_e4m3 (8 bits, as in the paper) or bf16 (a little more "
                        "memory). fp8 falls back to bf16 for a tensor whose steps exceed 448.",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "rotation_seed",
                        default=0,
                        min=0,
                        max=2**31 - 1,
                        tooltip="Changes the rotation's random signs (and QVG's first centroids); change it only to check that a "
                        "result is not luck. Ignored with rotation none.",
                    )
                ),
                # added after the original inputs, and optional: prompts saved before them (UI or API
                # format) still validate and run as RTN
                Combo(
                    "method",
                    options=list(METHOD_CHOICES),
                    default=QUANTIZE_DEFAULTS["method"],
                    optional=True,
                    tooltip="rtn rounds every number on its own (fast). qvg (QuantVideoGen) first groups similar tokens of a "
                    "chunk and rounds only what differs from the group: sharper at 2 bits, slower, a little more "
                    "memory (see the planner). Per chunk and head: k-means, then RTN of the residual; Jensen uses "
                    "the residual's steps.",
                ),
                advanced(
                    io.Int.Input(
                        "qvg_stages",
                        optional=True,
                        default=QVG_STAGES_RANGE[0],
                        min=QVG_STAGES_RANGE[1],
                        max=QVG_STAGES_RANGE[2],
                        tooltip="QVG only: rounds of grouping; more is sharper and stores more (1 is usual). Each stage "
                        "clusters what the previous ones left (progressive residual k-means).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "qvg_centroids",
                        optional=True,
                        default=QVG_CENTROIDS_RANGE[0],
                        min=QVG_CENTROIDS_RANGE[1],
                        max=QVG_CENTROIDS_RANGE[2],
                        tooltip="QVG only: groups per chunk and head; more is sharper and stores more. 0 = auto, picked "
                        "from the chunk's size: 98 on Wan 480p chunks of 3 latent frames, 32 on one-frame chunks, 4 on "
                        "the tiny demo model's; the planner and the report show the number used. Cost: 16*K / "
                        "tokens-per-chunk bits per element; auto is K = 256*T/(12150*S), QVG's own budget.",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "qvg_iters",
                        optional=True,
                        default=QVG_ITERS_RANGE[0],
                        min=QVG_ITERS_RANGE[1],
                        max=QVG_ITERS_RANGE[2],
                        tooltip="QVG only: how long to search for the groups (k-means iterations per stage; QVG's scripts use "
                        "2). Stops early when fewer than 0.01% of the tokens change group.",
                    )
                ),
                # precision by age (optional, after the others: older prompts run with every chunk at one precision)
                Combo(
                    "recent_chunks_bits",
                    options=list(TIER_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["recent_chunks_bits"],
                    optional=True,
                    tooltip="Keeps the newest chunks sharper: stored at 3, 4 or 8 bits, they drop to key_bits / "
                    "value_bits as they age (older frames carry less of the attention). off = every chunk at the "
                    "bits above. The planner shows the average; recent_chunks_key_bits can leave the keys out.",
                ),
                io.Int.Input(
                    "recent_chunks",
                    optional=True,
                    default=RECENT_CHUNKS_RANGE[0],
                    min=RECENT_CHUNKS_RANGE[1],
                    max=RECENT_CHUNKS_RANGE[2],
                    tooltip="How many of the newest chunks stay sharper with recent_chunks_bits (ignored when it is "
                    "off).",
                ),
                Combo(
                    "sink_bits",
                    options=list(TIER_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["sink_bits"],
                    optional=True,
                    tooltip="Keeps the chunks the sampler never forgets (its sink_chunks) at 3, 4 or 8 bits for good. off "
                    "stores them like any other chunk. No effect without a sink.",
                ),
                Combo(
                    "recent_chunks_key_bits",
                    options=list(RECENT_KEY_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["recent_chunks_key_bits"],
                    optional=True,
                    tooltip="Which bits the newest chunks' keys get with recent_chunks_bits: same = those bits; off "
                    "= key_bits, so only the values are sharper (on the tiny model the values carry most of the "
                    "gain for fewer bits: docs/tiers.md); or their own bits.",
                ),
                # precision by head (optional, after the others: older prompts run with every head at key_bits)
                Combo(
                    "head_bits",
                    options=list(HEAD_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["head_bits"],
                    optional=True,
                    tooltip="Stores the keys of the heads the correction can't fix at 3, 4 or 8 bits instead of key_bits "
                    "(a quarter of the heads at 4 over INT2, group 32: +9% memory, see the planner). The heads with the "
                    "largest predicted bias (query group norms x step sizes) at the first chunk, kept for the run.",
                ),
                io.Float.Input(
                    "head_fraction",
                    optional=True,
                    default=HEAD_FRACTION_RANGE[0],
                    min=HEAD_FRACTION_RANGE[1],
                    max=HEAD_FRACTION_RANGE[2],
                    step=0.01,
                    tooltip="Share of each layer's heads whose keys head_bits keeps sharper (rounded up: at least one "
                    "head). Ignored when head_bits is off.",
                ),
            ],
            outputs=[
                io.Model.Output(
                    tooltip="A clone of the model carrying the KV-cache spec (Chunked AR sampler or SamplerARVideo)."
                )
            ],
        )

    @classmethod
    def execute(
        cls,
        model,
        key_bits,
        value_bits,
        group_size,
        rotation,
        scale_format="fp8_e4m3",
        rotation_seed=0,
        method="rtn",
        qvg_stages=QVG_STAGES_RANGE[0],
        qvg_centroids=QVG_CENTROIDS_RANGE[0],
        qvg_iters=QVG_ITERS_RANGE[0],
        recent_chunks_bits=QUANTIZE_DEFAULTS["recent_chunks_bits"],
        recent_chunks=RECENT_CHUNKS_RANGE[0],
        sink_bits=QUANTIZE_DEFAULTS["sink_bits"],
        recent_chunks_key_bits=QUANTIZE_DEFAULTS["recent_chunks_key_bits"],
        head_bits=QUANTIZE_DEFAULTS["head_bits"],
        head_fraction=HEAD_FRACTION_RANGE[0],
    ) -> io.NodeOutput:
        config = build_config(
            model,
            key_bits,
            value_bits,
            group_size,
            rotation,
            scale_format,
            rotation_seed,
            method,
            qvg_stages,
            qvg_centroids,
            qvg_iters,
            recent_chunks_bits,
            recent_chunks,
            sink_bits,
            recent_chunks_key_bits,
            head_bits,
            head_fraction,
        )
        logger.info("jensen_kv: KV cache %s", config.describe())
        return patched_model(model, config, set_config)
