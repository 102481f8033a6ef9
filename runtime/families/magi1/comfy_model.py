"""MAGI-1 as a ComfyUI MODEL: the pack's pure-torch DiT (``runtime/families/magi1/model/``) inside ``comfy.model_base.BaseModel``.

- :class:`Magi1ModelConfig` (a ``supported_models_base.BASE``) carries the architecture and the latent format
  (16 channels, 3-D, 8 x 8 pixels and 4 frames per latent pixel, scale 0.18215: the DiT works on
  ``vae_latent * 0.18215``, as the reference's ``encode_prefix_video`` / ``decode_chunk`` scale it);
- :class:`Magi1Model` (a ``BaseModel``, flow-matching model type) builds :class:`ComfyMagiDiT` with the
  operations ComfyUI picks for the weight dtype (``comfy.ops``), so ModelPatcher, memory management,
  LoRA-style weight patches and fp8 storage (``weight_dtype``) work as for core models;
- :func:`load_magi1` reads a file or Sand AI's folder (``runtime.families.magi1.model.checkpoint``) and returns a ModelPatcher the
  way ``comfy.sd.load_diffusion_model_state_dict`` does.

The DiT's ``forward(x, timestep, context)`` (what ComfyUI's KSampler calls) denoises all chunks of the latent
together at one noise level with block-causal attention, which is *not* MAGI-1's pipeline: sample MAGI-1 with
its chunk sampler (``runtime.families.magi1.model.sampler``, on :func:`diffusion_model` of the patcher).

ComfyUI is imported inside functions only; the classes that subclass its types are built on first use.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from .model import checkpoint as ck
from .model.attention import ChunkPlan
from .model.config import MagiConfig
from .model.dit import Forward, MagiDiT

logger = logging.getLogger("jensen_kv")

IMAGE_MODEL = "magi1"
#: the VAE latent -> DiT latent scale (``runtime_config.scale_factor``)
SCALE_FACTOR = 0.18215
#: weight_dtype choices of the loader -> torch dtype (None: ComfyUI picks, as UNETLoader's "default")
WEIGHT_DTYPES = {"default": None, "fp8_e4m3fn": torch.float8_e4m3fn, "bf16": torch.bfloat16}
VARIANTS = ("auto", "base", "distill")
#: latent frames per chunk in the reference (24 video frames)
CHUNK_FRAMES = 6


class ComfyMagiDiT(MagiDiT):
    """The DiT as ``BaseModel`` builds it (``unet_model(**unet_config, device=, operations=)``), with a
    KSampler-shaped ``forward``. ``special_tokens``: the caption's special tokens found in the file."""

    def __init__(
        self, magi1_config: MagiConfig, image_model=None, dtype=None, device=None, operations=None, **_ignored
    ):
        super().__init__(magi1_config, operations=operations, device=device, dtype=dtype)
        self.special_tokens: dict[str, torch.Tensor] = {}

    def forward(self, x, timestep, context=None, transformer_options=None, **kwargs):
        """ComfyUI's flow convention: ``timestep`` is sigma (1 noise .. 0 clean), the output ``noise - clean``.
        All chunks of ``x`` share sigma and read every earlier chunk (block-causal, no K/V buffer)."""
        n, _, frames, h, w = x.shape
        cw = CHUNK_FRAMES if frames % CHUNK_FRAMES == 0 else frames
        chunks = frames // cw
        sigma = timestep.float().reshape(-1)[:n].reshape(n, 1).expand(n, chunks)
        ctx = context if context is not None else self.null_caption()[None].expand(n, -1, -1)
        captions = [ctx[b] for b in range(n) for _ in range(chunks)]
        spec = Forward(
            t=1 - sigma,
            captions=captions,
            caption_dropped=torch.tensor([context is None]),
            first_frame=0,
            plan=ChunkPlan.block_causal(cw // self.config.t_patch_size * self.tokens_per_frame(h, w), chunks),
            distill_dt=8.0 if self.config.distill else None,  # the 16-step constant
        )
        return -self.forward_chunks(x, spec).to(x.dtype)


@functools.cache
def _classes():
    import comfy.latent_formats
    import comfy.model_base
    import comfy.supported_models_base

    class Magi1LatentFormat(comfy.latent_formats.LatentFormat):
        latent_channels = 16
        latent_dimensions = 3
        scale_factor = SCALE_FACTOR
        spacial_downscale_ratio = 8
        temporal_downscale_ratio = 4

    class Magi1Model(comfy.model_base.BaseModel):
        def __init__(self, model_config, model_type=comfy.model_base.ModelType.FLOW, device=None):
            super().__init__(model_config, model_type, device=device, unet_model=ComfyMagiDiT)
            dm = self.diffusion_model
            dm.compute_dtype = self.manual_cast_dtype or model_config.unet_config.get("dtype") or torch.float32
            if dm.compute_dtype not in (torch.float32, torch.float16, torch.bfloat16):
                dm.compute_dtype = torch.bfloat16

    class Magi1ModelConfig(comfy.supported_models_base.BASE):
        unet_config = {"image_model": IMAGE_MODEL}
        unet_extra_config = {}
        sampling_settings = {"shift": 3.0, "multiplier": 1.0}
        latent_format = Magi1LatentFormat
        supported_inference_dtypes = [torch.bfloat16, torch.float32]
        memory_usage_factor = 1.0

        def __init__(self, magi: MagiConfig):
            super().__init__({"image_model": IMAGE_MODEL, "magi1_config": magi})

        def get_model(self, state_dict, prefix="", device=None):
            return Magi1Model(self, device=device)

        def model_type(self, state_dict, prefix=""):
            return comfy.model_base.ModelType.FLOW

    return Magi1LatentFormat, Magi1Model, Magi1ModelConfig


def latent_format():
    return _classes()[0]()


def is_magi1(model_patcher) -> bool:
    return isinstance(getattr(getattr(model_patcher, "model", None), "diffusion_model", None), ComfyMagiDiT)


def load_magi1(path: str | os.PathLike, weight_dtype: str = "default", variant: str = "auto"):
    """A ModelPatcher of the MAGI-1 DiT at ``path`` (a ``.safetensors`` file, or a folder with an index and shards
    or a ``model.safetensors``), built like ``comfy.sd.load_diffusion_model_state_dict`` builds core models.
    Raises :class:`runtime.families.magi1.model.checkpoint.CheckpointError` (and its subclasses) naming what is wrong."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.utils

    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype {weight_dtype!r}: use one of {list(WEIGHT_DTYPES)}")
    ckpt = ck.inspect_dit(path, variant)
    sd = ckpt.state_dict()
    special = ckpt.special()
    _, _, config_class = _classes()
    model_config = config_class(ckpt.config)
    load_device = mm.get_torch_device()
    offload_device = mm.unet_offload_device()
    dtype = WEIGHT_DTYPES[weight_dtype]
    if dtype is None:
        dtype = mm.unet_dtype(
            model_params=comfy.utils.calculate_parameters(sd),
            supported_dtypes=list(model_config.supported_inference_dtypes),
            weight_dtype=comfy.utils.weight_dtype(sd),
        )
    manual_cast = mm.unet_manual_cast(dtype, load_device, model_config.supported_inference_dtypes)
    model_config.set_inference_dtype(dtype, manual_cast)
    model = model_config.get_model(sd, "")
    model = model.to(offload_device)
    model.load_model_weights(sd, "")
    model.diffusion_model.special_tokens = special
    # which variant, and what said so (file metadata, path name, the node's variant): the sampler's report names it
    model.diffusion_model.variant_from = ckpt.variant_from
    logger.info(
        "jensen_kv: loaded MAGI-1 (%d layers, hidden %d, %s from %s, weights %s, compute %s) from %s",
        ckpt.config.num_layers,
        ckpt.config.hidden_size,
        "distill" if ckpt.config.distill else "base",
        ckpt.variant_from,
        dtype,
        model.diffusion_model.compute_dtype,
        path,
    )
    return comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)


def diffusion_model(model_patcher):
    """The patcher's DiT, loaded on its device with the patches applied (what the chunk sampler calls)."""
    import comfy.model_management as mm

    if not is_magi1(model_patcher):
        raise ValueError(
            f"not a MAGI-1 MODEL ({type(getattr(model_patcher, 'model', None)).__name__}); load it with Load MAGI-1 Model"
        )
    mm.load_models_gpu([model_patcher])
    return model_patcher.model.diffusion_model
