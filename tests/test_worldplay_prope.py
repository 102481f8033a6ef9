"""PRoPE (runtime/families/worldplay/model/prope.py) against a float64 implementation written out plainly here, against the reference's
own outputs (tests/data/worldplay/prope.safetensors, made by HY-WorldPlay's ``prope_qkv`` on random cameras), and
the property that makes it projective: attention through PRoPE does not depend on the world frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from runtime.families.worldplay.model.prope import PRoPE, apply_blockwise, invert_rigid, projection_matrices, prope_qkv

DATA = Path(__file__).parent / "data" / "worldplay"


def random_rigid(g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    m = torch.eye(4, dtype=torch.float64)
    m[:3, :3], m[:3, 3] = q, torch.randn(3, generator=g, dtype=torch.float64)
    return m


def cameras(frames: int, seed: int, batch: int = 1):
    g = torch.Generator().manual_seed(seed)
    w = torch.stack([torch.stack([random_rigid(g) for _ in range(frames)]) for _ in range(batch)])
    k = torch.zeros(batch, frames, 3, 3, dtype=torch.float64)
    k[..., 0, 0] = 0.3 + torch.rand(batch, frames, generator=g, dtype=torch.float64)
    k[..., 1, 1] = 0.3 + torch.rand(batch, frames, generator=g, dtype=torch.float64)
    k[..., 0, 2] = k[..., 1, 2] = 0.5
    k[..., 2, 2] = 1
    return w, k


def plain_prope(x: np.ndarray, w: np.ndarray, k: np.ndarray, role: str) -> np.ndarray:
    """x (B, H, L, D) float64, one camera per frame: each 4-channel block of each token times its frame's matrix,
    P = diag(fx, fy, 1, 1) W (principal point dropped), P^T for queries, P^-1 (general inverse) for keys / values,
    P for outputs."""
    b, h, n, d = x.shape
    frames = w.shape[1]
    per = n // frames
    out = np.empty_like(x)
    for bi in range(b):
        for f in range(frames):
            p = np.diag([k[bi, f, 0, 0], k[bi, f, 1, 1], 1.0, 1.0]) @ w[bi, f]
            m = {"q": p.T, "kv": np.linalg.inv(p), "o": p}[role]
            for hi in range(h):
                for t in range(f * per, (f + 1) * per):
                    for blk in range(d // 4):
                        out[bi, hi, t, 4 * blk : 4 * blk + 4] = m @ x[bi, hi, t, 4 * blk : 4 * blk + 4]
    return out


@pytest.mark.parametrize("batch", [1, 2])
def test_prope_matches_a_plain_float64_implementation(batch):
    w, k = cameras(frames=3, seed=batch, batch=batch)
    g = torch.Generator().manual_seed(7)
    q, kk, v, o = (torch.randn(batch, 2, 3 * 5, 16, generator=g, dtype=torch.float64) for _ in range(4))
    qp, kp, vp, t = prope_qkv(q, kk, v, w, k)
    for got, x, role in ((qp, q, "q"), (kp, kk, "kv"), (vp, v, "kv"), (t.outputs(o), o, "o")):
        want = plain_prope(x.numpy(), w.numpy(), k.numpy(), role)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_prope_matches_the_reference_outputs():
    """The reference lifts K into a float32 4 x 4 (``_lift_K`` allocates float32 zeros), so its fx, fy are rounded to
    float32: with K rounded so, queries and outputs agree to float64 rounding, keys and values (whose P^-1 it
    rounds after inverting) to 3e-7; with the float64 K the pack uses, everything agrees to 1e-6 relative."""
    ref = load_file(DATA / "prope.safetensors")
    k32 = ref["Ks"].float().double()
    qp, kp, vp, t = prope_qkv(ref["q"], ref["k"], ref["v"], ref["viewmats"], k32)
    torch.testing.assert_close(qp, ref["q_prope"], rtol=0, atol=1e-12)
    torch.testing.assert_close(t.outputs(ref["o"]), ref["o_prope"], rtol=0, atol=1e-12)
    torch.testing.assert_close(kp, ref["k_prope"], rtol=0, atol=1e-6)
    torch.testing.assert_close(vp, ref["v_prope"], rtol=0, atol=1e-6)
    qp, kp, vp, t = prope_qkv(ref["q"], ref["k"], ref["v"], ref["viewmats"], ref["Ks"])
    for got, name in ((qp, "q_prope"), (kp, "k_prope"), (vp, "v_prope"), (t.outputs(ref["o"]), "o_prope")):
        scale = float(ref[name].abs().max())
        assert float((got - ref[name]).abs().max()) < 1e-6 * scale, name
    out = t.outputs(torch.nn.functional.scaled_dot_product_attention(qp, kp, vp))
    assert float((out - ref["attention_out"]).abs().max()) < 1e-6 * float(ref["attention_out"].abs().max())


def test_attention_through_prope_does_not_depend_on_the_world_frame():
    """W -> W G for every camera (the same rigid G: another world frame) leaves P_a P_b^-1, and so the attention
    output, unchanged; moving one camera alone changes it (the check has teeth)."""
    w, k = cameras(frames=4, seed=3)
    g = torch.Generator().manual_seed(9)
    q, kk, v = (torch.randn(1, 2, 4 * 6, 8, generator=g, dtype=torch.float64) for _ in range(3))

    def attend(w):
        qp, kp, vp, t = prope_qkv(q, kk, v, w, k)
        return t.outputs(torch.nn.functional.scaled_dot_product_attention(qp, kp, vp))

    base = attend(w)
    world = random_rigid(torch.Generator().manual_seed(4))
    torch.testing.assert_close(attend(w @ world), base, rtol=1e-9, atol=1e-9)
    moved = w.clone()
    moved[0, 2] = moved[0, 2] @ world
    assert (attend(moved) - base).abs().max() > 1e-3


def test_transforms_invert_and_queries_pair_with_keys():
    w, k = cameras(frames=2, seed=5)
    p, p_inv = projection_matrices(w, k)
    torch.testing.assert_close(p @ p_inv, torch.eye(4, dtype=torch.float64).expand(1, 2, 4, 4), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        invert_rigid(w) @ w, torch.eye(4, dtype=torch.float64).expand(1, 2, 4, 4), atol=1e-12, rtol=0
    )
    t = PRoPE(p, p_inv)
    x = torch.randn(1, 1, 2 * 3, 8, dtype=torch.float64)
    torch.testing.assert_close(t.outputs(t.keys_values(x)), x, rtol=1e-12, atol=1e-12)
    # within one frame the query-key score is unchanged: (P^T q) . (P^-1 k) = q . k
    q, kk = torch.randn(2, 1, 1, 2 * 3, 8, dtype=torch.float64)
    same = (t.queries(q) * t.keys_values(kk)).sum(-1)
    torch.testing.assert_close(same, (q * kk).sum(-1), rtol=1e-10, atol=1e-10)


def test_without_intrinsics_the_projection_is_the_view_matrix():
    w, _ = cameras(frames=2, seed=6)
    p, p_inv = projection_matrices(w, None)
    torch.testing.assert_close(p, w)
    torch.testing.assert_close(p_inv, torch.linalg.inv(w), rtol=1e-12, atol=1e-12)


def test_half_precision_inputs_keep_their_dtype_and_stay_close():
    w, k = cameras(frames=2, seed=8)
    x = torch.randn(1, 2, 2 * 4, 16, dtype=torch.float64)
    exact = PRoPE.from_cameras(w, k).queries(x)
    got = PRoPE.from_cameras(w, k).queries(x.to(torch.bfloat16))
    assert got.dtype == torch.bfloat16
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 2e-2


@pytest.mark.parametrize(
    "shape, frames, match",
    [((1, 2, 6, 6), 2, "multiple of 4"), ((1, 2, 7, 8), 2, "do not split"), ((3, 2, 6, 8), 2, "batch")],
)
def test_bad_shapes_are_named(shape, frames, match):
    m = torch.eye(4).expand(2 if shape[0] == 3 else 1, frames, 4, 4)
    with pytest.raises(ValueError, match=match):
        apply_blockwise(torch.zeros(shape), m)


def test_a_zero_focal_length_is_refused():
    w, k = cameras(frames=1, seed=1)
    k[0, 0, 1, 1] = 0
    with pytest.raises(ValueError, match="zero focal length"):
        projection_matrices(w, k)
