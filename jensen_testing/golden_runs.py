"""A fixed set of runs whose outputs refactors must leave unchanged: every recipe on the pack's sampler, core's AR
path, save and continue, tiers, QVG, a prefix clip, a prompt switch.

Each run is tiny (2-layer random Wan, 8x8 latents, 2 to 4 steps). Its output latents are recorded whole, in
float32, per ComfyUI version (the model's arithmetic differs a little between versions: 0.33's Wan FFN is a module
of its own, and v0.3.64's LCM sampler draws its noise otherwise): ``tests/data/golden_runs.safetensors`` holds
each distinct tensor once, ``tests/data/golden_runs.json`` says which tensor each version's run recorded and how
many Wan blocks it evaluated (``depth``).

A run is compared with its recording within float32 rounding, not bit for bit: BLAS and the vectorised kernels
round differently on another CPU (:mod:`jensen_testing.numerics`: relative L2 error at most 3.2e-5 for the tiny
Wan's 2 blocks and its timestep sinusoid). ``depth``, the Wan blocks the run
evaluates, is counted while it runs and must equal the recorded one: a run that evaluates its blocks another number
of times has changed. ``tests/integration/test_golden_runs.py``
recomputes them and plants one-line bugs (:data:`PLANTS`) to show that the bound still catches a behaviour change;
``python tools/golden_runs.py --record`` rewrites a version's entry (only when a change is *meant* to alter
outputs; say which in the commit).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from . import causal_wan, wan_tiny
from .comfyui import PACK_MODULE, PACK_ROOT, comfyui_version, find_comfyui
from .numerics import RoundingBound, relative_error, rounding_bound

GOLDEN_FILE = PACK_ROOT / "tests" / "data" / "golden_runs.json"
GOLDEN_TENSORS = PACK_ROOT / "tests" / "data" / "golden_runs.safetensors"
COND_TOKENS = 13
#: the longest reduction of a golden run, rounded up to a power of two: the tiny Wan's FFN (128 wide) and its
#: attention over at most 9 latent frames of 16 tokens (144 keys)
REDUCTION = 256
#: the tiny Wan's timestep embedding width (its sinusoid's largest argument is Wan's timestep, 1000 sigma <= 1000)
FREQ_DIM = 256


@dataclass(frozen=True)
class GoldenRun:
    name: str
    fn: Callable[[], dict[str, torch.Tensor]]  # outputs by name
    core_ar: bool = False  # needs core's AR path (v0.27+)


@dataclass
class Computed:
    """One run's outputs and the number of Wan blocks it evaluated."""

    outputs: dict[str, torch.Tensor]
    depth: int

    def bound(self) -> RoundingBound:
        return rounding_bound(wan_tiny.TINY["num_layers"], REDUCTION, sinusoid=(1000.0, FREQ_DIM))


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


@contextlib.contextmanager
def _counting_wan_blocks() -> Iterator[list[int]]:
    """Counts every Wan block evaluated while active (a global forward pre-hook, removed on exit)."""
    from comfy.ldm.wan.model import WanAttentionBlock

    n = [0]

    def hook(module, _args):
        if isinstance(module, WanAttentionBlock):
            n[0] += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield n
    finally:
        handle.remove()


def compute(run: GoldenRun) -> Computed:
    torch.manual_seed(0)
    with _counting_wan_blocks() as n:
        outputs = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in run.fn().items()}
    return Computed(outputs, n[0])


# ------------------------------------------------------------------------------------------------ the recording
def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def load_recorded(version: str) -> dict[str, Computed]:
    """This ComfyUI version's recorded runs, by name (empty when none is recorded)."""
    from safetensors.torch import load_file

    index = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.is_file() else {}
    if version not in index:
        return {}
    tensors = load_file(str(GOLDEN_TENSORS))
    return {
        name: Computed({k: tensors[e["tensor"]] for k, e in entry["outputs"].items()}, entry["depth"])
        for name, entry in index[version].items()
    }


def record(version: str, computed: dict[str, Computed]) -> None:
    """Write ``computed`` as this version's runs (other runs and versions are kept). A tensor within the rounding
    bound of one already stored for the same run and output is shared, so versions that agree store it once."""
    from safetensors.torch import load_file, save_file

    index = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.is_file() else {}
    tensors = load_file(str(GOLDEN_TENSORS)) if GOLDEN_TENSORS.is_file() else {}
    mine = index.setdefault(version, {})
    for name, c in computed.items():
        outputs = {}
        for key, t in c.outputs.items():
            prefix = f"{name}/{key}/"
            same = [
                k
                for k, old in tensors.items()
                if k.startswith(prefix) and old.shape == t.shape and relative_error(t, old) <= c.bound().value
            ]
            tkey = same[0] if same else prefix + _digest(t)
            tensors.setdefault(tkey, t)
            outputs[key] = {"tensor": tkey, "shape": list(t.shape), "sum": float(t.double().sum())}
        mine[name] = {"depth": c.depth, "outputs": outputs}
    used = {e["tensor"] for v in index.values() for r in v.values() for e in r["outputs"].values()}
    save_file({k: t for k, t in sorted(tensors.items()) if k in used}, str(GOLDEN_TENSORS))
    GOLDEN_FILE.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")


def differences(got: Computed, want: Computed) -> list[str]:
    """What differs beyond float32 rounding (empty: the run matches its recording)."""
    out = []
    if got.depth != want.depth:
        out.append(f"{got.depth} Wan block evaluations (recorded {want.depth})")
    if got.outputs.keys() != want.outputs.keys():
        return out + [f"outputs {sorted(got.outputs)} (recorded {sorted(want.outputs)})"]
    bound = want.bound()
    for key, t in got.outputs.items():
        w = want.outputs[key]
        if tuple(t.shape) != tuple(w.shape):
            out.append(f"{key}: shape {tuple(t.shape)} (recorded {tuple(w.shape)})")
            continue
        err = relative_error(t, w)
        if not err <= bound.value:
            out.append(f"{key}: relative L2 error {err:.3g} over the bound {bound}")
    return out


# ------------------------------------------------------------------------------------------------ planted bugs
def _plant_one_layer_uncorrected():
    """One layer's cache (the second cache a run attends through: layer 1, or layer 0's second CFG branch) attends
    without its correction."""
    ChunkCache = importlib.import_module(f"{PACK_MODULE}.jensen_core.cache").ChunkCache  # noqa: N806
    real = ChunkCache.attend
    seen: list[int] = []

    def attend(self, *a, **k):
        if id(self) not in seen:
            seen.append(id(self))
        if len(seen) > 1 and seen[1] == id(self):
            k = {**k, "correction": "none"}
        return real(self, *a, **k)

    return [(ChunkCache, "attend", attend)]


def _plant_one_wrong_timestep():
    """The third denoising call of the run (a model call above sigma 0.2) gets its timestep 10 % off: one step of
    one chunk."""
    import comfy.model_base

    real = comfy.model_base.BaseModel.apply_model
    calls = [0]

    def apply_model(self, x, t, *a, **k):
        if bool((t > 0.2).any()):  # apply_model takes sigma: a denoising step, not a cache write
            calls[0] += 1
            if calls[0] == 3:
                t = t * 0.9
        return real(self, x, t, *a, **k)

    return [(comfy.model_base.BaseModel, "apply_model", apply_model)]


#: one-line bugs a refactor could make, each a function giving the (owner, attribute, replacement) it patches
PLANTS: dict[str, Callable[[], list]] = {
    "one_layer_uncorrected": _plant_one_layer_uncorrected,
    "one_wrong_timestep": _plant_one_wrong_timestep,
}


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Run with the planted bug ``name`` (every patch undone on exit)."""
    patches = PLANTS[name]()
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in patches]
    try:
        for owner, attr, fn in patches:
            setattr(owner, attr, fn)
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
