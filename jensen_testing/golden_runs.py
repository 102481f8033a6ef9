"""A fixed set of runs whose outputs must stay bit-identical through refactors: every recipe on the pack's sampler,
core's AR path, save and continue, tiers, QVG, a prefix clip, a prompt switch.

Each run is tiny (2-layer random Wan, 8x8 latents, 2 to 4 steps) and is recorded as the SHA-256 of its output
latent's float32 bytes (with the sum and the sum of absolute values, so a failure says how far off it is), per
ComfyUI version (the model's arithmetic differs a little between versions: 0.33's Wan FFN is a module of its
own). ``tests/integration/test_golden_runs.py`` recomputes them; ``python tools/golden_runs.py --record``
rewrites ``tests/data/golden_runs.json`` for the ComfyUI it runs against (only when a change is *meant* to
alter outputs; say which in the commit).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from . import causal_wan, wan_tiny
from .comfyui import PACK_MODULE, PACK_ROOT, comfyui_version, find_comfyui

GOLDEN_FILE = PACK_ROOT / "tests" / "data" / "golden_runs.json"
COND_TOKENS = 13


@dataclass(frozen=True)
class GoldenRun:
    name: str
    fn: Callable[[], dict[str, torch.Tensor]]  # outputs by name
    core_ar: bool = False  # needs core's AR path (v0.27+)


def digest(t: torch.Tensor) -> dict:
    x = t.detach().to("cpu", torch.float32).contiguous()
    return {
        "sha256": hashlib.sha256(x.numpy().tobytes()).hexdigest(),
        "shape": list(x.shape),
        "sum": float(x.double().sum()),
        "abs_sum": float(x.double().abs().sum()),
    }


def version_key(comfy_dir: Path | None = None) -> str:
    v = comfyui_version(comfy_dir or find_comfyui())
    return ".".join(map(str, v)) if v else "unknown"


# ------------------------------------------------------------------------------------------------ the runs
def _mods():
    nodes = importlib.import_module(f"{PACK_MODULE}.nodes")
    loop = importlib.import_module(f"{PACK_MODULE}.runtime.chunk_loop")
    ps = importlib.import_module(f"{PACK_MODULE}.runtime.prompt_schedule")
    sched = importlib.import_module(f"{PACK_MODULE}.runtime.schedules")
    return nodes, loop, ps, sched


def _conds(seed):
    return wan_tiny.conditioning(seed, COND_TOKENS, wan_tiny.TINY["text_dim"])


def _quant(nodes, model, bits="2", rotation="hadamard", mode="taylor", **kw):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, "32", rotation, **kw).args[0]
    if mode is not None:
        m = nodes.JensenKVBiasCorrection.execute(m, mode, 1.0).args[0]
    return m


def _sampler(name="euler"):
    import comfy.samplers

    return comfy.samplers.sampler_object(name)


def _sigmas(model, steps=2):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps)


def _pack(model, frames=5, cfg=1.0, positive=None, sampler="euler", sigmas=None, latent=None, **kw):
    _, loop, _, _ = _mods()
    pos = positive if positive is not None else _conds(1)
    return loop.run_chunked_ar(
        model,
        pos,
        _conds(2),
        latent if latent is not None else wan_tiny.video_latent(frames),
        seed=7,
        cfg=cfg,
        sampler=_sampler(sampler),
        sigmas=sigmas if sigmas is not None else _sigmas(model),
        chunk_frames=kw.pop("chunk_frames", 2),
        progress=False,
        **kw,
    )


def _switch(ps, at=2):
    return ps.add_to_schedule(ps.add_to_schedule(None, _conds(1), 0, "A"), _conds(5), at, "B")


def _tiny():
    return wan_tiny.build_patcher(seed=0)


def run_plain():
    nodes, *_ = _mods()
    return {"samples": _pack(_quant(nodes, _tiny())).samples}


def run_cfg_window_sink():
    nodes, *_ = _mods()
    r = _pack(
        _quant(nodes, _tiny(), rotation="none", mode="chunk_mean"), frames=7, cfg=2.0, window_chunks=1, sink_chunks=1
    )
    return {"samples": r.samples}


def run_self_forcing():
    nodes, _, _, sched = _mods()
    m = _quant(nodes, _tiny(), bits="4")
    return {"samples": _pack(m, sampler="lcm", sigmas=sched.ar_sigmas("self_forcing_4step")).samples}


def run_longlive_switch():
    nodes, _, ps, _ = _mods()
    r = _pack(
        _quant(nodes, _tiny()),
        frames=9,
        positive=_switch(ps, 3),
        window_chunks=1,
        sink_chunks=1,
        recache_mode="longlive",
        context_noise=0.0,
    )
    return {"samples": r.samples}


def run_causal_recache_switch():
    nodes, _, ps, _ = _mods()
    r = _pack(
        _quant(nodes, _tiny()), frames=7, positive=_switch(ps), window_chunks=1, sink_chunks=1, recache_mode="causal"
    )
    return {"samples": r.samples}


def run_krea():
    nodes, *_ = _mods()
    r = _pack(_quant(nodes, _tiny()), frames=9, chunk_frames=3, recompute_frames=3, attention_bias=0.3)
    return {"samples": r.samples}


def run_skyreels():
    nodes, *_ = _mods()
    r = _pack(_quant(nodes, _tiny()), frames=6, context_noise=0.1, context_noise_mode="skyreels")
    return {"samples": r.samples}


def run_causal_forcing_first_chunk():
    nodes, _, _, sched = _mods()
    m = _quant(nodes, _tiny())
    sigmas = sched.ar_sigmas("causal_forcing_framewise_2step")
    first = sched.first_chunk_sigmas("causal_forcing_framewise_2step")
    r = _pack(m, frames=5, sampler="lcm", sigmas=sigmas, first_chunk_sigmas=first, first_chunk_frames=1)
    return {"samples": r.samples}


def run_tiers():
    nodes, *_ = _mods()
    m = _quant(nodes, _tiny(), recent_chunks_bits="4", recent_chunks=1, sink_bits="8", recent_chunks_key_bits="8")
    return {"samples": _pack(m, frames=9, window_chunks=2, sink_chunks=1).samples}


def run_qvg():
    nodes, *_ = _mods()
    m = _quant(nodes, _tiny(), method="qvg", qvg_stages=1, qvg_centroids=4, qvg_iters=2)
    return {"samples": _pack(m, frames=5).samples}


def run_prefix():
    nodes, *_ = _mods()
    prefix = {"samples": torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(3))}
    r = _pack(_quant(nodes, _tiny()), frames=4, prefix=prefix, include_prefix=True)
    return {"samples": r.samples}


def run_save_continue():
    nodes, *_ = _mods()
    m = _quant(nodes, _tiny())
    first = _pack(m, frames=4, keep_state=True, window_chunks=2)
    second = _pack(m, frames=4, resume=first.state, window_chunks=2)
    return {"first": first.samples, "second": second.samples}


def run_core_plain():
    nodes, *_ = _mods()
    causal = causal_wan.build_causal_patcher(seed=0)
    lat = torch.zeros(1, 16, 6, 8, 8)
    out = causal_wan.sample_core(
        _quant(nodes, causal), lat, causal_wan.self_forcing_sigmas(), num_frame_per_block=2, seed=3
    )
    return {"samples": out}


def run_core_tiers_cfg():
    nodes, *_ = _mods()
    causal = causal_wan.build_causal_patcher(seed=0)
    m = _quant(nodes, causal, recent_chunks_bits="4", recent_chunks=1, sink_bits="8")
    lat = torch.zeros(1, 16, 6, 8, 8)
    out = causal_wan.sample_core(m, lat, causal_wan.self_forcing_sigmas(), num_frame_per_block=2, seed=3, cfg=2.0)
    return {"samples": out}


RUNS: tuple[GoldenRun, ...] = (
    GoldenRun("plain_int2_hadamard_taylor", run_plain),
    GoldenRun("cfg2_window1_sink1_chunk_mean", run_cfg_window_sink),
    GoldenRun("self_forcing_lcm_int4", run_self_forcing),
    GoldenRun("longlive_prompt_switch", run_longlive_switch),
    GoldenRun("causal_recache_prompt_switch", run_causal_recache_switch),
    GoldenRun("krea_recompute_bias", run_krea),
    GoldenRun("skyreels_context_noise", run_skyreels),
    GoldenRun("causal_forcing_first_chunk", run_causal_forcing_first_chunk),
    GoldenRun("tiers_per_side", run_tiers),
    GoldenRun("qvg", run_qvg),
    GoldenRun("prefix_clip", run_prefix),
    GoldenRun("save_and_continue", run_save_continue),
    GoldenRun("core_ar_plain", run_core_plain, core_ar=True),
    GoldenRun("core_ar_tiers_cfg2", run_core_tiers_cfg, core_ar=True),
)


def compute(run: GoldenRun) -> dict[str, dict]:
    torch.manual_seed(0)
    return {k: digest(v) for k, v in run.fn().items()}
