"""Raylight's Ulysses sequence parallelism on the CPU, in real processes, for the tests (and by hand).

Raylight (komikndr/raylight) is run from where ``../shared/comfyui/lay-out.sh`` lays it out, never
copied: ``RAYLIGHT_PATH``, ComfyUI's ``custom_nodes/raylight``, or ``/opt/comfyui/raylight``
(``COMFYUI_TREES``). Its worker (``RayWorker``) hard-requires CUDA and NCCL, so,
as Raylight's own tests do, each process here initialises xDiT's parallel groups itself (gloo, over
TCP on 127.0.0.1) and registers Raylight's injection (``USPInjectRegistry.inject``) as the ON_LOAD
callback its ``patch_usp`` registers. xfuser 0.7.0 and yunchang 0.6.4 come from PyPI ``--no-deps``
(the ``raylight`` extra; ``.ci/raylight-requirements.txt``).

What a CPU run needs that a GPU run does not, or that bites on GPUs too (:func:`import_raylight`,
:func:`init_ulysses`; docs/raylight.md lists them):

1. ``torch.cuda.is_available()`` reads True while Raylight's xfuser shim (``install_minimal_xfuser``,
   run by ``import raylight``) loads xfuser's ``hybrid/attn_layer.py``: that file only imports
   yunchang's ``LongContextAttention`` when CUDA is available, else subclasses ``object`` and cannot
   be built. CPU only.
2. ``xfuser.envs.get_device_name``: xfuser 0.7.0's ``init_distributed_environment`` calls it, and
   Raylight's ``xfuser.envs`` stub lacks it (AttributeError). Bites on GPUs too (it is the same stub
   there), unless Raylight's worker never reaches that call. Set to ``"cpu"`` here.
3. ``backend="gloo"`` for ``init_distributed_environment`` and ``initialize_model_parallel``: the
   stub's ``get_torch_distributed_backend`` says ``nccl`` whenever torch is a CUDA build. CPU only.
4. Raylight's attention type ``TORCH_MATH`` (yunchang's torch math SDPA), set before its Wan module
   is imported (the module builds its attention at import and needs the groups by then). CPU only.
5. Results leave the worker processes as files (``torch.save``), not through a
   ``torch.multiprocessing`` queue (shared-memory handles die with the process). Test harness only.

Run ``python -m jensen_testing.raylight --rank R --world N --port P --out DIR`` in N processes (the
test does, and once more with ``--world 1``: the reference, the same pack and Raylight's same float32
arithmetic in one process holding every head); each writes ``DIR/world{N}_rank{R}.pt`` with every
case's output, report and error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch

from . import comfyui as jc
from . import wan_tiny

#: the block's latent frames, the frames of a run, and the sigmas every case uses (4 steps + the clean pass)
SIGMAS = (1.0, 0.9375, 0.8333, 0.625, 0.0)
#: one text token: Raylight's cross-attention all-to-all hands every rank N copies of the text keys, and a
#: softmax over N copies of one key is exactly 1/N each, so Raylight's cross-attention equals core's to the
#: bit and the runs compared here differ by nothing but the head sharding of the self-attention cache
TEXT_LEN = 1
#: latent sizes: 8 x 8 -> 16 tokens per frame (divides by 2 ranks), 6 x 6 -> 9 (Raylight pads to 10)
EVEN_HW, ODD_HW = 8, 6


def find_raylight() -> Path | None:
    """Raylight's checkout (the folder holding ``src/raylight``), where one is laid out; None otherwise."""
    candidates = [os.environ.get("RAYLIGHT_PATH")]
    comfy = jc.locate_comfyui()
    if comfy is not None:
        candidates.append(comfy / "custom_nodes" / "raylight")
    candidates.append(jc.trees_dir() / "raylight")
    for c in candidates:
        if c and (Path(c) / "src" / "raylight" / "distributed_modules" / "usp.py").is_file():
            return Path(c).resolve()
    return None


def missing() -> str | None:
    """Why Raylight's Ulysses path cannot run here (None when it can): the skip reason."""
    import importlib.util

    if find_raylight() is None:
        return (
            f"Raylight not found (RAYLIGHT_PATH, ComfyUI/custom_nodes/raylight, {jc.trees_dir() / 'raylight'}): lay it "
            f"out with {jc.LAY_OUT_HINT}"
        )
    absent = [m for m in ("xfuser", "yunchang") if importlib.util.find_spec(m) is None]
    if absent:
        return f"{' and '.join(absent)} not installed: pip install --no-deps -r .ci/raylight-requirements.txt"
    return None


def import_raylight():
    """``import raylight`` on a CPU-only machine (workarounds 1 and 2 of the module doc); returns the package."""
    root = find_raylight()
    if root is None:
        raise RuntimeError(missing())
    if str(root / "src") not in sys.path:
        sys.path.append(str(root / "src"))
    available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # 1: xfuser's attn_layer imports yunchang's attention only "on CUDA"
    try:
        import raylight
    finally:
        torch.cuda.is_available = available
    envs = sys.modules.get("xfuser.envs")
    if envs is not None and not hasattr(envs, "get_device_name"):
        envs.get_device_name = lambda: "cpu"  # 2: xfuser 0.7.0 calls it; Raylight's stub lacks it
    return raylight


def init_ulysses(rank: int, world: int, port: int, attention: str = "TORCH_MATH") -> None:
    """xDiT's parallel groups for Ulysses degree ``world`` (ring 1), over gloo (workarounds 3 and 4)."""
    import torch.distributed as dist

    import_raylight()
    import raylight.distributed_modules.attention as xattn
    from xfuser.core.distributed import init_distributed_environment, initialize_model_parallel

    xattn.set_attn_type(attention)  # 4
    xattn.set_sync_ulysses(False)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=180)
    )
    init_distributed_environment(rank=rank, world_size=world, backend="gloo")  # 3
    initialize_model_parallel(sequence_parallel_degree=world, ulysses_degree=world, ring_degree=1, backend="gloo")


# ---------------------------------------------------------------------------------------------- the cases
def cases() -> list[dict]:
    """Every run the two-process test makes, in order (the same list on every rank and in the reference)."""
    int2 = dict(bits="2", group="16", rotation="hadamard", window=2, sink=1, tiers=True, frames=5)
    out = [
        dict(name="raylight_even", raylight=True, pack=False, hw=EVEN_HW),
        dict(name="raylight_odd", raylight=True, pack=False, hw=ODD_HW),
        dict(name="pack_fp_odd", bits="off", hw=ODD_HW),
        dict(name="pack_int2_even", bits="2", group="16", rotation="none", mode="taylor", hw=EVEN_HW, frames=4),
    ]
    for mode in ("taylor", "chunk_mean", "exact", "per_channel", "off"):
        out.append(dict(name=f"pack_{mode}", mode=mode, hw=ODD_HW, **int2))
    out += [
        dict(name="pack_taylor_cfg_half", mode="taylor", strength=0.5, cfg=2.0, block=2, hw=ODD_HW, **int2),
        dict(name="pack_first_taylor", mode="taylor", hw=ODD_HW, order="pack_first", **int2),
        dict(name="qvg", bits="2", group="16", rotation="none", method="qvg", mode="taylor", hw=ODD_HW, frames=4),
        dict(name="refuse_ring", mode="taylor", hw=ODD_HW, fault="ring", **int2),
        dict(name="refuse_no_seq_len", mode="taylor", hw=ODD_HW, fault="no_seq_len", **int2),
        dict(name="refuse_heads", bits="2", group="16", mode="taylor", hw=ODD_HW, frames=3, heads=3),
        dict(name="refuse_foreign", mode="taylor", hw=ODD_HW, fault="foreign", **int2),
    ]
    return out


def matrix_cases() -> list[dict]:
    """The combination matrix's runs (``tests/support/matrix.py``'s Raylight rows, ``--set matrix``): 4 heads over
    Ulysses 2, so each rank holds 2 heads (rank 1: global heads 2 and 3), crossed with the quantizer, every correction
    mode, tiers with window + sink, Raylight's padding, a rank 0 without a Taylor layout, and a shard padded by a whole
    rank's tokens. In this set rank 0 finds no Taylor layout at group 8 (:func:`main`), and rank 1 asks for none."""
    h4 = dict(heads=4, hw=ODD_HW)
    quarot = dict(bits="2", group="16", rotation="hadamard", window=2, sink=1, tiers=True, frames=5, **h4)
    qvg = dict(bits="2", group="16", method="qvg", mode="taylor", frames=4, **h4)
    out = [
        dict(name="mx_rtn", bits="2", group="16", rotation="none", mode="taylor", heads=4, hw=EVEN_HW, frames=4),
        dict(name="mx_quarot", mode="taylor", **quarot),
    ]
    out += [dict(name=f"mx_{m}", mode=m, **quarot) for m in ("chunk_mean", "exact", "per_channel", "off")]
    out += [
        dict(name="mx_qvg", qvg_k=4, **qvg),
        dict(name="mx_qvg_auto", qvg_k=0, **qvg),
        dict(name="mx_no_layout", bits="2", group="8", rotation="hadamard", mode="taylor", frames=4, **h4),
        dict(name="refuse_pad_rank", fault="pad_rank", **{**quarot, "mode": "taylor"}),
    ]
    return out


#: the Taylor layout key (head_dim, G) where rank 0 of ``--set matrix`` finds no layout (group 8 of head_dim 32)
NO_LAYOUT_KEY = (32, 4)


def _arch(case: dict) -> dict:
    heads = case.get("heads", 2)
    return dict(dim=32 * heads, num_heads=heads, text_len=TEXT_LEN)


def pack_model(nodes, model, case: dict):
    """``model`` through the pack's nodes as the case asks (Quantize KV Cache, Jensen Bias Correction, AR Cache Window)."""
    bits = case.get("bits", "off")
    tiers = case.get("tiers", False)
    m = nodes.JensenKVQuantizeKVCache.execute(
        model,
        bits,
        bits,
        case.get("group", "32"),
        case.get("rotation", "none"),
        "fp8_e4m3",
        0,
        case.get("method", "rtn"),
        1,
        case.get("qvg_k", 4),
        2,
        "4" if tiers else "off",
        1,
        "8" if tiers else "off",
        "same",
    ).args[0]
    if case.get("mode") is not None and bits != "off":
        m = nodes.JensenKVBiasCorrection.execute(m, case["mode"], case.get("strength", 1.0)).args[0]
    if case.get("window") or case.get("sink"):
        m = nodes.JensenKVARCacheWindow.execute(m, case.get("window", 0), case.get("sink", 0)).args[0]
    return m


def latent(case: dict) -> torch.Tensor:
    hw = case.get("hw", EVEN_HW)
    return torch.zeros(1, 16, case.get("frames", 4), hw, hw)


def sample(model, case: dict) -> torch.Tensor:
    from . import causal_wan as cw

    cond = [wan_tiny.conditioning(seed, TEXT_LEN, wan_tiny.TINY["text_dim"]) for seed in (1, 2)]
    return cw.sample_core(
        model,
        latent(case),
        torch.tensor(SIGMAS),
        num_frame_per_block=case.get("block", 1),
        seed=3,
        cfg=case.get("cfg", 1.0),
        positive=cond[0],
        negative=cond[1],
    )


def run_single(case: dict, nodes=None) -> dict:
    """The case in this process alone: core's sampler over the tiny model, with the pack's nodes unless ``pack`` is False."""
    from . import causal_wan as cw

    model = cw.build_causal_patcher(seed=0, **_arch(case))
    if case.get("pack", True):
        model = pack_model(nodes, model, case)
    return _outcome(model, case)


def _outcome(model, case: dict) -> dict:
    core_ar = sys.modules[f"{jc.PACK_MODULE}.runtime.core_ar"] if case.get("pack", True) else None
    try:
        out = sample(model, case)
    except Exception as exc:  # noqa: BLE001 - a refusal is a result the test checks
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    report = core_ar.last_report(model) if core_ar is not None else None
    return {"out": out, "report": report}


@contextlib.contextmanager
def _fault(case: dict, model):
    """What a refusal case changes around Raylight's path (restored afterwards)."""
    fault = case.get("fault")
    if fault == "ring":  # a Ring group of 2 ranks where Raylight would have one (yunchang's process groups)
        import torch.distributed as dist
        from yunchang.globals import PROCESS_GROUP

        ring = PROCESS_GROUP.RING_PG
        PROCESS_GROUP.RING_PG = dist.group.WORLD
        try:
            yield
        finally:
            PROCESS_GROUP.RING_PG = ring
        return
    if fault == "no_seq_len":  # another pack's block patch that rebuilds transformer_options without Raylight's key
        n = len(model.model.diffusion_model.blocks)

        def block_patch(args, extra):
            to = {k: v for k, v in args["transformer_options"].items() if k != "usp_ar_block_seq_len"}
            return extra["original_block"]({**args, "transformer_options": to})

        for i in range(n):
            model.set_model_patch_replace(block_patch, "dit", "double_block", i)
    elif fault == "pad_rank":  # the block's real token count one rank count short: a whole rank's tokens of padding
        import torch.distributed as dist

        n, ranks = len(model.model.diffusion_model.blocks), dist.get_world_size()

        def short_patch(args, extra):
            to = dict(args["transformer_options"])
            to["usp_ar_block_seq_len"] = int(to["usp_ar_block_seq_len"]) - ranks
            return extra["original_block"]({**args, "transformer_options": to})

        for i in range(n):
            model.set_model_patch_replace(short_patch, "dit", "double_block", i)
    elif fault == "foreign":  # an unknown sequence-parallel wrapper over Raylight's forward (ON_LOAD, after Raylight)
        import comfy.patcher_extension as pe

        def wrap(patcher, *args):
            for block in patcher.model.diffusion_model.blocks:
                inner = block.self_attn.__dict__["forward"]

                def other_packs_forward(*a, _inner=inner, **k):
                    return _inner(*a, **k)

                block.self_attn.forward = other_packs_forward

        model.add_callback(pe.CallbacksMP.ON_LOAD, wrap)
    yield


def run_sharded(case: dict, nodes) -> dict:
    """The case under Raylight's Ulysses injection in this rank (after :func:`init_ulysses`)."""
    import comfy.patcher_extension as pe
    from raylight.distributed_modules.usp import USPInjectRegistry

    from . import causal_wan as cw

    model = cw.build_causal_patcher(seed=0, **_arch(case))
    if not case.get("pack", True):
        model.add_callback(pe.CallbacksMP.ON_LOAD, USPInjectRegistry.inject)
        return _outcome(model, case)
    if case.get("order") == "pack_first":  # the pack's callback registered before Raylight's
        model = pack_model(nodes, model, case)
        model.add_callback(pe.CallbacksMP.ON_LOAD, USPInjectRegistry.inject)
    else:  # Raylight's patch_usp on the loaded model, then the pack's nodes (what its actors do)
        model.add_callback(pe.CallbacksMP.ON_LOAD, USPInjectRegistry.inject)
        model = pack_model(nodes, model, case)
    model = model.clone()
    with _fault(case, model):
        return _outcome(model, case)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out: Path, python: str = sys.executable, world: int = 2, case_set: str = "area") -> list:
    """Start ``world`` ranks and the one-process reference (``--world 1``) writing into ``out``; returns the processes.
    ``case_set``: ``"area"`` (:func:`cases`) or ``"matrix"`` (:func:`matrix_cases`)."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COMFYUI_PATH": str(jc.find_comfyui() or "")}
    procs = []
    for w, ranks in ((world, range(world)), (1, range(1))):
        port = _free_port()
        for r in ranks:
            log = open(out / f"world{w}_rank{r}.log", "w")  # noqa: SIM115 - closed in collect()
            cmd = [python, "-m", "jensen_testing.raylight", "--rank", str(r), "--world", str(w), "--port", str(port)]
            cmd += ["--set", case_set]
            p = subprocess.Popen(
                [*cmd, "--out", str(out)], cwd=jc.PACK_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
            p.log, p.world, p.rank = log, w, r
            procs.append(p)
    return procs


def collect(procs: list, out: Path, timeout: float = 600) -> dict:
    """Wait for :func:`start`'s processes; ``{(world, rank): results}``, or a RuntimeError with the failing logs."""
    import subprocess
    import time

    failed, deadline = [], time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.log.close()
        if p.returncode != 0:
            tail = (out / f"world{p.world}_rank{p.rank}.log").read_text()[-3000:]
            failed.append(f"world {p.world} rank {p.rank} exited {p.returncode}:\n{tail}")
    if failed:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise RuntimeError("\n\n".join(failed))
    return {(p.world, p.rank): torch.load(out / f"world{p.world}_rank{p.rank}.pt", weights_only=False) for p in procs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", help="case names (default: all)")
    p.add_argument("--set", choices=("area", "matrix"), default="area", help="cases() or matrix_cases()")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    jc.setup_inprocess_comfyui()
    jc.import_pack()
    import importlib

    nodes = importlib.import_module(f"{jc.PACK_MODULE}.nodes")
    importlib.import_module(f"{jc.PACK_MODULE}.runtime.core_ar")
    init_ulysses(a.rank, a.world, a.port)
    # rank 1 asks for another Taylor layout than rank 0 chooses; it must run rank 0's (agree_taylor_layout)
    if a.rank == 1 and a.world > 1 and a.set == "area":
        from comfyui_jensen_kv.jensen_core.correction_layouts import set_layout_preference

        set_layout_preference("flex")
    # the matrix: rank 0 on a device where no Taylor layout passes its check at group 8 (it takes none: one buffer);
    # rank 1, which would find one, must take none too
    if a.rank == 0 and a.world > 1 and a.set == "matrix":
        layouts = importlib.import_module(f"{jc.PACK_MODULE}.jensen_core.correction_layouts")
        offered = layouts.candidate_layouts

        def candidates(device, dtype, head_dim, G):
            return [] if (head_dim, G) == NO_LAYOUT_KEY else offered(device, dtype, head_dim, G)

        layouts.candidate_layouts = candidates
    results = {}
    for case in cases() if a.set == "area" else matrix_cases():
        if (a.only and case["name"] not in a.only) or (a.world == 1 and case["name"].startswith("refuse_")):
            continue
        results[case["name"]] = run_sharded(case, nodes)
    from comfyui_jensen_kv.jensen_core.correction_layouts import kernel_choices

    results["_kernel_choices"] = kernel_choices()
    results["_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("raylight", "xfuser", "yunchang"))
    a.out.mkdir(parents=True, exist_ok=True)
    torch.save(results, a.out / f"world{a.world}_rank{a.rank}.pt")
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()


__all__ = [
    "cases",
    "collect",
    "find_raylight",
    "import_raylight",
    "init_ulysses",
    "matrix_cases",
    "missing",
    "run_sharded",
    "run_single",
    "start",
]
