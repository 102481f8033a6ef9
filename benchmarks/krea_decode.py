"""Krea Realtime's re-encoded anchor frame: the decode it costs per chunk, with the decoder's cache kept between
chunks (the pack's stream, ``runtime/vae_stream.py``) against the video decoded again from its first frame (what
the pack did before), side by side in one run.

    python benchmarks/krea_decode.py                    # chunks 4, 8, 16 and 32 of 3 latent frames, 8 x 8 latents
    python benchmarks/krea_decode.py --chunks 4 8 --repeats 3

Before chunk n (of ``--frames`` latent frames each) Krea needs the last pixel frame of latent frame
``n * frames - K`` (K = 3, its ``kv_cache_num_frames``) as a whole decode of the video so far gives it. The stream
decodes each chunk's new frames once; the whole decode decodes ``n * frames - K + 1`` frames every time. ComfyUI's
own Wan 2.1 VAE class with random weights (``jensen_testing.wan_tiny.build_vae``: width 16, or 96 where the VAE
loader fixes it), on the CPU; each figure the fastest of ``--repeats`` rounds. Needs ComfyUI importable.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

K = 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, nargs="+", default=[4, 8, 16, 32], help="the chunks timed")
    ap.add_argument("--frames", type=int, default=3, help="latent frames per chunk (Krea's block: 3)")
    ap.add_argument("--size", type=int, default=8, help="latent height and width")
    ap.add_argument("--repeats", type=int, default=2, help="rounds per figure; the fastest is kept")
    args = ap.parse_args(argv)

    from jensen_testing import comfyui, wan_tiny

    comfyui.setup_inprocess_comfyui()
    vs = importlib.import_module(f"{comfyui.import_pack().__name__}.runtime.vae_stream")
    torch.set_grad_enabled(False)
    vae = wan_tiny.build_vae()
    last = max(args.chunks)
    video = torch.randn(1, 16, last * args.frames, args.size, args.size, generator=torch.Generator().manual_seed(0))

    def anchor(n: int) -> int:
        return n * args.frames - K  # the latent frame re-encoded before chunk n

    stream_s = {n: float("inf") for n in args.chunks}
    whole_s = {n: float("inf") for n in args.chunks}
    for _ in range(args.repeats):
        stream = vs.StreamDecoder(vae)
        for n in range(2, last + 1):  # every chunk that re-encodes, in order, as a run does
            t0 = time.perf_counter()
            got = stream.last_frame(video[:, :, : anchor(n) + 1])
            if n in stream_s:
                stream_s[n] = min(stream_s[n], time.perf_counter() - t0)
                t0 = time.perf_counter()
                p = vae.decode(video[:, :, : anchor(n) + 1])
                whole_s[n] = min(whole_s[n], time.perf_counter() - t0)
                want = p.reshape(1, -1, *p.shape[-3:])[:, -4:]
                assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max()), n  # the same frame
    first = args.chunks[0]
    print(
        f"Krea anchor decode per chunk: ComfyUI's Wan 2.1 VAE class (width {vae.first_stage_model.decoder.head[2].in_channels}, "
        f"random weights), {args.frames} latent frames a chunk, {args.size}x{args.size} latents, K = {K}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fastest of {args.repeats}"
    )
    print(
        f"| chunk | frames decoded (stream / whole) | stream ms | whole-video ms | stream / chunk {first} | "
        f"whole / chunk {first} | whole / stream |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.chunks:
        print(
            f"| {n} | {args.frames} / {anchor(n) + 1} | {stream_s[n] * 1e3:.1f} | {whole_s[n] * 1e3:.1f} | "
            f"{stream_s[n] / stream_s[first]:.2f} | {whole_s[n] / whole_s[first]:.2f} | {whole_s[n] / stream_s[n]:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
