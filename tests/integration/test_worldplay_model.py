"""HY-WorldPlay on ComfyUI's HunyuanVideo 1.5 (runtime/families/worldplay): the loader against the real key list,
FP8, refusals; the model's forwards and a 2-chunk AR rollout through the injectable attention against the
reference's outputs on the same tiny weights (tests/data/worldplay/, see its README).

Needs ComfyUI's HunyuanVideo 1.5 (v0.27+): marked ``hunyuan15``, deselected on v0.3.64 (never skipped).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import comfyui as support_comfyui

from jensen_testing.numerics import assert_within_rounding, relative_error
from jensen_testing.worldplay_tiny import REAL_KEYS_SMALL, TINY, reference_bound, tiny_state_dict

pytestmark = pytest.mark.hunyuan15

DATA = Path(__file__).resolve().parents[1] / "data" / "worldplay"
CPU = torch.device("cpu")


def pack_module(name: str):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


@pytest.fixture(scope="module")
def wp(pack):
    return pack_module("runtime.families.worldplay.comfy_model"), pack_module("runtime.families.worldplay.loader")


@pytest.fixture(scope="module")
def tiny_model(wp):
    _, loader = wp
    patcher = loader.worldplay_from_state_dict(tiny_state_dict(TINY), load_device=CPU, offload_device=CPU)
    return patcher.model.diffusion_model


@pytest.fixture(scope="module")
def ref_inputs():
    return load_file(DATA / "forward.safetensors")


@pytest.fixture(scope="module")
def trajectory(pack, ref_inputs):
    traj = pack_module("runtime.families.worldplay.model.trajectory").parse_trajectory("w-3, right-4")
    torch.testing.assert_close(traj.w2c, ref_inputs["w2c"], rtol=0, atol=1e-12)
    torch.testing.assert_close(traj.intrinsics, ref_inputs["Ks"], rtol=0, atol=1e-15)
    assert traj.actions.tolist() == ref_inputs["action"].tolist()
    return traj


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def _reference_forward(dm, model_mod, ref_inputs, trajectory):
    """One forward of the diffusion model ``dm`` on the reference's inputs (noise and image condition, per-frame
    timesteps, both text streams, SigLIP features, the trajectory), through ComfyUI's model call."""
    call = model_mod.WorldPlayCall(timesteps=ref_inputs["t_frames"][None])
    return dm(
        torch.cat([ref_inputs["noise"], ref_inputs["cond"]], dim=1),
        ref_inputs["t_frames"][:1],
        ref_inputs["text"],
        txt_byt5=ref_inputs["byt5"],
        clip_fea=ref_inputs["vision"],
        transformer_options={model_mod.CALL_KEY: call},
        worldplay_trajectory=trajectory,
    )


# ----------------------------------------------------------------------------------------------------- the loader
def test_the_real_key_list_loads_with_nothing_missing_or_left_over(wp, tmp_path):
    """A file with the released checkpoint's 1,905 key names (54 double blocks, ByT5, SigLIP) at a tiny width,
    through the loader's file path: every parameter of the model comes from the file."""
    model_mod, loader = wp
    keys = pack_module("runtime.families.worldplay.model.keys")
    sd = tiny_state_dict(REAL_KEYS_SMALL, seed=3, dtype=torch.bfloat16)
    assert sorted(sd) == keys.official_keys(REAL_KEYS_SMALL) and len(sd) == 1905
    path = tmp_path / "model.safetensors"
    save_file(sd, str(path))
    patcher = loader.load_worldplay(str(path), load_device=CPU, offload_device=CPU)
    dm = patcher.model.diffusion_model
    assert model_mod.is_worldplay(patcher)
    assert len(dm.double_blocks) == 54 and len(dm.single_blocks) == 0
    state = dm.state_dict()
    assert len(state) == 1905 - 54 * 2 * 2 * 2  # q, k, v fused into qkv for img and txt, weights and biases
    blk = dm.double_blocks[41]
    fused = torch.cat([sd[f"double_blocks.41.img_attn_{p}.weight"] for p in "qkv"])
    torch.testing.assert_close(blk.img_attn.qkv.weight.to(torch.bfloat16), fused, rtol=0, atol=0)
    torch.testing.assert_close(
        blk.img_attn_prope_proj.bias.to(torch.bfloat16), sd["double_blocks.41.img_attn_prope_proj.bias"], rtol=0, atol=0
    )
    torch.testing.assert_close(
        dm.action_in.in_layer.weight.to(torch.bfloat16), sd["action_in.mlp.0.weight"], rtol=0, atol=0
    )
    assert "54 double blocks, width 32, 1 heads x 32" in loader.describe(patcher)


def test_fp8_weights_load_and_run_close_to_full_precision(wp, tiny_model, ref_inputs, trajectory):
    """weight_dtype fp8_e4m3fn stores every linear weight in FP8 (manual cast to float32 on the CPU). A file stored
    in FP8 loads too: as FP8 with fp8_e4m3fn, and with default in what ComfyUI picks on the device (float32 on the
    CPU, holding the FP8 values). The forward stays within FP8's rounding of the float32 model's."""
    model_mod, loader = wp
    fp8 = loader.worldplay_from_state_dict(tiny_state_dict(TINY), "fp8_e4m3fn", load_device=CPU, offload_device=CPU)
    dm8 = fp8.model.diffusion_model
    assert dm8.double_blocks[0].img_attn.qkv.weight.dtype == torch.float8_e4m3fn
    assert dm8.double_blocks[1].img_attn_prope_proj.weight.dtype == torch.float8_e4m3fn
    assert dm8.action_in.out_layer.weight.dtype == torch.float8_e4m3fn
    # the linear weights in FP8 (the condition-type embedding is a plain nn.Embedding in core: it stays float32)
    stored = {
        k: v.to(torch.float8_e4m3fn) if v.ndim == 2 and not k.startswith("cond_type") else v
        for k, v in tiny_state_dict(TINY).items()
    }
    file8 = loader.worldplay_from_state_dict(stored, "fp8_e4m3fn", load_device=CPU, offload_device=CPU)
    from_file = file8.model.diffusion_model
    assert from_file.double_blocks[0].txt_attn.qkv.weight.dtype == torch.float8_e4m3fn
    upcast = loader.worldplay_from_state_dict(stored, load_device=CPU, offload_device=CPU).model.diffusion_model
    w = upcast.double_blocks[0].txt_attn.qkv.weight
    assert w.dtype == torch.float32 and torch.equal(w, w.to(torch.float8_e4m3fn).float())

    def run(dm):
        return _reference_forward(dm, model_mod, ref_inputs, trajectory)

    full, q8, q8_file = run(tiny_model), run(dm8), run(from_file)
    assert torch.isfinite(q8).all()
    err = rel_err(q8, full)
    assert 1e-4 < err < 0.15, err  # FP8 moves it (e4m3: 3 mantissa bits), but not far
    torch.testing.assert_close(q8_file, q8, rtol=1e-5, atol=1e-5)


def test_a_plain_hunyuanvideo_15_file_is_refused(wp, tmp_path):
    _, loader = wp
    keys = pack_module("runtime.families.worldplay.model.keys")
    sd = tiny_state_dict(TINY)
    plain = {k: v for k, v in sd.items() if k not in set(keys.worldplay_only_keys(TINY.depth))}
    path = tmp_path / "hunyuanvideo1.5_480p_i2v.safetensors"
    save_file(plain, str(path))
    with pytest.raises(keys.CheckpointError, match="plain HunyuanVideo 1.5.*UNETLoader"):
        loader.load_worldplay(str(path), load_device=CPU, offload_device=CPU)
    comfy_layout = {keys.core_name(k): v for k, v in keys.to_core(sd).items()}
    with pytest.raises(keys.CheckpointError, match="ComfyUI's layout"):
        loader.worldplay_from_state_dict(comfy_layout, load_device=CPU, offload_device=CPU)


def test_a_wrong_or_missing_key_is_named(wp):
    _, loader = wp
    keys = pack_module("runtime.families.worldplay.model.keys")
    sd = tiny_state_dict(TINY)
    sd["double_blocks.1.img_attn_prope_projection.weight"] = sd.pop("double_blocks.1.img_attn_prope_proj.weight")
    with pytest.raises(keys.CheckpointError) as exc:
        loader.worldplay_from_state_dict(sd, load_device=CPU, offload_device=CPU)
    msg = str(exc.value)
    assert "missing key(s): double_blocks.1.img_attn_prope_proj.weight" in msg
    assert "unexpected key(s): double_blocks.1.img_attn_prope_projection.weight" in msg
    sd = tiny_state_dict(TINY)
    sd["double_blocks.0.img_attn_k.weight"] = sd["double_blocks.0.img_attn_k.weight"][:, :32]
    with pytest.raises(keys.CheckpointError, match=r"wrong shape: double_blocks.0.img_attn_k.weight \(64, 32\)"):
        loader.worldplay_from_state_dict(sd, load_device=CPU, offload_device=CPU)
    sd = {f"model.diffusion_model.{k}": v for k, v in tiny_state_dict(TINY).items()}
    assert loader.worldplay_from_state_dict(sd, load_device=CPU, offload_device=CPU) is not None  # a prefix is fine
    with pytest.raises(ValueError, match="weight_dtype 'int8'"):
        loader.worldplay_from_state_dict(tiny_state_dict(TINY), "int8")


def test_the_model_config_samples_at_shift_5(wp, tiny_model):
    model_mod, _ = wp
    config = model_mod.classes().config(pack_module("runtime.families.worldplay.model.keys").RELEASED.core_config())
    assert config.sampling_settings["shift"] == 5.0
    assert config.unet_config["depth"] == 54 and config.unet_config["axes_dim"] == [16, 56, 56]


# ------------------------------------------------------------------------------------------ against the reference
@pytest.mark.numerics
def test_block_causal_forward_matches_the_reference(wp, tiny_model, ref_inputs, trajectory):
    """Through ComfyUI's model call (the default WorldPlay forward: text prefix at t = 0, block-causal over chunks of
    4, both streams): the reference's forward_bi with its torch_causal mask, per-frame timesteps and actions."""
    model_mod, _ = wp
    out = _reference_forward(tiny_model, model_mod, ref_inputs, trajectory)
    assert out.shape == ref_inputs["out_block_causal"].shape
    assert_within_rounding(out, ref_inputs["out_block_causal"], reference_bound(), "forward_bi")  # 3e-7 on an AMX Xeon


@pytest.mark.numerics
def test_first_chunk_forward_matches_the_reference_and_needs_both_streams(wp, tiny_model, ref_inputs, trajectory):
    """The reference's forward_txt then forward_vision of frames 0..3 at t = 937.5 without context; with the PRoPE
    stream's projection zeroed or the actions changed, the output moves (both additions are in play)."""
    model_mod, _ = wp
    attention = pack_module("runtime.families.worldplay.model.attention")
    x = torch.cat([ref_inputs["noise"], ref_inputs["cond"]], dim=1)[:, :, :4]

    def run(dm, traj=trajectory):
        call = model_mod.WorldPlayCall(attention=attention.sdpa_attention, frames=[0, 1, 2, 3])
        return dm(
            x,
            torch.tensor([937.5]),
            ref_inputs["text"],
            txt_byt5=ref_inputs["byt5"],
            clip_fea=ref_inputs["vision"],
            transformer_options={model_mod.CALL_KEY: call},
            worldplay_trajectory=traj,
        )

    out = run(tiny_model)
    assert_within_rounding(out, ref_inputs["out_chunk0"], reference_bound(), "forward_vision")
    saved = [b.img_attn_prope_proj.weight.detach().clone() for b in tiny_model.double_blocks]
    try:
        for b in tiny_model.double_blocks:
            b.img_attn_prope_proj.weight.data.zero_()
        assert relative_error(run(tiny_model), ref_inputs["out_chunk0"]) > 10 * reference_bound().value
    finally:
        for b, w in zip(tiny_model.double_blocks, saved):
            b.img_attn_prope_proj.weight.data.copy_(w)
    turned = pack_module("runtime.families.worldplay.model.trajectory").parse_trajectory("w-1, left-6")
    assert relative_error(run(tiny_model, turned), ref_inputs["out_chunk0"]) > 10 * reference_bound().value


@pytest.mark.numerics
def test_a_two_chunk_ar_rollout_through_the_injectable_attention_matches_the_reference(
    wp, tiny_model, ref_inputs, trajectory
):
    """The reference's AR rollout (2 chunks, 4 Euler steps at shift 5, cfg 1), re-run with the model's text prefix,
    the context plan (runtime.families.worldplay.model.context: chunk 1 re-encodes frames 0..3 at t = 14, RoPE 0..3, and sits at 4..7)
    and plain SDPA through ``ContextKV``: the one attention callable both streams go through."""
    model_mod, _ = wp
    attention = pack_module("runtime.families.worldplay.model.attention")
    context = pack_module("runtime.families.worldplay.model.context")
    schedules = pack_module("runtime.schedules")
    ref = load_file(DATA / "ar_rollout.safetensors")
    sigmas = schedules.ar_sigmas("worldplay_4step")
    torch.testing.assert_close(sigmas, ref["sigmas"], rtol=0, atol=1e-7)
    prefix = tiny_model.text_prefix(ref_inputs["text"], None, ref_inputs["byt5"], ref_inputs["vision"])
    cond = ref_inputs["cond"]
    latents = ref_inputs["noise"].clone()
    memory = attention.ContextKV()
    points = context.sphere_points(seed=0)
    calls = []

    def forward(x, t, frames, positions):
        calls.append((memory.mode, tuple(frames), tuple(positions)))
        call = model_mod.WorldPlayCall(attention=memory, positions=positions, text_prefix=prefix, frames=frames)
        xin = torch.cat([x, cond[:, :, list(frames)]], dim=1)
        return tiny_model(
            xin,
            torch.tensor([t]),
            ref_inputs["text"],
            transformer_options={model_mod.CALL_KEY: call},
            worldplay_trajectory=trajectory,
        )

    for chunk in range(2):
        plan = context.plan_chunk(trajectory.w2c, chunk, points)
        memory.clear()
        if plan.context_frames:
            memory.mode = "write"
            forward(
                latents[:, :, list(plan.context_frames)],
                plan.context_timestep,
                plan.context_frames,
                plan.context_positions,
            )
        memory.mode = "read"
        own = list(plan.chunk_frames)
        x = latents[:, :, own]
        for i in range(4):
            s, s_next = float(sigmas[i]), float(sigmas[i + 1])
            v = forward(x, 1000 * s, plan.chunk_frames, plan.chunk_positions)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
            assert s_next < s
        latents[:, :, own] = x
    assert calls[4] == ("write", (0, 1, 2, 3), (0, 1, 2, 3)) and calls[5] == ("read", (4, 5, 6, 7), (4, 5, 6, 7))
    assert len(memory.kept) == 2 * TINY.depth  # both streams of every block went through the callable
    assert_within_rounding(latents, ref["final"], reference_bound(), "AR rollout")
    # the context reaches chunk 1: without the re-encoded frames (an empty memory) it comes out elsewhere
    memory.clear()
    x = ref_inputs["noise"][:, :, 4:].clone()
    for i in range(4):
        x = x + (sigmas[i + 1] - sigmas[i]) * forward(x, 1000 * float(sigmas[i]), (4, 5, 6, 7), (4, 5, 6, 7))
    assert relative_error(x, ref["final"][:, :, 4:]) > 10 * reference_bound().value


# ------------------------------------------------------------------------------------------------ ComfyUI's paths
def _condition(video: int, h: int = 4, w: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    image = torch.zeros(1, TINY.latent_channels, video, h, w)
    image[:, :, :1] = torch.randn(1, TINY.latent_channels, 1, h, w, generator=g)
    mask = torch.ones(1, 1, video, h, w)
    mask[:, :, :1] = 0  # HunyuanVideo15ImageToVideo's convention: 0 where the image is given
    return image, mask


def test_a_calls_image_condition_is_its_own_frames_of_cores(wp, tiny_model):
    """concat_cond for a 4-frame call on an 8-frame condition equals core's concat_cond of the whole video cut to the
    call's frames (the image only where frame 0 is among them); core's own breaks on the 4-frame call."""
    _, loader = wp
    model = loader.worldplay_from_state_dict(tiny_state_dict(TINY), load_device=CPU, offload_device=CPU).model
    image, mask = _condition(8)
    core = type(model).__mro__[2]  # model_base.HunyuanVideo15
    assert core.__name__ == "HunyuanVideo15"
    whole = core.concat_cond(
        model, noise=torch.zeros(1, 32, 8, 4, 6), concat_latent_image=image, concat_mask=mask, device=CPU
    )
    for frames in ((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3, 5, 6)):
        noise = torch.zeros(1, 32, len(frames), 4, 6)
        got = model.concat_cond(
            noise=noise, concat_latent_image=image, concat_mask=mask, worldplay_frames=frames, device=CPU
        )
        torch.testing.assert_close(got, whole[:, :, list(frames)], rtol=0, atol=0)
    assert float(got[:, 32, 0].min()) == 1.0 and float(got[:, 32, 1:].max()) == 0.0  # the mask: frame 0 only
    # core's keeps the video's 8 frames for a 4-frame call: [x, c_concat] would not concatenate
    assert (
        core.concat_cond(
            model, noise=torch.zeros(1, 32, 4, 4, 6), concat_latent_image=image, concat_mask=mask, device=CPU
        ).shape[2]
        == 8
    )
    with pytest.raises(ValueError, match="worldplay_frames"):
        model.concat_cond(noise=torch.zeros(1, 32, 4, 4, 6), concat_latent_image=image, concat_mask=mask, device=CPU)


def test_comfyuis_sampler_runs_it_with_the_camera_path_on_the_conditioning(wp, ref_inputs, trajectory):
    """KSampler's path (extra_conds, the trajectory as a constant cond, the image condition, the default block-causal
    forward): deterministic, finite, and the camera path reaches the output."""
    import comfy.sample

    _, loader = wp
    patcher = loader.worldplay_from_state_dict(tiny_state_dict(TINY), load_device=CPU, offload_device=CPU)
    image, mask = _condition(8)

    def sample(traj):
        cond = {
            "worldplay_trajectory": traj,
            "concat_latent_image": image,
            "concat_mask": mask,
            "conditioning_byt5small": ref_inputs["byt5"],
            "pooled_output": None,  # core's HunyuanVideo reads it (a text encoder's conditioning has it)
        }
        positive = [[ref_inputs["text"], cond]]
        noise = torch.randn(1, 32, 8, 4, 6, generator=torch.Generator().manual_seed(1))
        return comfy.sample.sample(
            patcher, noise, 2, 1.0, "euler", "simple", positive, positive, torch.zeros(1, 32, 8, 4, 6), seed=1
        )

    a = sample(trajectory)
    assert a.shape == (1, 32, 8, 4, 6) and torch.isfinite(a).all()
    torch.testing.assert_close(sample(trajectory), a, rtol=0, atol=0)
    other = pack_module("runtime.families.worldplay.model.trajectory").parse_trajectory("s-3, left-4")
    assert rel_err(sample(other), a) > 1e-3
    with pytest.raises(ValueError, match="camera path on the conditioning"):
        comfy.sample.sample(
            patcher,
            torch.zeros(1, 32, 4, 4, 6),
            1,
            1.0,
            "euler",
            "simple",
            [[ref_inputs["text"], {"pooled_output": None}]],
            [[ref_inputs["text"], {"pooled_output": None}]],
            torch.zeros(1, 32, 4, 4, 6),
        )


def test_unetloaders_detection_reads_the_official_file_as_plain_hunyuanvideo_15_and_loses_worldplay(comfy):
    """Why Load HY-WorldPlay exists: ComfyUI's detection (what UNETLoader runs) takes the released key list for
    HunyuanVideo 1.5 and its renaming leaves every fused qkv unloaded (216 missing) while dropping the separate
    q / k / v and the 112 WorldPlay keys (760 unexpected). Shapes only (meta tensors)."""
    import json

    import comfy.ldm.hunyuan_video.model
    import comfy.model_detection
    import comfy.ops

    shapes = json.loads((DATA / "official_keys.json").read_text())["keys"]
    sd = {k: torch.empty(tuple(v), device="meta") for k, v in shapes.items()}
    config = comfy.model_detection.model_config_from_unet(sd, "")
    assert type(config).__name__ == "HunyuanVideo15"
    renamed = set(config.process_unet_state_dict(dict(sd)))
    with torch.device("meta"):
        core = comfy.ldm.hunyuan_video.model.HunyuanVideo(
            **config.unet_config, operations=comfy.ops.disable_weight_init
        )
    wanted = set(core.state_dict())
    missing, unexpected = wanted - renamed, renamed - wanted
    assert len(missing) == 216 and all(".qkv." in k for k in missing)
    worldplay = {k for k in unexpected if k.startswith("action_in.") or ".img_attn_prope_proj." in k}
    assert len(worldplay) == 112 and len(unexpected) == 112 + 54 * 2 * 3 * 2


def test_the_text_prefix_drops_padding_and_is_shared_by_the_streams(tiny_model, ref_inputs):
    """SigLIP (5) + ByT5 (3) + the LLM's valid tokens, padding dropped, one K/V pair per block; prompts of one batch
    with different valid counts are refused by name."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    prefix = tiny_model.text_prefix(ref_inputs["text"], mask, ref_inputs["byt5"], ref_inputs["vision"])
    assert prefix.layers == TINY.depth and prefix.tokens == 5 + 3 + 5
    assert prefix.keys[0].shape == (1, TINY.heads, 13, TINY.head_dim)
    full = tiny_model.text_prefix(ref_inputs["text"], None, ref_inputs["byt5"], ref_inputs["vision"])
    assert full.tokens == 5 + 3 + 7 and full.nbytes == 2 * TINY.depth * 15 * TINY.hidden_size * 4
    two = torch.cat([ref_inputs["text"]] * 2)
    with pytest.raises(ValueError, match=r"different numbers of valid text tokens \(\[5, 6\]\)"):
        tiny_model.text_prefix(two, torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]))


def test_a_padded_prompt_gives_the_prefix_of_its_real_tokens_alone(tiny_model, ref_inputs):
    """HY-WorldPlay's token refiner pools its condition over the real tokens only; core's TokenRefiner divides by the
    padded length. The pack takes the masked mean on a padded prompt, so the prefix of a prompt padded with 2 tokens
    (whatever they hold) equals the prefix of its 5 real tokens unpadded, within float32 rounding (the refiner's 2
    blocks and the model's blocks: reference_bound). Core's plain mean is shown to miss by far more."""
    real = ref_inputs["text"][:, :5]
    padded = torch.cat([real, 3.0 * torch.randn(1, 2, real.shape[-1], generator=torch.Generator().manual_seed(5))], 1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    got = tiny_model.text_prefix(padded, mask, ref_inputs["byt5"], ref_inputs["vision"])
    want = tiny_model.text_prefix(real, None, ref_inputs["byt5"], ref_inputs["vision"])
    got_kv = torch.cat([torch.cat(got.keys, -1), torch.cat(got.values, -1)], -1)
    want_kv = torch.cat([torch.cat(want.keys, -1), torch.cat(want.values, -1)], -1)
    bound = reference_bound()
    assert_within_rounding(got_kv, want_kv, bound)
    # core's mean over the padded length: the refiner run as core runs it on the same padded prompt
    core = tiny_model.txt_in
    t0 = torch.zeros(1)
    additive = (mask - 1).to(padded.dtype) * torch.finfo(padded.dtype).max
    from comfy.ldm.flux.layers import timestep_embedding

    pooled_core = core.c_embedder(padded.sum(dim=1) / padded.shape[1])
    pooled_real = core.c_embedder(real.sum(dim=1) / real.shape[1])
    t = core.t_embedder(timestep_embedding(t0, 256, time_factor=1.0))
    assert relative_error(t + pooled_core, t + pooled_real) > 100 * bound.value
    assert core(padded, t0, additive).shape[1] == 7  # core's refiner keeps the padded length
