"""The pack behaves like the ComfyUI tools users know: latent previews while sampling, a memory
request before the run, and no silent replacement of another pack's attention patch."""

from __future__ import annotations

import pytest
import torch
from support import wan_tiny


def _run(loop, model, frames=6, **kw):
    import comfy.samplers

    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2)
    return loop.run_chunked_ar(
        model,
        pos,
        neg,
        wan_tiny.video_latent(frames),
        seed=3,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=2,
        **kw,
    )


def test_latent_previews_arrive_for_every_step_of_every_chunk(loop, tiny, monkeypatch):
    import comfy.cli_args
    from latent_preview import LatentPreviewMethod
    from support.progress import record_progress

    monkeypatch.setattr(comfy.cli_args.args, "preview_method", LatentPreviewMethod.Latent2RGB)
    with record_progress() as progress:
        res = _run(loop, tiny)
    assert [(v, t) for v, t, _ in progress.sent] == [(i, 6) for i in range(1, 7)]  # 3 chunks x 2 steps, one bar
    # an update with a preview always reaches the front end (newer ComfyUI throttles only those without)
    seen = progress.shown
    assert [(v, t) for v, t, _ in seen] == [(i, 6) for i in range(1, 7)]
    formats = {p[0] for _, _, p in seen}
    assert formats == {"JPEG"}
    images = [torch.frombuffer(bytearray(p[1].tobytes()), dtype=torch.uint8).float() for _, _, p in seen]
    assert p_size(seen[0][2]) == (8, 8)  # the chunk's first latent frame, latent size (Latent2RGB)
    # the last step of each chunk previews that chunk: they differ from one another
    assert (images[1] - images[3]).abs().mean() > 1 and (images[3] - images[5]).abs().mean() > 1
    assert torch.isfinite(res.samples).all()


def p_size(preview):
    return preview[1].size


def test_no_previews_when_comfyui_runs_without_them(loop, tiny, monkeypatch):
    import comfy.cli_args
    from latent_preview import LatentPreviewMethod
    from support.progress import record_progress

    monkeypatch.setattr(comfy.cli_args.args, "preview_method", LatentPreviewMethod.NoPreviews)
    with record_progress() as progress:
        _run(loop, tiny)
    assert len(progress.sent) == 6 and all(p is None for _, _, p in progress.sent)
    assert all(p is None for _, _, p in progress.shown)
    progress.assert_shown_follows_sent()


def test_the_run_asks_comfyui_for_room_for_the_planned_cache(loop, nodes, tiny, monkeypatch):
    import comfy.model_management as mm

    calls = []
    real = mm.load_models_gpu

    def spy(models, memory_required=0, *args, **kwargs):
        calls.append(int(memory_required))
        return real(models, memory_required, *args, **kwargs)

    monkeypatch.setattr(mm, "load_models_gpu", spy)
    model = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    res = _run(loop, model, frames=10, window_chunks=2, progress=False)
    planned = res.report["planned_bytes"]
    assert calls and calls[0] == planned > 0  # asked before the first chunk, for the planned peak
    assert res.report["memory_request"]["bytes"] == planned == res.report["cache_bytes"]
    assert res.report["memory_request"]["device"] == str(tiny.load_device)


def test_another_packs_attention_patch_is_not_silently_replaced(loop, tiny):
    def other_pack_attention(*args, **kwargs):  # stands in for e.g. a sage-attention or teacache patch
        raise AssertionError("must not run")

    m = tiny.clone()
    m.add_object_patch("diffusion_model.blocks.1.self_attn.forward", other_pack_attention)
    with pytest.raises(
        ValueError,
        match=r"already carries an object patch on diffusion_model\.blocks\.1\.self_attn"
        r"\.forward \(test_another_packs_attention_patch_is_not_silently_replaced"
        r"\.<locals>\.other_pack_attention from test_comfyui_fit\)",
    ):
        _run(loop, m, progress=False)
    # nothing was left behind on the model or its clone
    assert "diffusion_model.blocks.0.self_attn.forward" not in m.object_patches
    assert m.object_patches["diffusion_model.blocks.1.self_attn.forward"] is other_pack_attention
