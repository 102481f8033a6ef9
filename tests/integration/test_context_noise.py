"""``context_noise`` > 0 as each reference does it (``context_noise_mode``), spied on the model's forward.

- relabel (Self-Forcing ``pipeline/causal_inference.py`` 226-235 at guandeh17/Self-Forcing 33593df; LongLive
  ``pipeline/causal_inference.py`` 191-200 and ``interactive_causal_inference.py`` 249-258 at NVlabs/LongLive
  2462895; CausVid ``causvid/models/wan/causal_inference.py`` 184-196 at tianweiy/CausVid ca21150, always t = 0):
  the cache-writing forward sees the clean chunk; only its timestep is context_noise x 1000.
- skyreels (SkyReels-V2 ``skyreels_v2_infer/pipelines/diffusion_forcing_pipeline.py`` 314-325 / 591-603 at
  SkyworkAI/SkyReels-V2 abed76f): the context is noised, ``x * (1 - f) + randn * f`` at t = f x 1000, with fresh
  noise before every denoising call; here the context is the cache, so it is re-written that way every step.
"""

from __future__ import annotations

import pytest
import torch
from support import wan_tiny

CHUNK, CHUNKS, STEPS, F = 2, 3, 2, 0.3


class ForwardSpy:
    """Records every ``forward_orig`` call of the diffusion model (what the model really sees: x and t)."""

    def __init__(self, dm):
        self.dm, self.calls, self.real = dm, [], dm.forward_orig

    def __call__(self, x, t, context, *args, **kwargs):
        self.calls.append({"x": x.detach().clone(), "t": t.detach().clone()})
        return self.real(x, t, context, *args, **kwargs)


@pytest.fixture
def spied(tiny, monkeypatch):
    dm = tiny.model.diffusion_model
    spy = ForwardSpy(dm)
    monkeypatch.setattr(dm, "forward_orig", spy, raising=False)
    return tiny, spy


def _run(loop, model, euler, cfg=1.0, **kw):
    import comfy.samplers

    return loop.run_chunked_ar(
        model,
        wan_tiny.conditioning(1, 13, 32),
        wan_tiny.conditioning(2, 13, 32),
        wan_tiny.video_latent(CHUNKS * CHUNK),
        seed=4,
        cfg=cfg,
        sampler=euler,
        sigmas=comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS),
        chunk_frames=CHUNK,
        context_noise=F,
        progress=False,
        **kw,
    )


def _clean(model, res, c):
    """Chunk ``c`` of the output as the model takes it (model space)."""
    return model.model.process_latent_in(res.samples[:, :, c * CHUNK : (c + 1) * CHUNK])


def _check_relabelled_writes(model, spy, res):
    writes = [call for i, call in enumerate(spy.calls) if (i + 1) % (STEPS + 1) == 0]  # steps, then the write
    assert len(writes) == CHUNKS - 1 and len(spy.calls) == CHUNKS * STEPS + CHUNKS - 1
    for c, call in enumerate(writes):
        assert torch.allclose(call["t"], torch.full_like(call["t"], F * 1000))  # the relabelled timestep
        assert torch.equal(call["x"], _clean(model, res, c))  # the clean chunk, not a noised one


def test_relabel_writes_the_clean_chunk_at_the_context_timestep(loop, spied, euler):
    model, spy = spied
    res = _run(loop, model, euler)  # relabel is the default
    _check_relabelled_writes(model, spy, res)


def test_the_relabel_spy_catches_a_noised_write(loop, spied, euler, monkeypatch):
    """Negative control: the write of the code before context_noise_mode (noised to context_noise) fails the check."""
    model, spy = spied
    monkeypatch.setattr(loop, "_write_relabelled", loop._write_once)
    res = _run(loop, model, euler)
    with pytest.raises(AssertionError):
        _check_relabelled_writes(model, spy, res)


def test_skyreels_mode_redraws_the_context_noise_every_step(loop, spied, euler):
    model, spy = spied
    res = _run(loop, model, euler, context_noise_mode="skyreels")
    calls = iter(spy.calls)
    implied: dict[int, list[torch.Tensor]] = {}
    for c in range(CHUNKS):
        for _ in range(STEPS):
            for kept in range(c):  # before every denoising call: every cached chunk, noised afresh, at t = F x 1000
                call = next(calls)
                assert torch.allclose(call["t"], torch.full_like(call["t"], F * 1000))
                noise = (call["x"] - (1 - F) * _clean(model, res, kept)) / F
                implied.setdefault(kept, []).append(noise)
            call = next(calls)  # the denoising call
            assert call["t"].max() > F * 1000
        if c < CHUNKS - 1:
            call = next(calls)  # the chunk's own write: noised once (what a saved state holds)
            assert torch.allclose(call["t"], torch.full_like(call["t"], F * 1000))
            assert not torch.allclose(call["x"], _clean(model, res, c))
    assert next(calls, None) is None
    assert len(implied[0]) == STEPS * (CHUNKS - 1) and len(implied[1]) == STEPS
    for draws in implied.values():
        for n in draws:
            assert 0.8 < n.std().item() < 1.2 and abs(n.mean().item()) < 0.2  # standard normal noise
        for a in range(len(draws)):
            for b in range(a):
                assert not torch.allclose(draws[a], draws[b], atol=1e-3)  # a fresh draw every step
    again = _run(loop, model, euler, context_noise_mode="skyreels")
    assert torch.equal(res.samples, again.samples)  # reproducible from the seed
    relabel = _run(loop, model, euler)
    assert torch.equal(res.samples[:, :, :CHUNK], relabel.samples[:, :, :CHUNK])  # no context for the first chunk
    assert not torch.equal(res.samples, relabel.samples)


def test_context_noise_modes_are_checked(loop, tiny, euler):
    with pytest.raises(ValueError, match="context_noise_mode='noisy'.*relabel, skyreels"):
        _run(loop, tiny, euler, context_noise_mode="noisy")
    with pytest.raises(ValueError, match="recache_mode='joint'.*causal, longlive"):
        _run(loop, tiny, euler, recache_mode="joint")


def test_context_noise_zero_is_the_same_in_both_modes(loop, tiny, euler):
    import comfy.samplers

    kw = dict(context_noise=0.0, chunk_frames=CHUNK, seed=4, cfg=1.0, sampler=euler, progress=False)
    sig = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", STEPS)
    pos, neg, lat = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32), wan_tiny.video_latent(6)
    a = loop.run_chunked_ar(tiny, pos, neg, lat, sigmas=sig, context_noise_mode="relabel", **kw)
    b = loop.run_chunked_ar(tiny, pos, neg, lat, sigmas=sig, context_noise_mode="skyreels", **kw)
    assert torch.equal(a.samples, b.samples)


def test_skyreels_mode_with_cfg_and_a_continued_run(loop, tiny, euler):
    """Both CFG branches are redrawn (one batched call, the same noise in both slots), and a run continued from
    its state equals the one run: the redraws are seeded by the chunk, not by where the run started."""
    kw = dict(cfg=2.0, context_noise_mode="skyreels", window_chunks=1, sink_chunks=1)
    whole = _run(loop, tiny, euler, **kw)
    assert whole.report["cache_bytes"] > 0
    import comfy.samplers

    common = dict(seed=4, sampler=euler, chunk_frames=CHUNK, context_noise=F, progress=False, **kw)
    sig = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", STEPS)
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    first = loop.run_chunked_ar(tiny, pos, neg, wan_tiny.video_latent(2 * CHUNK), sigmas=sig, keep_state=True, **common)
    second = loop.run_chunked_ar(tiny, pos, neg, wan_tiny.video_latent(CHUNK), sigmas=sig, resume=first.state, **common)
    assert torch.equal(torch.cat([first.samples, second.samples], dim=2), whole.samples)
