"""Cost per chunk as the video grows, for every model family, and the correction's overhead; peak memory beside the
planned cache (issue 42, items 2 and 3).

    python benchmarks/chunk_cost.py                  # every family and Wan recipe, 3 rounds (about 10 min on 2 cores)
    python benchmarks/chunk_cost.py --quick          # 1 round, fewer chunks (about 2 min)
    python benchmarks/chunk_cost.py --cases magi1 worldplay --rounds 5

Each case is a family's tiny random model from ``jensen_testing.families.TINY`` (the conformance suite's: the Wan
loop with each of its recipes, MAGI-1's multi-noise pipeline, HY-WorldPlay's context rebuild; ComfyUI in-process,
float32 on the CPU) sampled for ``--chunks`` chunks under a window that fills early (Wan: window 2 + sink 1; MAGI-1:
its window of 4 chunks in flight; HY-WorldPlay: its context of at most 5 chunks; LingBot-World: its window of 18
latent frames with a sink of 6), with the cache in three settings,
run round by round in a rotating order:

- ``full``: no Quantize KV Cache (the cache in the model's dtype);
- ``int2``: INT2 g16, Hadamard, FP8 scales (the suite's setting);
- ``int2+taylor``: the same with Jensen Bias Correction (taylor, strength 1).

Printed per case:

1. **time per chunk** against chunk index (the median over rounds of the report's ``seconds_per_chunk``), and
   *flat*: the mean of the last third of the chunks over the first chunk after the window filled;
2. **the correction's overhead**: ``int2+taylor / int2``, the median over rounds of paired ratios of process CPU
   time (one torch thread by default, so a shared machine disturbs it little), at the attention op (inside
   ``RunCaches.attend``, the pack's one attention seam for every family, timed around each call) and end to end
   (the whole run); and ``int2 / full`` the same way. Time per chunk (1.) is the report's wall clock;
3. **peak memory** (one more run per setting under ``jensen_testing.memory.LiveTensors``, untimed): the bytes of
   tensors alive at once during the run against the cache's planned and measured peak; what the run held above the
   cache (the model's activations, the block in flight, the context re-encode, MAGI-1's chunks in flight) and the
   largest transient of one attention call (its dequantized copies: what ``attend`` allocated above what it left
   stored). The report's own ``peak_memory`` (the process's resident peak, ``runtime/peak_memory.py``) beside it.

The tiny models are narrow (Wan: 2 heads of 32; MAGI-1: 2 K/V heads of 64; HY-WorldPlay: 2 heads of 32), so the
cache's own work weighs more against the model's than at real widths (see ``benchmarks/sampler.py`` for Wan 1.3B's
width); ``benchmarks/gpu.py`` measures the same ratios at the released shapes on a GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

SETTINGS = ("full", "int2", "int2+taylor")
WAN_RECIPES = ("plain", "self_forcing", "longlive", "krea", "skyreels", "causal_forcing")
CASES = tuple(f"wan/{r}" for r in WAN_RECIPES) + ("magi1", "worldplay", "lingbot")
MIB = 2**20


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def clock(device: str):
    """Seconds of work on ``device``: the process's CPU time on a CPU; on CUDA the wall clock after a synchronize."""
    if device == "cuda":
        import torch

        def cuda_time():
            torch.cuda.synchronize()
            return time.perf_counter()

        return cuda_time
    return time.process_time


class Bench:
    """ComfyUI in-process, the pack, and one run of a case in a setting."""

    def __init__(self, device: str = "cpu"):
        from jensen_testing import comfyui

        comfyui.setup_inprocess_comfyui(cpu=device == "cpu")
        self.clock = clock(device)
        import comfy.samplers

        self.pack = comfyui.import_pack().__name__
        self.nodes = importlib.import_module(f"{self.pack}.nodes")
        self.loop = importlib.import_module(f"{self.pack}.runtime.chunk_loop")
        self.sched = importlib.import_module(f"{self.pack}.runtime.schedules")
        self.run_caches = importlib.import_module(f"{self.pack}.runtime.run_caches")
        self.euler, self.lcm = comfy.samplers.sampler_object("euler"), comfy.samplers.sampler_object("lcm")
        from jensen_testing.families import TINY

        self.tiny = TINY
        self.models: dict[str, object] = {}
        self._vae = None

    # ------------------------------------------------------------------ models and options
    def model(self, case: str, setting: str):
        family = case.split("/")[0]
        if family not in self.models:
            self.models[family] = self.tiny[family].build(0)
        m = self.models[family]
        if setting == "full":
            return m
        m = self.nodes.JensenKVQuantizeKVCache.execute(m, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
        if setting == "int2+taylor":
            m = self.nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
        return m

    def vae(self):
        if self._vae is None:
            from jensen_testing import wan_tiny

            self._vae = wan_tiny.build_vae()
        return self._vae

    def wan_options(self, recipe: str, model) -> dict:
        """The request options of a Wan recipe (as the combination matrix sets them), under window 2 + sink 1."""
        import comfy.samplers

        simple = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2)
        o = {"sampler": self.euler, "sigmas": simple, "chunk_frames": 2, "window_chunks": 2, "sink_chunks": 1}
        if recipe == "self_forcing":
            o.update(sampler=self.lcm, sigmas=self.sched.ar_sigmas("self_forcing_4step"))
        elif recipe == "longlive":
            o.update(sampler=self.lcm, sigmas=self.sched.ar_sigmas("longlive_4step"))
        elif recipe == "krea":  # Krea recomputes its cache from the last frames: no window of its own
            o.update(recompute_frames=2, attention_bias=0.5, vae=self.vae(), window_chunks=0, sink_chunks=0)
        elif recipe == "skyreels":
            o.update(context_noise=0.1, context_noise_mode="skyreels")
        elif recipe == "causal_forcing":
            o.update(
                sampler=self.lcm,
                chunk_frames=1,
                sigmas=self.sched.ar_sigmas("causal_forcing_framewise_2step"),
                first_chunk_sigmas=self.sched.first_chunk_sigmas("causal_forcing_framewise_2step"),
            )
        return o

    def frames_and_window(self, case: str, chunks: int) -> tuple[int, int]:
        """Latent frames for ``chunks`` chunks, and the chunk index from which the window is full."""
        if case == "magi1":
            return chunks * self.tiny["magi1"].chunk_frames, 4  # 4 chunks in flight, then one finished per chunk
        if case == "worldplay":
            return chunks * 4, 5  # the context: at most 5 chunks of 4 frames (20 frames)
        if case == "lingbot":
            return chunks * 4, 4  # window 18 latent frames with the sink and the chunk: 14 cached, full from chunk 4
        if case == "wan/causal_forcing":
            return chunks, 3
        if case == "wan/krea":
            return 2 * chunks, 2  # rebuilt from the last 2 frames (the anchor decoded) from chunk 2 on
        return 2 * chunks, 3  # window 2 + sink 1

    def run(self, case: str, setting: str, chunks: int, observer=None):
        tiny = self.tiny[case.split("/")[0]]
        model = self.model(case, setting)
        frames, _ = self.frames_and_window(case, chunks)
        common = {"seed": 7, "cfg": 1.0, "observer": observer, "progress": False, **tiny.run_options}
        if case.startswith("wan/"):
            options = {**common, **self.wan_options(case.split("/")[1], model)}
            conds = (tiny.conditioning(1), tiny.conditioning(2))
            return self.loop.run_chunked_ar(model, *conds, tiny.latent(frames, 1), **options)
        schedule = {} if tiny.sigmas is None else {"sampler": self.euler, "sigmas": tiny.sigmas(model)}
        positive = tiny.conditioning(1)
        if case == "worldplay":  # its image condition spans the video's latent frames (the suite's is 32)
            from jensen_testing import worldplay_tiny

            positive = worldplay_tiny.conditioning(1, frames)
        elif case == "lingbot":
            from jensen_testing import lingbot_tiny

            positive = lingbot_tiny.conditioning(1, frames)
        return tiny.sample(model, positive, tiny.latent(frames, 1), **common, **schedule)


class AttendTimer:
    """Seconds inside ``RunCaches.attend`` (every family's attention seam), patched on the class for one run."""

    def __init__(self, run_caches, live=None, clock=time.process_time):
        self.cls, self.live, self.seconds, self.calls = run_caches.RunCaches, live, 0.0, 0
        self.clock = clock

    def __enter__(self):
        original = self.original = self.cls.attend
        timer = self

        def attend(run, *args, **kwargs):
            if timer.live is not None:
                with timer.live.scope("attend"):
                    return original(run, *args, **kwargs)
            t0 = timer.clock()
            try:
                return original(run, *args, **kwargs)
            finally:
                timer.seconds += timer.clock() - t0
                timer.calls += 1

        self.cls.attend = attend
        return self

    def __exit__(self, *exc):
        self.cls.attend = self.original


def time_case(bench: Bench, case: str, chunks: int, rounds: int) -> dict:
    per_chunk = {s: [] for s in SETTINGS}  # setting -> rounds of seconds_per_chunk
    attend = {s: [] for s in SETTINGS}  # CPU seconds inside attend, per run
    whole = {s: [] for s in SETTINGS}  # CPU seconds of the run
    bench.run(case, "int2+taylor", 2)  # warm-up (first-use checks, the model's first call)
    for r in range(rounds):
        order = SETTINGS[r % 3 :] + SETTINGS[: r % 3]
        for s in order:
            gc.collect()
            c0 = bench.clock()
            with AttendTimer(bench.run_caches, clock=bench.clock) as timer:
                rep = bench.run(case, s, chunks).report
            whole[s].append(bench.clock() - c0)
            per_chunk[s].append(rep["seconds_per_chunk"])
            attend[s].append(timer.seconds)
    _, full_from = bench.frames_and_window(case, chunks)
    return {"per_chunk": per_chunk, "attend": attend, "whole": whole, "full_from": full_from}


def memory_case(bench: Bench, case: str, chunks: int) -> dict:
    from jensen_testing.memory import LiveTensors

    out = {}
    for s in SETTINGS:
        gc.collect()
        with LiveTensors() as live, AttendTimer(bench.run_caches, live):
            rep = bench.run(case, s, chunks).report
        out[s] = {
            "live_peak": live.peak,
            "attend_transient": live.transients.get("attend", 0),
            "cache": rep["cache_bytes"],
            "planned": rep.get("planned_bytes"),
            "resident_peak": (rep.get("peak_memory") or {}).get("peak_bytes"),
        }
    return out


def paired(a: list, b: list) -> float:
    return _median([x / y for x, y in zip(a, b) if y > 0])


def ratios(t: dict) -> dict:
    """The case's headline numbers: flatness per setting, the correction's overhead and INT2's, op and end to end."""
    pc, full_from = t["per_chunk"], t["full_from"]
    n = len(pc["int2"][0])
    tail = list(range(n - max(1, n // 3), n))
    return {
        "flat": {s: _median([statistics.fmean(r[i] for i in tail) / r[full_from] for r in pc[s]]) for s in SETTINGS},
        "taylor_op": paired(t["attend"]["int2+taylor"], t["attend"]["int2"]),
        "taylor_e2e": paired(t["whole"]["int2+taylor"], t["whole"]["int2"]),
        "int2_op": paired(t["attend"]["int2"], t["attend"]["full"]),
        "int2_e2e": paired(t["whole"]["int2"], t["whole"]["full"]),
    }


def report_case(case: str, t: dict, m: dict | None) -> list[str]:
    lines = [f"### {case}", ""]
    pc, full_from = t["per_chunk"], t["full_from"]
    n = len(pc["int2"][0])
    med = {s: [_median([r[i] for r in pc[s]]) for i in range(n)] for s in SETTINGS}
    lines.append("| chunk | " + " | ".join(f"{i}" for i in range(n)) + " |")
    lines.append("|---|" + "---|" * n)
    for s in SETTINGS:
        lines.append(f"| {s} ms | " + " | ".join(f"{1000 * x:.0f}" for x in med[s]) + " |")
    r = ratios(t)
    lines += [
        "",
        f"- flat once the window is full (chunk {full_from} on): last third / chunk {full_from} = "
        + ", ".join(f"{s} {r['flat'][s]:.2f}" for s in SETTINGS),
        f"- correction overhead, int2+taylor / int2: attention op {r['taylor_op']:.3f}, end to end {r['taylor_e2e']:.3f}",
        f"- int2 / full: attention op {r['int2_op']:.3f}, end to end {r['int2_e2e']:.3f}",
    ]
    if m:
        lines += [
            "",
            "| setting | live peak MiB | cache peak MiB (planned) | above the cache MiB | largest attend transient KiB | resident peak MiB |",
            "|---|---|---|---|---|---|",
        ]
        for s in SETTINGS:
            r = m[s]
            planned = "-" if r["planned"] is None else f"{r['planned'] / MIB:.3f}"
            resident = "-" if r["resident_peak"] is None else f"{r['resident_peak'] / MIB:.1f}"
            lines.append(
                f"| {s} | {r['live_peak'] / MIB:.3f} | {r['cache'] / MIB:.3f} ({planned}) | "
                f"{(r['live_peak'] - r['cache']) / MIB:.3f} | {r['attend_transient'] / 1024:.1f} | {resident} |"
            )
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES, metavar="CASE", help=" ".join(CASES))
    ap.add_argument("--chunks", type=int, default=10, help="chunks per run (default 10; HY-WorldPlay needs 7+)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round, 8 chunks")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak memory runs")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time is then the op's own)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.chunks = 1, 8
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench()
    cmd = "python benchmarks/chunk_cost.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    out = [f"`{cmd.strip()}` (torch {torch.__version__}, {torch.get_num_threads()} threads)", ""]
    print(out[0], flush=True)
    for case in args.cases:
        t0 = time.perf_counter()
        t = time_case(bench, case, args.chunks, args.rounds)
        m = None if args.no_memory else memory_case(bench, case, args.chunks)
        lines = report_case(case, t, m)
        print("\n".join(lines), f"({time.perf_counter() - t0:.0f} s)", sep="\n", flush=True)
        out += lines
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
