"""LongLive's re-cache (``recache_mode="longlive"``) against a reference written from LongLive's code.

The reference is NVlabs/LongLive at commit 2462895 (its last Wan 2.1 commit):
``pipeline/interactive_causal_inference.py`` (the loop and ``_recache_after_switch``) and
``wan/modules/causal_model.py`` (``CausalWanSelfAttention.forward``'s KV-cache branch and
``_apply_cache_updates``). :class:`LongLiveKV` below mirrors that KV cache step by step - a rolling
buffer of ``local_attn_size`` frames with a ``sink_size``-frame sink, LongLive's ``is_recompute`` rule
and its unmasked attention - and runs ComfyUI's own tiny ``WanModel`` with it (self-attention swapped
in through ``optimized_attention_override``). The pack's run is recorded call by call (the inputs of
every model call: noisy chunks, timesteps, prompts); the reference replays LongLive's loop on the same
inputs, re-caching where the prompt switches as LongLive does, and must give the same output for
every denoising call and the same cached K/V after the switch. Full precision (no Quantize KV Cache),
so only the re-cache logic is tested.

Mapping: LongLive's ``local_attn_size`` = (sink + window + 1) x chunk_frames latent frames,
``sink_size`` = sink x chunk_frames (``Retention.from_local_attention``); LongLive 1.0 is 12 and 3 with
blocks of 3 (window 2, sink 1); here blocks of 2 frames, window 2, sink 1: 8 and 2.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from support import reference, wan_tiny

CHUNK, WINDOW, SINK, CHUNKS = 2, 2, 1, 7
LOCAL_ATTN, SINK_SIZE = (SINK + WINDOW + 1) * CHUNK, SINK * CHUNK  # LongLive's frames: 8 and 2
TPF = 16  # tokens per latent frame of the tiny latents (8 x 8 latent pixels, 2 x 2 patches)


class LongLiveKV:
    """LongLive's self-attention KV cache of every block (``causal_model.py`` 205-348, 837-889), frame_seqlen
    ``fs``. LongLive's ``max_attention_size`` is ``local_attn_size * 1560`` (88): 1560 is 480x832's frame_seqlen,
    so at that size it is ``local_attn_size`` frames - the reference uses ``local_attn_size * fs``."""

    def __init__(self, layers: int, local_attn_size: int, sink_size: int, fs: int):
        self.layers, self.fs = layers, fs
        self.size, self.sink_tokens = local_attn_size * fs, sink_size * fs
        self.max_attention_size = local_attn_size * fs
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers
        self.global_end = [0] * layers
        self.local_end = [0] * layers
        self.current_start = 0  # tokens; set before each forward (LongLive's current_start argument)
        self.sink_recache_after_switch = False  # LongLive passes ``not global_sink``; global_sink is true
        self.last_attended: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (k_cat, v_cat)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``CausalWanSelfAttention.forward`` from line 206 on; q, k (post-RoPE), v: (B, s, n, d)."""
        if self.k[layer] is None:  # _initialize_kv_cache: zeros of kv_cache_size tokens
            self.k[layer] = k.new_zeros(k.shape[0], self.size, *k.shape[2:])
            self.v[layer] = v.new_zeros(v.shape[0], self.size, *v.shape[2:])
        cache_k, cache_v = self.k[layer], self.v[layer]
        current_start = self.current_start
        current_end = current_start + q.shape[1]  # 213
        sink_tokens, kv_cache_size, num_new_tokens = self.sink_tokens, self.size, q.shape[1]  # 214-217
        ge, le = self.global_end[layer], self.local_end[layer]
        is_recompute = current_end <= ge and current_start > 0  # 230
        temp_k, temp_v = cache_k.clone(), cache_v.clone()  # 250-251 / 292-293
        if current_end > ge and num_new_tokens + le > kv_cache_size:  # 231-232: roll
            num_evicted_tokens = num_new_tokens + le - kv_cache_size  # 235
            num_rolled_tokens = le - num_evicted_tokens - sink_tokens  # 236
            local_end_index = le + current_end - ge - num_evicted_tokens  # 244-245
            local_start_index = local_end_index - num_new_tokens  # 246
            src = slice(sink_tokens + num_evicted_tokens, sink_tokens + num_evicted_tokens + num_rolled_tokens)
            temp_k[:, sink_tokens : sink_tokens + num_rolled_tokens] = temp_k[:, src].clone()  # 254-257
            temp_v[:, sink_tokens : sink_tokens + num_rolled_tokens] = temp_v[:, src].clone()
            write_start_index = max(local_start_index, sink_tokens) if is_recompute else local_start_index  # 261
        else:  # 286-302: direct insert
            local_end_index = le + current_end - ge  # 288
            local_start_index = local_end_index - num_new_tokens  # 289
            write_start_index = max(local_start_index, sink_tokens) if is_recompute else local_start_index  # 295
            if self.sink_recache_after_switch:  # 296-297
                write_start_index = local_start_index
        roped_offset = max(0, write_start_index - local_start_index)  # 262 / 298
        write_len = max(0, local_end_index - write_start_index)  # 263 / 299
        if write_len > 0:  # 264-266 / 300-302
            temp_k[:, write_start_index:local_end_index] = k[:, roped_offset : roped_offset + write_len]
            temp_v[:, write_start_index:local_end_index] = v[:, roped_offset : roped_offset + write_len]
        if sink_tokens > 0:  # 321-341
            local_budget = self.max_attention_size - sink_tokens
            local_start_for_window = max(sink_tokens, local_end_index - local_budget)
            k_cat = torch.cat([temp_k[:, :sink_tokens], temp_k[:, local_start_for_window:local_end_index]], dim=1)
            v_cat = torch.cat([temp_v[:, :sink_tokens], temp_v[:, local_start_for_window:local_end_index]], dim=1)
        else:  # 342-348
            window_start = max(0, local_end_index - self.max_attention_size)
            k_cat, v_cat = temp_k[:, window_start:local_end_index], temp_v[:, window_start:local_end_index]
        self.last_attended[layer] = (k_cat, v_cat)
        # attention(q, k, v) is flash attention without a mask: every query sees every key
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k_cat.transpose(1, 2), v_cat.transpose(1, 2))
        # _apply_cache_updates (837-889): the cache becomes what the attention used; pointers move unless recomputing
        self.k[layer], self.v[layer] = temp_k, temp_v
        if not is_recompute:
            self.global_end[layer], self.local_end[layer] = current_end, local_end_index
        return out.transpose(1, 2)

    def forward(self, dm, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor, start_frame: int) -> torch.Tensor:
        """One generator call with ``kv_cache`` at ``current_start = start_frame * frame_seqlen``: ComfyUI's
        ``WanModel.forward_orig`` with RoPE from ``start_frame`` (``causal_rope_apply``) and this cache."""
        B, _, T, H, W = x.shape
        L, calls = T * self.fs, [0]
        self.current_start = start_frame * self.fs

        def override(func, q, k, v, *args, **kwargs):
            if q.ndim == 3 and q.shape[1] == L and k.shape[1] == L:  # self-attention (cross-attention: text keys)
                heads = kwargs["heads"] if "heads" in kwargs else args[0]
                b, n, dim = q.shape
                split = (b, n, heads, dim // heads)
                out = self.attend(calls[0], q.view(split), k.view(split), v.view(split))
                calls[0] += 1
                return out.reshape(b, n, dim)
            return func(q, k, v, *args, **kwargs)

        freqs = dm.rope_encode(T, H, W, t_start=start_frame, device=x.device, dtype=torch.float32)
        with torch.no_grad():
            out = dm.forward_orig(
                x, t, context, freqs=freqs, transformer_options={"optimized_attention_override": override}
            )
        assert calls[0] == self.layers
        return out


def longlive_replay(dm, calls: list[dict], switch_chunk: int, layers: int, steps: int, context_t: float = 0.0):
    """LongLive's ``InteractiveCausalInferencePipeline.inference`` (98-261) on the pack's recorded inputs.

    ``calls`` are the pack's model calls in order; its re-cache call is skipped: the reference re-caches
    from the clean chunks itself (``_recache_after_switch``, 34-96). Returns per denoising call the
    reference output, and the K/V the first denoising call after the switch attended to, per layer."""
    kv = LongLiveKV(layers, LOCAL_ATTN, SINK_SIZE, TPF)
    outputs, clean, i, attended = [], [], 0, None
    for c in range(CHUNKS):
        current_start_frame = c * CHUNK
        if c == switch_chunk:
            i += 1  # the pack's re-cache call (replaced by LongLive's own below)
            new_context = calls[i]["context"]  # the next call runs under the new prompt
            num_recache_frames = min(LOCAL_ATTN, current_start_frame)  # 54
            recache_start_frame = current_start_frame - num_recache_frames  # 55
            frames = torch.cat(clean, dim=2)[:, :, recache_start_frame:current_start_frame]  # 57
            t = torch.full_like(calls[i]["t"], context_t)  # 75-76: timestep = context_noise
            kv.forward(dm, frames, t, new_context, recache_start_frame)  # 81-90
        for s in range(steps):  # 210-244: denoising steps, each at current_start_frame
            call = calls[i]
            outputs.append((call, kv.forward(dm, call["x"], call["t"], call["context"], current_start_frame)))
            if c == switch_chunk and s == 0:
                attended = {layer: kv.last_attended[layer] for layer in range(layers)}
            i += 1
        if c < CHUNKS - 1:  # 249-258: re-run with the clean chunk to update the cache
            call = calls[i]
            kv.forward(dm, call["x"], call["t"], call["context"], current_start_frame)
            clean.append(call["x"])
            i += 1
    assert i == len(calls)
    return outputs, attended


def _schedule(ps, switch_at):
    a, b = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(7, 13, 32)
    return ps.add_to_schedule(ps.add_to_schedule(None, a, 0, "A"), b, switch_at, "B")


def _recorded_run(loop, tiny, euler, switch_at, observer=None, cfg=1.0, **kw):
    import comfy.patcher_extension
    import comfy.samplers

    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    rec = reference.DiffusionModelRecorder()
    m = tiny.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def watch(e):  # the pack's cache as the first step of the switch chunk reads it
        if observer is not None:
            observer(e)
        full = e.cache is not None and e.cache.entries and isinstance(e.cache.entries[0].k, torch.Tensor)
        if full and e.phase == "denoise" and e.chunk == switch_at and e.step == 0 and e.layer not in seen:
            seen[e.layer] = (
                torch.cat([en.k for en in e.cache.entries], dim=2),
                torch.cat([en.v for en in e.cache.entries], dim=2),
            )

    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    res = loop.run_chunked_ar(
        m,
        _schedule(ps, switch_at),
        wan_tiny.conditioning(2, 13, 32),
        wan_tiny.video_latent(CHUNKS * CHUNK),
        seed=3,
        cfg=cfg,
        sampler=euler,
        sigmas=sigmas,
        chunk_frames=CHUNK,
        window_chunks=WINDOW,
        sink_chunks=SINK,
        observer=watch,
        progress=False,
        **kw,
    )
    return res, rec.calls, seen


# switch at chunk 5 (frame 10 > local_attn_size 8): the sink keeps prompt A's K/V, window + evicted chunk re-cached;
# at chunk 4 (frame 8, not past local_attn_size): LongLive's recompute starts at frame 0, the sink is re-cached too
# (the default re-cache is LongLive's: a run that does not name recache_mode is checked too; it was the pack's own
# causal re-cache before, which fails this comparison: test_causal_recache_differs_from_longlive)
@pytest.mark.parametrize("mode", ["longlive", None], ids=["longlive", "default"])
@pytest.mark.parametrize("switch_at,recached", [(5, 3), (4, 4)])
def test_longlive_recache_matches_longlive(loop, tiny, euler, switch_at, recached, mode):
    kw = {} if mode is None else {"recache_mode": mode}
    res, calls, seen = _recorded_run(loop, tiny, euler, switch_at, **kw)
    assert res.report["recipe"] == "longlive" and res.report["recache_mode"] == "longlive"
    dm = tiny.model.diffusion_model
    # the re-cache is one forward of the recomputed chunks, at t = context_noise = 0, under prompt B
    recache = calls[3 * switch_at]
    assert recache["x"].shape[2] == recached * CHUNK and torch.all(recache["t"] == 0)
    assert torch.equal(recache["context"], calls[3 * switch_at + 1]["context"])
    assert not torch.equal(recache["context"], calls[0]["context"])
    assert [(p["label"], p["recached_chunks"]) for p in res.report["prompts"]] == [("A", 0), ("B", recached)]
    outputs, attended = longlive_replay(dm, calls, switch_at, layers=2, steps=2)
    assert len(outputs) == 2 * CHUNKS
    for call, ref in outputs:  # every denoising call, the ones after the switch included
        torch.testing.assert_close(call["out"], ref, atol=1e-5, rtol=1e-5)
    # the cache the first step after the switch reads: LongLive's sink + window, K and V
    for layer in range(2):
        k_ref, v_ref = (a[:, : -CHUNK * TPF].transpose(1, 2) for a in attended[layer])  # without the current chunk
        torch.testing.assert_close(seen[layer][0], k_ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(seen[layer][1], v_ref, atol=1e-5, rtol=1e-5)


def test_causal_recache_differs_from_longlive(loop, tiny, euler):
    """The old per-chunk causal re-cache does not match the reference: the comparison above can fail."""
    switch_at = 5
    res, calls, seen = _recorded_run(loop, tiny, euler, switch_at, recache_mode="causal")
    # the causal mode re-writes sink + window one chunk per call: drop those calls to line up with the reference
    calls = calls[: 3 * switch_at] + [calls[3 * switch_at]] + calls[3 * switch_at + SINK + WINDOW :]
    outputs, attended = longlive_replay(tiny.model.diffusion_model, calls, switch_at, layers=2, steps=2)
    before = outputs[: 2 * switch_at]
    for call, ref in before:  # the same before the switch ...
        torch.testing.assert_close(call["out"], ref, atol=1e-5, rtol=1e-5)
    after = outputs[2 * switch_at]  # ... but not the first call after it
    assert (after[0]["out"] - after[1]).abs().max() > 1e-4
    k_ref = attended[1][0][:, : -CHUNK * TPF].transpose(1, 2)
    assert (seen[1][0] - k_ref).abs().max() > 1e-4  # layer 1's cached keys differ (layer 0 sees no text)
    longlive = _recorded_run(loop, tiny, euler, switch_at, recache_mode="longlive")[0]
    assert torch.equal(res.samples[:, :, : switch_at * CHUNK], longlive.samples[:, :, : switch_at * CHUNK])
    assert not torch.equal(res.samples, longlive.samples)


def test_recomputed_chunks_are_quantized_as_writes_are(loop, nodes, tiny, euler, jk):
    """With a 2-bit cache each recomputed chunk is stored as quantize(its K/V) - the same as any write."""
    model = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    config = model.model_options["transformer_options"]["jensen_kv"]
    written: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    cached: dict[int, list] = {}
    switch_at = 5

    def watch(e):
        if e.phase == "write":  # the last write of each chunk: the re-cache's for the recomputed ones
            written[(e.layer, e.chunk)] = (e.k.detach().clone(), e.v.detach().clone())
        elif e.chunk == switch_at and e.step == 0 and e.layer not in cached:
            cached[e.layer] = list(e.cache.entries)

    res, calls, _ = _recorded_run(loop, model, euler, switch_at, recache_mode="longlive", observer=watch)
    assert calls[3 * switch_at]["x"].shape[2] == 3 * CHUNK  # the window and the evicted chunk, one forward
    for layer in range(2):
        entries = cached[layer]
        assert len(entries) == SINK + WINDOW  # sink (prompt A, chunk 0) + window (chunks 3, 4, prompt B)
        for entry, chunk in zip(entries, [0, switch_at - 2, switch_at - 1]):
            k, v = written[(layer, chunk)]
            assert torch.equal(entry.k.dequantize(), jk.quantize(k, config.spec_k).dequantize())
            assert torch.equal(entry.v.dequantize(), jk.quantize(v, config.spec_v).dequantize())
    assert res.report["prompts"][1]["recached_chunks"] == 3


def _small_run(loop, model, frames, switch_at, **kw):
    import comfy.samplers

    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    return loop.run_chunked_ar(
        model,
        _schedule(ps, switch_at),
        wan_tiny.conditioning(2, 13, 32),
        wan_tiny.video_latent(frames),
        seed=5,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2),
        chunk_frames=CHUNK,
        window_chunks=1,
        sink_chunks=1,
        recache_mode="longlive",
        progress=False,
        **kw,
    )


@pytest.mark.parametrize("switch_at", [2, 3])  # at the first chunk after loading, or after one more chunk
def test_a_continued_run_re_caches_as_the_one_run_does(loop, tiny, tmp_path, switch_at):
    """2 chunks, save, load, 2 more: bit for bit the one run (LongLive's re-cache included) whenever the one run's
    re-cache needs no chunk the window dropped before the save."""
    rs = importlib.import_module("comfyui_jensen_kv.runtime.saved_run")
    whole = _small_run(loop, tiny, 4 * CHUNK, switch_at)
    first = _small_run(loop, tiny, 2 * CHUNK, switch_at, keep_state=True)
    first.state.save(str(tmp_path / "s.safetensors"))
    second = _small_run(loop, tiny, 2 * CHUNK, switch_at, resume=rs.load_saved_run(str(tmp_path / "s.safetensors")))
    assert torch.equal(torch.cat([first.samples, second.samples], dim=2), whole.samples)
    assert second.report["prompts"][1]["recached_chunks"] == whole.report["prompts"][1]["recached_chunks"] == switch_at


def test_a_state_saved_with_a_full_window_re_caches_without_the_dropped_chunk(loop, tiny):
    """A saved state keeps the window, not the chunk it dropped last: a switch at the first chunk after loading
    recomputes sink and window without it (documented in docs/long-videos.md), where the one run has it."""
    whole = _small_run(loop, tiny, 4 * CHUNK, 3)
    first = _small_run(loop, tiny, 3 * CHUNK, 3, keep_state=True)
    assert [c.chunk for c in first.state.retained] == [0, 2]  # chunk 1 was evicted before the save
    second = _small_run(loop, tiny, CHUNK, 3, resume=first.state)
    assert whole.report["prompts"][1]["recached_chunks"] == 3 and second.report["prompts"][1]["recached_chunks"] == 2
    assert torch.equal(first.samples, whole.samples[:, :, : 3 * CHUNK])
    assert not torch.equal(second.samples, whole.samples[:, :, 3 * CHUNK :])


@pytest.mark.parametrize("switch_at", [5, 4])  # sink kept / sink re-cached
def test_diagnostics_follow_the_longlive_recache(loop, nodes, tiny, euler, switch_at):
    """KV Cache Diagnostics keeps a full-precision copy of every cached chunk; after the joint re-cache it still
    matches the cache chunk by chunk (it raises 'lost track' otherwise) and covers the chunks after the switch."""
    model = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    model = nodes.JensenKVDiagnostics.execute(model, "all", "all", "all", 1).args[0]
    res, _, _ = _recorded_run(loop, model, euler, switch_at, recache_mode="longlive")
    assert res.report["prompts"][1]["recached_chunks"] == (3 if switch_at == 5 else 4)
    assert "diagnostics" in res.report


def test_both_sampler_nodes_pass_the_modes_on(loop, nodes, tiny, monkeypatch):
    mod = importlib.import_module("comfyui_jensen_kv.nodes.chunked_ar_sampler")
    seen, real = [], mod.run
    monkeypatch.setattr(mod, "run", lambda request: (seen.append(request), real(request))[1])
    import comfy.samplers

    common = dict(
        positive=wan_tiny.conditioning(1, 13, 32),
        negative=wan_tiny.conditioning(2, 13, 32),
        latent=wan_tiny.video_latent(4),
        seed=4,
        cfg=1.0,
        chunk_frames=2,
        window_chunks=0,
        context_noise=0.1,
        recache_mode="longlive",
        context_noise_mode="skyreels",
    )
    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    nodes.JensenKVChunkedARSampler.execute(
        tiny, sampler=comfy.samplers.sampler_object("euler"), sigmas=sigmas, **common
    )
    nodes.JensenKVChunkedARKSampler.execute(tiny, steps=2, sampler_name="euler", scheduler="simple", **common)
    assert [(r.recipe.recache_mode, r.recipe.context_noise_mode) for r in seen] == [("longlive", "skyreels")] * 2
    defaults = {k: v for k, v in common.items() if k not in ("recache_mode", "context_noise_mode")}
    nodes.JensenKVChunkedARSampler.execute(
        tiny, sampler=comfy.samplers.sampler_object("euler"), sigmas=sigmas, **defaults
    )
    nodes.JensenKVChunkedARKSampler.execute(tiny, steps=2, sampler_name="euler", scheduler="simple", **defaults)
    # a prompt switch re-caches as LongLive does unless asked otherwise (the old default was the pack's causal one,
    # which re-writes the sink LongLive keeps)
    assert [(r.recipe.recache_mode, r.recipe.context_noise_mode) for r in seen[2:]] == [("longlive", "relabel")] * 2
    assert loop.RecipeOptions().recache_mode == "longlive"


def test_longlive_recache_with_both_cfg_branches(loop, tiny, euler):
    """cfg > 1: the joint forward re-caches the cond and the uncond cache (each its own chunk entries)."""
    entries = {}

    def watch(e):
        if e.phase == "denoise" and e.chunk == 5 and e.step == 0:
            entries[(e.layer, e.branch)] = len(e.cache.entries)

    res, calls, _ = _recorded_run(loop, tiny, euler, 5, recache_mode="longlive", observer=watch, cfg=2.0)
    assert sorted(calls[15]["cond_or_uncond"]) == [0, 1] and calls[15]["x"].shape[2] == 3 * CHUNK
    assert entries == {(layer, b): SINK + WINDOW for layer in range(2) for b in (0, 1)}
    assert res.report["prompts"][1]["recached_chunks"] == 3
