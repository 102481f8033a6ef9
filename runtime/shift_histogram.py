"""The diagnostics as a picture and as text: ΔP_S histograms before/after correction (the paper's Fig. 4).

Rendered with Pillow only (ComfyUI ships Pillow, not matplotlib). Input is the JSON-ready dict that
``DiagnosticsObserver.summary()`` puts in the sampler's report under ``diagnostics``. No ComfyUI
import here.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from PIL import Image, ImageDraw, ImageFont

BEFORE = (123, 63, 160)  # purple: quantized, no correction (the paper's Fig. 4 colours)
AFTER = (240, 138, 36)  # orange: with the correction
INK = (30, 30, 30)
GRID = (225, 225, 225)
BACKGROUND = (255, 255, 255)
MODE_NAMES = {
    "off": "no correction",
    "taylor": "Taylor",
    "chunk_mean": "chunk mean",
    "exact": "exact",
    "per_channel": "per-channel",
    "head_mean": "head mean",
}


# ------------------------------------------------------------------------------------------------ text
def mode_label(diag: dict, mode: str) -> str:
    if mode == "off":
        return "quantized, no correction"
    label = f"corrected ({MODE_NAMES.get(mode, mode)}"
    if diag.get("strength", 1.0) != 1.0:
        label += f" x{diag['strength']:g}"
    return label + (", what-if: not applied in this run)" if diag.get("what_if") else ")")


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def diagnostics_text(diag: dict) -> str:
    """The numbers, one mode per line, plus what was sampled."""
    head = "KV cache attention diagnostics"
    if diag.get("cache"):
        head += f" - {diag['cache']}"
    lines = [head]
    if not diag.get("calls"):
        lines.append(diag.get("note", "no data"))
        return "\n".join(lines)
    for mode in diag["modes"]:
        s = diag["stats"][mode]
        lines.append(
            f"{mode_label(diag, mode)}: median dP_S {_num(s['median_delta_ps'], '+.5f')} "
            f"(IQR {_num(s['iqr_delta_ps'], '.5f')}: {_num(s['q25_delta_ps'], '+.5f')} .. "
            f"{_num(s['q75_delta_ps'], '+.5f')}), mean JSD {_num(s['mean_jsd'], '.3e')}, "
            f"output MSE {_num(s['output_mse'], '.3e')}"
        )
    for mode in diag["modes"]:
        s = diag["stats"][mode]
        worst = s.get("worst_head")
        if s.get("p99_abs_delta_ps") is not None:
            lines.append(
                f"  tails of |dP_S|: p95 {_num(s['p95_abs_delta_ps'], '.5f')}, p99 {_num(s['p99_abs_delta_ps'], '.5f')}"
                + (
                    f"; worst head {worst['head']} (p95 {worst['p95_abs_delta_ps']:.5f}, p99 "
                    f"{worst['p99_abs_delta_ps']:.5f}, median dP_S {worst['median_delta_ps']:+.5f})"
                    if worst
                    else ""
                )
            )
    if len(diag["modes"]) == 2:
        a, b = (diag["stats"][m] for m in diag["modes"])
        if a["median_delta_ps"] and b["median_delta_ps"] is not None:
            lines.append(
                f"median |dP_S| x{abs(b['median_delta_ps']) / abs(a['median_delta_ps']):.2f}, "
                f"JSD x{_ratio(b['mean_jsd'], a['mean_jsd'])}, "
                f"output MSE x{_ratio(b['output_mse'], a['output_mse'])} with the correction"
            )
    if not diag.get("keys_quantized", True):
        lines.append(
            "The keys are not quantized: there is no Jensen bias to correct (values only, or a full-precision cache)."
        )
    stride = diag["query_stride"]
    lines.append(
        f"Sampled: layers {_short(diag['layers'])}, heads {_short(diag['heads'])}, steps {_short(diag['steps'])}, "
        f"chunks {_short(diag['chunks'])}, {'every query' if stride == 1 else f'every {stride}th query'}: "
        f"{diag['stats'][diag['modes'][0]]['samples']} queries from {diag['calls']} attention calls. "
        "dP_S > 0: cached keys steal attention from the current chunk."
    )
    return "\n".join(lines)


def _ratio(b: float | None, a: float | None) -> str:
    if a is None or b is None or a == 0:
        return "n/a"
    return f"{b / a:.2f}"


def _short(xs: list[int]) -> str:
    if not xs:
        return "-"
    runs, start, prev = [], xs[0], xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(runs)


# ----------------------------------------------------------------------------------------------- fonts
@lru_cache(maxsize=8)
def _font(size: int) -> tuple[ImageFont.ImageFont, bool]:
    """(font, has Greek/math glyphs): DejaVu Sans where installed, else Pillow's own font."""
    for name in ("DejaVuSans.ttf", "Arial.ttf", "LiberationSans-Regular.ttf"):
        try:
            return ImageFont.truetype(name, size), name != "LiberationSans-Regular.ttf"
        except OSError:
            continue
    try:
        return ImageFont.load_default(size=size), False
    except TypeError:  # Pillow < 10.1: a fixed bitmap font
        return ImageFont.load_default(), False


def _t(text: str, unicode_ok: bool) -> str:
    if unicode_ok:
        return text
    return text.replace("Δ", "d").replace("−", "-").replace("→", "->").replace("·", "-").replace("×", "x")


def _nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, x = [], first
    while x <= hi + step * 1e-9:
        ticks.append(0.0 if abs(x) < step * 1e-9 else x)
        x += step
    return ticks


def _tick_label(x: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step)) + (1 if step / 10 ** math.floor(math.log10(step)) == 2.5 else 0))
    return f"{x:.{decimals}f}".replace("-", "−")


# ---------------------------------------------------------------------------------------------- render
def render_histogram(diag: dict, width: int = 960, height: int = 540) -> Image.Image:
    """An RGB picture of the ΔP_S histograms (before: purple, after: orange), medians dashed, numbers below."""
    if width < 320 or height < 240:
        raise ValueError(f"the plot needs at least 320 x 240 pixels, got {width} x {height}")
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    s = max(0.6, min(width / 960, height / 540))
    font, uni = _font(max(10, round(15 * s)))
    small, _ = _font(max(9, round(12 * s)))
    title = "Attention mass shifted to cached keys: ΔP_S = P_S(quantized) − P_S(full precision)"
    if diag.get("cache"):
        title += f"  ·  {diag['cache']}"
    draw.text((round(14 * s), round(10 * s)), _t(title, uni), font=font, fill=INK)

    hist = diag.get("histogram")
    left, right = round(70 * s), width - round(20 * s)
    top, bottom = round(44 * s), height - round(112 * s)
    if not diag.get("calls") or not hist:
        msg = diag.get("note", "no diagnostics data")
        draw.rectangle((left, top, right, bottom), outline=GRID, width=2)
        draw.multiline_text((left + 20, (top + bottom) // 2 - 20), _wrap(msg, 90), font=font, fill=INK)
        return img

    edges = hist["edges"]
    lo, hi = edges[0], edges[-1]
    modes = diag["modes"]
    totals = {m: max(sum(hist["counts"][m]), 1) for m in modes}
    shares = {m: [c / totals[m] * 100 for c in hist["counts"][m]] for m in modes}
    ymax = max(max(v) for v in shares.values()) * 1.3 or 1.0

    def px(x: float) -> float:
        return left + (x - lo) / (hi - lo) * (right - left)

    def py(y: float) -> float:
        return bottom - y / ymax * (bottom - top)

    # grid and axes
    yt = _nice_ticks(0, ymax, 5)
    ystep = yt[1] - yt[0] if len(yt) > 1 else 1.0
    for y in yt:
        draw.line((left, py(y), right, py(y)), fill=GRID, width=1)
        lab = _tick_label(y, ystep)
        w = draw.textlength(lab, font=small)
        draw.text((left - 6 - w, py(y) - 7 * s), lab, font=small, fill=INK)
    xt = _nice_ticks(lo, hi, 7)
    xstep = xt[1] - xt[0] if len(xt) > 1 else 1.0
    for x in xt:
        draw.line((px(x), bottom, px(x), bottom + 5), fill=INK, width=1)
        lab = _t(_tick_label(x, xstep), uni)
        w = draw.textlength(lab, font=small)
        draw.text((px(x) - w / 2, bottom + 7), lab, font=small, fill=INK)

    # bars: each mode on its own translucent layer, composited
    colors = {modes[0]: BEFORE, **({modes[1]: AFTER} if len(modes) > 1 else {})}
    base = img.convert("RGBA")
    for m in modes:
        layer = Image.new("RGBA", img.size, (0, 0, 0, 0))
        ld = ImageDraw.Draw(layer)
        for i, share in enumerate(shares[m]):
            if share <= 0:
                continue
            x0, x1 = px(edges[i]), px(edges[i + 1])
            ld.rectangle((x0, py(share), max(x1 - 1, x0), bottom), fill=(*colors[m], 140))
        base = Image.alpha_composite(base, layer)
    img.paste(base.convert("RGB"))
    draw = ImageDraw.Draw(img)
    draw.line((left, top, left, bottom), fill=INK, width=1)
    draw.line((left, bottom, right, bottom), fill=INK, width=1)
    if lo <= 0 <= hi:
        draw.line((px(0), top, px(0), bottom), fill=INK, width=max(1, round(1.5 * s)))
    for m in modes:  # medians, dashed
        med = diag["stats"][m]["median_delta_ps"]
        if med is None:
            continue
        x = px(min(max(med, lo), hi))
        y = top
        while y < bottom:
            draw.line((x, y, x, min(y + 6, bottom)), fill=colors[m], width=max(2, round(2 * s)))
            y += 11
    draw.text(
        (
            (left + right) / 2 - draw.textlength(_t("ΔP_S (share of the attention row)", uni), font=small) / 2,
            bottom + round(24 * s),
        ),
        _t("ΔP_S (share of the attention row)", uni),
        font=small,
        fill=INK,
    )
    ylab = Image.new("RGBA", (round(draw.textlength("queries (%)", font=small)) + 4, round(16 * s)), (0, 0, 0, 0))
    ImageDraw.Draw(ylab).text((2, 0), "queries (%)", font=small, fill=INK)
    ylab = ylab.rotate(90, expand=True)
    img.paste(ylab, (round(4 * s), (top + bottom) // 2 - ylab.height // 2), ylab)

    # legend (top left inside the plot) and the numbers under the axis
    ly = top + round(8 * s)
    legend = [
        _t(
            f"{mode_label(diag, m)}: median {diag['stats'][m]['median_delta_ps']:+.4f}, "
            f"IQR {diag['stats'][m]['iqr_delta_ps']:.4f}",
            uni,
        )
        for m in modes
    ]
    box_w = max(draw.textlength(t, font=small) for t in legend) + round(40 * s)
    draw.rectangle(
        (left + 6, ly - 4, left + 6 + box_w, ly + round(20 * s) * len(modes) + 2), fill=BACKGROUND, outline=GRID
    )
    for m in modes:
        st = diag["stats"][m]
        text = _t(f"{mode_label(diag, m)}: median {st['median_delta_ps']:+.4f}, IQR {st['iqr_delta_ps']:.4f}", uni)
        draw.rectangle((left + 12, ly + 3, left + 12 + round(22 * s), ly + round(15 * s)), fill=colors[m])
        draw.text((left + 18 + round(22 * s), ly), text, font=small, fill=INK)
        ly += round(20 * s)
    fy = bottom + round(50 * s)
    for m in modes:
        st = diag["stats"][m]
        line = _t(f"{mode_label(diag, m)}: mean JSD {st['mean_jsd']:.3e} · output MSE {st['output_mse']:.3e}", uni)
        draw.rectangle((left, fy + 3, left + round(10 * s), fy + round(13 * s)), fill=colors[m])
        draw.text((left + round(16 * s), fy), line, font=small, fill=INK)
        fy += round(18 * s)
    n = diag["stats"][modes[0]]["samples"]
    clamped = sum(hist.get("clamped", {}).values())
    foot = (
        f"{n} queries, {diag['calls']} attention calls (layers {_short(diag['layers'])}, heads "
        f"{_short(diag['heads'])}, steps {_short(diag['steps'])})"
        + (f"; {clamped} tail values in the edge bins" if clamped else "")
    )
    draw.text((left, fy), _t(foot, uni), font=small, fill=(90, 90, 90))
    return img


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width and line:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "\n".join(lines)


def image_tensor(img: Image.Image) -> torch.Tensor:
    """A ComfyUI IMAGE: float32 (1, H, W, 3) in [0, 1]."""
    rgb = img.convert("RGB")
    data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    return data.view(1, rgb.height, rgb.width, 3).to(torch.float32) / 255.0
