"""The paper's Table 1 in MAGI-1's own setting, on the pack's trained tiny MAGI-1 (issue 40, item 2).

    nice -n 10 python benchmarks/magi1_quality.py --threads 1 --out docs/results   # 8 seeds x 6 chunks: 36 min (shared)
    python benchmarks/magi1_quality.py --quick                    # 2 seeds x 2 chunks, 8 steps (the test runs it)

The model: ``models/tiny_magi1`` (5.4M parameters, 4 query heads over 2 K/V heads of 64, chunks of 6 latent frames
= 384 tokens; ``jensen_testing.magi1_trained``). Every rollout is text to video with the pack's pure-torch MAGI-1
sampler (``runtime.families.magi1.model.sampler``: distilled, cfg 1, key ranges 5, 4, 3, 2), ``--steps`` steps per
chunk, at ``window_size`` 4 and 1 (chunks in flight), and reads its finished chunks through the pack's own MAGI-1
cache seam (``runtime.families.magi1.family.Magi1CacheAttention`` over ``runtime.run_caches.RunCaches``, as the
MAGI-1 AR Sampler's recipe drives it, without ComfyUI): the cache keeps what the key ranges reach (window 0, auto:
1 finished chunk at window_size 4, 4 at window_size 1), quantized and corrected as each row's
``JensenKVConfig`` says, guard on. Chunks still in flight are attended in full precision, as in the recipe.

Paired: seed ``i`` is prompt ``i % 6`` and the noise ``torch.randn`` after ``manual_seed(100 + i)``; every row of
one seed starts from that same noise, so rows differ by their cache alone. The reference of each seed is the run
with a full-precision cache (float32: the model's dtype on the CPU, in which it was trained; the paper's BF16
baseline is its GPU counterpart). The "BF16" row *is* that reference run (so PSNR inf, SSIM 1, shift 0 by
construction); its effective bits are the 32 float32 stores.

Rows (:data:`ROWS`; the paper's defaults: group size 32, FP8 E4M3 scales, BF16 zero-points, keys and values alike):
INT2 RTN and INT2 QuaRot (2.75 bits), each without and with the Taylor correction; QVG (the pack's QuantVideoGen,
INT2 residual at group 64, one stage, auto K = 8 centroids on 384-token chunks: the budget of QVG's default K = 256
on MAGI-1's 12,150-token chunks), without and with the correction; INT4 (QuaRot, group 32, no correction: 4.75
bits); precision by age (:data:`TIERS`, the pack's ``tiers`` option, INT2 g64 QuaRot + Taylor) at <= 2.85 bits
(2.75) at window_size 1; at window_size 4, where the cache holds one chunk, no tier fits 2.85 bits (2.875 shown).

Metrics per row and seed, against the seed's reference:

- **latent PSNR** (dB): of the final latent, every chunk (1, 16, chunks x 6, 16, 16), in the DiT's latent space:
  ``10 log10(L^2 / MSE)``, ``L`` = the reference latent's range (max - min);
- **latent SSIM**: SSIM (Wang et al. 2004; C1 = (0.01 L)^2, C2 = (0.03 L)^2, the same ``L``) of every (frame,
  channel) 16x16 latent image, with a uniform 7x7 window (reflect-padded), averaged over pixels, frames and
  channels;
- **cached attention mass shift** ΔP_S (paper Eq. 9): at every self-attention call of every layer that reads a
  finished chunk from the cache (every denoising forward), per query of the chunk, the attention mass on the
  cached tokens read (quantized, corrected as the row's run corrects them, guard included) minus the mass on the
  same tokens in full precision, for the same queries, keys in flight and own keys
  (``jensen_core.attention_shift.attention_shift`` against a full-precision shadow of the cache); the mean over
  every query (every ``--query-stride``-th) of every such call of the run. It is measured inside each row's own
  run, so it compares the attention the run did with the attention it would have done on unquantized keys.

Printed per window: mean ± standard error (sd / sqrt(seeds)) over seeds, and paired differences (a - b seed by
seed) of each INT2 + correction row against INT4 and against the same row without correction. ``--out`` writes
``magi1_quality_per_seed.csv`` there.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jensen_testing import magi1_trained as mt  # noqa: E402
from jensen_testing.pack import load_pack_module  # noqa: E402
from jensen_testing.results import write_csv  # noqa: E402

# the pack's MAGI-1 cache seam and the cache's config, imported as ComfyUI imports the pack (no ComfyUI needed)
_jk = load_pack_module("jensen_core")
_config = load_pack_module("runtime.config")
_run_caches = load_pack_module("runtime.run_caches")
_family = load_pack_module("runtime.families.magi1.family")
_window = load_pack_module("runtime.families.magi1.window")
_shift = load_pack_module("jensen_core.attention_shift")
_quant = load_pack_module("jensen_core.quant")
_tiers = load_pack_module("jensen_core.tiers")

PROMPTS = 6
SEED0 = 100
WINDOWS = (4, 1)
#: precision by age per window_size, INT2 g64 QuaRot + Taylor underneath (head_dim 64: g128 does not fit). At
#: window_size 1 the cache holds 4 finished chunks: the newest keeps its values at INT4 and its keys at INT3, the
#: other three stay INT2: (2.625 + 2.875) / 2 = 2.75 bits, the INT2 g32 rows' budget. At window_size 4 it holds
#: one chunk, and no tier fits 2.85 bits: the cheapest, that chunk's values at INT3 (keys INT2), stores
#: (2.375 + 3.375) / 2 = 2.875 bits; the row is shown, flagged as over the bound
TIERS = {1: "recent1@4k3", 4: "recent1@3k0"}
BITS_BOUND = 2.85


@dataclass(frozen=True)
class Row:
    """One cache setting: ``bits`` None is the full-precision reference."""

    name: str
    bits: int | None = None
    group: int = 32
    rotation: str = "none"
    method: str = "rtn"
    correction: str = "off"
    tiered: bool = False

    def config(self, window: int):
        if self.bits is None:
            return _config.JensenKVConfig()
        spec = _jk.QuantSpec(bits=self.bits, group_size=self.group, rotation=self.rotation, method=self.method)
        tiers = _tiers.parse_tiers(TIERS[window]) if self.tiered else None
        return _config.JensenKVConfig(spec_k=spec, spec_v=spec, correction=self.correction, tiers=tiers)

    def label(self, window: int) -> str:
        return f"{self.name} ({TIERS[window]})" if self.tiered else self.name


ROWS = (
    Row("BF16"),
    Row("INT2 RTN", 2),
    Row("INT2 RTN + correction", 2, correction="taylor"),
    Row("INT2 QuaRot", 2, rotation="hadamard"),
    Row("INT2 QuaRot + correction", 2, rotation="hadamard", correction="taylor"),
    Row("QVG", 2, group=64, method="qvg"),
    Row("QVG + correction", 2, group=64, method="qvg", correction="taylor"),
    Row("INT4", 4, rotation="hadamard"),
    Row("precision by age", 2, group=64, rotation="hadamard", correction="taylor", tiered=True),
)
#: (a, b) paired differences a - b printed per window
PAIRS = (
    ("INT2 RTN + correction", "INT4"),
    ("INT2 QuaRot + correction", "INT4"),
    ("QVG + correction", "INT4"),
    ("precision by age", "INT4"),
    ("INT2 RTN + correction", "INT2 RTN"),
    ("INT2 QuaRot + correction", "INT2 QuaRot"),
    ("QVG + correction", "QVG"),
)
#: the comparison the issue asks about: the paper's best INT2 setting with the correction against INT4
KEY_PAIR = ("INT2 QuaRot + correction", "INT4")
METRICS = ("psnr", "ssim", "delta_ps")


# ------------------------------------------------------------------------------------------------ metrics
def latent_psnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    """10 log10(L^2 / MSE), L = the reference's range; inf when equal."""
    mse = float((x.double() - ref.double()).square().mean())
    peak = float(ref.max() - ref.min())
    return 10 * math.log10(peak**2 / mse) if mse > 0 else float("inf")


def latent_ssim(ref: torch.Tensor, x: torch.Tensor, window: int = 7) -> float:
    """Mean SSIM of every (frame, channel) latent image of two (..., C, T, H, W) latents (module docstring)."""
    peak = float(ref.max() - ref.min())
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    a = ref.double().reshape(-1, 1, *ref.shape[-2:])
    b = x.double().reshape(-1, 1, *x.shape[-2:])
    pad = window // 2
    ap, bp = (F.pad(t, (pad,) * 4, mode="reflect") for t in (a, b))
    mu_a, mu_b = F.avg_pool2d(ap, window, 1), F.avg_pool2d(bp, window, 1)
    saa = F.avg_pool2d(ap * ap, window, 1) - mu_a * mu_a
    sbb = F.avg_pool2d(bp * bp, window, 1) - mu_b * mu_b
    sab = F.avg_pool2d(ap * bp, window, 1) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2))
    return float(s.mean())


class MassShift:
    """An observer of the run's cache (``runtime.observer``): keeps a full-precision shadow of every chunk written,
    and at every call that reads cached chunks adds the ΔP_S of its queries (module docstring)."""

    def __init__(self, guard: bool, query_stride: int = 1):
        self.guard, self.stride = guard, query_stride
        self.shadow: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.total, self.count, self.calls = 0.0, 0, 0

    def __call__(self, e) -> None:
        if e.phase == "write":
            self.shadow.setdefault(e.layer, {})[e.chunk] = (e.k.detach().clone(), e.v.detach().clone())
            return
        n = e.last_chunks
        if not n or e.cache is None or e.cache.num_chunks == 0:
            return
        held = e.cache.retention.indices(e.cache.chunks_appended)[-n:]
        entries = e.cache.entries[-n:]
        shadow = self.shadow[e.layer]
        k_ref = torch.cat([shadow[c][0] for c in held], dim=-2)
        v_ref = torch.cat([shadow[c][1] for c in held], dim=-2)
        k_hat = _quant.cat_quantized([en.k for en in entries])
        v_hat = _quant.cat_quantized([en.v for en in entries])
        k_cur, v_cur = e.k, e.v
        if e.context is not None:
            k_cur, v_cur = torch.cat([e.context[0], e.k], dim=-2), torch.cat([e.context[1], e.v], dim=-2)
        stats = _shift.attention_shift(
            e.q, k_ref, v_ref, k_cur, v_cur, k_hat, v_hat, correction=e.correction, strength=e.strength,
            query_stride=self.stride, chunk_tokens=[en.tokens for en in entries], guard=self.guard,
        )  # fmt: skip
        self.total += float(stats.delta_ps.double().sum())
        self.count += stats.delta_ps.numel()
        self.calls += 1

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


# ------------------------------------------------------------------------------------------------ rollouts
@dataclass
class Rollout:
    latent: torch.Tensor
    effective_bits: float
    delta_ps: float
    seconds: float


def rollout(model, special, row: Row, window: int, prompt: int, seed: int, chunks: int, steps: int, stride: int):
    """One text-to-video rollout through the pack's MAGI-1 cache seam at ``row``'s cache setting."""
    t0 = time.perf_counter()
    config = row.config(window)
    settings = mt.settings(window, steps)
    layers = model.config.num_layers
    observer = MassShift(config.guard, stride) if row.bits is not None else None
    run = _run_caches.RunCaches(config, _window.auto_window(settings, chunks), layers, observer=observer)
    attention = _family.Magi1CacheAttention(run, layers)
    attention.chunk_frames = mt.CHUNK_FRAMES
    noise = torch.randn(
        (1, mt.CONFIG.latent_channels, chunks * mt.CHUNK_FRAMES, mt.LATENT_HW, mt.LATENT_HW),
        generator=torch.Generator().manual_seed(seed),
    )
    events = mt.iter_sample(model, noise, mt.captions(prompt, chunks, special), settings, attention)
    x, i = noise, 0
    while True:
        run.at(step=i)
        event = next(events, None)
        if event is None:
            break
        x = event.latent
        for chunk in attention.take_stored():
            run.finish_write({0}, chunk=chunk)
        i += 1
    usage = run.usage
    bits = 16.0 * usage.peak_bytes / usage.peak_bf16_bytes
    shift = observer.mean if observer is not None else 0.0
    return Rollout(x, bits, shift, time.perf_counter() - t0)


def mean_se(values: list[float]) -> tuple[float, float]:
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan"))


def run_window(model, special, window: int, args, log) -> list[dict]:
    """Every row at ``window`` over every seed: one dict per (row, seed)."""
    out = []
    for i in range(args.seeds):
        prompt, seed = i % PROMPTS, SEED0 + i
        ref = None
        for row in ROWS:
            r = rollout(model, special, row, window, prompt, seed, args.chunks, args.steps, args.query_stride)
            if ref is None:
                ref = r.latent
            out.append(
                {
                    "window": window,
                    "row": row.name,
                    "setting": row.label(window),
                    "seed_index": i,
                    "prompt": prompt,
                    "noise_seed": seed,
                    "effective_bits": r.effective_bits,
                    "psnr": latent_psnr(ref, r.latent),
                    "ssim": latent_ssim(ref, r.latent),
                    "delta_ps": r.delta_ps,
                    "seconds": r.seconds,
                    "finite": bool(torch.isfinite(r.latent).all()),
                }
            )
        log(f"   window {window}: seed {i + 1}/{args.seeds} (prompt {prompt}, noise {seed}) done")
    return out


def summarize(records: list[dict], window: int) -> list[dict]:
    rows = []
    for row in ROWS:
        rs = [r for r in records if r["window"] == window and r["row"] == row.name]
        s = {"row": row.name, "setting": rs[0]["setting"], "effective_bits": rs[0]["effective_bits"], "n": len(rs)}
        if row.tiered and s["effective_bits"] > BITS_BOUND:
            s["setting"] += f", over the {BITS_BOUND} bound"
        for m in METRICS:
            s[m], s[f"{m}_se"] = mean_se([r[m] for r in rs]) if row.bits is not None else (_exact(m), 0.0)
        rows.append(s)
    return rows


def _exact(metric: str) -> float:
    return {"psnr": float("inf"), "ssim": 1.0, "delta_ps": 0.0}[metric]


def paired(records: list[dict], window: int, a: str, b: str, metric: str) -> tuple[float, float, int]:
    """Mean and SE of ``a - b`` over the seeds, seed by seed."""
    by = {(r["row"], r["seed_index"]): r[metric] for r in records if r["window"] == window}
    seeds = sorted({s for _, s in by})
    d = [by[(a, s)] - by[(b, s)] for s in seeds]
    m, se = mean_se(d)
    return m, se, len(d)


def table(summary: list[dict]) -> list[str]:
    lines = [
        "| setting | eff. bits | latent PSNR (dB) | latent SSIM | ΔP_S (cached mass shift) |",
        "|---|---|---|---|---|",
    ]
    for s in summary:
        if s["psnr"] == float("inf"):
            lines.append(f"| {s['setting']} (reference) | {s['effective_bits']:.2f} | ∞ | 1 | 0 |")
            continue
        lines.append(
            f"| {s['setting']} | {s['effective_bits']:.2f} | {s['psnr']:.2f} ± {s['psnr_se']:.2f} | "
            f"{s['ssim']:.4f} ± {s['ssim_se']:.4f} | {s['delta_ps']:+.5f} ± {s['delta_ps_se']:.5f} |"
        )
    return lines


def paired_table(records: list[dict], window: int) -> list[str]:
    lines = [
        f"| a − b (window {window}) | Δ latent PSNR (dB) | Δ latent SSIM | Δ ΔP_S |",
        "|---|---|---|---|",
    ]
    for a, b in PAIRS:
        cells = []
        for m, digits in (("psnr", 2), ("ssim", 4), ("delta_ps", 5)):
            d, se, n = paired(records, window, a, b, m)
            cells.append(f"{d:+.{digits}f} ± {se:.{digits}f}")
        lines.append(f"| {a} − {b} (n = {n}) | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--chunks", type=int, default=6, help="chunks per rollout (6 latent frames each)")
    p.add_argument("--steps", type=int, default=16, help="denoising steps per chunk (a multiple of 4)")
    p.add_argument("--windows", default="4,1", help="window_size values (chunks in flight), comma-separated")
    p.add_argument("--query-stride", type=int, default=8, help="ΔP_S on every n-th query (of 384 per chunk)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 seeds x 2 chunks, 8 steps")
    p.add_argument("--out", type=Path, default=None, help="folder for magi1_quality_per_seed.csv")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.chunks, args.steps = 2, 2, 8
    torch.set_num_threads(args.threads)
    windows = [int(w) for w in args.windows.split(",")]
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"{msg} ({time.perf_counter() - t_start:.0f} s)", flush=True)

    model, special = mt.load()
    print("MAGI-1's setting on the trained tiny MAGI-1: the paper's Table 1, paired over seeds")
    print(f"command: python benchmarks/magi1_quality.py {shlex.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"{args.seeds} seeds (prompt i % 6, noise seed {SEED0} + i) x {args.chunks} chunks x {args.steps} steps, "
        f"window_size {', '.join(map(str, windows))}, key ranges 5,4,3,2; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); reference: float32 full-precision cache"
    )
    records = []
    for w in windows:
        records += run_window(model, special, w, args, log)
    for w in windows:
        summary = summarize(records, w)
        print()
        print(f"window_size {w}: mean ± SE over {args.seeds} seeds, against the same seed's full-precision run")
        print("\n".join(table(summary)))
        print()
        print("\n".join(paired_table(records, w)))
        d, se, n = paired(records, w, *KEY_PAIR, "psnr")
        verdict = "beats" if d - 2 * se > 0 else ("loses to" if d + 2 * se < 0 else "does not separate from")
        print(
            f"\nwindow_size {w}: {KEY_PAIR[0]} {verdict} {KEY_PAIR[1]} in latent PSNR: {d:+.2f} ± {se:.2f} dB "
            f"(paired, n = {n}; 'beats' / 'loses to' need the difference 2 SE away from 0)"
        )
    seconds = [r["seconds"] for r in records]
    print(
        f"\n{len(records)} rollouts, {statistics.fmean(seconds):.1f} s each on average; "
        f"total {time.perf_counter() - t_start:.0f} s"
    )
    if args.out is not None:
        write_csv(args.out / "magi1_quality_per_seed.csv", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
