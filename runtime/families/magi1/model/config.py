"""The architecture of a MAGI-1 DiT (Sand AI, github:SandAI-org/MAGI-1), as ``example/*/*_config.json`` state it.

The published models (``model_config`` of ``example/4.5B/4.5B_*_config.json`` and ``example/24B/24B_*_config.json``):

======================  ==========  ==========
field                   4.5B        24B
======================  ==========  ==========
num_layers              34          48
hidden_size             3072        6144
ffn_hidden_size         12288       16384
num_attention_heads     24          48
num_query_groups (K/V)  8           8
kv_channels (head_dim)  128         128
gated_linear_unit       false       true (SwiGLU: fc1 is 2 x ffn wide)
half_channel_vae        false       true (in/out 32 channels: the 16-channel latent is fed twice)
x_rescale_factor        1           0.1
======================  ==========  ==========

Both: patch 2 x 2 (t_patch 1), caption 4096 wide (T5-XXL) and 800 tokens long, cond_hidden_ratio 0.25 (the
AdaLN condition is hidden / 4 wide), LayerNorm eps 1e-6 with zero-centred gammas (``apply_layernorm_1p``).
:func:`config_from_shapes` reads a state dict's shapes back into a :class:`MagiConfig` (the loader and the
converter use it); the two facts shapes cannot tell (``x_rescale_factor``, base vs distill) come from the
file's metadata or from which published model the shapes are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

#: the reference's RoPE: ``LearnableRotaryEmbeddingCat(hidden // heads, in_pixels=False)``: head_dim // 8 bands
#: per axis (t, h, w), so 3 * 2 * head_dim // 8 = 3/4 of each head's channels are rotated (96 of 128)
ROPE_AXES = 3
#: the reference hard-codes this split in ``TransformerLayer.attn_linear_proj`` (``hn=8``: TP-8 training)
PROJ_GROUPS = 8
#: sinusoidal width of the timestep embedding (``TimestepEmbedder.frequency_embedding_size``)
FREQ_DIM = 256


class ConfigError(ValueError):
    """A MAGI-1 architecture that is inconsistent or not one this implementation runs."""


@dataclass(frozen=True)
class MagiScales:
    """The reference's norms, input scale and conditioning widths (as ratios of ``hidden_size``): the part of a
    MAGI-1 DiT's architecture that is a number, not a size. Both published models: LayerNorm eps 1e-6 with
    zero-centred gammas, the AdaLN condition hidden / 4 wide, cross-attention and gates as wide as hidden; the 24B
    scales its input by 0.1."""

    layernorm_epsilon: float = 1e-6
    apply_layernorm_1p: bool = True
    x_rescale_factor: float = 1.0
    cond_hidden_ratio: float = 0.25
    xattn_cond_hidden_ratio: float = 1.0
    cond_gating_ratio: float = 1.0

    def __post_init__(self) -> None:
        for name in ("cond_hidden_ratio", "xattn_cond_hidden_ratio", "cond_gating_ratio", "x_rescale_factor"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be positive")


#: the reference's ``ModelConfig`` fields that :class:`MagiScales` holds (read as :class:`MagiConfig` attributes too)
SCALE_FIELDS = tuple(f.name for f in fields(MagiScales))


@dataclass(frozen=True)
class MagiConfig:
    """One MAGI-1 DiT's architecture (the reference's ``ModelConfig`` fields this implementation uses): its sizes,
    and its norms, input scale and conditioning ratios in ``scales`` (each read as an attribute of the config too,
    ``cfg.x_rescale_factor``). :meth:`of` takes the reference's flat fields; :meth:`to_json` gives them back."""

    num_layers: int = 34
    hidden_size: int = 3072
    ffn_hidden_size: int = 12288
    num_attention_heads: int = 24
    num_query_groups: int = 8
    kv_channels: int = 128
    half_channel_vae: bool = False
    patch_size: int = 2
    t_patch_size: int = 1
    in_channels: int = 16
    out_channels: int = 16
    caption_channels: int = 4096
    caption_max_length: int = 800
    gated_linear_unit: bool = False
    #: the distilled checkpoints add a step-size embedding to the timestep embedding (engine_config.distill)
    distill: bool = False
    scales: MagiScales = MagiScales()

    def __post_init__(self) -> None:
        ints = (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "patch_size",
            "t_patch_size",
            "in_channels",
            "out_channels",
            "caption_channels",
            "caption_max_length",
        )
        for name in ints:
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ConfigError(f"{name}={v!r} must be a positive integer")
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_query_groups "
                f"{self.num_query_groups} (each K/V group serves the same number of query heads)"
            )
        if self.hidden_size != self.num_attention_heads * self.kv_channels:
            raise ConfigError(
                f"hidden_size {self.hidden_size} != num_attention_heads {self.num_attention_heads} x kv_channels "
                f"{self.kv_channels}: the reference builds its RoPE for hidden_size // num_attention_heads channels"
            )
        if self.kv_channels % 8:
            raise ConfigError(f"kv_channels {self.kv_channels} must be a multiple of 8 (head_dim // 8 RoPE bands)")
        if (2 * self.hidden_size) % (2 * PROJ_GROUPS):
            raise ConfigError(
                f"2 x hidden_size {2 * self.hidden_size} must split into {2 * PROJ_GROUPS} equal parts (the "
                "reference's fixed 8-way reordering before linear_proj)"
            )
        if self.half_channel_vae and (self.in_channels % 2 or self.out_channels % 2):
            raise ConfigError(
                f"half_channel_vae feeds the latent twice: in_channels {self.in_channels} and out_channels "
                f"{self.out_channels} must be even"
            )
        if not isinstance(self.scales, MagiScales):
            raise ConfigError(f"scales must be a MagiScales, got {type(self.scales).__name__}")

    @classmethod
    def of(cls, **flat) -> MagiConfig:
        """The config of the reference's flat fields (``x_rescale_factor=0.1, num_layers=48, ...``)."""
        scales = {k: flat.pop(k) for k in SCALE_FIELDS if k in flat}
        return cls(**flat, scales=MagiScales(**scales))

    def with_(self, **flat) -> MagiConfig:
        """This config with some of the reference's flat fields changed."""
        return MagiConfig.of(**{**self.flat(), **flat})

    def flat(self) -> dict:
        """The reference's flat fields of this config."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "scales"}
        return {**out, **asdict(self.scales)}

    # ------------------------------------------------------------------ the scales, read as the reference names them
    @property
    def layernorm_epsilon(self) -> float:
        return self.scales.layernorm_epsilon

    @property
    def apply_layernorm_1p(self) -> bool:
        return self.scales.apply_layernorm_1p

    @property
    def x_rescale_factor(self) -> float:
        return self.scales.x_rescale_factor

    @property
    def cond_hidden_ratio(self) -> float:
        return self.scales.cond_hidden_ratio

    @property
    def xattn_cond_hidden_ratio(self) -> float:
        return self.scales.xattn_cond_hidden_ratio

    @property
    def cond_gating_ratio(self) -> float:
        return self.scales.cond_gating_ratio

        for name in ("cond_hidden_ratio", "xattn_cond_hidden_ratio", "cond_gating_ratio", "x_rescale_factor"):
            if not float(getattr(self, name)) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be positive")

    # ------------------------------------------------------------------ derived sizes
    @property
    def head_dim(self) -> int:
        return self.kv_channels

    @property
    def cond_dim(self) -> int:
        """Width of the AdaLN condition (timestep + caption token): hidden * cond_hidden_ratio."""
        return int(self.hidden_size * self.cond_hidden_ratio)

    @property
    def xattn_dim(self) -> int:
        return int(self.hidden_size * self.xattn_cond_hidden_ratio)

    @property
    def rope_bands(self) -> int:
        """Learned frequencies per axis (``rope.bands`` has this many entries)."""
        return self.kv_channels // 8

    @property
    def rotary_dim(self) -> int:
        """Channels of each head the RoPE rotates (96 of 128): sin and cos of 3 axes x head_dim // 8 bands."""
        return 2 * ROPE_AXES * self.rope_bands

    @property
    def latent_channels(self) -> int:
        """Channels of the VAE latent the model takes (16 for both published sizes)."""
        return self.in_channels // 2 if self.half_channel_vae else self.in_channels

    def to_json(self) -> str:
        return json.dumps(self.flat(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MagiConfig:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"the MAGI-1 config is not JSON ({e})") from None
        if not isinstance(data, dict):
            raise ConfigError("the MAGI-1 config must be a JSON object")
        known = set(cls().flat())
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown MAGI-1 config fields {unknown}; known: {sorted(known)}")
        return cls.of(**data)

    @classmethod
    def from_reference_json(cls, data: dict, distill: bool | None = None) -> MagiConfig:
        """A config from the reference's ``example/*/*_config.json`` (its ``model_config`` and ``engine_config``)."""
        model = data.get("model_config", data)
        known = set(cls().flat()) - {"distill"}
        kwargs = {k: v for k, v in model.items() if k in known}
        engine = data.get("engine_config", {})
        if engine.get("fp8_quant"):
            raise ConfigError(FP8_QUANT_REFUSAL)
        kwargs["distill"] = bool(engine.get("distill", False)) if distill is None else distill
        return cls.of(**kwargs)


FP8_QUANT_REFUSAL = (
    "Sand AI's distill_quant checkpoints store per-tensor fp8 weights with input/weight scales that only "
    "flashinfer's fp8 matmul (bmm_fp8) evaluates; this implementation does not reproduce it. Use the "
    "non-quantized distill checkpoint (ckpt/magi/4.5B_distill or 24B_distill) and pick weight_dtype "
    "fp8_e4m3fn in the loader for ComfyUI's own fp8 storage"
)

#: the published DiTs, by (hidden_size, num_layers)
PUBLISHED: dict[str, MagiConfig] = {
    "4.5B": MagiConfig(),
    "24B": MagiConfig.of(
        num_layers=48,
        hidden_size=6144,
        ffn_hidden_size=16384,
        num_attention_heads=48,
        num_query_groups=8,
        kv_channels=128,
        x_rescale_factor=0.1,
        half_channel_vae=True,
        in_channels=32,
        out_channels=32,
        gated_linear_unit=True,
    ),
}

#: a tiny MAGI-1 for tests: 2 layers, 4 query heads over 2 K/V groups of 64, 16 latent channels, a 32-wide
#: caption of 800 tokens (the reference hard-codes 800 where it pads special tokens)
TINY = MagiConfig(
    num_layers=2,
    hidden_size=256,
    ffn_hidden_size=512,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=64,
    caption_channels=32,
    caption_max_length=800,
)
#: the tiny model with the 24B's differences: SwiGLU, the doubled 16-channel latent and the 0.1 input scale
TINY_24B_STYLE = TINY.with_(
    gated_linear_unit=True, half_channel_vae=True, in_channels=32, out_channels=32, x_rescale_factor=0.1
)


def config_from_shapes(
    shapes: dict[str, tuple[int, ...]],
    distill: bool = False,
    x_rescale_factor: float | None = None,
    half_channel_vae: bool | None = None,
) -> MagiConfig:
    """The architecture a MAGI-1 state dict's shapes describe (keys as the reference names them).

    Shapes cannot tell ``x_rescale_factor`` and ``half_channel_vae``: given, else those of the published model
    of these sizes (:data:`PUBLISHED`: the 24B has 0.1 and True), else 1.0 and False."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in shapes:
            raise ConfigError(f"not a MAGI-1 DiT: {key} is missing")
        return tuple(int(x) for x in shapes[key])

    xw = shape("x_embedder.weight")
    if len(xw) != 5 or xw[3] != xw[4]:
        raise ConfigError(f"x_embedder.weight has shape {xw}; a MAGI-1 DiT's is (hidden, channels, t_patch, p, p)")
    hidden, in_ch, tp, p, _ = xw
    layer_ids = set()
    for k in shapes:
        if k.startswith("videodit_blocks.layers."):
            idx = k.split(".")[2]
            if not (idx.isdigit() and idx.isascii() and len(idx) <= 4):
                raise ConfigError(f"layer numbers must be integers: found videodit_blocks.layers.{idx[:20]!r}")
            layer_ids.add(int(idx))
    if not layer_ids:
        raise ConfigError("not a MAGI-1 DiT: no videodit_blocks.layers.N keys")
    layers = max(layer_ids) + 1
    gaps = sorted(set(range(layers)) - layer_ids)
    if gaps:
        raise ConfigError(f"an incomplete MAGI-1 DiT: layers {gaps[:5]} of 0..{layers - 1} are missing")
    pre = "videodit_blocks.layers.0."
    head_dim = shape(pre + "self_attention.q_layernorm.weight")[0]
    q_out = shape(pre + "self_attention.linear_qkv.q.weight")[0]
    k_out = shape(pre + "self_attention.linear_qkv.k.weight")[0]
    fc1 = shape(pre + "mlp.linear_fc1.weight")[0]
    ffn = shape(pre + "mlp.linear_fc2.weight")[1]
    cond = shape("t_embedder.mlp.0.weight")[0]
    xattn = shape("y_embedder.y_proj_xattn.0.weight")[0]
    gate_out = shape(pre + "ada_modulate_layer.proj.0.weight")[0]
    null = shape("y_embedder.null_caption_embedding")
    out_ch = shape("final_linear.linear.weight")[0] // (p * p * tp)
    if len(null) != 2:
        raise ConfigError(f"y_embedder.null_caption_embedding has shape {null}; expected (tokens, caption width)")
    if q_out % head_dim or k_out % head_dim:
        raise ConfigError(f"q ({q_out}) / k ({k_out}) projections are not whole heads of {head_dim}")
    if fc1 not in (ffn, 2 * ffn):
        raise ConfigError(f"mlp.linear_fc1 has {fc1} outputs for an ffn of {ffn}: neither GELU ({ffn}) nor SwiGLU")
    published = next(
        (c for c in PUBLISHED.values() if (c.hidden_size, c.num_layers, c.in_channels) == (hidden, layers, in_ch)),
        None,
    )
    if x_rescale_factor is None:
        x_rescale_factor = published.x_rescale_factor if published is not None else 1.0
    if half_channel_vae is None:
        half_channel_vae = published.half_channel_vae if published is not None else False
    return MagiConfig.of(
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=q_out // head_dim,
        num_query_groups=k_out // head_dim,
        kv_channels=head_dim,
        x_rescale_factor=float(x_rescale_factor),
        half_channel_vae=bool(half_channel_vae),
        patch_size=p,
        t_patch_size=tp,
        in_channels=in_ch,
        out_channels=out_ch,
        cond_hidden_ratio=cond / hidden,
        caption_channels=null[1],
        caption_max_length=null[0],
        xattn_cond_hidden_ratio=xattn / hidden,
        cond_gating_ratio=gate_out / (2 * hidden),
        gated_linear_unit=fc1 == 2 * ffn,
        distill=distill,
    )


def expected_shapes(cfg: MagiConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a MAGI-1 DiT of ``cfg`` and its shape, with the reference's names."""
    h, hd = cfg.hidden_size, cfg.kv_channels
    q_out, kv_out = cfg.num_attention_heads * hd, cfg.num_query_groups * hd
    p, tp = cfg.patch_size, cfg.t_patch_size
    fc1 = 2 * cfg.ffn_hidden_size if cfg.gated_linear_unit else cfg.ffn_hidden_size
    shapes = {
        "x_embedder.weight": (h, cfg.in_channels, tp, p, p),
        "t_embedder.mlp.0.weight": (cfg.cond_dim, FREQ_DIM),
        "t_embedder.mlp.0.bias": (cfg.cond_dim,),
        "t_embedder.mlp.2.weight": (cfg.cond_dim, cfg.cond_dim),
        "t_embedder.mlp.2.bias": (cfg.cond_dim,),
        "y_embedder.y_proj_xattn.0.weight": (cfg.xattn_dim, cfg.caption_channels),
        "y_embedder.y_proj_xattn.0.bias": (cfg.xattn_dim,),
        "y_embedder.y_proj_adaln.0.weight": (cfg.cond_dim, cfg.caption_channels),
        "y_embedder.y_proj_adaln.0.bias": (cfg.cond_dim,),
        "y_embedder.null_caption_embedding": (cfg.caption_max_length, cfg.caption_channels),
        "rope.bands": (cfg.rope_bands,),
        "videodit_blocks.final_layernorm.weight": (h,),
        "videodit_blocks.final_layernorm.bias": (h,),
        "final_linear.linear.weight": (p * p * tp * cfg.out_channels, h),
    }
    gate = int(h * cfg.cond_gating_ratio * 2)
    layer = {
        "ada_modulate_layer.proj.0.weight": (gate, cfg.cond_dim),
        "ada_modulate_layer.proj.0.bias": (gate,),
        "self_attention.linear_qkv.layer_norm.weight": (h,),
        "self_attention.linear_qkv.layer_norm.bias": (h,),
        "self_attention.linear_qkv.q.weight": (q_out, h),
        "self_attention.linear_qkv.qx.weight": (q_out, h),
        "self_attention.linear_qkv.k.weight": (kv_out, h),
        "self_attention.linear_qkv.v.weight": (kv_out, h),
        "self_attention.linear_kv_xattn.weight": (2 * kv_out, cfg.xattn_dim),
        "self_attention.linear_proj.weight": (h, 2 * q_out),
        "self_attn_post_norm.weight": (h,),
        "self_attn_post_norm.bias": (h,),
        "mlp.layer_norm.weight": (h,),
        "mlp.layer_norm.bias": (h,),
        "mlp.linear_fc1.weight": (fc1, h),
        "mlp.linear_fc2.weight": (h, cfg.ffn_hidden_size),
        "mlp_post_norm.weight": (h,),
        "mlp_post_norm.bias": (h,),
    }
    for norm in ("q_layernorm", "k_layernorm", "q_layernorm_xattn", "k_layernorm_xattn"):
        layer[f"self_attention.{norm}.weight"] = (hd,)
        layer[f"self_attention.{norm}.bias"] = (hd,)
    for i in range(cfg.num_layers):
        shapes.update({f"videodit_blocks.layers.{i}.{k}": v for k, v in layer.items()})
    return shapes
