"""Two measures of how the pack's chunk loop is laid out (issue 30): the walk of a run through the pack's rooms, and
the size of every function of the loop.

    python tools/loop_anatomy.py sizes [FILES...]      # lines per function (default: the loop's files)
    python tools/loop_anatomy.py walk [--recipe NAME]  # one tiny run of the sampler node, traced

**The walk** follows a run from the sampler node's ``execute`` (the node's ``model`` input) through the pack's calls,
as a path through rooms (files): every call from a pack function to a pack function outside the model's forward (a
call with no ComfyUI frame between it and the node: what the loop itself does, not what the patched attention does
inside ComfyUI's sampler), each call edge (caller, callee) taken once, in the order the run first takes it; control
goes to the callee's file and, when the callee returns, back to the caller's. Consecutive steps in one file are one
visit. A **return** is a visit to a file the walk had already left: each is a place where a room remote-controls
another and is called back. The count is per file; fewer is better.

**The sizes**: lines (``def`` to its last line) of every function and method of the given files, largest first.

Needs ComfyUI for ``walk`` (COMFYUI_PATH, a ComfyUI above the checkout, or /opt/comfyui/<version>).
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

#: the loop's files: measured by ``sizes`` when no file is given (the recipes' package is taken whole where it exists)
LOOP_FILES = ("runtime/chunk_loop.py", "runtime/run_caches.py", "runtime/options.py")
LOOP_DIRS = ("runtime/recipes",)
#: the rooms the walk counts (jensen_core is the library the rooms call; its calls are not steps of the walk)
ROOMS = ("runtime/", "nodes/")


# ------------------------------------------------------------------------------------------------------ sizes
def function_sizes(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[str, int]] = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return out


def loop_files() -> list[Path]:
    files = [ROOT / f for f in LOOP_FILES if (ROOT / f).is_file()]
    for d in LOOP_DIRS:
        files += sorted(p for p in (ROOT / d).glob("*.py") if p.name != "__init__.py")
    return files


def print_sizes(files: list[Path], top: int) -> None:
    rows = [(str(p.relative_to(ROOT)), name, n) for p in files for name, n in function_sizes(p)]
    sizes = [n for *_, n in rows]
    print("| file | function | lines |\n|---|---|---|")
    for f, name, n in sorted(rows, key=lambda r: -r[2])[:top]:
        print(f"| {f} | {name} | {n} |")
    print(
        f"\n{len(rows)} functions in {len(files)} files: {sum(sizes)} lines, largest {max(sizes)}, median "
        f"{statistics.median(sizes):g}, over 40 lines: {sum(n > 40 for n in sizes)}"
    )
    for p in files:
        mine = [n for _, n in function_sizes(p)]
        print(f"  {p.relative_to(ROOT)}: {len(p.read_text().splitlines())} lines, {len(mine)} functions")


# ------------------------------------------------------------------------------------------------------- walk
def carries(value, model, depth: int = 2) -> bool:
    """Whether ``value`` is the MODEL (the node's ModelPatcher, or a clone of it: the same base model) or holds it
    in an attribute, ``depth`` attributes deep."""
    if value is model or (getattr(value, "model", None) is model.model and hasattr(value, "clone")):
        return True
    if depth == 0 or isinstance(value, (int, float, str, bytes, bool, type(None))):
        return False
    try:
        attrs = vars(value)
    except TypeError:
        return False
    return any(carries(v, model, depth - 1) for v in list(attrs.values()))


def trace_walk(fn, model=None) -> list[tuple[str, str]]:
    """The (file, function) steps of ``fn()`` as the module docstring defines them; with ``model``, only the calls
    that take it (an argument that is or holds the MODEL: the walk of the model parameter)."""
    pack = str(ROOT) + "/"
    tools = str(ROOT / "tools") + "/"

    def ours(code) -> bool:
        return code.co_filename.startswith(pack) and not code.co_filename.startswith(tools)

    def room(code) -> bool:
        """A room of the walk: the pack's runtime and nodes (jensen_core is the library they call, not a room)."""
        return ours(code) and code.co_filename[len(pack) :].startswith(ROOMS)

    steps: list[tuple[str, str]] = []
    seen: set[tuple] = set()
    emitting: dict[int, tuple[str, str]] = {}  # id(frame) of a callee whose call was a step -> caller's step

    def where(frame) -> tuple[str, str]:
        return (frame.f_code.co_filename[len(pack) :], frame.f_code.co_qualname)

    def pure_pack_chain(frame) -> bool:
        """Every frame from ``frame`` up to this tool's is the pack's (no ComfyUI frame between: not in a forward)."""
        f = frame
        while f is not None and not f.f_code.co_filename.startswith(tools):
            if not ours(f.f_code):
                return False
            f = f.f_back
        return f is not None

    def prof(frame, event, arg):
        if event == "call":
            caller = frame.f_back
            if caller is None or not room(frame.f_code) or not room(caller.f_code):
                return
            if frame.f_code.co_name.startswith("<") and frame.f_code.co_name != "<lambda>":
                return  # a comprehension: part of its function
            if not pure_pack_chain(frame):
                return
            if model is not None:
                args = frame.f_code.co_varnames[: frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
                if not any(carries(frame.f_locals.get(a), model) for a in args):
                    return
            edge = (caller.f_code, frame.f_code)
            if edge in seen:
                return
            seen.add(edge)
            steps.append(where(frame))
            emitting[id(frame)] = where(caller)
        elif event == "return":
            back = emitting.pop(id(frame), None)
            if back is not None:
                steps.append(back)

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return steps


def traffic(fn) -> dict[tuple[str, str], int]:
    """Every call of ``fn()`` from one room to another outside the model's forward, not deduplicated: (caller's
    file, callee's file) -> calls."""
    pack, tools = str(ROOT) + "/", str(ROOT / "tools") + "/"
    counts: dict[tuple[str, str], int] = {}

    def room(code) -> bool:
        f = code.co_filename
        return f.startswith(pack) and not f.startswith(tools) and f[len(pack) :].startswith(ROOMS)

    def prof(frame, event, arg):
        if event != "call" or frame.f_code.co_name.startswith("<") and frame.f_code.co_name != "<lambda>":
            return
        caller = frame.f_back
        if caller is None or not room(frame.f_code) or not room(caller.f_code):
            return
        a, b = caller.f_code.co_filename[len(pack) :], frame.f_code.co_filename[len(pack) :]
        if a == b:
            return
        f = frame
        while f is not None and not f.f_code.co_filename.startswith(tools):
            if not f.f_code.co_filename.startswith(pack):
                return  # inside ComfyUI (the model's forward): not the loop's traffic
            f = f.f_back
        counts[(a, b)] = counts.get((a, b), 0) + 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts


def rooms(steps: list[tuple[str, str]]) -> list[str]:
    """The files of ``steps``, consecutive repeats collapsed."""
    out: list[str] = []
    for f, _ in steps:
        if not out or out[-1] != f:
            out.append(f)
    return out


def returns(path: list[str]) -> dict[str, int]:
    """Visits to a file the walk had already left, per file."""
    seen: set[str] = set()
    out: dict[str, int] = {}
    for f in path:
        if f in seen:
            out[f] = out.get(f, 0) + 1
        seen.add(f)
    return out


def node_run(recipe: str):
    """A tiny run of the Chunked AR Video Sampler node for ``recipe``, prepared (model, inputs): call it to run."""
    import importlib

    import comfy.samplers
    import torch

    from jensen_testing import wan_tiny
    from jensen_testing.comfyui import PACK_MODULE

    nodes = importlib.import_module(f"{PACK_MODULE}.nodes")
    ps = importlib.import_module(f"{PACK_MODULE}.runtime.prompt_schedule")
    sched = importlib.import_module(f"{PACK_MODULE}.runtime.schedules")
    model = wan_tiny.build_patcher(seed=0)
    model = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "32", "hadamard").args[0]
    model = nodes.JensenKVBiasCorrection.execute(model, "taylor", 1.0).args[0]

    def cond(seed):
        return wan_tiny.conditioning(seed, 13, wan_tiny.TINY["text_dim"])

    kw = dict(
        model=model,
        positive=cond(1),
        negative=cond(2),
        latent={"samples": torch.zeros(1, 16, 6, 8, 8)},
        seed=7,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2),
        chunk_frames=2,
        window_chunks=0,
        context_noise=0.0,
    )
    if recipe == "longlive":
        kw["positive"] = ps.add_to_schedule(ps.add_to_schedule(None, cond(1), 0, "A"), cond(5), 2, "B")
        kw.update(
            window_chunks=1, sink_chunks=1, recache_mode="longlive", latent={"samples": torch.zeros(1, 16, 8, 8, 8)}
        )
    elif recipe == "krea":
        kw.update(recompute_frames=2, kv_cache_attention_bias=0.3)
    elif recipe == "skyreels":
        kw.update(context_noise=0.1, context_noise_mode="skyreels")
    elif recipe == "causal_forcing":
        kw.update(
            sampler=comfy.samplers.sampler_object("lcm"),
            sigmas=sched.ar_sigmas("causal_forcing_framewise_2step"),
            first_chunk_sigmas=sched.first_chunk_sigmas("causal_forcing_framewise_2step"),
            first_chunk_frames=1,
            chunk_frames=1,
            latent={"samples": torch.zeros(1, 16, 3, 8, 8)},
        )
    node = nodes.JensenKVChunkedARSampler
    # the kv_cache output unconnected (as in a workflow that does not save it): Krea's recompute refuses it
    node.hidden = type("Hidden", (), {"prompt": {"1": {"inputs": {}}}, "unique_id": "1"})()
    return (lambda: node.execute(**kw)), model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sizes", help="lines per function")
    s.add_argument("files", nargs="*", help="files (default: the loop's)")
    s.add_argument("--top", type=int, default=25, help="rows of the table")
    w = sub.add_parser("walk", help="one tiny run of the sampler node, traced")
    w.add_argument("--recipe", default="plain", choices=("plain", "longlive", "krea", "skyreels", "causal_forcing"))
    w.add_argument("--steps", action="store_true", help="print every step")
    w.add_argument("--all-calls", action="store_true", help="every call, not only those that take the MODEL")
    w.add_argument("--traffic", action="store_true", help="also every call between two rooms, counted")
    args = ap.parse_args(argv)

    if args.what == "sizes":
        files = [Path(f).resolve() for f in args.files] or loop_files()
        print_sizes(files, args.top)
        return 0

    from jensen_testing import comfyui

    comfyui.setup_inprocess_comfyui()
    comfyui.import_pack()
    for label, follow in (("the MODEL's walk (calls that take it)", True), ("every call between rooms", False)):
        if args.all_calls and follow:
            continue
        run, model = node_run(args.recipe)
        steps = trace_walk(run, model if follow else None)
        if args.steps:
            for f, name in steps:
                print(f"  {f}: {name}")
        path = rooms(steps)
        back = returns(path)
        print(f"{args.recipe} recipe, {label}: {len(path)} visits to {len(set(path))} files")
        print("  " + " -> ".join(Path(f).stem for f in path))
        print(f"  returns to a file already left: {sum(back.values())}")
        for f, n in sorted(back.items(), key=lambda kv: -kv[1]):
            print(f"    {f}: {n}")
    if args.traffic:
        run, _ = node_run(args.recipe)
        counts = traffic(run)
        print(f"{args.recipe} recipe, calls between rooms (not deduplicated): {sum(counts.values())}")
        for (a, b), n in sorted(counts.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {a} -> {b}: {n}")
        rc = sum(n for (a, b), n in counts.items() if b == "runtime/run_caches.py")
        print(f"  into runtime/run_caches.py: {rc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
