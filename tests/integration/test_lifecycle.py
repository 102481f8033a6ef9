"""Lifecycle of a Chunked AR run: nothing mutated, nothing left patched, caches freed, runs independent."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from support import wan_tiny

STEPS = 3
FRAMES = 6
CHUNK = 2


def _sigmas(model, steps=STEPS):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps)


def _run(loop, model, euler, *, seed=3, cfg=2.0, frames=FRAMES, chunk=CHUNK, window=0, **kw):
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    return loop.run_chunked_ar(
        model,
        pos,
        neg,
        wan_tiny.video_latent(frames),
        seed=seed,
        cfg=cfg,
        sampler=euler,
        sigmas=_sigmas(model),
        chunk_frames=chunk,
        window_chunks=window,
        progress=False,
        **kw,
    )


def _patched(nodes, model):
    m = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


def assert_unpatched(model):
    """Every block's self_attn.forward is WanSelfAttention.forward bound to that block; the run's wrapper is gone.

    (The patch nodes' own wrappers, which let core's AR sampler use the pack's settings, belong to their
    MODEL output and stay: ``_snapshot`` checks that a run leaves those as they were.)"""
    import importlib

    from comfy.ldm.wan.model import WanSelfAttention
    from support.comfyui import PACK_MODULE

    run_wrapper = importlib.import_module(f"{PACK_MODULE}.runtime.families.wan.family").WRAPPER_KEY

    for i, blk in enumerate(model.model.diffusion_model.blocks):
        fwd = blk.self_attn.forward
        assert getattr(fwd, "__func__", None) is WanSelfAttention.forward, f"block {i}: {fwd!r} is still patched"
        assert fwd.__self__ is blk.self_attn
    assert not any(k.endswith("self_attn.forward") for k in model.object_patches_backup)
    for per_key in model.wrappers.values():
        assert run_wrapper not in per_key


class CacheSpy:
    """An observer that remembers every ChunkCache the run showed it."""

    def __init__(self):
        self.caches = {}
        self.first_chunk_cache_sizes = []

    def __call__(self, e):
        if e.cache is not None:
            self.caches[id(e.cache)] = e.cache
        if e.chunk == 0 and e.phase == "denoise":
            self.first_chunk_cache_sizes.append(0 if e.cache is None else e.cache.num_chunks)

    def assert_freed(self):
        assert self.caches, "the observer saw no cache"
        for c in self.caches.values():
            assert c.num_chunks == 0 and c.nbytes == 0


def _snapshot(model):
    return (
        copy.deepcopy(model.model_options),
        dict(model.object_patches),
        {k: {kk: list(vv) for kk, vv in v.items()} for k, v in model.wrappers.items()},
        {k: {kk: list(vv) for kk, vv in v.items()} for k, v in model.callbacks.items()},
        dict(model.patches),
    )


def test_input_model_is_never_mutated(loop, nodes, tiny, euler):
    before_tiny = _snapshot(tiny)
    model = _patched(nodes, tiny)
    assert model is not tiny and model.model is tiny.model
    assert _snapshot(tiny) == before_tiny  # the patch nodes cloned
    assert "jensen_kv" not in tiny.model_options["transformer_options"]
    before = _snapshot(model)
    _run(loop, model, euler)
    assert _snapshot(model) == before
    assert _snapshot(tiny) == before_tiny
    assert_unpatched(model)


def test_patches_removed_and_cache_freed_after_success(loop, nodes, tiny, euler):
    spy = CacheSpy()
    result = _run(loop, _patched(nodes, tiny), euler, observer=spy)
    assert result.report["cache_bytes"] > 0
    assert_unpatched(tiny)
    spy.assert_freed()


def test_patches_removed_and_cache_freed_after_an_exception(loop, nodes, tiny, euler):
    spy = CacheSpy()

    def boom(chunk, step, steps):
        if chunk == 1 and step == 1:
            raise RuntimeError("sampler callback failed")

    with pytest.raises(RuntimeError, match="sampler callback failed"):
        _run(loop, _patched(nodes, tiny), euler, observer=spy, step_callback=boom)
    assert_unpatched(tiny)
    spy.assert_freed()
    # the model still samples normally, exactly like a fresh model
    again = _run(loop, _patched(nodes, tiny), euler)
    fresh = _run(loop, _patched(nodes, wan_tiny.build_patcher(seed=0)), euler)
    assert torch.equal(again.samples, fresh.samples)


def _comfyui_checks_interrupts_in_every_op() -> bool:
    """ComfyUI's layers check the interrupt flag themselves (``comfy.ops.run_every_op``, v0.27), so an interrupt
    raised during a model call stops it at the next layer, before the pack's own check between steps."""
    import comfy.ops

    return hasattr(comfy.ops, "run_every_op")


def test_interrupt_is_honoured_between_steps_and_cleans_up(loop, nodes, tiny, euler):
    import comfy.model_management

    seen = []
    spy = CacheSpy()

    class InterruptMidStep(CacheSpy):
        def __call__(self, e):
            spy(e)
            # raise the flag *inside* a model call of chunk 1, step 1 (after one finished step)
            if e.chunk == 1 and e.phase == "denoise" and e.step == 1 and e.layer == 0:
                comfy.model_management.interrupt_current_processing()

    with pytest.raises(comfy.model_management.InterruptProcessingException):
        _run(
            loop,
            _patched(nodes, tiny),
            euler,
            observer=InterruptMidStep(),
            step_callback=lambda c, s, n: seen.append((c, s)),
        )
    if _comfyui_checks_interrupts_in_every_op():
        # newer ComfyUI (v0.27) raises from its next layer op: the step in flight stops there
        assert seen == [(0, 0), (0, 1), (0, 2), (1, 0)]
    else:
        # v0.3.64: the step in flight finished; the pack's check after it stopped the run
        assert seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert not comfy.model_management.processing_interrupted()
    assert_unpatched(tiny)
    spy.assert_freed()
    # and the next run is normal
    assert _run(loop, _patched(nodes, tiny), euler).samples.shape == (1, 16, FRAMES, 8, 8)


def test_interrupt_between_chunks(loop, tiny, euler):
    import comfy.model_management

    seen = []

    def on_step(c, s, n):
        seen.append((c, s))
        if c == 0 and s == n - 1:
            comfy.model_management.interrupt_current_processing()

    with pytest.raises(comfy.model_management.InterruptProcessingException):
        _run(loop, tiny, euler, step_callback=on_step)
    assert max(seen) == (0, STEPS - 1)
    assert_unpatched(tiny)


def test_same_seed_gives_identical_latents(loop, nodes, tiny, euler):
    model = _patched(nodes, tiny)
    a, b = _run(loop, model, euler, seed=11), _run(loop, model, euler, seed=11)
    c = _run(loop, model, euler, seed=12)
    assert torch.equal(a.samples, b.samples)
    assert not torch.equal(a.samples, c.samples)


def test_two_samplers_on_the_same_model_share_no_cache(loop, nodes, tiny, euler):
    model = _patched(nodes, tiny)
    spy_a, spy_b = CacheSpy(), CacheSpy()
    first = _run(loop, model, euler, observer=spy_a)
    other = _run(loop, model, euler, seed=99, chunk=3, window=1, observer=spy_b)
    again = _run(loop, model, euler)
    assert torch.equal(first.samples, again.samples)
    assert not set(spy_a.caches) & set(spy_b.caches)
    # the second run's first chunk saw empty caches, not the first run's
    assert spy_b.first_chunk_cache_sizes and set(spy_b.first_chunk_cache_sizes) == {0}
    assert other.report["chunks"] == 2 and other.report["window_chunks"] == 1
    assert "jensen_kv_run" not in str(model.model_options)


def test_progress_counts_chunks_times_steps(loop, tiny, euler):
    """One bar over the whole run: the pack reports every step of every chunk, in order; ComfyUI passes
    them on to the front end (all of them on v0.3.64; v0.27 throttles, keeping the first and the last)."""
    from support.progress import record_progress

    with record_progress() as progress:
        pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
        wan_tiny.run(loop, tiny, pos, neg, FRAMES, euler, _sigmas(tiny), chunk_frames=CHUNK)
    chunks = FRAMES // CHUNK
    assert [(v, t) for v, t, _ in progress.sent] == [(i, chunks * STEPS) for i in range(1, chunks * STEPS + 1)]
    progress.assert_shown_follows_sent()


def _other_wan(kind):
    import comfy.model_patcher
    import comfy.supported_models

    cfg = wan_tiny.unet_config(**wan_tiny.TINY)
    if kind == "i2v":
        cfg.update(model_type="i2v", in_dim=36)
        mc = comfy.supported_models.WAN21_I2V(cfg)
    else:
        cfg.update(model_type="vace", vace_layers=1, vace_in_dim=96)
        mc = comfy.supported_models.WAN21_Vace(cfg)
    mc.set_inference_dtype(torch.float32, None)
    return comfy.model_patcher.ModelPatcher(
        mc.get_model({}), load_device=torch.device("cpu"), offload_device=torch.device("cpu")
    )


@pytest.mark.parametrize("kind,match", [("i2v", "image-to-video"), ("vace", "WAN21_Vace")])
def test_other_wan_variants_are_rejected_by_name(loop, comfy, tiny, euler, kind, match):
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    with pytest.raises(ValueError, match=r"supports Wan 2\.1 text-to-video.*Self-Forcing.*" + match):
        wan_tiny.run(loop, _other_wan(kind), pos, neg, 4, euler, _sigmas(tiny), chunk_frames=2)


def test_non_wan_models_are_rejected_by_name(loop, tiny, euler):
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    not_wan = types.SimpleNamespace(model=torch.nn.Linear(2, 2), model_options={"transformer_options": {}})
    with pytest.raises(
        ValueError,
        match=r"supports Wan 2\.1 text-to-video.*\(node: Chunked AR Video Sampler\).*HY-WorldPlay.*MAGI-1.*"
        r"This MODEL \(Linear\) is not one",
    ):
        wan_tiny.run(loop, not_wan, pos, neg, 4, euler, _sigmas(tiny), chunk_frames=2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(chunk=0), "chunk_frames=0 must be at least 1"),
        (dict(window=-1), "window_chunks=-1 must be 0"),
        (dict(context_noise=1.5), "context_noise=1.5 must be between 0"),
    ],
)
def test_bad_settings_name_the_value_and_the_fix(loop, tiny, euler, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _run(loop, tiny, euler, **kwargs)
    assert_unpatched(tiny)


def test_bad_inputs_name_the_value_and_the_fix(loop, tiny, euler):
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    sig = _sigmas(tiny)
    common = dict(seed=0, cfg=1.0, sampler=euler, chunk_frames=2)
    with pytest.raises(ValueError, match=r"a Wan video latent is \(batch, 16, frames, height, width\)"):
        loop.run_chunked_ar(tiny, pos, neg, {"samples": torch.zeros(1, 16, 8, 8)}, sigmas=sig, **common)
    with pytest.raises(ValueError, match="must be even.*multiples of 16"):
        loop.run_chunked_ar(tiny, pos, neg, wan_tiny.video_latent(4, 7, 8), sigmas=sig, **common)
    with pytest.raises(ValueError, match="at least 2 values"):
        loop.run_chunked_ar(tiny, pos, neg, wan_tiny.video_latent(4), sigmas=sig[:1], **common)
    with pytest.raises(ValueError, match="positive conditioning has 2 entries.*ConditioningConcat"):
        loop.run_chunked_ar(tiny, pos + pos, neg, wan_tiny.video_latent(4), sigmas=sig, **common)
    assert_unpatched(tiny)


def test_a_patch_that_skips_the_cache_write_is_reported(loop, tiny, euler):
    """A step-cache style wrapper that skips the model call of the write pass must not go unnoticed."""
    import comfy.patcher_extension

    def skip_clean_calls(executor, x, timestep, *args, **kwargs):
        if bool((timestep == 0).all()):  # the cache-writing forward (context noise 0)
            return torch.zeros_like(x)
        return executor(x, timestep, *args, **kwargs)

    m = tiny.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_skipper", skip_clean_calls)
    with pytest.raises(RuntimeError, match="cache-writing pass of chunk 0 did not reach every self-attention layer"):
        _run(loop, m, euler)
    assert_unpatched(tiny)
