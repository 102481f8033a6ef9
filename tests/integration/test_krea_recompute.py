"""Krea Realtime's per-block cache recompute and attention bias in the chunk loop, against a reference from scope.

The reference is written here from daydreamlive/scope 68b0f95 ``krea_realtime_video``:
``blocks/recompute_kv_cache.py`` (``get_context_frames``: the first latent frame while
``current_start - block < K``, else the oldest of the last ``1 + (K - 1) x 4`` decoded frames re-encoded
alone, then the last K - 1 latent frames; the cache rebuilt at t = 0 with the block-causal mask of
``_prepare_blockwise_causal_attn_mask`` over the context, RoPE from frame 0), ``blocks/denoise.py``
(the block at RoPE frame ``min(current_start, K)``) and ``modules/causal_model.py`` (``score_mod``:
``log(bias)`` on keys ``frame_seqlen <= kv_idx < cache_current_block_start``). Every model call of a run
(tiny Wan, fp32, CPU) is recomputed as one full forward over [context at t = 0, current block] with that
mask and that bias, and compared.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from support import wan_tiny
from support.fake_vae import FakeVAE, StreamVAE

STEPS = 2
TPF = 16  # tokens per latent frame of the tiny latent (8 x 8 latent pixels, 2 x 2 patches)
COND_TOKENS = 13


def scope_context(samples, n, K, block, vae):
    """``get_context_frames`` of scope for the block starting at latent frame ``n`` (samples: the video so far)."""
    latents = samples[:, :, :n]
    if n <= K:  # scope's buffer then holds every frame after the first (the rest is its zero padding)
        return latents
    rest = latents[:, :, n - (K - 1) :] if K > 1 else latents[:, :, :0]
    if n - block < K:
        first = latents[:, :, :1]
    elif vae is None:
        first = latents[:, :, n - K : n - K + 1]
    else:
        decoded = vae.decode(latents)  # the stream decoded so far
        buffer = decoded[:, -(1 + (K - 1) * 4) :]  # decoded_frame_buffer
        first = vae.encode(buffer[0, :1])
    return torch.cat([first, rest], dim=2)


def krea_forward(dm, context, x, t, text, block, bias, *, block_rope=None, exempt=TPF):
    """scope's two passes as one forward: the context at t = 0 under the block-causal mask, then the block over
    [context, itself] with log(bias) on context keys past the first frame. RoPE frames: the context from 0, the
    block right after it (``block_rope`` puts it elsewhere: a negative control)."""
    n, T = context.shape[2], context.shape[2] + x.shape[2]
    B, H, W = x.shape[0], x.shape[3], x.shape[4]
    frames = torch.cat([context, x], dim=2)
    ts = torch.cat([torch.zeros(B, n), t.reshape(B, 1).expand(B, x.shape[2])], dim=1)
    L = T * TPF
    ends = torch.zeros(L, dtype=torch.long)
    for start in range(0, n * TPF, block * TPF):  # get_block_mask over the context frames
        ends[start : start + block * TPF] = min(start + block * TPF, n * TPF)
    ends[n * TPF :] = L  # the block attends the whole cache and itself
    qi, kj = torch.arange(L)[:, None], torch.arange(L)[None, :]
    allowed = kj < ends[qi]
    add = torch.zeros(L, L)
    add[n * TPF :, exempt : n * TPF] = math.log(bias)  # score_mod, in the block's pass only
    mask = add.masked_fill(~allowed, float("-inf"))
    freqs = dm.rope_encode(T, H, W, t_start=0, device=x.device, dtype=torch.float32)
    if block_rope is not None:
        at = dm.rope_encode(x.shape[2], H, W, t_start=block_rope, device=x.device, dtype=torch.float32)
        freqs = torch.cat([freqs[:, : n * TPF], at], dim=1)

    def override(func, q, k, v, *args, **kwargs):
        if q.shape[1] == L and k.shape[1] == L and q.ndim == 3:
            heads = kwargs["heads"] if "heads" in kwargs else args[0]
            b, m, dim = q.shape
            d = dim // heads
            qh, kh, vh = (a.view(b, m, heads, d).transpose(1, 2) for a in (q, k, v))
            return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask).transpose(1, 2).reshape(b, m, dim)
        return func(q, k, v, *args, **kwargs)

    with torch.no_grad():
        out = dm.forward_orig(
            frames, ts, text, freqs=freqs, transformer_options={"optimized_attention_override": override}
        )
    return out[:, :, n:]


def _run(loop, model, euler, *, K, block, frames, bias, vae, cfg=1.0, **extra):
    import comfy.patcher_extension
    import comfy.samplers
    from support import reference

    rec = reference.DiffusionModelRecorder()
    m = model.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)
    result = loop.run_chunked_ar(
        m,
        wan_tiny.conditioning(1, COND_TOKENS, 32),
        wan_tiny.conditioning(2, COND_TOKENS, 32),
        wan_tiny.video_latent(frames),
        seed=3,
        cfg=cfg,
        sampler=euler,
        sigmas=sigmas,
        chunk_frames=block,
        recompute_frames=K,
        attention_bias=bias,
        vae=vae,
        progress=False,
        **extra,
    )
    return rec.calls, result


def _per_chunk(calls, K, block, frames):
    """scope's order: no recompute before the first block; before every later one ceil(context / block) writes."""
    out, i = [], 0
    for n in range(0, frames, block):
        ctx = min(n, K)
        writes = calls[i : i + math.ceil(ctx / block)]
        i += len(writes)
        out.append((n, writes, calls[i : i + STEPS]))
        i += STEPS
    assert i == len(calls), f"expected {i} model calls, recorded {len(calls)}"
    return out


@pytest.mark.parametrize(
    "K,block,bias,vae_type",
    [(2, 2, 0.3, FakeVAE), (3, 2, 0.5, FakeVAE), (2, 2, 0.3, StreamVAE), (3, 1, 0.5, StreamVAE), (2, 2, 0.3, None)],
    ids=["K2", "K3", "K2-causal-vae", "K3-block1-causal-vae", "no-vae"],
)
def test_every_call_matches_scopes_recompute_and_bias(loop, tiny, euler, K, block, bias, vae_type):
    """StreamVAE decodes a frame differently without the frames before it (as Wan's causal VAE does): scope's
    re-encoded first frame is the one a decode of the whole video so far gives, not a decode of the last frames."""
    frames = 8
    with_vae = vae_type is not None
    vae = vae_type() if with_vae else None
    calls, result = _run(loop, tiny, euler, K=K, block=block, frames=frames, bias=bias, vae=vae)
    dm, samples = tiny.model.diffusion_model, result.samples
    ref_vae = vae_type() if with_vae else None
    reencoded = 0
    for n, writes, denoise in _per_chunk(calls, K, block, frames):
        context = tiny.model.process_latent_in(scope_context(samples, n, K, block, ref_vae))  # as the model sees it
        reencoded += n > K and n - block >= K
        # the writes hold exactly scope's context frames, in pieces of one block, at t = 0
        if n:
            torch.testing.assert_close(torch.cat([w["x"] for w in writes], dim=2), context, rtol=0, atol=1e-6)
            assert all(float(w["t"].abs().max()) == 0 for w in writes)
        for call in denoise:
            ref = krea_forward(dm, context, call["x"], call["t"], call["context"], block, bias)
            torch.testing.assert_close(call["out"], ref, atol=2e-5, rtol=2e-5)
    assert reencoded >= 1  # the re-encoded first frame was exercised
    if with_vae:
        assert ("encode", 1) in vae.calls
        assert result.report["anchor_frame"] == "vae"
    else:  # the report says the anchor frame was not re-encoded, and how to get it
        assert result.report["anchor_frame"] == "latent"
        assert "no VAE connected" in loop.report_text(result.report)


def test_the_causal_vae_decodes_a_window_otherwise_than_the_whole_video():
    """What makes StreamVAE a test of the anchor frame: its last pixel frame of a 3-frame window differs from the one
    the whole video's decode gives (FakeVAE's do not)."""
    latents = torch.randn(1, 16, 7, 4, 4, generator=torch.Generator().manual_seed(0))
    for vae, differs in ((StreamVAE(), True), (FakeVAE(), False)):
        window = vae.decode(latents[:, :, 3:6])[:, -1]
        whole = vae.decode(latents[:, :, :6])[:, -1]
        assert (float((window - whole).abs().max()) > 0.05) is differs, type(vae).__name__


def test_the_reference_catches_a_dropped_bias_absolute_rope_and_a_kept_first_frame(loop, tiny, euler):
    """Negative controls: each departure from scope moves the output of a late block well past the tolerance."""
    K = block = 2
    vae = FakeVAE()
    calls, result = _run(loop, tiny, euler, K=K, block=block, frames=6, bias=0.3, vae=vae)
    dm, samples = tiny.model.diffusion_model, result.samples
    n, _, denoise = _per_chunk(calls, K, block, 6)[-1]
    call = denoise[0]
    ctx = tiny.model.process_latent_in(scope_context(samples, n, K, block, FakeVAE()))
    args = (dm, ctx, call["x"], call["t"], call["context"], block)
    good = krea_forward(*args, 0.3)
    torch.testing.assert_close(call["out"], good, atol=2e-5, rtol=2e-5)
    wrong = {
        "no bias": krea_forward(*args, 1.0),
        "bias on the first frame": krea_forward(*args, 0.3, exempt=0),
        "the block at its absolute RoPE frame": krea_forward(*args, 0.3, block_rope=n),
        "first frame not re-encoded": krea_forward(
            dm, tiny.model.process_latent_in(samples[:, :, n - K : n]), *args[2:], 0.3
        ),
    }
    for what, ref in wrong.items():
        assert float((ref - good).abs().max()) > 1e-3, what


def test_recompute_refuses_what_it_cannot_combine(loop, tiny, euler):
    with pytest.raises(ValueError, match="window_chunks=1"):
        _run(loop, tiny, euler, K=2, block=2, frames=4, bias=1.0, vae=None, window_chunks=1)
    with pytest.raises(ValueError, match="kv_cache output"):
        _run(loop, tiny, euler, K=2, block=2, frames=4, bias=1.0, vae=None, keep_state=True)
    with pytest.raises(ValueError, match="kv_cache_attention_bias=0"):
        _run(loop, tiny, euler, K=2, block=2, frames=4, bias=0.0, vae=None)
    with pytest.raises(ValueError, match="VAE is used only with recompute_frames"):
        _run(loop, tiny, euler, K=0, block=2, frames=4, bias=1.0, vae=FakeVAE())
    with pytest.raises(ValueError, match="first_chunk_frames=1"):
        _run(loop, tiny, euler, K=2, block=2, frames=4, bias=1.0, vae=None, first_chunk_frames=1)
    with pytest.raises(ValueError, match="context_noise_mode='skyreels'"):
        _run(
            loop,
            tiny,
            euler,
            K=2,
            block=2,
            frames=4,
            bias=1.0,
            vae=None,
            context_noise=0.1,
            context_noise_mode="skyreels",
        )


def test_bias_without_recompute_spares_the_first_cached_frame_and_cfg_branches(loop, tiny, euler):
    """The bias alone (the pack's own cache): the block attends [cached chunks, itself] with log(bias) on every
    cached key but the first frame's, in both CFG branches; the writes stay unbiased."""
    import comfy.patcher_extension
    import comfy.samplers
    from support import reference

    rec = reference.DiffusionModelRecorder()
    m = tiny.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", STEPS)
    wan_tiny.run(
        loop,
        m,
        wan_tiny.conditioning(1, COND_TOKENS, 32),
        wan_tiny.conditioning(2, COND_TOKENS, 32),
        6,
        euler,
        sigmas,
        seed=3,
        cfg=3.0,
        chunk_frames=2,
        attention_bias=0.4,
        progress=False,
    )
    dm = tiny.model.diffusion_model
    calls = rec.calls  # chunk 0: 2 steps, write; chunk 1: 2 steps, write; chunk 2: 2 steps
    writes = [calls[2], calls[5]]
    call = calls[6]
    assert call["x"].shape[0] == 2  # cond and uncond batched
    ctx = torch.cat([w["x"] for w in writes], dim=2)
    # the pack's write attends block-causally at absolute RoPE frames; the reference's context pass does the same
    ref = krea_forward(dm, ctx, call["x"], call["t"], call["context"], 2, 0.4)
    torch.testing.assert_close(call["out"], ref, atol=2e-5, rtol=2e-5)
    assert float((krea_forward(dm, ctx, call["x"], call["t"], call["context"], 2, 1.0) - ref).abs().max()) > 1e-3


# ------------------------------------------------------------------------------------------ the stream decode
def _last_frames(vae, latents):
    """The pixel frames of the last latent frame in a whole decode of ``latents`` (what scope's stream gives)."""
    p = vae.decode(latents)
    return p.reshape(1, -1, *p.shape[-3:])[:, -(1 if latents.shape[2] == 1 else 4) :]


def test_the_stream_decode_gives_the_whole_videos_last_frame_decoding_only_new_frames(pack):
    """ComfyUI's own Wan 2.1 VAE class (random weights): the stream's last frame after every length equals a whole
    decode of the video so far (its own groups of frames: within float32 rounding, in practice bit for bit), each
    call decoding only frames not in a complete group yet; a 4-frame window decodes the last frame otherwise."""
    import importlib

    from jensen_testing.numerics import assert_within_rounding, relative_error, rounding_bound

    vs = importlib.import_module(f"{pack.__name__}.runtime.vae_stream")
    vae = wan_tiny.build_vae()
    lat = torch.randn(1, 16, 10, 4, 4, generator=torch.Generator().manual_seed(1))
    stream = vs.StreamDecoder(vae)
    assert stream.streams
    decoded = []
    real = vae.first_stage_model.decoder.forward
    vae.first_stage_model.decoder.forward = lambda x, *a, **k: decoded.append(x.shape[2]) or real(x, *a, **k)
    try:
        bound = rounding_bound(25, 27 * 64)  # ~25 3x3x3 convolutions, up to 64 channels in
        for t in (1, 2, 3, 4, 6, 7, 10):
            decoded.clear()
            got = stream.last_frame(lat[:, :, :t])
            assert sum(decoded) <= 3 + 1  # the new frames (at most 3 here) and a half-full group again
            want = _last_frames(vae, lat[:, :, :t])
            assert_within_rounding(got, want, bound, f"{t} frames")
    finally:
        vae.first_stage_model.decoder.forward = real
    window = _last_frames(vae, lat[:, :, 6:10])
    assert relative_error(window, want) > 100 * bound.value  # the decoder is causal: the frames before matter
    assert "decode" not in vae.first_stage_model.__dict__  # the instance's decode was restored
    with pytest.raises(ValueError, match="not the start of this one"):
        stream.last_frame(torch.randn(1, 16, 10, 4, 4))


def test_a_vae_stand_in_is_decoded_whole():
    """A VAE that is not Wan 2.1's (the stand-ins here) is decoded from the first frame every time, as before."""
    from support import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui()
    import importlib

    vs = importlib.import_module(f"{support_comfyui.import_pack().__name__}.runtime.vae_stream")
    vae = StreamVAE()
    stream = vs.StreamDecoder(vae)
    assert not stream.streams
    lat = torch.randn(1, 16, 5, 4, 4)
    assert torch.equal(stream.last_frame(lat), vae.decode(lat)[:, -4:])
    assert vae.calls[-1] == ("decode", 5)


def test_krea_with_wan_vae_decodes_each_chunk_once(loop, tiny, euler):
    """A Krea run with ComfyUI's Wan 2.1 VAE class: the model calls equal scope's recompute with the whole-video
    re-encode (the reference above, its VAE calls made whole), and no chunk's decode grows with the video."""
    vae = wan_tiny.build_vae()
    sizes = []
    real = vae.first_stage_model.decoder.forward
    vae.first_stage_model.decoder.forward = lambda x, *a, **k: sizes.append(x.shape[2]) or real(x, *a, **k)
    try:
        calls, result = _run(loop, tiny, euler, K=3, block=1, frames=8, bias=0.3, vae=vae)
    finally:
        vae.first_stage_model.decoder.forward = real
    assert result.report["anchor_frame"] == "vae"
    assert sum(sizes) <= 2 * (8 - 3)  # one new frame per chunk from chunk 4 on, and at most one half group again
    from jensen_testing.numerics import assert_within_rounding, rounding_bound

    ref_vae = wan_tiny.build_vae()
    samples = result.samples
    for n, writes, _ in _per_chunk(calls, 3, 1, 8):
        if n > 3:  # the re-encoded first frame: the decoder's and the encoder's ~25 convolutions each
            context = tiny.model.process_latent_in(scope_context(samples, n, 3, 1, ref_vae))
            got = torch.cat([w["x"] for w in writes], dim=2)
            assert_within_rounding(got, context, rounding_bound(50, 27 * 64), f"chunk at frame {n}")
