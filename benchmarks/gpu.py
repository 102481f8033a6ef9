"""One command for a GPU: the CUDA tests, the layouts chosen, op-level times and memory, end-to-end s/chunk.

    python benchmarks/gpu.py                       # everything, one table (<= 8 minutes on one GPU)
    python benchmarks/gpu.py --out docs/results/gpu_h200.txt   # the same, the table also written there
    python benchmarks/gpu.py --dry-run             # what it would run (any machine, exits 0)
    python benchmarks/gpu.py --skip-tests --skip-e2e           # op level only (a minute)

Sections (each row of the table names its section):

1. ``tests``   - ``pytest -m cuda tests/``: the CUDA-marked tests (layouts against float64, the choice),
   passed / failed / skipped;
2. ``layouts`` - the Taylor layout the first-use check and timing choose per dtype at Wan 1.3B's
   shapes (:func:`jensen_core.correction_layouts.kernel_choices`);
3. ``op``      - one attend at Wan 1.3B's attention shape at 480p (12 heads x 128, chunks of 3 latent
   frames = 4680 tokens, 4 cached chunks + the current one), BF16: SDPA over the unquantized window,
   INT2 (no correction), INT2 + Taylor through each layout (pad, split, flex, and triton where the
   choice offers it), INT2 + chunk_mean, and the fused Triton kernel (``jensen_core.triton_kernel``,
   called once per cached chunk; "not available" where the module or Triton is missing). Medians of
   interleaved rounds (CUDA events around each call), ratios to SDPA;
4. ``memory``  - the peak allocated above the inputs during each of those attends (CUDA allocator), and
   its ratio to one layer's window (K+V, BF16);
5. ``e2e``     - seconds per chunk through the pack's chunk loop on random models, BF16: Wan 1.3B's
   geometry (dim 1536, 12 heads, 30 layers, FFN 8960) at 480p (60 x 104 latent), 3-frame chunks,
   window 4, 6 chunks, 4 euler steps; and a 14B-geometry slice (dim 5120 = 40 heads x 128, FFN 13824,
   4 of its 40 layers) at the same size. Full-precision cache, INT2 + Taylor, INT2 + chunk_mean;
6. ``family_ops`` - one attend at the other families' released shapes at 480p, BF16, as ``op`` does for Wan
   (:data:`FAMILY_OPS`): MAGI-1 4.5B's grouped-query attention (24 query heads over 8 K/V heads x 128; the 4
   chunks in flight, 4 x 9,360 tokens, attend in full precision to themselves and to the one finished chunk the
   window reads, quantized) and HY-WorldPlay's (16 heads x 128; a chunk of 6,240 tokens over its rebuilt context
   of 5 chunks, quantized; each of its two streams makes this call once per block). SDPA over the same keys
   unquantized, INT2, INT2 + Taylor, INT2 + chunk_mean; ratios to INT2 and to SDPA; the peak above the inputs;
7. ``families`` - every family's own loop end to end (``benchmarks/chunk_cost.py``'s cases ``wan/plain``,
   ``magi1``, ``worldplay``, ``lingbot`` on their tiny models, on the GPU): the correction's overhead over INT2 and INT2's over
   the full-precision cache, at ``RunCaches.attend`` and for the whole run, whether a chunk's time stays flat once
   the window is full, and the run's peak (the report's ``peak_memory``, the CUDA allocator) beside the cache.

A section that would run past ``--budget`` seconds is skipped and says so in the table. On a machine
without CUDA the script stops with a message (exit 2) unless ``--dry-run``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

SECTIONS = ("tests", "layouts", "op", "memory", "e2e", "family_ops", "families")
#: the other families' attention at 480p (released shapes): name -> (query heads, K/V heads, query tokens, cached
#: chunks of ``tokens`` each, in-flight tokens attended in full precision besides the query's own)
FAMILY_OPS = {
    "MAGI-1 4.5B (GQA 24/8 x 128, 4 chunks in flight, 1 finished chunk read)": (24, 8, 4 * 9360, 1, 9360),
    "HY-WorldPlay (16 x 128, one stream; a chunk over its context of 5 chunks)": (16, 16, 6240, 5, 6240),
}
#: benchmarks/chunk_cost.py's cases that the families section runs (one per family)
FAMILY_CASES = ("wan/plain", "magi1", "worldplay", "lingbot")
#: Wan 1.3B at 480p: 12 heads x 128; 3 latent frames of 30 x 52 tokens per chunk; window 4
HEADS, HEAD_DIM, CHUNK_TOKENS, CACHED = 12, 128, 3 * 1560, 4
WAN13B = dict(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30, text_dim=64, text_len=32)
WAN14B_SLICE = dict(dim=5120, ffn_dim=13824, num_heads=40, num_layers=4, text_dim=64, text_len=32)
LATENT_H, LATENT_W, CHUNK_FRAMES, WINDOW, E2E_CHUNKS, STEPS = 60, 104, 3, 4, 6, 4


class Table:
    """Rows of (section, item, value, note), printed as one table at the end."""

    def __init__(self):
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, section: str, item: str, value: str = "", note: str = "") -> None:
        self.rows.append((section, item, value, note))
        print(f"  [{section}] {item}: {value} {note}".rstrip(), flush=True)

    def render(self) -> str:
        head = ("section", "item", "value", "note")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(4)]
        line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([line(head), sep, *(line(r) for r in self.rows)])


def triton_module():
    """``jensen_core.triton_kernel`` if this checkout has it, else None."""
    if importlib.util.find_spec("jensen_core.triton_kernel") is None:
        return None
    return importlib.import_module("jensen_core.triton_kernel")


def plan(args) -> list[tuple[str, str]]:
    """(section, what it runs) - what ``--dry-run`` lists."""
    tk = triton_module()
    triton = "the fused Triton kernel per cached chunk" if tk else "Triton kernel: not available (no module)"
    shape = f"{HEADS} heads x {HEAD_DIM}, {CHUNK_TOKENS} tokens/chunk, {CACHED} cached chunks + current, BF16"
    out = [
        ("tests", f"{sys.executable} -m pytest -q -m cuda tests/ (the CUDA-marked tests)"),
        ("layouts", "the Taylor layout chosen at first use for bf16, fp16, fp32 (head_dim 128, 4 groups)"),
        (
            "op",
            f"{shape}: SDPA unquantized; INT2; INT2 + Taylor per layout (pad, split, flex, triton if offered); "
            f"INT2 + chunk_mean; {triton}; {args.rounds} interleaved rounds",
        ),
        ("memory", "peak CUDA memory above the inputs of each attend above / one layer's window (K+V, BF16)"),
        (
            "e2e",
            f"s/chunk, chunk loop, random BF16 models at {LATENT_H * 8}x{LATENT_W * 8} ({CHUNK_FRAMES}-frame chunks, "
            f"window {WINDOW}, {E2E_CHUNKS} chunks, {STEPS} steps): Wan 1.3B geometry (30 layers) and a 14B-geometry "
            "slice (4 of 40 layers); FP cache, INT2 + Taylor, INT2 + chunk_mean",
        ),
        (
            "family_ops",
            "one attend per family at its released shape, BF16: "
            + "; ".join(FAMILY_OPS)
            + ": SDPA unquantized, INT2, INT2 + Taylor, INT2 + chunk_mean, peak CUDA memory",
        ),
        (
            "families",
            "each family's own loop on its tiny model (benchmarks/chunk_cost.py cases "
            + ", ".join(FAMILY_CASES)
            + "): full cache, INT2, INT2 + Taylor; the correction's overhead at the attention op and end to end, "
            "flat per-chunk time once the window is full, the report's peak memory",
        ),
    ]
    skip = {s for s in SECTIONS if getattr(args, f"skip_{s}", False)}
    return [(s, ("(skipped) " if s in skip else "") + what) for s, what in out]


# ----------------------------------------------------------------------------------------------- tests
def run_tests(table: Table, timeout: float) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests/"]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        table.add("tests", "pytest -m cuda", "timed out", f"after {timeout:.0f} s")
        return
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", tail)}
    value = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "errors", "skipped") if k in counts)
    table.add("tests", "pytest -m cuda tests/", value or tail, f"exit {r.returncode}, {time.perf_counter() - t0:.0f} s")
    for line in r.stdout.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            table.add("tests", line[:100], "", "")


# --------------------------------------------------------------------------------------------- layouts
def run_layouts(table: Table) -> None:
    from jensen_core import correction_layouts

    dev = torch.device("cuda")
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        cands = [lay.describe(HEAD_DIM) for lay in correction_layouts.candidate_layouts(dev, dt, HEAD_DIM, 4)]
        t0 = time.perf_counter()
        correction_layouts.taylor_layout(dev, dt, HEAD_DIM, 4, (HEADS, CHUNK_TOKENS, CHUNK_TOKENS))
        took = time.perf_counter() - t0
        chosen = correction_layouts.kernel_choices().get(f"cuda/{dt} d{HEAD_DIM} G4", "?")
        table.add("layouts", f"{dt} d{HEAD_DIM} G4", chosen, f"of {len(cands)} candidates; choice took {took:.1f} s")


# -------------------------------------------------------------------------------------------- op level
def _window(dtype, device, heads=HEADS, kv_heads=HEADS, query=CHUNK_TOKENS, cached=CACHED, tokens=CHUNK_TOKENS):
    """q (``heads`` x ``query`` tokens), the current K/V (``kv_heads``, the query's tokens), ``cached`` chunks of
    ``tokens`` in an INT2 g32 Hadamard cache, and the whole window's K/V unquantized."""
    from jensen_core import ChunkCache, QuantSpec

    g = torch.Generator(device=device).manual_seed(0)

    def rand(h=kv_heads, n=tokens):
        return torch.randn((1, h, n, HEAD_DIM), generator=g, device=device, dtype=torch.float32).to(dtype)

    q, k_cur, v_cur = rand(heads, query) * 2, rand(n=query) * 2, rand(n=query)
    ks, vs = [rand() * 2 for _ in range(cached)], [rand() for _ in range(cached)]
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    cache = ChunkCache(spec, spec)
    for k, v in zip(ks, vs):
        cache.append(k, v)
    return q, k_cur, v_cur, torch.cat([*ks, k_cur], -2), torch.cat([*vs, v_cur], -2), cache


def op_calls(dtype, device: str = "cuda") -> tuple[dict, int, list[str]]:
    """The attends to time: name -> callable; the window's bytes; notes about what is missing."""
    import torch.nn.functional as F

    from jensen_core import correction_layouts

    q, k_cur, v_cur, k_all, v_all, cache = _window(dtype, device)
    window_bytes = 2 * k_all.numel() * k_all.element_size()
    dev, G = torch.device(device), HEAD_DIM // 32
    key = (dev.type, dtype, HEAD_DIM, G)
    calls = {"SDPA BF16, unquantized window": lambda: F.scaled_dot_product_attention(q, k_all, v_all)}
    calls["INT2 (no correction)"] = lambda: cache.attend(q, k_cur, v_cur, correction="off")
    notes = []
    for lay in correction_layouts.candidate_layouts(dev, dtype, HEAD_DIM, G):
        if not correction_layouts._layout_ok(lay, dev, dtype, HEAD_DIM, G):
            notes.append(f"{lay.kind}: failed its float64 check")
            continue

        def forced(lay=lay):
            correction_layouts._LAYOUTS[key] = lay
            return cache.attend(q, k_cur, v_cur, correction="taylor")

        calls[f"INT2 + Taylor [{lay.kind} {lay.describe(HEAD_DIM)}]"] = forced
    calls["INT2 + chunk_mean"] = lambda: cache.attend(q, k_cur, v_cur, correction="chunk_mean")
    tk = triton_module()
    if tk is None:
        notes.append("Triton kernel: not available (no jensen_core.triton_kernel in this checkout)")
    elif not tk.available(dev):
        notes.append("Triton kernel: not available (triton does not import or no CUDA)")
    else:
        entries = cache.entries

        def fused():
            return [tk.triton_attend_chunk(q, e.k, e.v, "taylor") for e in entries]

        calls["Triton kernel, Taylor, one call per cached chunk (no merge)"] = fused
    return calls, window_bytes, notes


def interleaved_ms(calls: dict, rounds: int) -> dict[str, list[float]]:
    """CUDA milliseconds of each call over ``rounds`` interleaved rounds (a rotating order), after one warm-up call
    each (kernel choice, checks, compilation)."""
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    names, times = list(calls), {n: [] for n in calls}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            calls[name]()
            b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b))
    return times


def peak_above_inputs(fn) -> int:
    """The CUDA allocator's peak during one ``fn()`` above what was allocated before it (its output included)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def run_ops(table: Table, rounds: int, memory: bool) -> None:
    dtype = torch.bfloat16
    calls, window_bytes, notes = op_calls(dtype)
    times = interleaved_ms(calls, rounds)
    names = list(calls)
    base = names[0]
    for name in names:
        ratio = statistics.median(x / y for x, y in zip(times[name], times[base]))
        table.add("op", name, f"{statistics.median(times[name]):.2f} ms", f"x{ratio:.3f} of SDPA")
    for n in notes:
        table.add("op", n)
    if not memory:
        return
    for name in names:
        peak = peak_above_inputs(calls[name])
        table.add("memory", name, f"{peak / 2**20:.1f} MiB", f"{peak / window_bytes:.3f} x window K+V")
    table.add("memory", "one layer's window K+V, BF16", f"{window_bytes / 2**20:.1f} MiB", "")


# ------------------------------------------------------------------------------------- the other families
def family_op_calls(name: str, dtype, device: str = "cuda") -> tuple[dict, int]:
    """The attends of :data:`FAMILY_OPS` ``name``: label -> callable, and the bytes of the window's K/V."""
    import torch.nn.functional as F

    heads, kv_heads, query, cached, tokens = FAMILY_OPS[name]
    q, k_cur, v_cur, k_all, v_all, cache = _window(dtype, device, heads, kv_heads, query, cached, tokens)
    rep = heads // kv_heads
    k_sdpa, v_sdpa = k_all.repeat_interleave(rep, 1), v_all.repeat_interleave(rep, 1)
    calls = {
        "SDPA BF16, unquantized": lambda: F.scaled_dot_product_attention(q, k_sdpa, v_sdpa),
        "INT2 (no correction)": lambda: cache.attend(q, k_cur, v_cur, correction="off"),
        "INT2 + Taylor": lambda: cache.attend(q, k_cur, v_cur, correction="taylor"),
        "INT2 + chunk_mean": lambda: cache.attend(q, k_cur, v_cur, correction="chunk_mean"),
    }
    return calls, 2 * k_all.numel() * k_all.element_size()


def run_family_ops(table: Table, rounds: int) -> None:
    for name in FAMILY_OPS:
        calls, window_bytes = family_op_calls(name, torch.bfloat16)
        names, times = list(calls), interleaved_ms(calls, rounds)
        for label in names:
            to_int2 = statistics.median(x / y for x, y in zip(times[label], times["INT2 (no correction)"]))
            to_sdpa = statistics.median(x / y for x, y in zip(times[label], times[names[0]]))
            peak = peak_above_inputs(calls[label])
            table.add(
                "family_ops",
                f"{name.split(' (')[0]}: {label}",
                f"{statistics.median(times[label]):.2f} ms",
                f"x{to_int2:.3f} of INT2, x{to_sdpa:.3f} of SDPA; peak {peak / window_bytes:.2f} x window K+V",
            )
        del calls
        torch.cuda.empty_cache()


def run_families(table: Table, deadline: float) -> None:
    spec = importlib.util.spec_from_file_location("jensen_kv_chunk_cost", ROOT / "benchmarks" / "chunk_cost.py")
    chunk_cost = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = chunk_cost
    spec.loader.exec_module(chunk_cost)
    bench = chunk_cost.Bench("cuda")
    for case in FAMILY_CASES:
        if time.perf_counter() > deadline:
            table.add("families", case, "skipped", "past --budget")
            continue
        t = chunk_cost.time_case(bench, case, chunks=8, rounds=2)
        r = chunk_cost.ratios(t)
        table.add(
            "families",
            f"{case}: INT2 + Taylor / INT2",
            f"op x{r['taylor_op']:.3f}",
            f"end to end x{r['taylor_e2e']:.3f}",
        )
        table.add(
            "families", f"{case}: INT2 / full cache", f"op x{r['int2_op']:.3f}", f"end to end x{r['int2_e2e']:.3f}"
        )
        table.add(
            "families",
            f"{case}: flat once the window is full",
            ", ".join(f"{s} {v:.2f}" for s, v in r["flat"].items()),
            "last third of the chunks / the first full one",
        )
        for s in chunk_cost.SETTINGS:
            peak = bench.run(case, s, 8).report.get("peak_memory") or {}
            if peak.get("peak_bytes") is not None:
                table.add(
                    "families",
                    f"{case}: {s} peak",
                    f"{peak['peak_bytes'] / 2**20:.1f} MiB",
                    f"cache {peak['cache_bytes'] / 2**20:.2f} MiB (planned {(peak['planned_cache_bytes'] or 0) / 2**20:.2f})",
                )


# ------------------------------------------------------------------------------------------------- e2e
def _chunk_loop(loop, model, pos, neg, sigmas, chunks: int):
    """Wall seconds per chunk (synchronised) of one chunk-loop run, and its result."""
    import comfy.samplers

    from jensen_testing import wan_tiny

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = loop.run_chunked_ar(
        model,
        pos,
        neg,
        wan_tiny.video_latent(chunks * CHUNK_FRAMES, LATENT_H, LATENT_W),
        seed=0,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=CHUNK_FRAMES,
        window_chunks=WINDOW,
        progress=False,
    )
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / chunks, r


def run_e2e(table: Table, deadline: float) -> None:
    from jensen_testing import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui(cpu=False)
    import comfy.samplers

    from jensen_testing import wan_tiny

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")
    for label, arch in (("Wan 1.3B geometry, 30 layers", WAN13B), ("Wan 14B geometry, 4 of 40 layers", WAN14B_SLICE)):
        if time.perf_counter() > deadline:
            table.add("e2e", label, "skipped", "past --budget")
            continue
        model = wan_tiny.build_patcher(seed=0, dtype=torch.bfloat16, device="cuda", **arch)
        model.model.to(model.load_device)
        pos, neg = wan_tiny.conditioning(1, 32, 64), wan_tiny.conditioning(2, 32, 64)
        sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)
        q = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "32", "hadamard", "fp8_e4m3", 0).args[0]
        settings = {
            "FP (BF16) cache": model,
            "INT2 + Taylor": nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0).args[0],
            "INT2 + chunk_mean": nodes.JensenKVBiasCorrection.execute(q, "chunk_mean", 1.0).args[0],
        }

        base = None
        for name, m in settings.items():
            if time.perf_counter() > deadline:
                table.add("e2e", f"{label}: {name}", "skipped", "past --budget")
                continue
            _chunk_loop(loop, m, pos, neg, sigmas, 2)  # warm-up: kernels, the layout choice
            torch.cuda.reset_peak_memory_stats()
            per_chunk, r = _chunk_loop(loop, m, pos, neg, sigmas, E2E_CHUNKS)
            base = base or per_chunk
            last = r.seconds_per_chunk[-1] if r.seconds_per_chunk else float("nan")
            table.add(
                "e2e",
                f"{label}: {name}",
                f"{per_chunk:.3f} s/chunk",
                f"x{per_chunk / base:.3f}; last chunk {last:.3f} s; cache {r.report.get('cache_mib', 0):.2f} MiB; "
                f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
            )
        choices = importlib.import_module(f"{pack.__name__}.jensen_core.correction_layouts").kernel_choices()
        table.add("e2e", f"{label}: layouts used", "; ".join(f"{k}: {v}" for k, v in choices.items()) or "-")
        del model, settings, q
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list what would run and exit 0 (any machine)")
    ap.add_argument("--out", help="also write the table (with the command and the device) to this file")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the op-level timings")
    ap.add_argument("--budget", type=float, default=450, help="seconds; a section that would start later is skipped")
    for s in ("tests", "e2e", "family_ops", "families"):
        ap.add_argument(f"--skip-{s.replace('_', '-')}", action="store_true", help=f"skip the {s} section")
    args = ap.parse_args(argv)
    command = "python benchmarks/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        print(f"{command.strip()}: would run, in this order")
        for section, what in plan(args):
            print(f"  {section:8s} {what}")
        print(f"cuda available here: {torch.cuda.is_available()}")
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA device (none here); --dry-run lists what it would run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    deadline = start + args.budget
    table = Table()
    device = f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    print(f"{command.strip()}\ntorch {torch.__version__}, {device}", flush=True)
    if args.skip_tests:
        table.add("tests", "pytest -m cuda", "skipped", "--skip-tests")
    else:
        run_tests(table, timeout=max(60.0, min(240.0, deadline - time.perf_counter() - 200)))
    run_layouts(table)
    run_ops(table, args.rounds, memory=True)
    if args.skip_e2e:
        table.add("e2e", "chunk loop", "skipped", "--skip-e2e")
    else:
        run_e2e(table, deadline)
    if args.skip_family_ops:
        table.add("family_ops", "MAGI-1, HY-WorldPlay attends", "skipped", "--skip-family-ops")
    else:
        run_family_ops(table, args.rounds)
    if args.skip_families:
        table.add("families", "the families' loops", "skipped", "--skip-families")
    else:
        run_families(table, deadline)
    total = time.perf_counter() - start
    text = (
        f"command: {command.strip()}\ntorch {torch.__version__}, {device}; {total:.0f} s in all\n\n{table.render()}\n"
    )
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if math.isfinite(total) else 1


if __name__ == "__main__":
    raise SystemExit(main())
