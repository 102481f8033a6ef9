"""How the per-score Taylor correction reaches an attention kernel: layouts, their candidates, their check.

:func:`taylor_layout` feeds the rank ``G = d / g`` Taylor correction to a kernel in one of these
layouts, chosen once per (device type, dtype, head_dim, G) at first use:

``pad``   q' = [q, -sqrt(d) lambda nu], k' = [k_hat, W], v' = [v, 0], all of one width (a multiple
          of 8, or of 64 where the CPU flash kernel packs its operands for AMX);
``split`` q', k' as above, v of head_dim (kernels that take a narrower v: CUDA's memory-efficient
          attention), so the output needs no padding;
``flex``  FlexAttention with a ``score_mod`` that subtracts ``lambda nu . W`` - no extra channels on
          q and k, the head_dim the kernel is built for (what the paper runs). On CUDA the kernel
          returns its log-sum-exp; the CPU kernel (torch.compile's C++ template) does not, so there
          each chunk gets one *sink* key (zero key, score set by the ``score_mod`` to a Jensen lower
          bound ``c`` of the row's log-sum-exp) whose value is a one-hot extra value channel: that
          channel's output ``y = e^c / (e^c + Z)`` gives ``lse = c + log((1 - y) / y)`` and the
          attention output is the rest divided by ``1 - y`` (``Layout.sink``).
``triton`` (CUDA) the fused Triton kernel of :mod:`jensen_core.triton_kernel`: reads the packed codes,
          dequantizes and corrects in registers, no buffer at all; checked like the others (its own
          float64 check on quantized keys, :func:`jensen_core.triton_kernel.layout_check`). Its speed is
          unmeasured (no GPU yet); where timed, it is timed with its dequantization, the others without.

What the kernels want (read from their sources): the CPU flash kernel needs q, k, v of one width
(else SDPA falls back to its ~2.7x slower math path), and in reduced precision on AMX it packs its
operands for the tile units only when the width is a multiple of 64 (so d + G = 132 -> 136 loses
the packing; 192 keeps it but does 50% more work); CUDA flash kernels are compiled for head dims
64/96/128/160/..., so 136 runs as 160. Every candidate the device offers (:func:`candidate_layouts`)
is checked against a float64 reference on a tiny problem; where more than one passes, each is timed
on the first call's shapes and the fastest is kept (logged; :func:`kernel_choices` reports it).

FlexAttention on the CPU compiles once per shape (about 20 s of CPU time each, minutes of wall time
on a busy 2-core machine) and is slower per attend than ``pad`` there (2.75x in fp32 on an AVX2 CPU:
``benchmarks/flex_cpu.py``, docs/benchmarks.md), so the automatic choice leaves it out on the CPU; ``JENSEN_KV_TAYLOR_LAYOUT=flex`` (or :func:`set_layout_preference`)
asks for it explicitly, as ``pad`` / ``split`` ask for those.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from .cpu import cpu_class
from .sdpa_lse import HALF_DTYPES, check_tolerance, sdpa_with_lse

logger = logging.getLogger("jensen_kv")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Layout:
    """How the rank-G Taylor bias reaches the kernel (see the module docstring)."""

    kind: str  # "pad", "split", "flex" or "triton"
    width: int  # width of q and k in the kernel (head_dim for "flex")
    sink: bool = False  # "flex" without a kernel log-sum-exp (CPU): a sink key and value channel added per chunk

    def value_width(self, head_dim: int) -> int:
        return self.width if self.kind == "pad" else head_dim

    def describe(self, head_dim: int) -> str:
        if self.kind == "flex":
            how = ", log-sum-exp from a sink key" if self.sink else ""
            return f"FlexAttention score_mod at width {head_dim}{how}"
        if self.kind == "triton":
            return f"fused Triton kernel over the packed codes at width {head_dim}"
        if self.kind == "split":
            return f"q,k width {self.width}, v width {head_dim}"
        return f"q,k,v padded to {self.width}"


def layout_query(layout: Layout, q: Tensor, nu: Tensor, strength: float) -> Tensor:
    """The query the kernel gets: ``[q, -sqrt(d) lambda nu, 0...]`` (``pad``/``split``) or ``q`` itself (``flex``, ``triton``)."""
    if layout.kind in ("flex", "triton"):
        return q
    D, G = q.shape[-1], nu.shape[-1]
    out = q.new_empty(*q.shape[:-1], layout.width)
    out[..., :D] = q
    out[..., D : D + G] = nu * (-math.sqrt(D) * strength)
    out[..., D + G :] = 0
    return out


def layout_attend(
    layout: Layout, q: Tensor, k: Tensor, v: Tensor, nu: Tensor, w: Tensor, strength: float, scale: float
) -> tuple[Tensor, Tensor]:
    """Corrected attention of one cached chunk and its fp32 log-sum-exp.

    ``q``: from :func:`layout_query`; ``k`` of the layout's width with ``W`` in channels
    ``D:D+G`` (``pad``/``split``; plain keys for ``flex``), ``v`` of :meth:`Layout.value_width`;
    ``nu`` (B, H, M, G) and ``w`` (B, H, T, G) float32, used by ``flex`` only.
    """
    if layout.kind == "triton":
        raise ValueError("the triton layout reads packed codes: use jensen_core.triton_kernel.triton_attend_chunk")
    if layout.sink:
        return _flex_sink_attend(q, k, v, nu * strength, w, scale)
    if layout.kind == "flex":
        out, lse = _flex_fn()(q, k, v, nu * strength, w, scale)
        return out, lse.to(torch.float32)
    return sdpa_with_lse(q, k, v, scale)


#: the sink's score is raised by this much (for the rows where it underflowed) and the chunk attended again
_SINK_STEP = 64.0
_SINK_MIN = 1e-30  # a sink share below this has lost its precision (float32 and bfloat16 reach ~1e-38)


def _flex_sink_attend(q: Tensor, k: Tensor, v: Tensor, nu_s: Tensor, w: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """FlexAttention without a kernel log-sum-exp: the chunk's keys plus one sink key (see the module docstring).

    ``k``, ``v`` (B, H, T, D), ``w`` (B, H, T, G); the sink is appended here (one more key row and
    value channel: a transient copy of the chunk's K/V, as the kernel takes no separate sink). The sink's score ``c`` = mean corrected score + log T <= the row's log-sum-exp (Jensen), so its
    share ``y`` <= 1/2 and ``1 - y`` never cancels; where ``y`` underflows (scores spread by more
    than ~69 nats) those rows are attended again with ``c`` raised by ``_SINK_STEP``.
    """
    D, T = q.shape[-1], k.shape[-2]
    wz = torch.cat([w, w.new_zeros(*w.shape[:-2], 1, w.shape[-1])], -2)  # the sink has no correction
    kz = torch.cat([k, k.new_zeros(*k.shape[:-2], 1, D)], -2)  # its key is 0, its score set by the score_mod
    vz = v.new_zeros(*v.shape[:-2], T + 1, D + 1)  # its value is the one-hot channel D
    vz[..., :T, :D] = v
    vz[..., T, D] = 1
    kmean = k.mean(-2, keepdim=True, dtype=torch.float32)
    c = (q.float() @ kmean.transpose(-1, -2)).squeeze(-1) * scale
    c = c - (nu_s * w.mean(-2, keepdim=True)).sum(-1) + math.log(T)
    fn = _flex_sink_fn()
    out = lse = None
    todo = None
    for _ in range(8):
        full = fn(q, kz, vz, nu_s, wz, c, scale)
        y = full[..., D].float()
        ok = y > _SINK_MIN  # also False where y is nan
        o = full[..., :D] / (1 - y).unsqueeze(-1).to(full.dtype)
        ls = c + torch.log1p(-y) - torch.log(y)
        if out is None:
            out, lse = o, ls
        else:
            out = torch.where(todo.unsqueeze(-1), o, out)
            lse = torch.where(todo, ls, lse)
        todo = ~ok if todo is None else todo & ~ok
        if not bool(todo.any()):
            return out, lse
        c = torch.where(todo, c + _SINK_STEP, c)
    raise RuntimeError("FlexAttention sink: the log-sum-exp could not be recovered (non-finite scores?)")


def _flex_available(device: torch.device) -> bool:
    if device.type not in ("cuda", "cpu"):
        return False
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


_FLEX_FN = None


def _flex_fn():
    """FlexAttention with the Taylor bias as a ``score_mod`` (compiled once; CUDA)."""
    global _FLEX_FN
    if _FLEX_FN is None:
        from torch.nn.attention.flex_attention import flex_attention

        def corrected(q: Tensor, k: Tensor, v: Tensor, nu: Tensor, w: Tensor, scale: float):
            G = nu.shape[-1]

            def score_mod(score, b, h, m, n):
                bias = nu[b, h, m, 0] * w[b, h, n, 0]
                for j in range(1, G):
                    bias = bias + nu[b, h, m, j] * w[b, h, n, j]
                return score - bias

            return flex_attention(q, k, v, score_mod=score_mod, scale=scale, return_lse=True)

        _FLEX_FN = torch.compile(corrected, dynamic=False)
    return _FLEX_FN


_FLEX_SINK_FN = None


def _flex_sink_fn():
    """FlexAttention with the Taylor bias and a sink key as a ``score_mod`` (compiled once per shape; CPU)."""
    global _FLEX_SINK_FN
    if _FLEX_SINK_FN is None:
        from torch.nn.attention.flex_attention import flex_attention

        def corrected_sink(q: Tensor, k: Tensor, v: Tensor, nu: Tensor, w: Tensor, c: Tensor, scale: float):
            G, T = nu.shape[-1], k.shape[-2] - 1

            def score_mod(score, b, h, m, n):
                bias = nu[b, h, m, 0] * w[b, h, n, 0]
                for j in range(1, G):
                    bias = bias + nu[b, h, m, j] * w[b, h, n, j]
                return torch.where(n == T, c[b, h, m], score - bias)

            return flex_attention(q, k, v, score_mod=score_mod, scale=scale)

        _FLEX_SINK_FN = torch.compile(corrected_sink, dynamic=False)
    return _FLEX_SINK_FN


def candidate_layouts(device: torch.device, dtype: torch.dtype, head_dim: int, G: int) -> list[Layout]:
    """The layouts worth trying on this device and dtype, the default first."""
    w8 = round_up(head_dim + G, 8)
    out = [Layout("pad", w8)]
    if device.type == "cpu":
        w64 = round_up(head_dim + G, 64)
        if dtype in HALF_DTYPES and cpu_class() == "AMX" and w64 != w8:
            out.append(Layout("pad", w64))  # keeps the AMX packing of the CPU flash kernel, at more work
        if dtype in (torch.float32, torch.bfloat16) and _flex_available(device):
            # no log-sum-exp from the CPU kernel: a sink key gives it (its share underflows in float16)
            out.append(Layout("flex", head_dim, sink=True))
    elif device.type == "cuda":
        out.append(Layout("split", w8))
        if _flex_available(device):
            out.append(Layout("flex", head_dim))
        out += _triton_candidates(device, head_dim)
    return out


def _triton_candidates(device: torch.device, head_dim: int) -> list[Layout]:
    """The fused Triton kernel, where triton imports and the device is CUDA (never on a CPU)."""
    from . import triton_kernel

    return [Layout("triton", head_dim)] if device.type == "cuda" and triton_kernel.available(device) else []


#: the environment variable that asks for one layout kind (``pad``, ``split``, ``flex``, ``triton``; ``auto`` = choose)
LAYOUT_ENV = "JENSEN_KV_TAYLOR_LAYOUT"
LAYOUT_KINDS = ("pad", "split", "flex", "triton")
_PREFERENCE: str | None = None  # set_layout_preference's kind or "auto"; None: the environment decides


def set_layout_preference(kind: str | None) -> None:
    """Ask for one layout kind (``"pad"``, ``"split"``, ``"flex"``) or ``"auto"``; forgets the choices made so far.

    Overrides ``JENSEN_KV_TAYLOR_LAYOUT`` (``None`` follows it again). A kind this device does not
    offer, or whose check fails, is logged and the automatic choice is used instead.
    """
    global _PREFERENCE
    _PREFERENCE = None if kind is None else (_check_kind(kind, "set_layout_preference") or "auto")
    _LAYOUTS.clear()


def _check_kind(kind: str | None, where: str) -> str | None:
    if kind is None or kind == "auto":
        return None
    if kind not in LAYOUT_KINDS:
        raise ValueError(f"{where}: unknown correction layout {kind!r}; use one of {', '.join(LAYOUT_KINDS)} or 'auto'")
    return kind


def layout_preference() -> str | None:
    """The kind asked for (:func:`set_layout_preference`, else ``JENSEN_KV_TAYLOR_LAYOUT``), or ``None``: choose."""
    if _PREFERENCE is not None:
        return _check_kind(_PREFERENCE, "set_layout_preference")
    return _check_kind(os.environ.get(LAYOUT_ENV, "").strip().lower() or None, LAYOUT_ENV)


def _problem(device, dtype, B, H, M, T, D, G, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (M, T, T))
    nu = torch.rand(B, H, M, G, generator=gen) * 4
    w = torch.rand(B, H, T, G, generator=gen) * 0.05
    move = lambda t, dt=dtype: t.to(device=device, dtype=dt)  # noqa: E731
    return move(q), move(k), move(v), move(nu, torch.float32), move(w, torch.float32)


def _inputs(layout: Layout, q, k, v, nu, w, strength):
    D, G = q.shape[-1], nu.shape[-1]
    qi = layout_query(layout, q, nu, strength)
    if layout.kind == "flex":
        return qi, k, v
    kb = k.new_zeros(*k.shape[:-1], layout.width)
    kb[..., :D] = k
    kb[..., D : D + G] = w
    vb = v.new_zeros(*v.shape[:-1], layout.value_width(D))
    vb[..., :D] = v
    return qi, kb, vb


def _layout_ok(layout: Layout, device: torch.device, dtype: torch.dtype, D: int, G: int) -> bool:
    """The layout's corrected attention against softmax(q k^T / sqrt(d) - lambda nu W^T) v in float64."""
    try:
        if layout.kind == "triton":  # it reads packed codes: its own check on quantized keys and values
            from .triton_kernel import layout_check

            return layout_check(device, dtype, D, G)
        q, k, v, nu, w = _problem(device, dtype, 1, 2, 5, 11, D, G)
        strength, scale = 0.7, 1.0 / math.sqrt(D)
        out, lse = layout_attend(layout, *_inputs(layout, q, k, v, nu, w, strength), nu, w, strength, scale)
        s = (q.double() @ k.double().transpose(-1, -2)) * scale - strength * (
            nu.double() @ w.double().transpose(-1, -2)
        )
        tol = check_tolerance(dtype)
        return bool(
            lse.shape == q.shape[:-1]
            and torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=tol, rtol=tol)
            and torch.allclose(out[..., :D].double(), torch.softmax(s, -1) @ v.double(), atol=tol, rtol=tol)
        )
    except Exception as exc:  # noqa: BLE001 - a layout that fails in any way is not used
        logger.info("jensen_kv: correction layout %s unavailable on %s/%s: %s", layout, device, dtype, exc)
        return False


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()  # our threads' time: other processes on a shared machine don't count


def _fastest(layouts: list[Layout], device, dtype, D, G, shape, rounds: int = 3, margin: float = 0.05) -> Layout:
    """Time each layout on one cached chunk of the first call's shape; keep the default unless another wins by ``margin``."""
    H, M, T = shape
    q, k, v, nu, w = _problem(device, dtype, 1, min(H, 16), min(M, 2048), min(T, 2048), D, G, seed=1)
    calls = []
    for layout in layouts:
        if layout.kind == "triton":  # from packed codes (its dequantization timed too)
            from .triton_kernel import timing_call

            calls.append(timing_call(device, dtype, D, G, shape))
            continue
        args = _inputs(layout, q, k, v, nu, w, 1.0)
        calls.append(lambda layout=layout, args=args: layout_attend(layout, *args, nu, w, 1.0, 1.0 / math.sqrt(D)))
    for c in calls:  # warm-up (and FlexAttention's compilation)
        c()
    times = [[] for _ in calls]
    for r in range(rounds):
        for i in range(len(calls)) if r % 2 == 0 else reversed(range(len(calls))):
            t0 = _clock(device)
            calls[i]()
            times[i].append(_clock(device) - t0)
    med = [statistics.median(t) for t in times]
    best = min(range(len(layouts)), key=med.__getitem__)
    if med[best] > (1 - margin) * med[0]:
        best = 0
    logger.info(
        "jensen_kv: correction layouts on %s/%s timed %s: using %s",
        device.type,
        dtype,
        ", ".join(f"{lay.describe(D)} {m * 1e3:.2f} ms" for lay, m in zip(layouts, med)),
        layouts[best].describe(D),
    )
    return layouts[best]


_LAYOUTS: dict[tuple[str, torch.dtype, int, int], Layout | None] = {}


def taylor_layout(
    device: torch.device, dtype: torch.dtype, head_dim: int, G: int, shape: tuple[int, int, int] = (8, 512, 512)
) -> Layout | None:
    """The per-score correction's layout here, chosen at first use and cached per (device type, dtype, head_dim, G).

    ``shape`` = (heads, queries, tokens of one cached chunk) of the first call, for the timing.
    ``None`` when no layout passes its check (the caller falls back to one padded buffer per window).
    A kind asked for (:func:`layout_preference`) is taken where offered and passing its check; the
    automatic choice never takes the CPU's FlexAttention (``Layout.sink``).
    """
    key = (device.type, dtype, head_dim, G)
    if key not in _LAYOUTS:
        cands = candidate_layouts(device, dtype, head_dim, G)
        kind = layout_preference()
        asked = [lay for lay in cands if lay.kind == kind]
        ok = [lay for lay in asked if _layout_ok(lay, device, dtype, head_dim, G)]
        if kind is not None and not ok:
            logger.warning(
                "jensen_kv: correction layout %r %s on %s/%s; choosing automatically",
                kind,
                "failed its check" if asked else "is not offered",
                device.type,
                dtype,
            )
        if not ok:
            # the CPU's FlexAttention compiles per shape and is slower per attend than pad: only when asked for
            auto = [lay for lay in cands if not lay.sink]
            ok = [lay for lay in auto if _layout_ok(lay, device, dtype, head_dim, G)]
        choice = None if not ok else ok[0] if len(ok) == 1 else _fastest(ok, device, dtype, head_dim, G, shape)
        if choice is not None:
            logger.info(
                "jensen_kv: Taylor correction on %s/%s (head_dim %d, %d groups): %s",
                device.type,
                dtype,
                head_dim,
                G,
                choice.describe(head_dim),
            )
        _LAYOUTS[key] = choice
    return _LAYOUTS[key]


def adopt_layout(device: torch.device, dtype: torch.dtype, head_dim: int, G: int, layout: Layout | None) -> None:
    """Use ``layout`` (another process's :func:`taylor_layout` choice) for this key from now on, instead of choosing.

    For sequence-parallel ranks that must all run one layout: rank 0 chooses, the others adopt it.
    ``None`` adopts "no layout" (the one-buffer path). A layout this device does not offer, or whose
    check fails here, is a ValueError naming it (the ranks could not agree).
    """
    key = (device.type, dtype, head_dim, G)
    if layout is not None:
        if layout not in candidate_layouts(device, dtype, head_dim, G) or not _layout_ok(
            layout, device, dtype, head_dim, G
        ):
            raise ValueError(
                f"the correction layout {layout.describe(head_dim)} ({layout.kind}) chosen on another rank is not "
                f"offered or fails its check on {device.type}/{dtype} here; set {LAYOUT_ENV} to one every rank offers "
                "(e.g. pad)"
            )
    _LAYOUTS[key] = layout


def kernel_choices() -> dict[str, str]:
    """The layouts chosen so far, ``"cpu/torch.bfloat16 d128 G4" -> "q,k,v padded to 136"`` (for benchmarks and reports)."""
    return {
        f"{dev}/{dt} d{d} G{g}": ("none (single buffer)" if lay is None else lay.describe(d))
        for (dev, dt, d, g), lay in _LAYOUTS.items()
    }
