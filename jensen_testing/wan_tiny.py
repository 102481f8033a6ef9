"""Tiny Wan 2.1 text-to-video models built from ComfyUI's own classes, for tests and benchmarks.

Needs ComfyUI importable in-process (``jensen_testing.comfyui.setup_inprocess_comfyui()`` first).
Weights are random: normal(0, std) for every parameter, except norm scales and the blocks' residual
gates, which are 1 as in a trained model. With std-0.02 RMSNorm scales the queries would be ~0
(uniform attention), and with std-0.02 gates self-attention would barely reach the output - a
test comparing outputs would then not see attention errors.
"""

from __future__ import annotations

import torch

#: the smallest Wan that exercises everything: 2 heads of 32, 2 layers (in-process tests)
TINY = dict(dim=64, ffn_dim=128, num_heads=2, num_layers=2, text_dim=32, text_len=16)
#: a Wan that ComfyUI's model_detection recognises from a checkpoint: dim 128 -> 1 head of 128, 4096-wide text
DETECTABLE = dict(dim=128, ffn_dim=256, num_heads=1, num_layers=2, text_dim=4096, text_len=512)


def unet_config(dim: int, ffn_dim: int, num_heads: int, num_layers: int, text_dim: int, text_len: int) -> dict:
    return dict(
        dim=dim,
        ffn_dim=ffn_dim,
        freq_dim=256,
        text_dim=text_dim,
        text_len=text_len,
        in_dim=16,
        out_dim=16,
        num_heads=num_heads,
        num_layers=num_layers,
        patch_size=(1, 2, 2),
        window_size=(-1, -1),
        qk_norm=True,
        cross_attn_norm=True,
        eps=1e-6,
        image_model="wan2.1",
        model_type="t2v",
    )


def init_weights(module: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.split(".")[-2:-1] and name.split(".")[-2].startswith("norm") and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.copy_((torch.randn(p.shape, generator=g) * std).to(p.dtype))
            if name.startswith("blocks.") and name.endswith(".modulation"):
                p[:, 2] += 1.0  # self-attention gate
                p[:, 5] += 1.0  # feed-forward gate


def build_base_model(seed: int = 0, dtype: torch.dtype = torch.float32, **arch):
    """A ``comfy.model_base.WAN21`` with random weights."""
    import comfy.supported_models

    cfg = unet_config(**{**TINY, **arch})
    model_config = comfy.supported_models.WAN21_T2V(cfg)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({})
    init_weights(model.diffusion_model, seed)
    return model.eval()


def build_patcher(seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", **arch):
    """A ModelPatcher around a tiny random Wan (what UNETLoader would return)."""
    import comfy.model_patcher

    model = build_base_model(seed, dtype, **arch)
    dev = torch.device(device)
    return comfy.model_patcher.ModelPatcher(model, load_device=dev, offload_device=dev)


def state_dict_for_file(seed: int = 0, **arch) -> dict[str, torch.Tensor]:
    """The diffusion-model weights as a checkpoint file holds them (keys like ``blocks.0.self_attn.q.weight``)."""
    model = build_base_model(seed, torch.float32, **{**DETECTABLE, **arch})
    return {k: v.detach().clone().contiguous() for k, v in model.diffusion_model.state_dict().items()}


def write_file(path, seed: int = 0, *, causal: bool = False) -> None:
    """Write the checkpoint of :func:`state_dict_for_file` (float32) to ``path``, as UNETLoader reads it (ComfyUI
    detects it as wan2.1); ``causal``: with the flag core's SamplerARVideo (v0.27+) looks for. ComfyUI must be
    importable (``jensen_testing.comfyui.setup_inprocess_comfyui``)."""
    import json

    from safetensors.torch import save_file

    meta = {"config": json.dumps({"transformer": {"causal_ar": True}})} if causal else None
    sd = state_dict_for_file(seed=seed)
    save_file({k: v.to(torch.float32) for k, v in sd.items()}, str(path), metadata=meta)


def conditioning(seed: int, tokens: int, width: int):
    """A CONDITIONING list with one random text embedding of shape (1, tokens, width)."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(1, tokens, width, generator=g), {}]]


def video_latent(frames: int, height: int = 8, width: int = 8, batch: int = 1) -> dict:
    """An empty Wan latent with ``frames`` latent frames (height/width in latent pixels)."""
    return {"samples": torch.zeros(batch, 16, frames, height, width)}


def run(loop, model, positive, negative, frames: int, sampler, sigmas, *, seed: int = 0, cfg: float = 1.0, **options):
    """A Chunked AR run (``loop``: the pack's ``runtime.chunk_loop``) over an empty latent of ``frames`` latent
    frames (:func:`video_latent`), the tests' usual seed 0 and cfg 1; ``options`` as ``run_chunked_ar`` takes them
    (``chunk_frames=...``, ``window_chunks=...``)."""
    return loop.run_chunked_ar(
        model, positive, negative, video_latent(frames), seed=seed, cfg=cfg, sampler=sampler, sigmas=sigmas, **options
    )


def build_vae(seed: int = 0, dim: int = 16):
    """ComfyUI's ``VAE`` around a Wan 2.1 VAE (``comfy.ldm.wan.vae.WanVAE``, 16 latent channels, 8x spatial and 4x
    temporal compression) of width ``dim`` (the released one's is 96; v0.3.64's VAE loader builds width 96 whatever
    the file holds, so there it is 96) with random weights, loaded from a state dict as VAELoader loads a file. Norm
    scales are 1, conv weights normal / sqrt(fan_in) (the output head's a quarter of that, so that few pixels reach
    ComfyUI's clamp to [0, 1]), biases 0.1 normal."""
    import inspect

    import comfy.ldm.wan.vae
    import comfy.sd

    if "decoder.head.0.gamma" not in inspect.getsource(comfy.sd.VAE.__init__):
        dim = 96
    arch = dict(dim=dim, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[])
    model = comfy.ldm.wan.vae.WanVAE(temperal_downsample=[False, True, True], dropout=0.0, **arch)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, p in model.state_dict().items():
        if p.dim() >= 2:
            sd[name] = torch.randn(p.shape, generator=g) / max(1, p[0].numel()) ** 0.5
            if name.startswith("decoder.head."):
                sd[name] *= 0.25
        elif name.endswith("gamma"):
            sd[name] = torch.ones(p.shape)
        else:
            sd[name] = 0.1 * torch.randn(p.shape, generator=g)
    vae = comfy.sd.VAE(sd=sd)
    vae.first_stage_model.float()
    vae.vae_dtype = torch.float32
    return vae
