"""Loading a saved run state inside ComfyUI (hostile metadata, half-true state).

The file checks themselves need no ComfyUI (``tests/test_saved_run.py``); here: the Load KV Cache node
passes ComfyUI's interrupt check to the loader, so an interrupt stops a load, and a resumed run asks
ComfyUI for memory for the chunks the state really holds, never for a number the state claims.
"""

from __future__ import annotations

import dataclasses

import pytest
from support import wan_tiny

CHUNK, STEPS = 2, 2


def _model(nodes, tiny):
    return nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]


def _run(loop, model, frames, **kw):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)
    return loop.run_chunked_ar(
        model,
        wan_tiny.conditioning(1, 13, 32),
        wan_tiny.conditioning(2, 13, 32),
        wan_tiny.video_latent(frames),
        seed=5,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=CHUNK,
        progress=False,
        **kw,
    )


def test_load_kv_cache_stops_on_an_interrupt(nodes, loop, tiny, tmp_path, monkeypatch):
    import comfy.model_management as mm
    import folder_paths

    monkeypatch.setattr(folder_paths, "output_directory", str(tmp_path))
    state = _run(loop, _model(nodes, tiny), 4, keep_state=True).state
    state.save(str(tmp_path / "s.safetensors"))
    loaded = nodes.JensenKVLoadKVCache.execute("output/s.safetensors").args[0]
    assert (loaded.next_chunk, loaded.next_frame) == (2, 4)
    mm.interrupt_current_processing(True)
    with pytest.raises(mm.InterruptProcessingException):
        nodes.JensenKVLoadKVCache.execute("output/s.safetensors")
    assert not mm.processing_interrupted()  # the check consumed the interrupt, as ComfyUI's own checks do


def test_a_resumed_run_plans_memory_for_the_chunks_the_state_holds(nodes, loop, tiny):
    model = _model(nodes, tiny)
    state = _run(loop, model, 4, keep_state=True).state  # window 0: chunks 0 and 1 held
    honest = _run(loop, model, 2, resume=state)
    # a state (built in memory: a file like it is refused at load) that claims a million frames before it
    claimed = dataclasses.replace(state, next_chunk=500_000, next_frame=10**6)
    lying = _run(loop, model, 2, resume=claimed)
    assert 0 < honest.report["planned_bytes"] < 1 << 20
    assert lying.report["planned_bytes"] == honest.report["planned_bytes"]
    assert lying.report["first_chunk"] == 500_000
