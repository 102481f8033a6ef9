"""Compile the fused Triton kernel (jensen_core/triton_kernel.py) for a CUDA GPU, without one.

    python tools/triton_compile_check.py              # sm_90 (H100 / H200): three variants
    python tools/triton_compile_check.py --arch 80    # sm_80 (A100)
    python tools/triton_compile_check.py --all        # also the float32 variant (slow)

About a minute per variant on a busy 2-core machine (the float32 one about 3.5 min), instant once Triton has
cached it (~/.triton/cache).

The interpreter tests (tests/test_triton_kernel.py) prove the kernel's arithmetic, but the interpreter accepts
code the compiler may reject. This tool runs Triton's whole compiler (Triton IR, TTGIR, LLVM, PTX, and ptxas to a
cubin) for a target GPU on a machine without one, and prints per variant: the compile time, the shared memory
the kernel asks for, and whether the PTX uses tensor-core instructions (``wgmma`` on sm_90, ``mma`` otherwise).
It measures no speed: that needs a GPU (``benchmarks/gpu.py``). Exits non-zero when a variant fails to compile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile for real, before triton is imported

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import triton_kernel  # noqa: E402

#: (query dtype, key bits, value bits (0: full precision), correction code, float32 dots)
VARIANTS = {
    "bf16 INT2 K/V, taylor": ("bf16", 2, 2, 1, False),
    "fp16 INT4 K/V, chunk_mean": ("fp16", 4, 4, 2, False),
    "bf16 INT3 K, full-precision V, off": ("bf16", 3, 0, 0, False),
    "fp32 INT2 K/V, taylor (float32 dots)": ("fp32", 2, 2, 1, True),
}
SLOW = {"fp32 INT2 K/V, taylor (float32 dots)"}


def compile_variant(qdt: str, kbits: int, vbits: int, corr: int, f32: bool, arch: int, head_dim: int, group: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = triton_kernel._load_impl().attend_chunk_kernel
    ptrs = {
        "Q": f"*{qdt}", "KP": "*u8", "KS": "*u8", "KZ": "*bf16", "VP": "*u8" if vbits else f"*{qdt}",
        "VS": "*u8", "VZ": "*bf16", "OUT": f"*{qdt}", "LSE": "*fp32",
    }  # fmt: skip
    dp = max(16, 1 << (head_dim - 1).bit_length())
    const = dict(D=head_dim, DP=dp, KBITS=kbits, KGS=group, KSF=0, KZF=1, VBITS=vbits, VGS=group, VSF=0, VZF=1)
    const |= dict(CORR=corr, F32_DOTS=f32, BLOCK_M=64, BLOCK_N=64)
    sig = {}
    for name in fn.arg_names:
        if name in ptrs:
            sig[name] = ptrs[name]
        elif name in const:
            sig[name] = "constexpr"
        else:
            sig[name] = "fp32" if name in ("scale", "corr") else "i32"
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability as one number (90: H100/H200)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--all", action="store_true", help="also the float32 variant (a few minutes)")
    args = ap.parse_args()
    if not triton_kernel._triton_importable():
        print("triton is not installed (pip install triton)")
        return 1
    import triton

    print(f"triton {triton.__version__}, target sm_{args.arch}, head_dim {args.head_dim}, groups of {args.group_size}")
    failed = 0
    for name, variant in VARIANTS.items():
        if name in SLOW and not args.all:
            continue
        t0 = time.perf_counter()
        try:
            kernel = compile_variant(*variant, args.arch, args.head_dim, args.group_size)
        except Exception as exc:  # noqa: BLE001 - report every variant
            failed += 1
            print(f"  {name}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        ptx = kernel.asm.get("ptx", "")
        tc = "wgmma" if "wgmma" in ptx else "mma" if "mma.sync" in ptx else "none"
        print(
            f"  {name}: compiled to a cubin of {len(kernel.asm['cubin'])} bytes in {time.perf_counter() - t0:.0f} s; "
            f"shared memory {kernel.metadata.shared} bytes; tensor-core instructions: {tc}"
        )
    print("speed: unmeasured (needs a GPU; benchmarks/gpu.py)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
