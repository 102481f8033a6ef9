"""The Triton code of :mod:`jensen_core.triton_kernel` (imported only by it, lazily: this module needs triton).

:func:`jensen_core.triton_kernel.triton_attend_chunk` loads this file once per interpreter mode, so that
the kernels are decorated under the ``TRITON_INTERPRET`` setting in force at that time.
"""

import triton
import triton.language as tl


@triton.jit
def _float_at(ptr, offs, mask, FMT: tl.constexpr):
    """A step or grid origin as float32: FP8 E4M3 (FMT 0) decoded from its byte, else a native load."""
    if FMT == 0:
        x = tl.load(ptr + offs, mask=mask, other=0).to(tl.int32)
        e = (x >> 3) & 15
        m = x & 7
        sign = tl.where((x & 128) != 0, -1.0, 1.0)
        # normal: (1 + m/8) 2^(e-7), built as float32 bits; subnormal (e == 0): m 2^-9
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        val = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal) * sign
    else:
        val = tl.load(ptr + offs, mask=mask, other=0).to(tl.float32)
    return val


@triton.jit
def _dequant(
    P, S, Z, row, scol, rows, cols, mask, BITS: tl.constexpr, GS: tl.constexpr, SF: tl.constexpr, ZF: tl.constexpr
):
    """Rows of one stored side, ``m + code * delta`` in float32, and the per-channel step ``delta``."""
    bit = cols * BITS  # code c of a row starts at bit c * bits (little-endian), whatever the width
    code = tl.load(P + row + bit // 8, mask=mask, other=0).to(tl.int32)
    if BITS == 3:  # a 3-bit code starting at bit 6 or 7 of a byte runs into the next one
        hi = tl.load(P + row + bit // 8 + 1, mask=mask & ((bit % 8) > 5), other=0).to(tl.int32)
        code = code | (hi << 8)
    code = (code >> (bit % 8)) & ((1 << BITS) - 1)
    group = cols // GS
    step = _float_at(S, scol + group, mask, SF)
    origin = _float_at(Z, rows + group, mask, ZF)
    return origin + code.to(tl.float32) * step, step


@triton.jit
def attend_chunk_kernel(
    Q, KP, KS, KZ, VP, VS, VZ, OUT, LSE,
    sq_b, sq_h, sq_m,
    skp_b, skp_h, skp_t, sks_b, sks_h, sks_t, skz_b, skz_h, skz_t,
    svp_b, svp_h, svp_t, svs_b, svs_h, svs_t, svz_b, svz_h, svz_t,
    so_b, so_h, so_m,
    H, M, N, scale, corr,
    D: tl.constexpr, DP: tl.constexpr,
    KBITS: tl.constexpr, KGS: tl.constexpr, KSF: tl.constexpr, KZF: tl.constexpr,
    VBITS: tl.constexpr, VGS: tl.constexpr, VSF: tl.constexpr, VZF: tl.constexpr,
    CORR: tl.constexpr, F32_DOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, DP)
    cmask = cols < D
    qmask = (offs_m < M)[:, None] & cmask[None, :]
    q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_m + cols[None, :], mask=qmask, other=0.0)
    qf = q.to(tl.float32)
    qsq = qf * qf  # sum over a group's channels of q_c^2 is nu_g: the bias is a dot with delta^2 per channel
    if F32_DOTS:
        qd = qf
        qsqd = qsq
    else:
        qd = q
        qsqd = qsq.to(q.dtype)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    dsq_sum = tl.zeros([DP], tl.float32)
    kp = KP + b * skp_b + h * skp_h
    ks = KS + b * sks_b + h * sks_h
    kz = KZ + b * skz_b + h * skz_h
    vp = VP + b * svp_b + h * svp_h
    vs = VS + b * svs_b + h * svs_h
    vz = VZ + b * svz_b + h * svz_h
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        nmask = offs_n < N
        mask = nmask[:, None] & cmask[None, :]
        n2 = offs_n[:, None]
        c2 = cols[None, :]
        k, kstep = _dequant(kp, ks, kz, n2 * skp_t, n2 * sks_t, n2 * skz_t, c2, mask, KBITS, KGS, KSF, KZF)
        if F32_DOTS:
            s = tl.dot(qd, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(qd, tl.trans(k.to(q.dtype)))
        s = s * scale
        if CORR == 1:  # Taylor, per score: lambda * sum_g nu_g delta_g^2 / (24 d)
            dsq = kstep * kstep
            if F32_DOTS:
                s -= tl.dot(qsqd, tl.trans(dsq), input_precision="ieee") * corr
            else:
                s -= tl.dot(qsqd, tl.trans(dsq.to(q.dtype))) * corr
        elif CORR == 2:  # chunk_mean: only the chunk's sum of delta^2 is needed (an LSE offset at the end)
            dsq_sum += tl.sum(tl.where(mask, kstep * kstep, 0.0), 0)
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if VBITS == 0:  # full-precision values
            v = tl.load(vp + n2 * svp_t + c2, mask=mask, other=0.0).to(tl.float32)
        else:
            v, _ = _dequant(vp, vs, vz, n2 * svp_t, n2 * svs_t, n2 * svz_t, c2, mask, VBITS, VGS, VSF, VZF)
        if F32_DOTS:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    lse = m_i + tl.log(l_i)
    if CORR == 2:
        lse -= tl.sum(qsq * dsq_sum[None, :], 1) * (corr / N)
    tl.store(OUT + b * so_b + h * so_h + offs_m[:, None] * so_m + cols[None, :], out.to(q.dtype), mask=qmask)
    tl.store(LSE + pid_bh * M + offs_m, lse, mask=offs_m < M)
