"""KV-cache memory on ComfyUI core's own AR sampler (``sample_ar_video``): core's preallocation against the pack's cache.

    COMFYUI_PATH=/opt/comfyui/v0.27 python benchmarks/core_ar_memory.py          # both parts (3-5 min, 2 CPU cores)
    COMFYUI_PATH=/opt/comfyui/v0.27 python benchmarks/core_ar_memory.py --quick  # smaller measured video (< 1 min)
    python benchmarks/core_ar_memory.py --planner-only                                # part 2 alone, no ComfyUI

1. **Measured** (ComfyUI v0.27+ in-process; a tiny random causal Wan, ``WAN21_CausalAR_T2V``, with Wan's real
   head geometry: 2 heads x 128 = dim 256, 2 layers, BF16 weights and compute; latent 16 x 16 = 64 tokens a
   frame, 21 latent frames; SamplerARVideo blocks of 3 frames and of 1 frame, Self-Forcing's 4 steps, cfg 1):
   the same video sampled by core's own sampler with (a) core's cache: the bytes of the tensors core's
   ``init_kv_caches`` really returns (captured by an object patch on a clone of the unpatched MODEL; nothing of
   core's is edited) next to the formula ``2 (K, V) x layers x batch x latent_frames x tokens_per_frame x heads x
   head_dim x element bytes``; and (b) the pack's cache on the same path (Quantize KV Cache [+ AR Cache Window]):
   the peak bytes the cache really stored (the run's report, ``cache_bytes``), the planner's figure
   (``planned_bytes``), and the block in flight the pack also holds: the last model call's K/V of every layer in
   the model's dtype, kept until the next call tells whether core moved ``end`` back (read at every sampler
   callback from the running session). Full precision and INT8 / INT4 / INT2 (group 32, rotation none and
   hadamard), without a window and with window 4 + sink 1 (in blocks).
2. **Planner** (``jensen_core.planner.plan_cache``, no model): Wan 2.1 1.3B (30 layers, 12 heads x 128) and 14B
   (40 layers, 40 heads x 128), BF16, batch 1, cfg 1, at 480p (latent 104 x 60) and 720p (160 x 90), 81 and 1,024
   video frames, chunks (blocks) of 3 latent frames: core's preallocation (the formula above, checked against
   the measured allocation of part 1) against the pack at full precision without a window, BF16 with window 4 +
   sink 1, INT4 and INT2 (group 32, 4.75 and 2.75 bits) without and with window 4 + sink 1, and the block in flight.

Raw output: ``docs/results/core_ar_memory.txt`` (+ ``.csv``) for the default run (``--out`` elsewhere; ``--quick``
writes nothing unless ``--out`` is given). The pack's ``runtime.core_ar`` is read through its public
``last_report``; the block in flight through the module's running-session context variable.
"""

from __future__ import annotations

import argparse
import csv
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402

DEFAULT_OUT = ROOT / "docs" / "results" / "core_ar_memory.txt"
PATCH_HW = (2, 2)  # Wan's spatial patch: one token per 2 x 2 latent pixels
GIB, MIB = 2**30, 2**20


# ---------------------------------------------------------------------------------------------- shared arithmetic
def tokens_per_frame(latent_height: int, latent_width: int) -> int:
    """Tokens of one latent frame as core's sample_ar_video counts them (ceiling division by the patch)."""
    return -(-latent_height // PATCH_HW[0]) * -(-latent_width // PATCH_HW[1])


def core_cache_bytes(
    *, layers: int, batch: int, latent_frames: int, frame_tokens: int, heads: int, head_dim: int, element_bytes: int
) -> int:
    """Core's preallocation: ``init_kv_caches(batch, latent_frames * frame_tokens, ...)`` gives every layer a K and
    a V of shape (batch, latent_frames * frame_tokens, heads, head_dim) in the model's dtype (ar_model.py, v0.27)."""
    return 2 * layers * batch * latent_frames * frame_tokens * heads * head_dim * element_bytes


def block_in_flight_bytes(
    *,
    layers: int,
    batch: int,
    block_frames: int,
    frame_tokens: int,
    heads: int,
    head_dim: int,
    element_bytes: int,
    cfg_branches: int = 1,
    bits: str = "off",
    group_size: int = 32,
    rotation: str = "none",
) -> int:
    """The pack's pending block on core's path: the last call's K and V of every layer (and CFG branch), held as the
    cache will store them (the planner's ``block_in_flight_bytes``)."""
    from jensen_core import CachePrecision, CacheShape, QuantSpec
    from jensen_core.planner import block_in_flight_bytes as planned

    spec = None if bits == "off" else QuantSpec(bits=int(bits), group_size=group_size, rotation=rotation)
    return planned(
        block_tokens=block_frames * frame_tokens,
        shape=CacheShape(layers, heads, head_dim, cfg_branches=cfg_branches, batch=batch, full_bytes=element_bytes),
        precision=CachePrecision(spec, spec),
    )


def latent_frames_of(video_frames: int) -> int:
    return (video_frames - 1) // 4 + 1


@dataclass(frozen=True)
class Setting:
    """One cache setting of the pack: bits ("off" = the model's precision), rotation, window and sink (in blocks)."""

    bits: str
    rotation: str = "none"
    window: int = 0
    sink: int = 0
    group_size: int = 32

    @property
    def label(self) -> str:
        what = "full precision" if self.bits == "off" else f"INT{self.bits} g{self.group_size} {self.rotation}"
        return what + (f", window {self.window} + sink {self.sink}" if self.window else "")


def measured_settings(window: int = 4, sink: int = 1) -> list[Setting]:
    out = [Setting("off"), Setting("off", window=window, sink=sink)]
    for bits in ("8", "4", "2"):
        for rotation in ("none", "hadamard"):
            out += [Setting(bits, rotation), Setting(bits, rotation, window=window, sink=sink)]
    return out


# ---------------------------------------------------------------------------------------------- part 1: measured
@dataclass
class CoreCapture:
    """Stands in for ``CausalWanModel.init_kv_caches`` on a clone: calls core's own and records what it returned."""

    dm: object
    calls: list

    def __call__(self, batch_size, max_seq_len, device, dtype):
        caches = type(self.dm).init_kv_caches(self.dm, batch_size, max_seq_len, device, dtype)
        tensors = [t for c in caches for t in c.values() if hasattr(t, "nbytes")]
        self.calls.append(
            {
                "batch": int(batch_size),
                "max_seq_len": int(max_seq_len),
                "dtype": str(dtype),
                "tensors": len(tensors),
                "bytes": sum(int(t.nbytes) for t in tensors),
                "shape": tuple(caches[0]["k"].shape),
            }
        )
        return caches


class SessionWatch:
    """A sampler callback that reads the pack's running session: peak of the pending block and of cache + pending."""

    def __init__(self, patches):
        self.patches = patches
        self.pending_peak = self.total_peak = self.seen = 0

    def __call__(self, *_):
        session = self.patches._ACTIVE.get()
        if session is None:
            return
        pending = int(session.in_flight_bytes)
        cache = sum(int(c.nbytes) for c in session.run.caches.values())
        self.pending_peak = max(self.pending_peak, pending)
        self.total_peak = max(self.total_peak, pending + cache)
        self.seen += 1


def _sample(model, latent, sigmas, block_frames: int, seed: int, callback=None):
    import comfy.sample
    import comfy.samplers

    from jensen_testing import wan_tiny

    pos = wan_tiny.conditioning(1, wan_tiny.TINY["text_len"], wan_tiny.TINY["text_dim"])
    neg = wan_tiny.conditioning(2, wan_tiny.TINY["text_len"], wan_tiny.TINY["text_dim"])
    sampler = comfy.samplers.ksampler("ar_video", {"num_frame_per_block": block_frames})
    noise = comfy.sample.prepare_noise(latent, seed)
    return comfy.sample.sample_custom(
        model, noise, 1.0, sampler, sigmas, pos, neg, latent, callback=callback, disable_pbar=True, seed=seed
    )


def measure(
    *,
    latent_frames: int = 21,
    height: int = 16,
    width: int = 16,
    block_frames: int = 3,
    layers: int = 2,
    heads: int = 2,
    head_dim: int = 128,
    dtype: str = "bf16",
    settings: list[Setting] | None = None,
    seed: int = 0,
) -> dict:
    """Sample one video through core's sample_ar_video with core's cache, then with each of the pack's settings.

    Needs ComfyUI v0.27+ set up in-process (``jensen_testing.comfyui.setup_inprocess_comfyui()``). Returns the geometry,
    core's measured and formula bytes, and one row per setting (measured peak, planner, block in flight).
    """
    import importlib

    import torch

    from jensen_testing import causal_wan

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    core_ar = importlib.import_module(f"{pack.__name__}.runtime.core_ar")
    patches = importlib.import_module(f"{pack.__name__}.runtime.core_ar.patches")
    import comfy.model_base

    if not hasattr(comfy.model_base, "WAN21_CausalAR"):
        raise RuntimeError(
            "this ComfyUI has no core AR path (WAN21_CausalAR, v0.27+): set COMFYUI_PATH to a v0.27+ "
            "checkout, e.g. COMFYUI_PATH=/opt/comfyui/v0.27 (laid out by ../shared/comfyui/lay-out.sh)"
        )
    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    element_bytes = torch.finfo(torch_dtype).bits // 8
    base = causal_wan.build_causal_patcher(
        seed=seed,
        dtype=torch_dtype,
        dim=heads * head_dim,
        ffn_dim=2 * heads * head_dim,
        num_heads=heads,
        num_layers=layers,
    )
    latent = torch.zeros(1, 16, latent_frames, height, width)
    sigmas = causal_wan.self_forcing_sigmas()
    frame_tokens = tokens_per_frame(height, width)
    geometry = dict(
        latent_frames=latent_frames,
        latent_height=height,
        latent_width=width,
        frame_tokens=frame_tokens,
        block_frames=block_frames,
        layers=layers,
        heads=heads,
        head_dim=head_dim,
        dtype=dtype,
        element_bytes=element_bytes,
        batch=1,
    )

    # (a) core's own cache, on a clone of the MODEL nothing of the pack touched
    calls: list[dict] = []
    core_model = base.clone()
    core_model.add_object_patch("diffusion_model.init_kv_caches", CoreCapture(base.model.diffusion_model, calls))
    t0 = time.perf_counter()
    core_video = _sample(core_model, latent, sigmas, block_frames, seed)
    core_seconds = time.perf_counter() - t0
    if len(calls) != 1:
        raise RuntimeError(f"core's sampler called init_kv_caches {len(calls)} times; expected once")
    formula = core_cache_bytes(
        layers=layers,
        batch=1,
        latent_frames=latent_frames,
        frame_tokens=frame_tokens,
        heads=heads,
        head_dim=head_dim,
        element_bytes=element_bytes,
    )
    bf16_in_flight = block_in_flight_bytes(
        layers=layers,
        batch=1,
        block_frames=block_frames,
        frame_tokens=frame_tokens,
        heads=heads,
        head_dim=head_dim,
        element_bytes=element_bytes,
    )

    # (b) the pack on core's path
    rows = []
    for s in settings if settings is not None else measured_settings():
        m = nodes.JensenKVQuantizeKVCache.execute(base, s.bits, s.bits, str(s.group_size), s.rotation).args[0]
        if s.window or s.sink:
            m = nodes.JensenKVARCacheWindow.execute(m, s.window, s.sink).args[0]
        watch = SessionWatch(patches)
        t0 = time.perf_counter()
        video = _sample(m, latent, sigmas, block_frames, seed, callback=watch)
        seconds = time.perf_counter() - t0
        report = core_ar.last_report(m)
        if report is None:
            raise RuntimeError(f"{s.label}: the pack did not serve core's sampler (no report)")
        if not watch.seen:
            raise RuntimeError(f"{s.label}: the sampler callback never saw the pack's session")
        rel = float(
            (video.float() - core_video.float()).square().mean().sqrt() / core_video.float().square().mean().sqrt()
        )
        rows.append(
            dict(
                setting=s,
                cache_bytes=int(report["cache_bytes"]),
                planned_bytes=report["planned_bytes"],
                bf16_bytes=int(report["bf16_bytes"]),
                effective_bits=float(report["effective_bits"]),
                pending_bytes=watch.pending_peak,
                total_bytes=watch.total_peak,
                seconds=seconds,
                in_flight_formula=block_in_flight_bytes(
                    layers=layers,
                    batch=1,
                    block_frames=block_frames,
                    frame_tokens=frame_tokens,
                    heads=heads,
                    head_dim=head_dim,
                    element_bytes=element_bytes,
                    bits=s.bits,
                    group_size=s.group_size,
                    rotation=s.rotation,
                ),
                reported_in_flight=int(report["in_flight_bytes"]),
                planned_in_flight=int(report["planned_in_flight_bytes"]),
                rel_rms_vs_core=rel,
                chunks=int(report["chunks"]),
            )
        )
    return dict(
        geometry=geometry,
        core=dict(calls[0], formula_bytes=formula, seconds=core_seconds),
        in_flight_formula=bf16_in_flight,
        rows=rows,
    )


def format_measured(result: dict) -> list[str]:
    g, core = result["geometry"], result["core"]
    blocks = math.ceil(g["latent_frames"] / g["block_frames"])
    lines = [
        f"blocks of {g['block_frames']} latent frame(s): {blocks} blocks; core's init_kv_caches(batch {core['batch']}, "
        f"{core['max_seq_len']} tokens, {core['dtype']}) -> {core['tensors']} tensors of shape {core['shape']}",
        f"  core's cache: measured {core['bytes']:,} B; formula 2 x {g['layers']} x 1 x {g['latent_frames']} x "
        f"{g['frame_tokens']} x {g['heads']} x {g['head_dim']} x {g['element_bytes']} = {core['formula_bytes']:,} B "
        f"({'equal' if core['bytes'] == core['formula_bytes'] else 'DIFFERENT'}); sampling {core['seconds']:.1f} s",
        f"  block in flight (pack), at full precision: 2 x {g['layers']} x {g['block_frames'] * g['frame_tokens']} "
        f"tokens x {g['heads']} x {g['head_dim']} x {g['element_bytes']} = {result['in_flight_formula']:,} B; "
        "quantized settings hold it at the cache's bits",
        f"  {'pack setting':<40} {'cache peak B':>12} {'planner B':>12} {'=':>2} {'bits':>5} {'in flight B':>11} "
        f"{'core/cache':>10} {'core/(cache+fl.)':>16} {'rel.RMS vs core':>15} {'s':>5}",
    ]
    for r in result["rows"]:
        same = "=" if r["planned_bytes"] == r["cache_bytes"] else "!="
        lines.append(
            f"  {r['setting'].label:<40} {r['cache_bytes']:>12,} {r['planned_bytes']:>12,} {same:>2} "
            f"{r['effective_bits']:>5.2f} {r['pending_bytes']:>11,} {core['bytes'] / r['cache_bytes']:>10.2f} "
            f"{core['bytes'] / r['total_bytes']:>16.2f} {r['rel_rms_vs_core']:>15.4f} {r['seconds']:>5.1f}"
        )
    same = all(
        r["pending_bytes"] == r["in_flight_formula"] == r["reported_in_flight"] == r["planned_in_flight"]
        for r in result["rows"]
    )
    lines.append(
        f"  block in flight measured = planner = report in every row: {'yes' if same else 'NO'}; the pack never "
        "stores the last block (nothing reads it), core's preallocation holds it"
    )
    return lines


def measured_csv_rows(result: dict) -> list[dict]:
    g, core = result["geometry"], result["core"]
    out = []
    for r in result["rows"]:
        s = r["setting"]
        out.append(
            dict(
                part="measured",
                model=f"tiny causal Wan {g['layers']}x{g['heads']}x{g['head_dim']} {g['dtype']}",
                video="",
                latent_frames=g["latent_frames"],
                latent_height=g["latent_height"],
                latent_width=g["latent_width"],
                tokens_per_frame=g["frame_tokens"],
                block_frames=g["block_frames"],
                setting=s.label,
                bits=s.bits,
                group_size="" if s.bits == "off" else s.group_size,
                rotation="" if s.bits == "off" else s.rotation,
                window=s.window,
                sink=s.sink,
                core_bytes=core["bytes"],
                core_formula_bytes=core["formula_bytes"],
                pack_cache_bytes=r["cache_bytes"],
                planned_bytes=r["planned_bytes"],
                in_flight_bytes=r["pending_bytes"],
                core_over_cache=core["bytes"] / r["cache_bytes"],
                core_over_cache_plus_in_flight=core["bytes"] / r["total_bytes"],
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- part 2: planner
WAN_MODELS = {"Wan 1.3B": (30, 12, 128), "Wan 14B": (40, 40, 128)}
RESOLUTIONS = {"480p": (832, 480), "720p": (1280, 720)}
VIDEO_FRAMES = (81, 1024)
PLAN_CHUNK = 3


def plan_settings(window: int = 4, sink: int = 1) -> list[tuple[str, int | None, int, int]]:
    """(column, bits or None for BF16, window, sink)."""
    return [
        ("BF16", None, 0, 0),
        (f"BF16 w{window}+s{sink}", None, window, sink),
        ("INT4", 4, 0, 0),
        (f"INT4 w{window}+s{sink}", 4, window, sink),
        ("INT2", 2, 0, 0),
        (f"INT2 w{window}+s{sink}", 2, window, sink),
    ]


def planner_rows(window: int = 4, sink: int = 1) -> list[dict]:
    from jensen_core import CacheShape, QuantSpec
    from jensen_testing.pack import load_pack_module
    from jensen_testing.planning import plan_video

    wan = load_pack_module("runtime.families.wan.family").GEOMETRY  # the Wan family's latent layout

    rows = []
    for model, (layers, heads, head_dim) in WAN_MODELS.items():
        for res, (w, h) in RESOLUTIONS.items():
            for frames in VIDEO_FRAMES:
                lat_t, lat_h, lat_w = wan.latent_shape(w, h, frames)
                assert lat_t == latent_frames_of(frames)
                frame_tokens = tokens_per_frame(lat_h, lat_w)
                core = core_cache_bytes(
                    layers=layers,
                    batch=1,
                    latent_frames=lat_t,
                    frame_tokens=frame_tokens,
                    heads=heads,
                    head_dim=head_dim,
                    element_bytes=2,
                )
                pack = {}
                for col, bits, win, snk in plan_settings(window, sink):
                    spec = None if bits is None else QuantSpec(bits=bits, group_size=32, rotation="hadamard")
                    shape = CacheShape(layers, heads, head_dim, wan, full_bytes=2)
                    plan = plan_video((lat_t, lat_h, lat_w), PLAN_CHUNK, win, shape, spec, sink_chunks=snk)
                    flight = block_in_flight_bytes(
                        layers=layers,
                        batch=1,
                        block_frames=PLAN_CHUNK,
                        frame_tokens=frame_tokens,
                        heads=heads,
                        head_dim=head_dim,
                        element_bytes=2,
                        bits="off" if bits is None else str(bits),
                        rotation="hadamard",
                    )
                    pack[col] = (plan.quantized_bytes, plan.effective_bits, plan.cached_chunks_peak, flight)
                rows.append(
                    dict(
                        model=model,
                        res=res,
                        frames=frames,
                        latent=(lat_t, lat_h, lat_w),
                        frame_tokens=frame_tokens,
                        core=core,
                        pack=pack,
                    )
                )
    return rows


def format_planner(rows: list[dict], window: int = 4, sink: int = 1) -> list[str]:
    cols = [c for c, *_ in plan_settings(window, sink)]
    head = f"{'model':<9} {'video':<15} {'latent':>12} {'tok/fr':>6} {'core':>8}"
    lines = [
        "GiB (2^30 B); the pack's columns are its cache's peak (chunks held in brackets); 'in flight' is the "
        "block of 3 latent frames the pack also holds (every layer, at the cache's bits: BF16 / INT2 shown) "
        "until the next model call",
        head + "".join(f" {c:>14}" for c in cols) + f" {'in flight':>15}",
    ]
    for r in rows:
        lat = "x".join(str(v) for v in r["latent"])
        line = (
            f"{r['model']:<9} {r['res'] + ' ' + format(r['frames'], ',') + ' fr':<15} {lat:>12} "
            f"{r['frame_tokens']:>6} {r['core'] / GIB:>8.2f}"
        )
        for c in cols:
            b, _, held, _ = r["pack"][c]
            line += f" {f'{b / GIB:.2f} [{held}]':>14}"
        flights = f"{r['pack'][cols[0]][3] / GIB:.2f} / {r['pack'][cols[-1]][3] / GIB:.2f}"
        lines.append(line + f" {flights:>15}")
    # every figure scales with layers x heads x tokens per frame: the ratios depend on the frame count alone
    ratios: dict[int, set] = {}
    for r in rows:
        cells = tuple(
            f"{r['core'] / r['pack'][c][0]:.1f} / {r['core'] / (r['pack'][c][0] + r['pack'][c][3]):.1f}" for c in cols
        )
        ratios.setdefault(r["frames"], set()).add(cells)
    lines += [
        "",
        "core / pack (cache alone / cache + block in flight); the same for both models and both resolutions"
        if all(len(v) == 1 for v in ratios.values())
        else "core / pack (differ by model or resolution)",
        f"{'video':<25}" + "".join(f" {c:>16}" for c in cols),
    ]
    for frames, cells_set in ratios.items():
        for cells in sorted(cells_set):
            lines.append(
                f"{f'{frames:,} frames ({latent_frames_of(frames)} latent)':<25}" + "".join(f" {c:>16}" for c in cells)
            )
    bits = {c: rows[0]["pack"][c][1] for c in cols}
    lines.append("bits per cached element: " + ", ".join(f"{c} {b:.2f}" for c, b in bits.items()))
    return lines


def planner_csv_rows(rows: list[dict], window: int = 4, sink: int = 1) -> list[dict]:
    out = []
    for r in rows:
        lat_t, lat_h, lat_w = r["latent"]
        for col, bits, win, snk in plan_settings(window, sink):
            b, flight = r["pack"][col][0], r["pack"][col][3]
            out.append(
                dict(
                    part="planner",
                    model=r["model"],
                    video=f"{r['res']} {r['frames']} frames",
                    latent_frames=lat_t,
                    latent_height=lat_h,
                    latent_width=lat_w,
                    tokens_per_frame=r["frame_tokens"],
                    block_frames=PLAN_CHUNK,
                    setting=col,
                    bits="off" if bits is None else bits,
                    group_size="" if bits is None else 32,
                    rotation="" if bits is None else "hadamard",
                    window=win,
                    sink=snk,
                    core_bytes=r["core"],
                    core_formula_bytes=r["core"],
                    pack_cache_bytes=b,
                    planned_bytes=b,
                    in_flight_bytes=flight,
                    core_over_cache=r["core"] / b,
                    core_over_cache_plus_in_flight=r["core"] / (b + flight),
                )
            )
    return out


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="latent 8 x 8, 9 latent frames, fewer settings")
    p.add_argument("--planner-only", action="store_true", help="part 2 alone (no ComfyUI needed)")
    p.add_argument("--frames", type=int, default=21, help="latent frames of the measured video")
    p.add_argument("--height", type=int, default=16, help="latent height of the measured video")
    p.add_argument("--width", type=int, default=16, help="latent width of the measured video")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2, help="heads of 128 channels")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--blocks", default="3,1", help="SamplerARVideo's num_frame_per_block values to measure")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--sink", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"text output (and a .csv next to it); default {DEFAULT_OUT.relative_to(ROOT)} except with --quick (none)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.frames, a.height, a.width = 9, 8, 8
    if a.out is None and not a.quick:
        a.out = DEFAULT_OUT
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    argv_ = argv if argv is not None else sys.argv[1:]
    lines: list[str] = []

    def emit(*text: str) -> None:
        for t in text:
            print(t, flush=True)
            lines.append(t)

    import os

    cpath = os.environ.get("COMFYUI_PATH")
    emit(
        f"`{'COMFYUI_PATH=' + cpath + ' ' if cpath and not args.planner_only else ''}python "
        f"benchmarks/core_ar_memory.py{' ' + shlex.join(argv_) if argv_ else ''}`"
    )
    t_start = time.perf_counter()
    csv_rows: list[dict] = []
    if not args.planner_only:
        support_comfyui.setup_inprocess_comfyui()
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        settings = measured_settings(args.window, args.sink)
        if args.quick:
            settings = [s for s in settings if s.rotation == "none"]
        emit(
            "",
            f"## 1. Measured on core's sample_ar_video: a tiny causal Wan ({args.layers} layers, {args.heads} heads x "
            f"128, {args.dtype}), latent {args.height}x{args.width} ({tokens_per_frame(args.height, args.width)} "
            f"tokens/frame), {args.frames} latent frames, 4 steps, cfg 1, batch 1, torch threads {args.threads or 'default'}",
            "core: the tensors core's init_kv_caches returned; pack: report cache_bytes (peak stored), planned_bytes "
            "(planner), block in flight (peak, read at every sampler callback); the same seed and latent for all; "
            "rel.RMS: the video against core's (random weights: a sanity figure, not a quality one)",
        )
        for block in (int(b) for b in args.blocks.split(",")):
            result = measure(
                latent_frames=args.frames,
                height=args.height,
                width=args.width,
                block_frames=block,
                layers=args.layers,
                heads=args.heads,
                dtype=args.dtype,
                settings=settings,
            )
            emit("", *format_measured(result))
            csv_rows += measured_csv_rows(result)
    emit(
        "",
        f"## 2. Planner (jensen_core.planner.plan_cache): BF16 model, batch 1, cfg 1, chunks (blocks) of {PLAN_CHUNK} "
        "latent frames, INT4/INT2 group 32 (fp8 scales, bf16 zero-points), window/sink in chunks",
        "core = 2 (K,V) x layers x batch x latent_frames x tokens_per_frame x heads x 128 x 2 B: sample_ar_video "
        "calls init_kv_caches(bs, lat_t * frame_seq_len, device, model_dtype), which gives every layer k and v = "
        "zeros(bs, max_seq_len, num_heads, head_dim) (comfy/ldm/wan/ar_model.py, v0.27); part 1 measures it equal",
    )
    rows = planner_rows(args.window, args.sink)
    emit(*format_planner(rows, args.window, args.sink))
    csv_rows += planner_csv_rows(rows, args.window, args.sink)
    emit("", f"({time.perf_counter() - t_start:.0f} s)")
    if args.out is not None:
        out = args.out if args.out.is_absolute() else Path.cwd() / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
            w.writeheader()
            w.writerows(csv_rows)
        print(f"wrote {out} and {out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
