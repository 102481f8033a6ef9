"""Precision by head (Quantize KV Cache's head_bits) against uniform INT2 + correction at equal average bits.

    python benchmarks/head_bits.py                 # both trained tiny models, 4 seeds each (~25 min, shared 2 cores)
    python benchmarks/head_bits.py --quick         # 1 seed, 2 chunks each (~2 min): the smoke test's run

On the pack's trained tiny MAGI-1 (models/tiny_magi1: 4 layers of 4 query heads over 2 K/V heads of 64, chunks of 6
latent frames, text to video through the MAGI-1 AR Sampler's recipe, window 4) and the trained tiny AR model
(models/tiny_ar: the Wan-style model, 4 layers of 2 heads of 128, chunks of 3 latent frames, a 2-chunk ground-truth prefix, then
``--chunks`` generated chunks, window 3), each setting's rollout is compared with the full-precision rollout of the
same seed: latent PSNR over the generated chunks (MAGI-1: every chunk but the first, which no cache reaches).

Settings (all QuaRot, FP8 scales, group 32, values INT2, Jensen Taylor correction with its guard):

- ``K INT2``: uniform INT2 keys (2.75 bits) + correction, the baseline the issue names;
- ``K INT2 + head_bits 4 @0.5``: half of each layer's K/V heads (those with the largest predicted bias at the first
  chunk) keep their keys at INT4: 0.5 x 4.75 + 0.5 x 2.75 = 3.75 key bits;
- ``K INT3``: uniform INT3 keys, 3.75 bits: the *same* key bits spent on every head (the equal-bits match);
- ``other half``: the same bytes on the heads with the *smallest* predicted bias (a control: does the choice
  matter?), ``HeadBits(pick="smallest")`` put on the node's config (not a node input).

Paired over seeds: each row's mean PSNR +- SE, and its difference from ``K INT2 + head_bits`` per seed (mean +- SE).
The effective bits are the run's report (peak bytes x 8 / elements, keys and values together); the promoted heads
are the report's, one digit per layer (the promoted K/V head of each of the 4 layers), one group per seed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

#: (name, key bits, head_bits, head_fraction, which heads: the largest predicted bias, or the control's smallest)
SETTINGS = [
    ("K INT2", 2, "off", 0.5, "largest"),
    ("K INT2 + head_bits 4 @0.5", 2, "4", 0.5, "largest"),
    ("K INT3 (equal bits)", 3, "off", 0.5, "largest"),
    ("K INT2 + head_bits 4 @0.5, other half", 2, "4", 0.5, "smallest"),
]
MAIN = SETTINGS[1][0]
MAGI_SCALE = 0.18215  # the MAGI-1 LATENT is the DiT's latent / 0.18215


def _patched(nodes, model, key_bits: int, head_bits: str, fraction: float, pick: str):
    m = nodes.JensenKVQuantizeKVCache.execute(
        model, str(key_bits), "2", "32", "hadamard", "fp8_e4m3", 0, "rtn", 1, 0, 2, "off", 2, "off", "same",
        head_bits, fraction,
    ).args[0]  # fmt: skip
    if pick != "largest":  # the control: the node's config with the other heads picked
        import dataclasses
        import importlib

        pack = nodes.__name__.rsplit(".", 1)[0]  # the pack as ComfyUI imports it
        config_mod = importlib.import_module(f"{pack}.runtime.config")
        hb_mod = importlib.import_module(f"{pack}.jensen_core.head_bits")
        config = config_mod.get_config(m.model_options)
        hb = hb_mod.HeadBits(config.head_bits.bits, config.head_bits.fraction, pick)
        config_mod.set_config(m, dataclasses.replace(config, head_bits=hb))  # m is the node's clone
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


def _rows(name_to_psnr: dict[str, list[float]], bits: dict[str, float], heads: dict[str, object]) -> list[dict]:
    rows = []
    base = name_to_psnr[MAIN]
    for name, vals in name_to_psnr.items():
        se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
        diff = [a - b for a, b in zip(vals, base)]
        dse = statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
        rows.append(
            {
                "setting": name,
                "effective_bits": bits[name],
                "psnr": statistics.fmean(vals),
                "psnr_se": se,
                "minus_head_bits": statistics.fmean(diff),
                "minus_head_bits_se": dse,
                "promoted": None if heads.get(name, [None])[0] is None else " ".join(heads[name]),
                "per_seed": vals,
            }
        )
    return rows


def tiny_ar_rows(args, nodes) -> list[dict]:
    from jensen_testing import tiny_ar

    model = tiny_ar.load_model(tiny_ar.MODEL_PATH)
    Fr = tiny_ar.CHUNK_FRAMES
    psnrs = {s[0]: [] for s in SETTINGS}
    bits, heads = {}, {}
    for i, (prompt, vseed) in enumerate(tiny_ar.held_out(args.seeds)):
        seed = 100 + i
        ref, _ = tiny_ar.rollout(model, prompt, vseed, seed, args.chunks, 2, tiny_ar.STEPS, with_report=True)
        peak = float(ref.max() - ref.min())
        for name, kb, hb, frac, pick in SETTINGS:
            m = _patched(nodes, model, kb, hb, frac, pick)
            x, report = tiny_ar.rollout(m, prompt, vseed, seed, args.chunks, 2, tiny_ar.STEPS, with_report=True)
            per_chunk = [
                tiny_ar.psnr(ref[:, c * Fr : (c + 1) * Fr], x[:, c * Fr : (c + 1) * Fr], peak)
                for c in range(args.chunks)
            ]
            psnrs[name].append(statistics.fmean(per_chunk))
            bits[name] = report["effective_bits"]
            heads.setdefault(name, []).append(_heads_text(report["promoted_heads"]))
        print(f"   tiny AR seed {i + 1}/{args.seeds} done at {time.perf_counter() - T0:.0f} s", flush=True)
    return _rows(psnrs, bits, heads)


def magi1_rows(args, nodes, pack) -> list[dict]:
    import importlib

    from jensen_core import toy_video as tv
    from jensen_testing import magi1_trained as mt

    recipe = importlib.import_module(f"{pack.__name__}.runtime.families.magi1.recipe")
    comfy_model = importlib.import_module(f"{pack.__name__}.runtime.families.magi1.comfy_model")
    patcher = comfy_model.load_magi1(str(mt.MODEL_PATH), "default", "auto")
    chunks = args.magi_chunks
    Fr = mt.CHUNK_FRAMES

    def run(model, prompt, seed):
        positive = [[tv.prompt_embedding(prompt), {"magi1_caption": True}]]
        req = recipe.Magi1Request.from_options(
            model, positive, latent_frames=chunks * Fr, latent_height=mt.LATENT_HW, latent_width=mt.LATENT_HW,
            seed=seed, num_steps=mt.STEPS, window_size=4, chunk_frames=Fr, progress=False,
        )  # fmt: skip
        res = recipe.run(req)
        return res.samples * MAGI_SCALE, res.report

    psnrs = {s[0]: [] for s in SETTINGS}
    bits, heads = {}, {}
    for i in range(args.seeds):
        prompt, seed = i % len(tv.PROMPTS), 11 + i
        ref, _ = run(patcher, prompt, seed)
        peak = float(ref.max() - ref.min())
        for name, kb, hb, frac, pick in SETTINGS:
            m = _patched(nodes, patcher, kb, hb, frac, pick)
            x, report = run(m, prompt, seed)
            per_chunk = [
                _psnr(ref[:, :, c * Fr : (c + 1) * Fr], x[:, :, c * Fr : (c + 1) * Fr], peak) for c in range(1, chunks)
            ]
            psnrs[name].append(statistics.fmean(per_chunk))
            bits[name] = report["effective_bits"]
            heads.setdefault(name, []).append(_heads_text(report["promoted_heads"]))
        print(f"   MAGI-1 seed {i + 1}/{args.seeds} done at {time.perf_counter() - T0:.0f} s", flush=True)
    return _rows(psnrs, bits, heads)


def _heads_text(promoted) -> str | None:
    """``[[1], [0], [1], [0]]`` -> ``"1010"`` (each layer's promoted heads; None without precision by head)."""
    if promoted is None:
        return None
    return "".join("".join(map(str, p)) if p is not None else "-" for p in promoted)


def _psnr(ref: torch.Tensor, x: torch.Tensor, peak: float) -> float:
    mse = float((ref.double() - x.double()).square().mean())
    return float("inf") if mse == 0 else 10 * math.log10(peak * peak / mse)


def print_rows(title: str, rows: list[dict]) -> None:
    print(title)
    print(
        f"{'setting':40} {'eff. bits':>9} {'latent PSNR (dB)':>17} {'minus head_bits (dB)':>21}  promoted K/V head per layer, per seed"
    )
    for r in rows:
        print(
            f"{r['setting']:40} {r['effective_bits']:9.3f} {r['psnr']:10.2f} +- {r['psnr_se']:.2f} "
            f"{r['minus_head_bits']:13.2f} +- {r['minus_head_bits_se']:.2f}  {r['promoted'] or '-'}"
        )
    print()


T0 = time.perf_counter()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed, 2 chunks per model (a smoke test)")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--chunks", type=int, default=6, help="tiny AR: generated chunks after the 2-chunk prefix")
    p.add_argument("--magi-chunks", type=int, default=4, help="MAGI-1: chunks of 6 latent frames")
    p.add_argument("--models", default="magi1,tiny_ar")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.chunks, args.magi_chunks = 1, 2, 2
    torch.set_num_threads(args.threads)
    cmd = "python benchmarks/head_bits.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# {cmd.strip()}  (torch {torch.__version__}, {args.threads} thread(s))")
    from jensen_testing import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui()
    import importlib

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    out = {}
    models = args.models.split(",")
    if "magi1" in models:
        out["magi1"] = magi1_rows(args, nodes, pack)
        print_rows(
            f"Trained tiny MAGI-1 ({args.seeds} seed(s) x {args.magi_chunks} chunks of 6 latent frames, window 4, V INT2 "
            "g32, QuaRot + Taylor): latent PSNR vs the full-precision rollout, chunks 1.. (paired SE over seeds)",
            out["magi1"],
        )
    if "tiny_ar" in models:
        out["tiny_ar"] = tiny_ar_rows(args, nodes)
        print_rows(
            f"Trained tiny AR / Wan-style ({args.seeds} seed(s) x {args.chunks} chunks after a 2-chunk prefix, window 3, "
            "V INT2 g32, QuaRot + Taylor): latent PSNR vs the full-precision rollout (paired SE over seeds)",
            out["tiny_ar"],
        )
    return out


if __name__ == "__main__":
    main()
    raise SystemExit(0)
