"""Long videos: bounded memory over 64 chunks, and what a prompt switch's re-cache changes.

    python benchmarks/long_video.py            # both parts (~5 min on 2 CPU cores)
    python benchmarks/long_video.py --quick    # 16 chunks, seconds

1. **Bounded memory** (a tiny random Wan at Wan 1.3B's head layout: 12 heads x 128, 2 layers; 64
   chunks of 3 latent frames x 64 tokens; INT2 g32 QuaRot + Jensen; window 4, sink 1): the cache's
   bytes after every chunk's write, against the planner's projection for window + sink; and the
   seconds per chunk, early against late, printed side by side (a benchmark, not a test).
2. **Re-cache** (the pack's trained tiny AR model, 8 held-out videos): the prompt switches at chunk 4
   (window 3). With re-cache the kept chunks' K/V are rewritten under the new prompt. Printed: how
   much each layer's cached keys change (layer 0 sees no text yet, so none), the attention of the
   first chunk after the switch over the cache (mass on cached tokens, P_S) with and without
   re-cache, and how far the chunks after the switch move.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--chunks", type=int, default=64)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--sink", type=int, default=1)
    p.add_argument("--videos", type=int, default=8, help="re-cache part: held-out videos")
    a = p.parse_args(argv)
    if a.quick:
        a.chunks, a.videos = 16, 2
    return a


def bounded_memory(args, loop, nodes, planner) -> None:
    import comfy.samplers

    from jensen_testing import wan_tiny

    model = wan_tiny.build_patcher(seed=0, dim=1536, ffn_dim=1536, num_heads=12, num_layers=2)
    model = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "32", "hadamard", "fp8_e4m3", 0).args[0]
    model = nodes.JensenKVBiasCorrection.execute(model, "taylor", 1.0).args[0]
    frames = 3 * args.chunks
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 4)
    res = loop.run_chunked_ar(
        model,
        wan_tiny.conditioning(1, 16, 32),
        wan_tiny.conditioning(2, 16, 32),
        wan_tiny.video_latent(frames, 16, 16),
        seed=0,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=3,
        window_chunks=args.window,
        sink_chunks=args.sink,
        progress=False,
    )
    config = model.model_options["transformer_options"]["jensen_kv"]
    plan = planner.plan_cache(
        latent_frames=frames,
        latent_height=16,
        latent_width=16,
        chunk_frames=3,
        window_chunks=args.window,
        sink_chunks=args.sink,
        shape=planner.CacheShape(layers=2, heads=12, head_dim=128, geometry=loop.detect(model).geometry),
        precision=planner.CachePrecision(spec_k=config.spec_k, spec_v=config.spec_v),
    )
    written = res.cache_bytes_after_write
    peak = max(written)
    secs = res.denoise_seconds
    early = statistics.median(secs[2:10])
    late = statistics.median(secs[-8:])
    print(f"bounded memory: {args.chunks} chunks, window {args.window} + sink {args.sink}, INT2 g32 QuaRot + Jensen")
    print(
        f"  cache bytes after writes 1..{len(written)}: "
        + " ".join(f"{b / 1024:.0f}" for b in written[:8])
        + f" ... {written[-1] / 1024:.0f} KiB"
    )
    print(
        f"  peak cache {peak:,} B vs planner {plan.quantized_bytes:,} B (ratio {peak / plan.quantized_bytes:.4f}); "
        f"the cache stops growing after chunk {args.window + args.sink}: "
        f"{len(set(written[args.window + args.sink - 1 :]))} distinct sizes since"
    )
    print(
        f"  denoising seconds per chunk, median of chunks 3-10: {early:.3f}; of the last 8: {late:.3f} "
        f"(late / early {late / early:.3f})"
    )


def recache(args, loop, nodes) -> None:
    import comfy.samplers
    import torch

    from jensen_testing import tiny_ar

    tv = tiny_ar.core()
    model = tiny_ar.load_model()
    sigmas = tiny_ar.sigmas(model)
    sampler = comfy.samplers.sampler_object(tiny_ar.SAMPLER)
    import importlib

    ps = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.prompt_schedule")
    switch, chunks = 4, 8
    key_change = {}  # layer -> list of relative changes
    mass, moved = {"on": [], "off": []}, []

    class Watch:
        def __init__(self):
            self.writes, self.first_after = {}, None

        def __call__(self, e):
            if e.phase == "write":
                self.writes.setdefault((e.layer, e.chunk), []).append(e.k.detach().clone())
            elif e.chunk == switch and e.step == 0 and e.layer == 2 and self.first_after is None and e.cache:
                d = e.q.shape[-1]
                ks = torch.cat(
                    [
                        en.k if isinstance(en.k, torch.Tensor) else en.k.dequantize(torch.float32)
                        for en in e.cache.entries
                    ],
                    dim=-2,
                )
                s_c = e.q @ ks.transpose(-1, -2) / d**0.5
                s_n = e.q @ e.k.transpose(-1, -2) / d**0.5
                p = torch.softmax(torch.cat([s_c, s_n], -1), -1)
                self.first_after = float(p[..., : ks.shape[-2]].sum(-1).mean())

    for i, (prompt, vseed) in enumerate(tiny_ar.held_out(args.videos)):
        new_prompt = (prompt + 1) % len(tv.PROMPTS)
        sched = ps.add_to_schedule(
            ps.add_to_schedule(None, tiny_ar.conditioning(prompt), 0, "a"),
            tiny_ar.conditioning(new_prompt),
            switch,
            "b",
        )
        prefix = tv.to_wan_latent(tv.render(tv.make_scene(prompt, vseed), 0, 6)).unsqueeze(0)
        outs = {}
        for mode in ("on", "off"):
            w = Watch()
            res = loop.run_chunked_ar(
                model,
                sched,
                tiny_ar.conditioning(prompt),
                {"samples": torch.zeros(1, 16, 3 * (chunks - 2), 16, 16)},
                seed=i,
                cfg=1.0,
                sampler=sampler,
                sigmas=sigmas,
                chunk_frames=3,
                window_chunks=3,
                prefix={"samples": prefix},
                include_prefix=True,
                recache_on_switch=mode == "on",
                observer=w,
                progress=False,
            )
            outs[mode] = tv.from_wan_latent(res.samples[0])
            mass[mode].append(w.first_after)
            if mode == "on":
                for (layer, _chunk), ks in w.writes.items():
                    if len(ks) == 2:  # written under the old prompt, then re-cached under the new one
                        key_change.setdefault(layer, []).append(float((ks[1] - ks[0]).norm() / ks[0].norm()))
        after = slice(3 * switch, None)
        moved.append(
            float(
                (outs["on"][:, after] - outs["off"][:, after]).square().mean() / outs["off"][:, after].square().mean()
            )
        )
    print(f"re-cache on a prompt switch at chunk {switch} (trained tiny AR model, window 3, {args.videos} videos):")
    for layer in sorted(key_change):
        print(
            f"  layer {layer}: cached keys change by {statistics.fmean(key_change[layer]):.4f} (relative L2) when "
            "re-written under the new prompt"
        )
    print(
        f"  first chunk after the switch, layer 2, step 0: attention mass on the cache "
        f"{statistics.fmean(mass['on']):.4f} with re-cache vs {statistics.fmean(mass['off']):.4f} without"
    )
    print(f"  chunks after the switch: relative MSE between re-cache on and off {statistics.fmean(moved):.4f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    support_comfyui.setup_inprocess_comfyui()
    import importlib

    pack = support_comfyui.import_pack()
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    planner = importlib.import_module(f"{pack.__name__}.jensen_core.planner")
    t0 = time.perf_counter()
    argv_ = argv if argv is not None else sys.argv[1:]
    print(f"`python benchmarks/long_video.py{' ' + shlex.join(argv_) if argv_ else ''}`")
    bounded_memory(args, loop, nodes, planner)
    recache(args, loop, nodes)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
