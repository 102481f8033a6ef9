"""Plant small bugs in the pack, one at a time, and check that the test suite catches each.

    python tools/mutation_test.py                 # every mutant, its own tests; prints the kill rate
    python tools/mutation_test.py --list          # the mutants, without running anything
    python tools/mutation_test.py --only R1 Q2    # some of them
    python tools/mutation_test.py --min-kill 0.95 # exit 1 below that kill rate

Each mutant is one textual edit of one source file (a comparison flipped, an index shifted, a check
dropped), named after the bug a review could plant there, with the test files that should catch it.
The pack is copied once into a temporary folder (the working tree is never touched); for each
mutant the edited file is written into the copy, its tests run there with ``pytest -x``, and the
file is put back. A mutant is *killed* when those tests fail, *survives* when they pass. Before any
mutant, the same tests run on the unmutated copy and must pass; a mutant whose text is not found,
or whose edit does not compile, is an error of this script (stale after a refactor), not a kill.

The new families' mutants (G1-G30, issue 43): baseline kill rate 12/30 with the areas' tests; with the matrix files
G19-G30 12/12 (HY-WorldPlay 8/8 and Raylight 3/4 by their matrix files alone, G29 by its area's test), G3 and G12
by test_magi1_cache.py's new checks: the table 29/30; G18 is equivalent (no input reaches the check it mutates; see the
G table, which has the commands). ``--tests FILE ...`` runs the chosen mutants against those tests instead of their own, which shows
what one file kills.

Not run in CI: about 12 minutes on 2 idle cores for the 63 mutants before the X table (5 to 30 s each), and
about 25 minutes for the 27 X mutants where features cross (the combination matrix's tests, ~10 minutes of
baseline). Tests that need ComfyUI find it as the suite does (``COMFYUI_PATH``, a ComfyUI above the
checkout, ``/opt/comfyui/<version>``); the copy is given the path this checkout resolves.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the pack root
    find: str  # exact text, found exactly once in the file
    replace: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the pack root
    bug: str  # what the planted bug would do to a user


def M(id, file, find, replace, tests, bug):  # noqa: N802 (a table row)
    return Mutant(id, file, find, replace, tuple(tests.split()), bug)


T_RET = "tests/test_retention.py tests/test_retention_and_warnings.py"
T_CACHE = "tests/test_cache.py tests/test_retention_and_warnings.py"
T_STATE = "tests/test_saved_run.py"
T_COMPAT = "tests/test_saved_run.py::test_each_compared_field_is_refused_on_its_own"
T_LONG = "tests/integration/test_long_videos.py"
T_RESUME = (
    "tests/integration/test_long_videos.py::test_resume_across_a_prompt_switch_equals_the_one_run_schedule "
    "tests/integration/test_long_videos.py::test_a_second_continuation_reports_its_next_frame_and_equals_one_long_run"
)
T_LOADING = "tests/integration/test_saved_run_loading.py"
T_FILES = "tests/integration/test_kv_cache_files.py"
T_QVG = "tests/test_qvg.py"
T_METH = "tests/test_methods.py tests/test_qvg.py"
T_KERN = "tests/test_kernels.py"
T_PLAN = "tests/test_retention_and_warnings.py tests/test_retention.py"
T_CONV = "tests/test_convert_checkpoint.py"
T_FAM = (
    "tests/integration/test_reference_fidelity.py::test_a_model_missing_norm_k_only_in_its_last_block_is_refused_before_the_run "
    "tests/integration/test_reference_fidelity.py::test_a_t2v_subclass_with_its_own_forward_orig_is_refused"
)

# where features cross (issue 29): the areas' own tests, and the combination matrix written for them
T_TIERS = "tests/test_tiers.py tests/test_cache.py tests/test_retention_and_warnings.py"
T_COREAR = (
    "tests/test_core_ar_session.py tests/integration/test_core_ar_path.py tests/integration/test_core_ar_memory.py"
)
T_KREA = "tests/integration/test_krea_recompute.py"
T_CF = "tests/integration/test_causal_forcing.py"
T_SKY = "tests/integration/test_context_noise.py"
T_LL = "tests/integration/test_longlive_recache.py"
T_READ = "tests/test_saved_run.py tests/test_cache.py tests/test_tiers.py"
T_MX_CORE = "tests/test_matrix_core.py"
T_MX_PACK = "tests/integration/test_matrix_pack.py"
T_MX_AR = "tests/integration/test_matrix_core_ar.py"
T_MX_READ = "tests/test_matrix_readers.py"

# the new families (issue 43): their areas' tests, and the matrix written for them
T_MAGI = "tests/integration/test_magi1_cache.py tests/test_magi1_model.py"
T_WP = "tests/integration/test_worldplay_recipe.py tests/test_worldplay_context.py tests/test_worldplay_memory.py"
T_RAY = "tests/integration/test_raylight_ulysses.py tests/test_planner_ranks.py"
T_MX_MAGI = "tests/integration/test_matrix_magi1.py"
T_MX_WP = "tests/integration/test_matrix_worldplay.py"
T_MX_RAY = "tests/integration/test_matrix_raylight.py"

MUTANTS: list[Mutant] = []  # filled by the table at the end of this file


def comfyui_path() -> str | None:
    """The ComfyUI the suite would use here (jensen_testing.comfyui's lookup: COMFYUI_PATH, a ComfyUI above the
    checkout, /opt/comfyui/<version>), handed to the copy, which lives elsewhere."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    from jensen_testing.comfyui import locate_comfyui

    found = locate_comfyui()
    return None if found is None else str(found)


def copy_pack(dest: Path) -> Path:
    skip = shutil.ignore_patterns(
        ".git", ".ci", "artifacts", "__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", ".ruff_cache"
    )
    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


def run_tests(pack: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CI": ""}
    if (c := comfyui_path()) is not None:
        env["COMFYUI_PATH"] = c
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", str(int(timeout)), *tests]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=pack, env=env, capture_output=True, text=True, timeout=timeout + 60)
        out, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired:
        out, rc = "timed out", 124
    return rc, time.perf_counter() - t0, out


def apply(pack: Path, m: Mutant) -> str:
    """Write the mutant into the copy; returns the original text (to put back)."""
    path = pack / m.file
    text = path.read_text()
    n = text.count(m.find)
    if n != 1:
        raise SystemExit(f"mutant {m.id}: its text occurs {n} times in {m.file} (must be once): update the table")
    mutated = text.replace(m.find, m.replace)
    compile(mutated, str(path), "exec")  # a SyntaxError here is a broken mutant, not a kill
    path.write_text(mutated)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--only", nargs="*", default=None, help="mutant ids to run")
    ap.add_argument("--min-kill", type=float, default=0.95, help="exit 1 when the kill rate is below this")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's tests")
    ap.add_argument(
        "--tests",
        nargs="*",
        default=None,
        help="run every mutant against these tests instead of its own (which kills it)",
    )
    args = ap.parse_args(argv)

    mutants = [m for m in MUTANTS if args.only is None or m.id in args.only]
    if args.tests:
        mutants = [Mutant(m.id, m.file, m.find, m.replace, tuple(args.tests), m.bug) for m in mutants]
    if args.only and len(mutants) != len(set(args.only)):
        known = {m.id for m in MUTANTS}
        raise SystemExit(f"unknown mutant ids: {sorted(set(args.only) - known)}")
    if args.list:
        for m in mutants:
            print(f"{m.id:5s} {m.file:38s} {m.bug}")
        print(f"{len(mutants)} mutants")
        return 0
    for m in mutants:  # every anchor checked before anything runs
        text = (ROOT / m.file).read_text()
        if text.count(m.find) != 1:
            raise SystemExit(f"mutant {m.id}: its text occurs {text.count(m.find)} times in {m.file}: update the table")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jensen-kv-mutants-") as tmp:
        pack = copy_pack(Path(tmp) / "pack")
        all_tests = tuple(sorted({t for m in mutants for t in m.tests}))
        print(f"baseline: {len(all_tests)} test files on the unmutated copy ...", flush=True)
        rc, dt, out = run_tests(pack, all_tests, args.timeout * 3)
        if rc != 0:
            print(out[-4000:])
            raise SystemExit(f"the unmutated pack fails its tests (exit {rc}): fix that first")
        print(f"baseline passed in {dt:.0f} s", flush=True)

        rows = []
        for i, m in enumerate(mutants, 1):
            original = apply(pack, m)
            try:
                rc, dt, out = run_tests(pack, m.tests, args.timeout)
            finally:
                (pack / m.file).write_text(original)
            killed = rc not in (0, 124)  # out of time is no kill: the tests said nothing (counted as surviving)
            rows.append((m, killed, dt))
            by = next((ln.split(" - ")[0] for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))), "")
            status = "killed  " if killed else "TIMED OUT" if rc == 124 else "SURVIVED"
            print(
                f"[{i:2d}/{len(mutants)}] {m.id:5s} {status} {dt:5.0f} s  {m.bug}"
                + (f"\n        by {by}" if killed and by else ""),
                flush=True,
            )

    killed = sum(k for _, k, _ in rows)
    rate = killed / len(rows) if rows else 1.0
    print(f"\nkill rate: {killed}/{len(rows)} = {rate:.1%} ({(time.perf_counter() - started) / 60:.0f} min in all)")
    survivors = [m for m, k, _ in rows if not k]
    for m in survivors:
        print(f"  survived: {m.id} {m.file}: {m.bug}")
    return 0 if rate >= args.min_kill else 1


# ------------------------------------------------------------------------------------------------ the mutants
RET = "jensen_core/retention.py"
CACHE = "jensen_core/cache.py"
SR = "runtime/saved_run.py"
LOOP = "runtime/chunk_loop.py"
RUN = "runtime/run_caches.py"
PLAIN, LONGLIVE, KREA, SKYREELS = (f"runtime/recipes/{n}.py" for n in ("plain", "longlive", "krea", "skyreels"))
QVGF = "jensen_core/qvg.py"
METH = "jensen_core/methods.py"
LAY = "jensen_core/correction_layouts.py"
LSE = "jensen_core/sdpa_lse.py"
PLAN = "jensen_core/planner.py"
CONV = "runtime/families/wan/model/checkpoint.py"  # the converter's checks (tools/convert_checkpoint.py imports them)
WAN = "runtime/families/wan/family.py"
LKV = "nodes/load_kv_cache.py"

MUTANTS += [
    # R: retention (sink + window), the rule and the caches that follow it
    M(
        "R1",
        RET,
        "list(range(appended - kept, appended))",
        "list(range(appended - kept - 1, appended - 1))",
        T_RET,
        "the window's indices are one chunk too old (window 1, sink 1, 4 chunks: [0, 2])",
    ),
    M(
        "R2",
        RET,
        "if sink_held < self.sink_chunks:",
        "if sink_held <= self.sink_chunks:",
        T_RET,
        "the sink takes one chunk more than sink_chunks",
    ),
    M(
        "R3",
        RET,
        "len(items) - sink_held > self.window_chunks:",
        "len(items) - sink_held >= self.window_chunks:",
        T_RET,
        "the window keeps one chunk fewer than window_chunks",
    ),
    M(
        "R4",
        RET,
        "del items[sink_held]",
        "del items[0]",
        T_RET,
        "eviction drops the sink instead of the window's oldest chunk (keeps [2, 3], not [0, 3])",
    ),
    M(
        "R5",
        RET,
        'object.__setattr__(self, "window_chunks", w or None)',
        'object.__setattr__(self, "window_chunks", w)',
        T_RET,
        "window 0 means a window of no chunks, not 'keep every chunk'",
    ),
    M(
        "R6",
        RET,
        "return min(self.sink_chunks, _count(appended))",
        "return self.sink_chunks",
        T_RET,
        "the sink is counted full before sink_chunks chunks were appended",
    ),
    M(
        "R7",
        RET,
        "held = min(rule.sink_chunks, len(self.items)) if sink_held is None else sink_held",
        "held = 0 if sink_held is None else sink_held",
        T_RET,
        "a resumed timeline forgets its sink and evicts it",
    ),
    M(
        "R8",
        CACHE,
        "if self.window_chunks is not None and n - held > self.window_chunks:",
        "if self.window_chunks is not None and n > self.window_chunks:",
        "tests/test_cache.py tests/test_saved_run.py",
        "a cache file with a sink is refused by a cache of its own window",
    ),
    M(
        "R9",
        CACHE,
        "if window is not None and n > sink + window:",
        "if window is not None and n > sink + window + 1:",
        T_STATE,
        "read_meta passes a record one chunk past sink + window (a later check refuses it, less clearly)",
    ),
    M(
        "R10",
        CACHE,
        "if held != min(sink, n):",
        "if held > min(sink, n):",
        "tests/test_cache.py tests/test_saved_run.py",
        "a cache file whose sink holds fewer chunks than it must is accepted",
    ),
    # W: multi-step flows (continue later, prompt switches)
    M(
        "W1",
        LOOP,
        "self.active = resume.active_prompt",
        "self.active = None",
        T_RESUME,
        "a resumed run forgets the prompt its cache was written under: no re-cache on the switch",
    ),
    M(
        "W2",
        LOOP,
        "next_frame=s.first_frame + s.plan.frames",
        "next_frame=s.plan.frames",
        T_RESUME,
        "a second continuation reports the frames of this run alone as next_frame",
    ),
    M(
        "W3",
        LOOP,
        "next_chunk=s.first_chunk + s.plan.chunks",
        "next_chunk=s.plan.chunks",
        T_RESUME,
        "a continuation's next_chunk restarts from this run's chunks",
    ),
    M(
        "W4",
        LOOP,
        "index, t0 = s.first_chunk + c, time.perf_counter()",
        "index, t0 = c, time.perf_counter()",
        T_RESUME,
        "a continuation reuses chunk 0's seeds and prompt schedule position",
    ),
    M(
        "W5",
        RUN,
        "self.write(c.chunk, c.frame_offset, c.latent, forward, record=False)",
        "self.write(c.chunk, c.frame_offset + 1, c.latent, forward, record=False)",
        T_RESUME + " " + T_LONG + "::test_recache_rewrites_every_layer_but_the_first",
        "a re-cache on a prompt switch writes the retained chunks one frame late (wrong RoPE positions)",
    ),
    # S: refusals when a saved run does not fit the run that loads it (check_compatible), each field alone
    M(
        "S1",
        SR,
        '("value", self.spec_v, spec_v)',
        '("value", self.spec_v, spec_k)',
        T_COMPAT,
        "the value spec is compared with the run's key spec",
    ),
    M(
        "S2",
        SR,
        "if (self.window_chunks, self.sink_chunks) != (window_chunks, sink_chunks):",
        "if self.window_chunks != window_chunks:",
        T_COMPAT,
        "another sink is accepted",
    ),
    M(
        "S3",
        SR,
        "if tuple(self.latent_shape) != tuple(latent_shape):",
        "if tuple(self.latent_shape)[:3] != tuple(latent_shape)[:3]:",
        T_COMPAT,
        "another latent width is accepted",
    ),
    M(
        "S4",
        SR,
        "if tuple(self.latent_shape) != tuple(latent_shape):",
        "if tuple(self.latent_shape)[::3] != tuple(latent_shape)[::3]:",
        T_COMPAT,
        "another latent height (or channel count) is accepted",
    ),
    M(
        "S5",
        SR,
        "if self.chunk_frames != chunk_frames:",
        "if self.chunk_frames < chunk_frames:",
        T_COMPAT,
        "shorter chunks than the saved ones are accepted",
    ),
    M(
        "S6",
        SR,
        "if sorted(self.branches) != sorted(branches):",
        "if len(self.branches) < len(branches):",
        T_COMPAT,
        "a cfg 1 run accepts a cfg > 1 cache",
    ),
    M(
        "S7",
        SR,
        'if self.fingerprint.get("weights") != fingerprint.get("weights"):',
        'if not fingerprint.get("weights"):',
        T_COMPAT,
        "other weights (another checkpoint or LoRA) are accepted",
    ),
    M(
        "S8",
        SR,
        'mine = {k: v for k, v in with_kv_heads(self.fingerprint).items() if k != "weights"}',
        'mine = {k: v for k, v in self.fingerprint.items() if k not in ("weights", "heads")}',
        T_COMPAT,
        "a model of another head count is accepted",
    ),
    # H: the hardened cache-file reader and the listing of cache files
    M(
        "H1",
        SR,
        "if (layer, branch) in caches:",
        "if (layer, branch) in caches and branch:",
        T_STATE,
        "a (layer, 0) pair listed twice is accepted",
    ),
    M(
        "H2",
        SR,
        "if next_frame != last.frame_offset + last.frames:",
        "if next_frame < last.frame_offset + last.frames:",
        T_STATE,
        "a next_frame far past the retained chunks is accepted",
    ),
    M(
        "H3",
        SR,
        'next_frame = whole(st["next_frame"], "next_frame", 1, MAX_FRAMES)',
        'next_frame = st["next_frame"]',
        T_STATE,
        "a huge or non-integer next_frame is not named as such",
    ),
    M(
        "H4",
        SR,
        "tick = check_interrupt or _no_interrupt",
        "tick = _no_interrupt",
        "tests/test_saved_run.py " + T_LOADING,
        "an interrupt is not honoured while a cache file loads",
    ),
    M(
        "H5",
        SR,
        'if t is None or list(t.shape) != rec["shape"] or',
        "if t is None or",
        T_STATE,
        "a retained latent of another shape than its record is accepted",
    ),
    M(
        "H6",
        SR,
        "or not 1 <= frames <= chunk_frames:",
        "or not 1 <= frames <= chunk_frames + 1:",
        T_STATE,
        "a retained chunk of more than chunk_frames frames is accepted",
    ),
    M(
        "H7",
        SR,
        "lo, hi = chunk, chunk * chunk_frames",
        "lo, hi = 0, chunk * chunk_frames",
        T_STATE,
        "a first retained chunk may start before its earlier chunks' frames",
    ),
    M(
        "H8",
        SR,
        "if self.size < 8:",
        "if self.size < 0:",
        T_STATE,
        "a file shorter than a safetensors header is not one clear error",
    ),
    M(
        "H9",
        SR,
        "if pos != self.size:",
        "if pos > self.size:",
        T_STATE,
        "trailing bytes after the tensors' data are accepted",
    ),
    M(
        "H10",
        LKV,
        "if stat.S_ISREG(st.st_mode):\n                yield",
        "if not stat.S_ISDIR(st.st_mode):\n                yield",
        T_FILES,
        "the listing offers FIFOs, devices and sockets",
    ),
    M(
        "H11",
        LKV,
        "if os.path.commonpath((base, real)) != base:\n                        continue",
        "if os.path.commonpath((base, e.path)) != base:\n                        continue",
        T_FILES,
        "the listing follows a symlink that leads out of the folder",
    ),
    M(
        "H12",
        LKV,
        "if e.is_dir(follow_symlinks=False):",
        "if e.is_dir():",
        T_FILES,
        "the listing enters a symlinked folder",
    ),
    M(
        "H13",
        LKV,
        "        if not stat.S_ISREG(st.st_mode):\n            return None\n        raw",
        "        raw",
        T_FILES,
        "the header reader reads from a FIFO or device swapped in after the listing",
    ),
    # Q: QVG k-means
    M(
        "Q1",
        QVGF,
        "return torch.where((counts > 0).unsqueeze(-1), means, old)",
        "return means",
        T_QVG,
        "an empty k-means cluster's centroid becomes 0 instead of keeping its previous one",
    ),
    M(
        "Q2",
        QVGF,
        "return torch.where((counts > 0).unsqueeze(-1), means, old)",
        "return torch.where((counts > 1).unsqueeze(-1), means, old)",
        T_QVG,
        "a cluster of one token keeps its old centroid instead of moving to the token",
    ),
    M(
        "Q3",
        QVGF,
        "c[sl].transpose(1, 2), alpha=-2.0)",
        "c[sl].transpose(1, 2), alpha=2.0)",
        T_QVG,
        "tokens join their farthest centroid",
    ),
    M(
        "Q4",
        QVGF,
        "        c = c.to(CENTROID_DTYPE)\n        residual = residual - _gather_rows(c.to(torch.float32), i)",
        "        residual = residual - _gather_rows(c, i)\n        c = c.to(CENTROID_DTYPE)",
        T_QVG,
        "the residual subtracts the float32 centroids, not the BF16 ones stored",
    ),
    M(
        "Q5",
        QVGF,
        "pick = torch.rand(N, T, generator=generator).argsort(-1)[:, :k]",
        "pick = torch.rand(N, T).argsort(-1)[:, :k]",
        T_QVG,
        "k-means starts ignore the spec's seed (runs differ)",
    ),
    M(
        "Q6",
        QVGF,
        "ids=torch.cat([p.ids for p in parts], dim=-1),",
        "ids=torch.cat([p.ids for p in parts], dim=0),",
        T_QVG,
        "concatenating chunks stacks their cluster ids on the stage axis",
    ),
    # M: method dispatch (RTN / QVG per spec)
    M(
        "M1",
        METH,
        "name = spec if isinstance(spec, str) else spec.method",
        'name = spec if isinstance(spec, str) else "rtn"',
        T_METH,
        "every spec is dispatched to RTN: a QVG spec quantizes without k-means",
    ),
    M(
        "M2",
        METH,
        "if t and int(ids[..., start : start + t].max()) >= k:",
        "if t and int(ids[..., start : start + t].max()) > k:",
        T_QVG,
        "a cluster id one past its chunk's centroids is accepted",
    ),
    M(
        "M3",
        METH,
        "        return min(spec.qvg_centroids, tokens)",
        "        return spec.qvg_centroids",
        T_QVG,
        "chunks shorter than K are counted (and checked) as K centroids",
    ),
    M(
        "M4",
        METH,
        'extra_parts = (".centroids", ".ids")',
        'extra_parts = (".centroids",)',
        T_QVG,
        "a QVG cache's ids are not a known part of its file",
    ),
    # L: correction layouts and their float64 check
    M(
        "L1",
        LAY,
        "            and torch.allclose(out[..., :D].double(), torch.softmax(s, -1) @ v.double(), atol=tol, rtol=tol)\n",
        "",
        T_KERN,
        "a layout with the right log-sum-exp but a wrong output passes its check",
    ),
    M(
        "L2",
        LAY,
        "            and torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=tol, rtol=tol)\n",
        "",
        T_KERN,
        "a layout with the right output but a wrong log-sum-exp passes its check",
    ),
    M(
        "L3",
        LAY,
        "s = (q.double() @ k.double().transpose(-1, -2)) * scale - strength * (",
        "s = (q.double() @ k.double().transpose(-1, -2)) * scale + strength * (",
        T_KERN,
        "the reference of the check has the correction's sign flipped: every layout is refused",
    ),
    M(
        "L4",
        LSE,
        "return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2",
        "return 5e-2 if dtype in (torch.float32, torch.float64) else 1e-4",
        "tests/test_kernels.py tests/test_attention.py",
        "float32 checks are loose and bf16 checks refuse every kernel",
    ),
    # P: the planner
    M(
        "P1",
        METH,
        "if share >= spec.bits:",
        "if share > spec.bits:",
        T_PLAN,
        "no warning when QVG's centroids cost as much as the residual's bits",
    ),
    M(
        "P2",
        METH,
        "if k >= chunk_tokens:",
        "if k > chunk_tokens:",
        T_PLAN,
        "K equal to the chunk's tokens is warned about as a cost only, not as every token its own centroid",
    ),
    M(
        "P3",
        PLAN,
        "written = prefix_chunks + chunks - (0 if write_last else 1)",
        "written = prefix_chunks + chunks - (1 if write_last else 0)",
        T_PLAN,
        "the planner's peak counts the final write the wrong way round",
    ),
    M(
        "P4",
        PLAN,
        "if window_chunks and window_chunks + sink_chunks >= prefix_chunks + chunks:",
        "if window_chunks and window_chunks >= prefix_chunks + chunks:",
        T_PLAN,
        "no 'window not smaller than the video' warning when the sink makes up the difference",
    ),
    M(
        "P5",
        PLAN,
        "None if errors else layers * cfg_branches * held_bytes(end_held, retention.sink_held(total_chunks)) + latents",
        "None if errors else layers * held_bytes(end_held, retention.sink_held(total_chunks)) + latents",
        T_PLAN,
        "the projected cache-file size leaves out the uncond branch",
    ),
    M(
        "P6",
        LOOP,
        "prefix_frames=len(resume.retained) * ch.chunk_frames\n",
        "prefix_frames=self.first_frame\n",
        T_LOADING,
        "a resumed run plans memory for every frame before it, not the chunks the state holds",
    ),
    # C: the checkpoint converter
    M(
        "C1",
        CONV,
        'LEADING_WRAPPERS = ("model", "module", "diffusion_model")',
        'LEADING_WRAPPERS = ("model", "module")',
        T_CONV,
        "model.diffusion_model. keys keep their diffusion_model. prefix",
    ),
    M(
        "C2",
        CONV,
        "while len(parts) > 1 and parts[0] in LEADING_WRAPPERS:",
        "if len(parts) > 1 and parts[0] in LEADING_WRAPPERS:",
        T_CONV,
        "only the first of two leading wrappers is stripped",
    ),
    M(
        "C3",
        CONV,
        "if p not in ANYWHERE_WRAPPERS]",
        'if p != "_fsdp_wrapped_module"]',
        T_CONV,
        "torch.compile's _orig_mod and activation checkpointing wrappers stay in the keys",
    ),
    M(
        "C4",
        CONV,
        "        if new in out:\n",
        "        if new in origin.values():\n",
        T_CONV,
        "two keys that collide once stripped are silently merged",
    ),
    # F: the family probe
    M(
        "F1",
        WAN,
        "for i, blk in enumerate(blocks):",
        "for i, blk in enumerate(blocks[:1]):",
        T_FAM,
        "the probe reads only the first block's self-attention",
    ),
    M(
        "F2",
        WAN,
        "if type(dm).forward_orig is not WanModel.forward_orig:",
        "if type(dm).forward is not WanModel.forward:",
        T_FAM,
        "a t2v subclass overriding forward_orig is accepted",
    ),
    M(
        "F3",
        WAN,
        'ATTN_PARTS = ("q", "k", "v", "o", "norm_q", "norm_k", "num_heads", "head_dim")',
        'ATTN_PARTS = ("q", "k", "v", "o", "norm_q", "num_heads", "head_dim")',
        T_FAM,
        "a self-attention without norm_k is accepted",
    ),
]

# ------------------------------------------------------------------------------------ X: where features cross
TIERS = "jensen_core/tiers.py"
SESS = "runtime/core_ar/session.py"
PATCH = "runtime/core_ar/patches.py"
MUTANTS += [
    # the seven behaviours issue 29 names
    M(
        "X1",
        TIERS,
        "xf = t.dequantize(dtype=torch.float32, rotated=True)",
        "xf = t.dequantize(dtype=torch.float32, rotated=False)",
        f"{T_TIERS} {T_MX_CORE}",
        "tiers x rotation: an aging chunk is requantized from the unrotated space (its codes live in the rotated one)",
    ),
    M(
        "X2",
        PLAN,
        "ebk, ebv = side_bits(spec_k, 0), side_bits(spec_v, 1)",
        "ebk, ebv = side_bits(spec_k, 0), side_bits(spec_v, 0)",
        f"{T_TIERS} {T_MX_CORE}",
        "tiers x planner: the values are given the keys' average bits when the sides' tiers differ",
    ),
    M(
        "X3",
        RUN,
        "cache = self._caches.get((layer, branch)) or self._new_cache()",
        "cache = self._new_cache()",
        f"{T_COREAR} {T_MX_AR}",
        "core path x tiers: the block in flight is prepared at the sink's bits and requantized only at commit",
    ),
    M(
        "X4",
        KREA,
        "if s.prefix_latent is not None:\n            history = torch.cat(",
        "if s.prefix_latent is not None and frame0 < 0:\n            history = torch.cat(",
        f"{T_KREA} {T_MX_PACK}",
        "Krea recompute x prefix clip: the context of the first generated chunks loses the clip's frames",
    ),
    M(
        "X5",
        KREA,
        "pixels = stream.last_frame(history[b : b + 1,",
        "pixels = stream.last_frame(history[0:1,",
        f"{T_KREA} {T_MX_PACK}",
        "Krea recompute x batch 2: every batch item's anchor frame is re-encoded from item 0",
    ),
    M(
        "X6",
        LOOP,
        "r.sampling.sigmas_of(c, r.resumed),",
        "r.sampling.sigmas_of(c, r.resumed or r.continuation.prefix is not None),",
        f"{T_CF} {T_MX_PACK}",
        "Causal Forcing x prefix clip: the first chunk's own schedule is ignored when the run extends a clip",
    ),
    M(
        "X7",
        CACHE,
        'if k["shape"] != v["shape"] or k["dtype"] != v["dtype"]:',
        'if k["shape"] != v["shape"] or k["dtype"] != k["dtype"]:',
        f"{T_READ} {T_MX_READ}",
        "saved cache reader: a chunk whose keys and values have different dtypes is accepted (compared with itself)",
    ),
    # more crossings
    M(
        "X8",
        SR,
        "if dtype is not None and lay[3] != dtype:",
        "if dtype is not None and lay[3] != lay[3]:",
        f"{T_READ} {T_MX_READ}",
        "saved run reader: caches of different dtypes in one file are accepted (compared with itself)",
    ),
    M(
        "X9",
        CACHE,
        'if (B, H, D, _CACHE_DTYPES[k["dtype"]]) != layout:',
        "if (B, H, D) != layout[:3]:",
        f"{T_READ} {T_MX_READ}",
        "cache file reader: a chunk of another dtype than the layout's is accepted",
    ),
    M(
        "X10",
        PLAN,
        'tiers.specs_for(spec_v, n, sink_held, "v")',
        'tiers.specs_for(spec_v, n, sink_held, "k")',
        f"{T_TIERS} {T_MX_CORE}",
        "tiers x planner: the values' bytes follow the keys' tier (recent_chunks_key_bits)",
    ),
    M(
        "X11",
        CACHE,
        "sink = self._sink_held < self.sink_chunks",
        "sink = self._sink_held <= self.sink_chunks",
        f"{T_TIERS} {T_MX_CORE}",
        "tiers x sink: the first chunk after the sink is stored at the sink's bits and requantized at once",
    ),
    M(
        "X12",
        CACHE,
        'want_v = t.specs_for(self.spec_v, n, self._sink_held, "v")',
        'want_v = t.specs_for(self.spec_v, n, self._sink_held, "k")',
        f"{T_TIERS} {T_MX_CORE}",
        "tiers per side: the values are demoted on the keys' schedule",
    ),
    M(
        "X13",
        PLAN,
        "tiers.newest_bits(s.bits, side, bool(tiers.sink_bits))",
        'tiers.newest_bits(s.bits, "k", bool(tiers.sink_bits))',
        f"{T_TIERS} {T_COREAR} {T_MX_CORE}",
        "core path x tiers per side: the block in flight is planned at the keys' bits on both sides",
    ),
    M(
        "X14",
        LOOP,
        "spec_v=precision.spec_v,\n            tiers=precision.tiers,",
        "spec_v=precision.spec_v,",
        f"{T_LONG} {T_LOADING} {T_MX_PACK}",
        "tiers x resume: the saved state forgets its tiers (its caches keep them): the file cannot be loaded",
    ),
    M(
        "X15",
        LOOP,
        "precision=self.config.precision,\n                chunk_frames=ch.chunk_frames,",
        "precision=self.config.with_specs(self.config.spec_k, self.config.spec_v).precision,\n"
        "                chunk_frames=ch.chunk_frames,",
        f"{T_LONG} {T_LOADING} {T_MX_PACK}",
        "tiers x resume: a run compares the loaded state's tiers with none (a tiered state is refused)",
    ),
    M(
        "X16",
        SKYREELS,
        "self.redraw_noise = self.redraw_generators(job, step.index)",
        "self.redraw_noise = self.redraw_generators(job, step.run_index)",
        f"{T_SKY} {T_MX_PACK}",
        "SkyReels context noise x resume / prefix: the redraws reuse the run's chunk 0 noise, not the video's chunk",
    ),
    M(
        "X17",
        PLAIN,
        "kept = list(run.timeline.items)\n",
        "kept = list(run.timeline.items)[run.timeline.sink_held :]\n",
        f"{T_LONG} {T_MX_PACK}",
        "window + sink x prompt switch: the causal re-cache drops the sink",
    ),
    M(
        "X18",
        LOOP,
        "ch.first_chunk_frames if co.resume is None and co.prefix is None else 0",
        "ch.first_chunk_frames if co.resume is None else 0",
        f"{T_CF} {T_MX_PACK}",
        "first chunk frames x prefix clip: a run extending a clip starts with a short chunk again",
    ),
    M(
        "X19",
        LOOP,
        "ChunkPlan(self.prefix_latent.shape[2], ch.chunk_frames, ch.first_chunk_frames).bounds()",
        "ChunkPlan(self.prefix_latent.shape[2], ch.chunk_frames).bounds()",
        f"{T_CF} {T_MX_PACK}",
        "first chunk frames x prefix clip: the clip is written in chunks of chunk_frames, not as the video was made",
    ),
    M(
        "X20",
        RUN,
        "sink_held=min(sink, sum(1 for c in saved.retained if c.chunk < sink)),",
        "sink_held=0,",
        f"{T_LONG} {T_MX_PACK}",
        "window + sink x resume: the resumed timeline forgets its sink (a later re-cache loses it)",
    ),
    M(
        "X21",
        PLAIN,
        "            prompt = s.schedule.at(i)\n",
        "            prompt = s.schedule.at(0)\n",
        f"{T_LONG} {T_MX_PACK}",
        "prefix clip x prompt schedule: every prefix chunk is written under the first prompt",
    ),
    M(
        "X22",
        LOOP,
        "tokens_per_frame=setup.tokens_per_frame,",
        "tokens_per_frame=adapter.tokens_per_frame(tuple(setup.latent_image.shape[:-1]) + "
        "(setup.latent_image.shape[-2],)),",
        f"{T_KREA} {T_MX_PACK}",
        "Krea bias x non-square latents: the exempt first frame is counted from the height twice",
    ),
    M(
        "X23",
        SESS,
        "sl = slice(i * per, (i + 1) * per)",
        "sl = slice(0, per)",
        f"{T_COREAR} {T_MX_AR}",
        "core path x cfg > 1: the uncond branch's block in flight is the cond branch's",
    ),
    M(
        "X24",
        SESS,
        "self.prepare_pending = all(method_of(sp).quantizes_early for sp in specs)",
        "self.prepare_pending = True",
        f"{T_COREAR} {T_MX_AR}",
        "core path x QVG: the block in flight runs k-means at every step (held as QVG, not in the model's dtype)",
    ),
    M(
        "X25",
        PATCH,
        "    adapter.check_latent(noise)\n",
        "",
        f"{T_COREAR} {T_MX_AR}",
        "core path x odd latent sizes: a latent of partial patches reaches core's sampler, which fails deep inside",
    ),
    M(
        "X26",
        LONGLIVE,
        "keep_sink = local_attn_frames is not None and step.frame0 > local_attn_frames",
        "keep_sink = local_attn_frames is not None and step.frame0 >= local_attn_frames",
        f"{T_LL} {T_MX_PACK}",
        "LongLive re-cache x window + sink: a switch exactly at the local attention size keeps the old sink",
    ),
    M(
        "X27",
        SR,
        "per = tokens // n if tokens_per_frame is None else tokens_per_frame",
        "per = tokens // n",
        f"{T_READ} {T_MX_READ}",
        "saved run reader: chunks of different tokens per frame in one cache are accepted",
    ),
]


# ---------------------------------------------------------------------------------- the new families (issue 43)
# MAGI-1, HY-WorldPlay and Raylight where their features cross (G mutants). Written before the matrix tests of
# issue 43; the baseline against the tests that existed then is in the module docstring.
#
# Baseline (2026-12-05, 2 busy cores, 60 min; the areas' tests only: T_MAGI, T_WP, T_RAY, before the matrix files):
#     python tools/mutation_test.py --only G1 G2 ... G30 --min-kill 0
# kill rate 12/30 = 40 %. Survivors: G1 G2 G3 G5 G6 G7 G8 G10 G11 G12 (MAGI-1 plan / schedule checks), G18 (loader),
# G19 G22 G24 G25 (HY-WorldPlay seeding, 0 frames, tiers in the plan, context score), G26 G27 G28 (Raylight: several
# heads per rank, rank 0's layout, padding). G2 is the shipped bug this branch fixes (check_schedule took a key range
# of 0 chunks from a request), so the G2 anchor is the new check.
#
# With the matrix files (2026-12-05, 2 cores shared with 3 other sessions; each file alone through --tests, since the
# whole table with every mutant's own tests would take hours on those cores):
#     python tools/mutation_test.py --only G19 G20 G21 G22 G23 G24 G25 G30 \
#         --tests tests/integration/test_matrix_worldplay.py --timeout 1500 --min-kill 0       # 8/8 in 21 min
#     python tools/mutation_test.py --only G26 G27 G28 G29 \
#         --tests tests/integration/test_matrix_raylight.py --timeout 1500 --min-kill 0        # 3/4 in 6 min
#     python tools/mutation_test.py --only G1 G2 ... G17 \
#         --tests tests/integration/test_matrix_magi1.py --timeout 1500 --min-kill 0           # 15/17, 45 min
# First failing test (pytest -x): G19 test_worldplay_cell[ar_4step-tie] (seed 7's points take chunk 1, seed 0's chunk
# 2); G20 test_the_family_selection_is_the_reference_rule[blind-0] (an exact tie); G25 [revisit-3] (frame h + 2); G30
# [tiny-5] (the 20-frame memory); G21, G24 test_worldplay_cell[ar_4step-revisit] (the planned bytes by hand, tiers'
# bits); G22 / G23 the refusals zero_frames / video_longer_than_its_path; G26 test_raylight_cell[heads4-rtn] (rank 1
# reports head_offset 1, not 2; the Hadamard and QVG cells' videos move too); G27 test_raylight_cell[heads4-no_layout];
# G28 test_raylight_cell[heads4-pad_rank]. G29 survives the Raylight matrix alone (the area's refuse_heads kills it).
# The MAGI-1 matrix alone (its file's baseline took 991 s here): 15/17 killed (G1-G17 but G3 and G12): G3 (the text
# '5,0' still meets the G2 check) and G12 (a window one chunk short gives no warning) survive it.
# Every mutant's own tests are its area's and its matrix file, and pytest -x fails on either, so with the baseline's
# area kills: G19-G30 12/12. G3 and G12 then got their tests in the area's file (tests/integration/test_magi1_cache.py:
# '5,0' refused by the parser itself; a window of reached - 1 warned), killed by
#     python tools/mutation_test.py --only G3 G12 --tests \
#         "tests/integration/test_magi1_cache.py::test_a_window_short_of_what_the_key_ranges_reach_is_said" \
#         "tests/integration/test_magi1_cache.py::test_what_the_recipe_refuses_names_the_fix" --min-kill 0   # 2/2, 1 min
# The table: 29/30. G18 is an equivalent mutant: checkpoint.py's "a tensor in two shards" check is unreachable (an
# index's weight_map names each tensor once and _add_file reads only a shard's listed names; one file's names are
# unique), so no test can tell it apart. Derived from these runs, not one run of the whole table; its command, for
# idle cores (hours on busy ones),
#     python tools/mutation_test.py --only G1 G2 ... G30 --timeout 1500 --min-kill 0
MAGI_W = "runtime/families/magi1/window.py"
MAGI_R = "runtime/families/magi1/recipe.py"
MAGI_F = "runtime/families/magi1/family.py"
MAGI_P = "runtime/families/magi1/model/pipeline.py"
MAGI_CK = "runtime/families/magi1/model/checkpoint.py"
WP_F = "runtime/families/worldplay/family.py"
WP_R = "runtime/families/worldplay/recipe.py"
WP_C = "runtime/families/worldplay/model/context.py"
RAY = "runtime/families/wan/raylight.py"

MUTANTS += [
    M(
        "G1",
        MAGI_R,
        "            precision=self.config.precision,\n        )\n        return plan.quantized_bytes or 0",
        "            precision=self.config.with_specs(self.config.spec_k, self.config.spec_v).precision,\n"
        "        )\n        return plan.quantized_bytes or 0",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 x tiers: the planned bytes (memory request, report) ignore precision by age",
    ),
    M(
        "G2",
        MAGI_W,
        "isinstance(r, bool) or not isinstance(r, int) or r < 1]",
        "isinstance(r, bool) or not isinstance(r, int) or r < 0]",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 kv_ranges: a key range of 0 chunks (a chunk that does not read itself) is accepted",
    ),
    M(
        "G3",
        MAGI_W,
        "    if not out or any(v < 1 for v in out):",
        "    if not out or any(v < 0 for v in out):",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 kv_ranges text: '5,0' is parsed into a range of 0 chunks",
    ),
    M(
        "G4",
        MAGI_W,
        "            most = max(most, st.slice_point - s)",
        "            most = max(most, st.slice_point - s - 1)",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 window 0: keeps one finished chunk fewer than the key ranges reach (off by one)",
    ),
    M(
        "G5",
        MAGI_W,
        "    return max(1, finished_reached(settings, chunks)) if settings.noise2clean_kvrange else 0",
        "    return finished_reached(settings, chunks) if settings.noise2clean_kvrange else 0",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 window 0 with key ranges of 1 (nothing finished read): keeps every chunk, not one",
    ),
    M(
        "G6",
        MAGI_W,
        "    if window_size not in WINDOW_SIZES:",
        "    if not 1 <= window_size <= 5:",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 window_size 5 is accepted (the reference and the planner know 1 to 4)",
    ),
    M(
        "G7",
        MAGI_W,
        "    if kv_ranges and num_steps % len(kv_ranges):",
        "    if kv_ranges and num_steps < len(kv_ranges):",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1: steps that do not split into the stages of kv_ranges pass the check (the pipeline fails later)",
    ),
    M(
        "G8",
        MAGI_R,
        "            sink_chunks=ch.sink_chunks,\n            shape=self.adapter.cache_shape()",
        "            sink_chunks=0,\n            shape=self.adapter.cache_shape()",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 window + sink: the planned bytes forget the sink",
    ),
    M(
        "G9",
        MAGI_R,
        "self.config, self.window, adapter.num_layers, observer=r.hooks.observer, sink_chunks=r.chunking.sink_chunks",
        "self.config, self.window, adapter.num_layers, observer=r.hooks.observer",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 window + sink: the run's caches keep no sink (the planner still counts it)",
    ),
    M(
        "G10",
        MAGI_R,
        "        if self.cfg_number not in (None, 1, 3):",
        "        if self.cfg_number not in (None, 1, 2, 3):",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 cfg_number 2 is accepted (the reference runs 1 or 3 passes)",
    ),
    M(
        "G11",
        MAGI_R,
        "        if self.latent_height % 2 or self.latent_width % 2:",
        "        if self.latent_height % 2:",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 an odd latent width passes the request (not whole 2 x 2 patches)",
    ),
    M(
        "G12",
        MAGI_R,
        "        if self.window and self.window < self.reached:",
        "        if self.window and self.window < self.reached - 1:",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 a window one chunk short of what the key ranges reach gives no warning",
    ),
    M(
        "G13",
        MAGI_F,
        "            reads = sum(1 for c in held if start <= c < cached)",
        "            reads = sum(1 for c in held if start < c < cached)",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 key ranges: a query reads one held chunk fewer than its range starts at",
    ),
    M(
        "G14",
        MAGI_F,
        "            first = max(start, cached) - cached  # the first chunk of this forward in range",
        "            first = max(start, cached + 1) - cached  # the first chunk of this forward in range",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1: the clean chunk riding in front is not read as context by the chunks behind it",
    ),
    M(
        "G15",
        MAGI_F,
        "        self.kv_heads = int(cfg.num_query_groups)",
        "        self.kv_heads = int(cfg.num_attention_heads)",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 x GQA: the plan and report count the query heads, not the K/V heads",
    ),
    M(
        "G16",
        MAGI_P,
        "        r = clean_chunk_kvrange if s == num_steps else noise2clean_kvrange[s // per]",
        "        r = clean_chunk_kvrange if s == num_steps else noise2clean_kvrange[min(s // per + 1, len(noise2clean_kvrange) - 1)]",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 pipeline: each quarter of a chunk's steps takes the next quarter's key range",
    ),
    M(
        "G17",
        MAGI_P,
        "        extra = cs > chunk_offset and sub == 0",
        "        extra = cs > chunk_offset and sub == per_stage - 1",
        f"{T_MAGI} {T_MX_MAGI}",
        "MAGI-1 pipeline: the finished chunk rides in front on the stage's last forward, not its first",
    ),
    M(
        "G18",
        MAGI_CK,
        "        if name in files.where:",
        "        if name in files.where and files.where[name] == path:",
        "tests/test_convert_magi1.py tests/integration/test_magi1_comfyui.py",
        "MAGI-1 loader: a tensor in two shards is taken from the last one silently",
    ),
    M(
        "G19",
        WP_R,
        "        self.points = sphere_points(seed=int(r.sampling.seed))",
        "        self.points = sphere_points()",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay: the context selection's view-overlap points ignore the run's seed (always seed 0)",
    ),
    M(
        "G20",
        WP_C,
        "    scored.sort(key=lambda item: item[1])  # stable: equal scores keep the older chunk first",
        "    scored.sort(key=lambda item: (item[1], -item[0]))  # stable: equal scores keep the older chunk first",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay context x a revisited view: ties go to the newest chunk, not the oldest",
    ),
    M(
        "G21",
        WP_F,
        "        rule = Chunking(CHUNK_LATENTS, CONTEXT_CHUNKS, 0)",
        "        rule = Chunking(CHUNK_LATENTS, CONTEXT_CHUNKS + 1, 0)",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay planner rule: plans 6 context chunks where the selection holds at most 5",
    ),
    M(
        "G22",
        WP_R,
        "        if frames is None or frames % CHUNK_LATENTS or frames < CHUNK_LATENTS:",
        "        if frames is None or frames % CHUNK_LATENTS:",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay: a latent of 0 frames is accepted (a run that makes nothing)",
    ),
    M(
        "G23",
        WP_R,
        "        if frames > path.latents:",
        "        if frames > path.latents + CHUNK_LATENTS:",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay: a video one chunk longer than its camera path passes the check",
    ),
    M(
        "G24",
        WP_R,
        "            precision=self.config.precision,\n        )\n        return plan.quantized_bytes or 0",
        "            precision=self.config.with_specs(self.config.spec_k, self.config.spec_v).precision,\n"
        "        )\n        return plan.quantized_bytes or 0",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay x tiers: the planned bytes ignore precision by age",
    ),
    M(
        "G25",
        WP_C,
        "[w2c[f] for h in starts for f in (h, h + 2)]",
        "[w2c[f] for h in starts for f in (h, h + 3)]",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay context score: the candidate's second view is its last frame, not its third",
    ),
    M(
        "G26",
        RAY,
        "        return self.rank * self.local_heads",
        "        return self.rank",
        f"{T_RAY} {T_MX_RAY}",
        "Raylight x several heads per rank: a rank's first global head is its rank (per-head seeds and signs wrong)",
    ),
    M(
        "G27",
        RAY,
        "    if shard.rank != 0:\n        adopt_layout(",
        "    if shard.rank != 0 and payload[0] is not None:\n        adopt_layout(",
        f"{T_RAY} {T_MX_RAY}",
        "Raylight x Taylor layout: where rank 0 takes no layout, the other ranks keep their own choice",
    ),
    M(
        "G28",
        RAY,
        "        if not 0 < full <= s * shard.ranks < full + shard.ranks:",
        "        if not 0 < full <= s * shard.ranks:",
        f"{T_RAY} {T_MX_RAY}",
        "Raylight: a shard padded by a whole rank's tokens or more is taken for the block",
    ),
    M(
        "G29",
        RAY,
        "    if heads % ranks:\n",
        "    if heads < ranks:\n",
        f"{T_RAY} {T_MX_RAY}",
        "Raylight: heads that do not divide by the Ulysses degree are accepted (a rank holds a partial head set)",
    ),
    M(
        "G30",
        WP_C,
        "    if start <= memory_frames:\n        return list(range(start))",
        "    if start <= memory_frames + CHUNK_LATENTS:\n        return list(range(start))",
        f"{T_WP} {T_MX_WP}",
        "HY-WorldPlay context: chunk 6 takes all 24 earlier frames (more than the 20 the memory holds)",
    ),
]


if __name__ == "__main__":
    sys.exit(main())
