"""The pure-torch MAGI-1 (``runtime/families/magi1/model/``) against the reference's own outputs, and its pipeline arithmetic.

``tests/data/magi1/expected.safetensors`` holds what github:SandAI-org/MAGI-1 (6ff822e) computed, in float32
on the CPU, on tiny seeded weights (README there): four DiT forwards and four whole sampler runs. The same
weights are rebuilt here from the seed (samples of them are stored too) and loaded strictly into
:class:`runtime.families.magi1.model.dit.MagiDiT`, so the reference's parameter names and shapes are checked as well.

The reference ran on another machine, so its outputs are compared within float32 rounding
(:func:`jensen_testing.numerics.rounding_bound`, relative L2): the tiny DiT's 2 blocks with reductions of at most
512 (its FFN), plus the phase of its timestep sinusoid. Its frequencies come from float32 ``exp``, which MKL rounds
per instruction set, and the phase grows with the argument: 1000 t, and 1000 times the distilled models' step
constant (8). The VAE decoder (2 blocks, 1024-wide MLP) rounds q, k, v and its attention's output to bfloat16 as
the reference's packed call does: 8 roundings. Measured on an AMX Xeon: forwards 1.9e-6 to 2.8e-5, samplers 2.1e-6
to 2.9e-5, VAE 3.4e-5 and 1.2e-4, each at least 8 times below its bound; ``test_the_sampler_sees_its_settings``
shows that a changed setting moves a run past it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from jensen_testing.magi1_tiny import build, dit_bound, sampled_weights, seeded_weights
from jensen_testing.numerics import U32, assert_within_rounding, relative_error, rounding_bound
from runtime.families.magi1.model import pipeline as P
from runtime.families.magi1.model.attention import ChunkPlan, FullPrecisionKV, sdpa
from runtime.families.magi1.model.caption import chunk_captions, null_caption
from runtime.families.magi1.model.config import (
    PUBLISHED,
    TINY,
    TINY_24B_STYLE,
    ConfigError,
    MagiConfig,
    config_from_shapes,
    expected_shapes,
)
from runtime.families.magi1.model.dit import Forward, MagiDiT, apply_rope
from runtime.families.magi1.model.sampler import MagiSettings, iter_sample, sample
from runtime.families.magi1.model.vae import MagiVAE, VAEConfig, config_from_decoder_shapes, decoder_shapes

DATA = Path(__file__).parent / "data" / "magi1" / "expected.safetensors"
WEIGHTS = Path(__file__).parent / "data" / "magi1" / "weights.safetensors"
#: the tiny VAE decoder: 2 blocks, a 1024-wide MLP, q, k, v and the attention's output rounded to bfloat16 per block
VAE_BOUND = rounding_bound(2, 1024, bf16_roundings=8)
FORWARDS = {
    "base": (TINY, False, 0),
    "distill": (replace(TINY, distill=True), False, 0),
    "base_dropped_offset": (TINY, True, 2),
    "24b_style": (TINY_24B_STYLE, False, 0),
}
RUNS = ["distill_w4", "distill_w2_12steps", "base_w2", "distill_w1"]


@pytest.fixture(scope="module")
def expected():
    return load_file(DATA)


@pytest.fixture(scope="module")
def special(expected):
    return {k.split(".", 1)[1]: v.reshape(-1) for k, v in expected.items() if k.startswith("special.")}


def test_data_is_small():
    assert DATA.stat().st_size < 1 << 20


def _stored_samples(model: str) -> dict[str, torch.Tensor]:
    stored = load_file(WEIGHTS)
    return {k.split("/", 1)[1]: v for k, v in stored.items() if k.startswith(model + "/")}


@pytest.mark.parametrize("model", ["base", "distill", "24b_style", "vae"])
def test_seeded_weights_are_the_references(model):
    """The rebuilt weights against samples stored with the reference's outputs, value by value: equal on x86 CPUs
    with AVX2, where ATen's float32 normal sampler is the one that drew them; elsewhere its Box-Muller transform is
    rounded by libm instead, r (<= 5.8) times cos or sin of 2 pi u, each float32 operation within a unit roundoff:
    at most 11 u r, below 64 u of the tensor's largest value (``rope.bands`` is made in float64 and rounded once)."""
    stored = _stored_samples(model)
    now = sampled_weights()[model]
    assert now.keys() == stored.keys()
    for name, want in stored.items():
        assert now[name].shape == want.shape, name
        bound = 64 * U32 * float(want.abs().max())
        assert float((now[name] - want).abs().max()) <= bound, name


@pytest.mark.parametrize("name", list(FORWARDS))
def test_one_forward_matches_the_reference(expected, name):
    cfg, dropped, slice_point = FORWARDS[name]
    y, mask = expected["fwd.y"], expected["fwd.mask"]
    captions = [y[i, 0][mask[i, 0].bool()] for i in range(y.shape[0])]
    ranges = tuple(tuple(int(v) for v in r) for r in expected["fwd.kv_chunks"])
    spec = Forward(
        t=expected["fwd.t"],
        captions=captions,
        caption_dropped=torch.tensor([dropped]),
        first_frame=slice_point * 2,
        plan=ChunkPlan(32, 0, ranges),
        distill_dt=P.distill_dt(16, 1) if cfg.distill else None,
    )
    out = build(cfg).forward_chunks(expected["fwd.x"], spec)
    assert_within_rounding(out, expected[f"fwd.{name}.out"], dit_bound(cfg.distill), name)


def _run_settings(expected, name):
    distill, cfg_number, steps, window, chunks = expected[f"sampler.{name}.settings"].tolist()
    settings = MagiSettings(
        num_steps=int(steps), window_size=int(window), chunk_width=2, cfg_number=int(cfg_number), distill=bool(distill)
    )
    return settings, int(chunks)


@pytest.mark.parametrize("name", RUNS)
def test_the_whole_sampler_matches_the_reference(expected, special, name):
    settings, chunks = _run_settings(expected, name)
    model = build(replace(TINY, distill=settings.distill))
    captions = chunk_captions(expected["sampler.caption_valid"], chunks, special)
    shape = (16, chunks * 2, 8, 8)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(1234))[None]  # the reference's seeded noise
    finished = []
    for event in iter_sample(model, noise, captions, settings):
        if event.finished is not None:
            c = event.finished
            finished.append((c, event.latent[:, :, 2 * c : 2 * c + 2].clone()))
        last = event
    assert [c for c, _ in finished] == list(range(chunks))
    ref_chunks = expected[f"sampler.{name}.chunks"]
    bound = dit_bound(settings.distill)
    for c, chunk in finished:
        assert_within_rounding(chunk, ref_chunks[:, :, 2 * c : 2 * c + 2], bound, f"{name} chunk {c}")
    assert_within_rounding(last.latent, ref_chunks, bound, name)


def test_the_sampler_sees_its_settings(expected, special):
    """Positive control: the comparison is not blind to the pipeline's knobs."""
    settings, chunks = _run_settings(expected, "distill_w4")
    model = build(replace(TINY, distill=True))
    captions = chunk_captions(expected["sampler.caption_valid"], chunks, special)
    ref = expected["sampler.distill_w4.chunks"]
    noise = torch.randn(16, 8, 8, 8, generator=torch.Generator().manual_seed(1234))[None]
    for changed in (
        replace(settings, nearly_clean_scale=0.6),
        replace(settings, clean_t=1.0),
        replace(settings, noise2clean_kvrange=(4, 3, 2, 1)),
    ):
        out = sample(model, noise, captions, changed)
        assert relative_error(out, ref) > dit_bound(True).value, changed


def test_settings_must_match_the_model(expected, special):
    with pytest.raises(ValueError, match="is a base MAGI-1"):
        sample(
            build(TINY), torch.zeros(1, 16, 4, 8, 8), [torch.zeros(3, 32)] * 2, MagiSettings(num_steps=8, chunk_width=2)
        )


def test_a_window_that_does_not_divide_the_steps_is_refused():
    with pytest.raises(ValueError, match="multiple of window_size 3"):
        MagiSettings(num_steps=16, window_size=3)


# ------------------------------------------------------------------------------------------ pipeline
def test_the_sd3_schedule():
    u = torch.linspace(0, 1, 17, dtype=torch.float64) ** 2
    expected = (u / 3) / (1 + (1 / 3 - 1) * u)
    torch.testing.assert_close(P.time_schedule(16).double(), expected, atol=3e-7, rtol=0)
    assert P.time_schedule(16)[0] == 0 and P.time_schedule(16).dtype == torch.float32


def test_window_sequences_are_the_references_examples():
    """The four examples written above ``generate_sequences`` in the reference."""
    cs, ce, ts, te = zip(*P.window_sequences(8, 8))
    assert list(cs) == [0] * 8 + [1, 2, 3, 4, 5, 6, 7] and list(ce) == [1, 2, 3, 4, 5, 6, 7] + [8] * 8
    assert list(ts) == [0] * 8 + [1, 2, 3, 4, 5, 6, 7] and list(te) == [1, 2, 3, 4, 5, 6, 7] + [8] * 8
    cs, ce, ts, te = zip(*P.window_sequences(8, 4))
    assert list(cs) == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7] and list(ce) == [1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert list(ts) == [0] * 8 + [1, 2, 3] and list(te) == [1, 2, 3] + [4] * 8
    cs, ce, ts, te = zip(*P.window_sequences(8, 4, chunk_offset=2))
    assert list(cs) == [2, 2, 2, 2, 3, 4, 5, 6, 7] and list(ce) == [3, 4, 5, 6, 7, 8, 8, 8, 8]
    assert list(ts) == [0] * 6 + [1, 2, 3] and list(te) == [1, 2, 3] + [4] * 6
    cs, ce, ts, te = zip(*P.window_sequences(8, 1))
    assert list(cs) == list(range(8)) and list(ce) == list(range(1, 9)) and set(ts) == {0} and set(te) == {1}


def test_every_chunk_gets_every_step_once_and_the_clean_chunk_rides_in_front():
    steps = P.steps_of(16, 4, chunk_num=5)
    seen = {c: [] for c in range(5)}
    for st in steps:
        noisy = st.steps_of_chunks[int(st.clean_in_front) :]
        assert list(noisy) == sorted(noisy, reverse=True)  # the oldest chunk is the most advanced
        for j, s in enumerate(noisy):
            seen[st.chunk_start + j].append(s)
        if st.clean_in_front:
            assert st.substep == 0 and st.steps_of_chunks[0] == 16 and st.slice_point == st.chunk_start - 1
    assert all(v == list(range(16)) for v in seen.values())
    assert sum(st.clean_in_front for st in steps) == 4  # chunks 0..3 each written once


def test_key_ranges_anneal_from_five_to_two_chunks():
    """A chunk reads itself and 4, 3, 2, 1 earlier chunks over its four quarters of steps; the clean chunk itself."""
    for step, want in [(0, 5), (3, 5), (4, 4), (8, 3), (15, 2)]:
        ((s, e),) = P.key_ranges(9, (step,), 16)
        assert (s, e) == (10 - want, 10)
    assert P.key_ranges(9, (16,), 16) == ((9, 10),)
    assert P.key_ranges(1, (5,), 16) == ((0, 2),)  # clipped at the first chunk
    assert P.key_ranges(2, (5, 0), 16, noise2clean_kvrange=()) == ((0, 3), (0, 4))


@pytest.mark.parametrize("window", [1, 2, 4])
def test_finished_chunks_reached_by_brute_force(window):
    """The most finished chunks any query reads, counted over every forward of a long video."""
    most = 0
    for st in P.steps_of(16, window, chunk_num=12):
        ranges = P.key_ranges(st.slice_point, st.steps_of_chunks, 16)
        for j in range(int(st.clean_in_front), st.chunks):
            s, e = ranges[j]
            most = max(most, max(0, min(e, st.chunk_start) - s))
    assert P.finished_chunks_reached(window) == most
    assert P.finished_chunks_reached(4) == 1 and P.finished_chunks_reached(1) == 4


def test_cfg_scales_switch_off_the_text_late():
    assert P.cfg_scales(torch.tensor(0.05)) == (1.5, 7.5)
    assert P.cfg_scales(torch.tensor(0.5)) == (1.0, 0.0)
    assert P.cfg_scales(torch.tensor(0.0)) == (1.5, 7.5)


def test_distill_step_constant():
    assert P.distill_dt(16, 1) == 8.0 and P.distill_dt(64, 1) == 32.0
    assert P.distill_dt(12, 2) == 4.0 and P.distill_dt(12, 1) == 8.0


# ------------------------------------------------------------------------------------------ attention, RoPE
def test_grouped_query_attention_against_float64():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 6, 5, 16, generator=g),
        torch.randn(1, 2, 7, 16, generator=g),
        torch.randn(1, 2, 7, 16, generator=g),
    )
    out = sdpa(q, k, v)
    for h in range(6):
        kv = h // 3
        p = torch.softmax(q[0, h].double() @ k[0, kv].double().T / 4.0, dim=-1)
        torch.testing.assert_close(out[0, h].double(), p @ v[0, kv].double(), atol=1e-6, rtol=1e-6)


def test_full_precision_buffer_reads_what_was_written():
    g = torch.Generator().manual_seed(1)
    n = 4
    kv = FullPrecisionKV()
    k0, v0 = torch.randn(1, 1, n, 8, generator=g), torch.randn(1, 1, n, 8, generator=g)
    q = torch.randn(1, 2, n, 8, generator=g)
    kv(0, q, k0, v0, ChunkPlan(n, 3, ((3, 4),), store=((0, 3),)))  # writes chunk 3
    k1, v1 = torch.randn(1, 1, n, 8, generator=g), torch.randn(1, 1, n, 8, generator=g)
    out = kv(0, q, k1, v1, ChunkPlan(n, 4, ((3, 5),)))
    torch.testing.assert_close(out, sdpa(q, torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)))
    with pytest.raises(ValueError, match=r"never written"):
        kv(0, q, k1, v1, ChunkPlan(n, 4, ((2, 5),)))


def test_rope_rotates_three_quarters_and_depends_on_time_differences():
    model = build(TINY)
    cfg = model.config
    sin, cos = model.rope.table(first_frame=5, frames=3, h=4, w=4, device="cpu")
    assert sin.shape == (48, 3 * cfg.rope_bands) and 2 * sin.shape[1] == cfg.rotary_dim == 48  # 48 of 64 channels
    x = torch.randn(1, 1, 48, 64)
    y = apply_rope(x, sin, cos)
    assert torch.equal(y[..., 48:], x[..., 48:])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    # the same token pair one frame apart scores the same at every absolute time
    q, k = torch.randn(64), torch.randn(64)
    scores = []
    for first in (0, 7):
        s, c = model.rope.table(first_frame=first, frames=2, h=4, w=4, device="cpu")
        qq = apply_rope(q.expand(1, 1, 32, 64), s, c)[0, 0, 16]  # frame first + 1, token 0
        kk = apply_rope(k.expand(1, 1, 32, 64), s, c)[0, 0, 0]  # frame first, token 0
        scores.append(float((qq @ kk).detach()))
    assert scores[0] == pytest.approx(scores[1], rel=1e-4)


# ------------------------------------------------------------------------------------------ configs and facts
def test_published_configs_and_their_memory_facts():
    c = PUBLISHED["4.5B"]
    assert (c.num_layers, c.num_attention_heads, c.num_query_groups, c.kv_channels, c.rotary_dim) == (
        34,
        24,
        8,
        128,
        96,
    )
    big = PUBLISHED["24B"]
    assert big.gated_linear_unit and big.half_channel_vae and big.x_rescale_factor == 0.1 and big.latent_channels == 16
    params = {k: sum(math.prod(s) for s in expected_shapes(v).values()) for k, v in PUBLISHED.items()}
    assert 4.4e9 < params["4.5B"] < 4.5e9 and 23.8e9 < params["24B"] < 24.0e9
    # a 720p chunk: 6 latent frames of 90 x 160 latents, 2 x 2 patches -> 21,600 tokens
    tokens = 6 * (720 // 8 // 2) * (1280 // 8 // 2)
    assert tokens == 21_600
    bf16 = c.num_layers * 2 * c.num_query_groups * c.kv_channels * tokens * 2
    assert round(bf16 / 2**30, 2) == 2.80 and round(bf16 * 2.75 / 16 / 2**30, 2) == 0.48
    # 240 frames -> 60 latent frames -> 10 chunks: the reference's whole-video buffer
    assert round(10 * bf16 / 2**30, 1) == 28.0


@pytest.mark.parametrize(
    "cfg", [TINY, TINY_24B_STYLE, PUBLISHED["4.5B"], PUBLISHED["24B"]], ids=["tiny", "24b-style", "4.5B", "24B"]
)
def test_config_round_trips_through_shapes(cfg):
    shapes = expected_shapes(cfg)
    if cfg in (TINY, TINY_24B_STYLE):
        assert {k: tuple(v.shape) for k, v in MagiDiT(cfg).state_dict().items()} == shapes
        back = config_from_shapes(shapes, x_rescale_factor=cfg.x_rescale_factor, half_channel_vae=cfg.half_channel_vae)
    else:
        back = config_from_shapes(shapes)  # the published sizes bring their own rescale and channel trick
    assert back == cfg
    assert MagiConfig.from_json(cfg.to_json()) == cfg


def test_inconsistent_configs_are_refused():
    with pytest.raises(ConfigError, match="num_query_groups"):
        replace(TINY, num_query_groups=3)
    shapes = expected_shapes(TINY)
    with pytest.raises(ConfigError, match="x_embedder.weight is missing"):
        config_from_shapes({k: v for k, v in shapes.items() if k != "x_embedder.weight"})
    with pytest.raises(ConfigError, match=r"layers \[1\] of 0..2 are missing"):
        config_from_shapes(
            {k: v for k, v in shapes.items() if ".layers.1." not in k} | {"videodit_blocks.layers.2.x": (1,)}
        )


# ------------------------------------------------------------------------------------------ captions
def test_chunk_captions_put_duration_then_hq_in_front(special):
    cap = torch.randn(5, 32)
    caps = chunk_captions(cap, 10, special)
    for i, c in enumerate(caps):
        k = min(10 - i - 1, 7) + 1
        assert torch.equal(c[0], special[f"DURATION_TOKEN_{k}"]) and torch.equal(c[1], special["HQ_TOKEN"])
        assert torch.equal(c[2:], cap)
    assert chunk_captions(torch.randn(799, 32), 1, special)[0].shape[0] == 800  # cut at 800 tokens
    with pytest.raises(ValueError, match="--special-tokens"):
        chunk_captions(cap, 2, None)
    assert torch.equal(chunk_captions(cap, 2, None, tokens=())[1], cap)


def test_null_caption_is_the_first_50_rows():
    model = build(TINY)
    assert torch.equal(null_caption(model.y_embedder.null_caption_embedding), model.null_caption())
    assert model.null_caption().shape == (50, 32)


# ------------------------------------------------------------------------------------------ the VAE decoder
VAE_TINY = VAEConfig(video_size=32, video_length=8, embed_dim=256, depth=2, num_heads=4)


@pytest.fixture(scope="module")
def vae(expected):
    model = MagiVAE(VAE_TINY)
    sd = seeded_weights({"decoder." + k: v for k, v in decoder_shapes(VAE_TINY).items()})
    model.load_state_dict(sd, strict=True)
    return model.eval()


def test_vae_decoder_matches_the_reference(vae, expected):
    with torch.no_grad():
        out = vae.decoder(expected["vae.z_grid"])
    assert out.shape == (1, 3, 8, 32, 32)  # 4 frames and 8 x 8 pixels per latent pixel
    assert_within_rounding(out, expected["vae.full"], VAE_BOUND, "decode")


def test_vae_tiled_decode_matches_the_reference(vae, expected):
    """Tiles of 4 x 4 latents overlapping by a quarter (resized position embeddings at the edges), 2 latent frames
    in time with a 1-frame remainder that decodes to 1 frame, as ViTVAE.decode does."""
    seen = []
    out = vae.decode(expected["vae.z_tiled"], tile_pixels=32, tile_frames=8, progress=lambda d, n: seen.append((d, n)))
    assert out.shape == (1, 3, 9, 40, 40) and seen[-1] == (8, 8)
    assert_within_rounding(out, expected["vae.tiled"], VAE_BOUND, "tiled decode")


def test_vae_config_from_the_published_shapes():
    assert config_from_decoder_shapes(decoder_shapes(VAEConfig())) == VAEConfig()
    assert config_from_decoder_shapes(decoder_shapes(VAE_TINY), num_heads=4, latent_length=2) == VAE_TINY


def test_the_published_vae_file_loads_as_it_is_downloaded(tmp_path):
    """The MAGI-1 workflow's model entry downloads Sand AI's ``ckpt/vae/diffusion_pytorch_model.safetensors`` alone
    (no config.json beside it, no metadata, encoder and decoder) into models/vae: Load MAGI-1 VAE reads it as it
    is, its config from the decoder's shapes (heads of 64 and 4 latent frames, as published), the encoder left out.
    A grid of 2 latent frames (a VAE unlike the published one) is refused with the way on (its config.json)."""
    from safetensors.torch import save_file

    from runtime.families.magi1.model.checkpoint import CheckpointError, inspect_vae

    cfg = VAEConfig(video_size=32, video_length=16, embed_dim=256, depth=2, num_heads=4)  # 256 / 64 heads, 4 frames
    decoder = seeded_weights({"decoder." + k: v for k, v in decoder_shapes(cfg).items()})
    encoder = {"encoder.patch_embed.proj.weight": torch.randn(256, 3, 4, 8, 8)}
    path = tmp_path / "magi1_vae.safetensors"
    save_file({**encoder, **decoder}, str(path))
    ck = inspect_vae(path)
    assert ck.config == cfg
    got = ck.decoder_state_dict()
    assert set(got) == {k[len("decoder.") :] for k in decoder}
    assert all(torch.equal(got[k[len("decoder.") :]], v) for k, v in decoder.items())
    MagiVAE(cfg).decoder.load_state_dict(got, strict=True)

    other = tmp_path / "two_frames.safetensors"
    save_file({"decoder." + k: v for k, v in seeded_weights(decoder_shapes(VAE_TINY)).items()}, str(other))
    with pytest.raises(CheckpointError, match="config.json"):
        inspect_vae(other)


@pytest.mark.parametrize("name", ["4.5B", "24B"])
def test_the_published_models_build_with_the_reference_names(name):
    """Built on the meta device (no memory): every tensor and shape the checkpoints hold, nothing else."""
    cfg = PUBLISHED[name]
    with torch.device("meta"):
        model = MagiDiT(cfg, dtype=torch.bfloat16)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected_shapes(cfg)
    attn = model.videodit_blocks.layers[0].self_attention
    assert attn.linear_qkv.k.weight.shape == (8 * 128, cfg.hidden_size)  # 8 K/V heads of 128
    assert attn.linear_qkv.q.weight.dtype == torch.bfloat16 and attn.q_layernorm.weight.dtype == torch.float32
