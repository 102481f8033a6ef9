"""Quantize KV Cache: attach a quantized-cache spec to a (cloned) MODEL."""

from __future__ import annotations

from comfy_api.latest import io

from ..jensen_core import QuantSpec
from ..runtime.config import (
    BITS_CHOICES,
    GROUP_SIZE_CHOICES,
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
    parse_tiers,
    set_config,
)
from ..runtime.core_ar import attach
from ..runtime.families import attention_shape
from .common import CATEGORY, Combo, advanced, logger


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
    config = (upstream or JensenKVConfig()).with_specs(*specs, tiers)
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
                "Store the KV cache in 2-8 bits (group-wise RTN, bit-packed; or QVG: k-means smoothing per chunk, then "
                "RTN of the residual), in the Chunked AR Video Sampler or in ComfyUI's own SamplerARVideo (v0.27+). "
                "Returns a copy of the model; the input model is unchanged."
            ),
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="A Wan 2.1 T2V model (Self-Forcing, CausVid, SkyReels-V2) or a causal-AR one for SamplerARVideo.",
                ),
                Combo(
                    "key_bits",
                    options=list(BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["key_bits"],
                    tooltip="Bits per cached key element; 'off' keeps keys in the model's precision. "
                    "Low bits inflate attention on cached keys; add Jensen Bias Correction.",
                ),
                Combo(
                    "value_bits",
                    options=list(BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["value_bits"],
                    tooltip="Bits per cached value element; 'off' keeps values in the model's precision.",
                ),
                Combo(
                    "group_size",
                    options=list(GROUP_SIZE_CHOICES),
                    default=QUANTIZE_DEFAULTS["group_size"],
                    tooltip="Channels sharing one scale and zero-point; must divide the head dim (128 for Wan). "
                    "Smaller = more accurate, more metadata (INT2 at 32: 2.75 bits/element).",
                ),
                Combo(
                    "rotation",
                    options=list(ROTATION_CHOICES),
                    default=QUANTIZE_DEFAULTS["rotation"],
                    tooltip="Randomized Hadamard rotation before quantization (QuaRot): spreads outlier "
                    "channels, usually better at 2-3 bits. Needs a power-of-two head dim.",
                ),
                advanced(
                    Combo(
                        "scale_format",
                        options=list(SCALE_FORMAT_CHOICES),
                        default=QUANTIZE_DEFAULTS["scale_format"],
                        tooltip="Storage format of each group's step size (fp8_e4m3 = 8 bits, as in the paper; "
                        "falls back to bf16 for a tensor whose steps exceed 448).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "rotation_seed",
                        default=0,
                        min=0,
                        max=2**31 - 1,
                        tooltip="Seed of the random signs of the Hadamard rotation (ignored with rotation 'none'); "
                        "with method 'qvg' also the seed of k-means' initial centroids.",
                    )
                ),
                # added after the original inputs, and optional: prompts saved before them (UI or API
                # format) still validate and run as RTN
                Combo(
                    "method",
                    options=list(METHOD_CHOICES),
                    default=QUANTIZE_DEFAULTS["method"],
                    optional=True,
                    tooltip="rtn: group-wise round-to-nearest of each token. qvg (QuantVideoGen): per chunk and "
                    "head, k-means over the chunk's tokens; each token stores its centroid's id and only "
                    "the small residual is quantized with the settings above. The Jensen correction "
                    "then uses the residual's step sizes. Costs BF16 centroids per chunk (see the planner).",
                ),
                advanced(
                    io.Int.Input(
                        "qvg_stages",
                        optional=True,
                        default=QVG_STAGES_RANGE[0],
                        min=QVG_STAGES_RANGE[1],
                        max=QVG_STAGES_RANGE[2],
                        tooltip="QVG only: k-means stages S (progressive residual quantization); each stage "
                        "clusters what the previous ones left and stores K more centroids and one id per token.",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "qvg_centroids",
                        optional=True,
                        default=QVG_CENTROIDS_RANGE[0],
                        min=QVG_CENTROIDS_RANGE[1],
                        max=QVG_CENTROIDS_RANGE[2],
                        tooltip="QVG only: centroids K per stage, chunk and head. Each costs head_dim BF16 values "
                        "per chunk: 16*K/tokens-per-chunk bits per element. 0 = auto: QVG's own centroid budget "
                        "(256 per 12,150-token chunk, 0.34 bits/element) scaled to the chunk, K = 256*T/(12150*S): "
                        "picks 98 on Wan 480p chunks of 3 latent frames (4,680 tokens), 32 on one-frame chunks "
                        "(1,560), 4 on the tiny demo model's (192). The planner and the run report show the K used.",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "qvg_iters",
                        optional=True,
                        default=QVG_ITERS_RANGE[0],
                        min=QVG_ITERS_RANGE[1],
                        max=QVG_ITERS_RANGE[2],
                        tooltip="QVG only: at most this many k-means iterations per stage (QVG's scripts use 2; "
                        "stops early when fewer than 0.01% of the tokens change cluster).",
                    )
                ),
                # precision by age (optional, after the others: older prompts run with every chunk at one precision)
                Combo(
                    "recent_chunks_bits",
                    options=list(TIER_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["recent_chunks_bits"],
                    optional=True,
                    tooltip="Precision by age: keep the newest recent_chunks cached chunks at 3, 4 or 8 bits; older "
                    "chunks are requantized to key_bits / value_bits when they age out (they carry less of the "
                    "attention). 'off' keeps every chunk at the bits above. The planner shows the average bits. "
                    "recent_chunks_key_bits can set the keys apart (e.g. values only).",
                ),
                io.Int.Input(
                    "recent_chunks",
                    optional=True,
                    default=RECENT_CHUNKS_RANGE[0],
                    min=RECENT_CHUNKS_RANGE[1],
                    max=RECENT_CHUNKS_RANGE[2],
                    tooltip="With recent_chunks_bits on: how many of the newest cached chunks keep those bits "
                    "(ignored when it is off).",
                ),
                Combo(
                    "sink_bits",
                    options=list(TIER_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["sink_bits"],
                    optional=True,
                    tooltip="Precision by age: keep the attention-sink chunks (the sampler's sink_chunks) at 3, 4 or "
                    "8 bits for good. 'off' stores them like any other chunk. No effect without a sink.",
                ),
                Combo(
                    "recent_chunks_key_bits",
                    options=list(RECENT_KEY_BITS_CHOICES),
                    default=QUANTIZE_DEFAULTS["recent_chunks_key_bits"],
                    optional=True,
                    tooltip="With recent_chunks_bits on: the newest chunks' keys. 'same' keeps them at "
                    "recent_chunks_bits; 'off' leaves them at key_bits, so only the values are tiered (on the "
                    "tiny model the values carry most of the gain for fewer bits: docs/tiers.md); or pick their "
                    "bits. Ignored when recent_chunks_bits is off.",
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
        )
        m = model.clone()
        set_config(m, config)
        attach(m)
        logger.info("jensen_kv: KV cache %s", config.describe())
        return io.NodeOutput(m)
