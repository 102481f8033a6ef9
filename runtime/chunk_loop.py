"""The chunk-wise autoregressive loop: ComfyUI's own samplers, one chunk of latent frames at a time.

For every chunk: denoise it with the given SAMPLER and SIGMAS (its self-attention reads the KV cache
of the finished chunks, never writes), then - unless it is the last chunk - write it to the cache
with one extra forward of the clean chunk at the context-noise level (that forward also attends to
the cache, as block-causal attention would). The noise of the whole video comes from
``comfy.sample.prepare_noise`` with the seed and is sliced per chunk, so runs are deterministic.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .cache_run import CacheRun
from .config import JensenKVConfig, get_config, mode_to_correction
from .diagnostics_observer import combine_observers, make_diagnostics
from .families import ModelFamily, detect
from .observer import PHASE_DENOISE, PHASE_WRITE

logger = logging.getLogger("jensen_kv")

MIB = 2**20
_SEED_MASK = 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True)
class ChunkPlan:
    """How a video of ``frames`` latent frames splits into chunks of ``chunk_frames``."""

    frames: int
    chunk_frames: int

    def __post_init__(self) -> None:
        if self.chunk_frames < 1:
            raise ValueError(f"chunk_frames={self.chunk_frames} must be at least 1 latent frame")
        if self.frames < 1:
            raise ValueError(f"the latent has {self.frames} frames; it needs at least one")

    @property
    def chunks(self) -> int:
        return math.ceil(self.frames / self.chunk_frames)

    def bounds(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.chunk_frames, self.frames)) for s in range(0, self.frames, self.chunk_frames)]


@dataclass
class ChunkedARResult:
    """The whole video latent, the report, and per-chunk timings (``denoise_seconds`` excludes the
    cache-writing pass, which the last chunk does not run)."""

    samples: torch.Tensor
    report: dict
    seconds_per_chunk: list[float] = field(default_factory=list)
    denoise_seconds: list[float] = field(default_factory=list)


def _write_once(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """A 'sampler' that runs the model once at ``sigmas[0]`` - the cache-writing forward - and returns x."""
    extra_args = {} if extra_args is None else extra_args
    with torch.no_grad():
        model(x, sigmas[0] * x.new_ones([x.shape[0]]), **extra_args)
    return x


def _validate(latent: dict, sigmas, cfg: float, window_chunks: int, context_noise: float) -> torch.Tensor:
    if not isinstance(latent, dict) or "samples" not in latent:
        raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from EmptyHunyuanLatentVideo")
    samples = latent["samples"]
    if samples.ndim != 5:
        raise ValueError(
            f"the latent has shape {tuple(samples.shape)}; a Wan video latent is (batch, 16, frames, height, width): "
            "make it with EmptyHunyuanLatentVideo (or Wan's image-to-video nodes' latent output)"
        )
    if samples.shape[-1] % 2 or samples.shape[-2] % 2:
        raise ValueError(
            f"latent height {samples.shape[-2]} and width {samples.shape[-1]} must be even (Wan patches 2x2): "
            "use a video width and height that are multiples of 16"
        )
    if latent.get("noise_mask") is not None:
        raise ValueError("the latent carries a noise_mask (inpainting); the Chunked AR sampler does not support masks yet")
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(
            f"SIGMAS must be a 1-D schedule with at least 2 values (one step), got "
            f"{tuple(sigmas.shape) if isinstance(sigmas, torch.Tensor) else type(sigmas).__name__}"
        )
    if window_chunks < 0:
        raise ValueError(f"window_chunks={window_chunks} must be 0 (keep every chunk) or a positive number of chunks")
    if not 0.0 <= context_noise <= 1.0:
        raise ValueError(f"context_noise={context_noise} must be between 0 (clean context) and 1 (pure noise)")
    if not math.isfinite(cfg) or cfg < 0:
        raise ValueError(f"cfg={cfg} must be a non-negative number")
    return samples


def _interrupt_check() -> None:
    import comfy.model_management

    comfy.model_management.throw_exception_if_processing_interrupted()


def build_report(run: CacheRun, adapter: ModelFamily, config: JensenKVConfig, plan: ChunkPlan, *,
                 window_chunks: int, seconds: list[float], cfg: float, tokens_per_frame: int,
                 model_dtype: torch.dtype) -> dict:
    spec = config.spec_k or config.spec_v
    full_bits = torch.finfo(model_dtype).bits if model_dtype.is_floating_point else 16
    branches = run.branches or ([0] if math.isclose(cfg, 1.0) else [0, 1])
    if run.peak_bf16_bytes:
        effective = 16.0 * run.peak_bytes / run.peak_bf16_bytes
    else:  # nothing was cached (a single chunk): what the specs would give on chunks of this size
        chunk_tokens = plan.chunk_frames * tokens_per_frame

        def bits(s):
            return s.effective_bits_for(adapter.head_dim, chunk_tokens) if s is not None else full_bits

        effective = (bits(config.spec_k) + bits(config.spec_v)) / 2
    return {
        "cache_bytes": int(run.peak_bytes),
        "bf16_bytes": int(run.peak_bf16_bytes),
        "cache_mib": run.peak_bytes / MIB,
        "bf16_mib": run.peak_bf16_bytes / MIB,
        "effective_bits": float(effective),
        "chunks": plan.chunks,
        "chunk_frames": plan.chunk_frames,
        "window_chunks": int(window_chunks),
        "seconds_per_chunk": [float(s) for s in seconds],
        "key_bits": config.spec_k.bits if config.spec_k else "off",
        "value_bits": config.spec_v.bits if config.spec_v else "off",
        "group_size": spec.group_size if spec else None,
        "rotation": spec.rotation if spec else "none",
        "method": spec.method if spec else "rtn",
        "qvg_stages": spec.qvg_stages if spec and spec.method == "qvg" else None,
        "qvg_centroids": spec.qvg_centroids if spec and spec.method == "qvg" else None,
        "correction": mode_to_correction(config.effective_correction),
        "strength": float(config.strength),
        "layers": adapter.num_layers,
        "heads": adapter.heads,
        "head_dim": adapter.head_dim,
        "cfg_branches": len(branches),
        "tokens_per_frame": int(tokens_per_frame),
    }


def report_text(report: dict) -> str:
    """One human paragraph for the node's UI."""
    window = "all chunks" if report["window_chunks"] == 0 else f"last {report['window_chunks']} chunks"
    kb, vb = report["key_bits"], report["value_bits"]
    kind = "full-precision" if kb == "off" and vb == "off" else f"K INT{kb}/V INT{vb}".replace("INToff", "full")
    if report.get("method") == "qvg" and kind != "full-precision":
        kind = f"QVG S={report['qvg_stages']} K={report['qvg_centroids']}, {kind} residual"
    lines = [
        f"{report['chunks']} chunks of {report['chunk_frames']} latent frames, cache window {window}, "
        f"{report['cfg_branches']} CFG branch(es), {report['layers']} layers x {report['heads']} heads x {report['head_dim']}.",
    ]
    if report["bf16_bytes"]:
        ratio = report["bf16_bytes"] / report["cache_bytes"]
        versus = (f"{ratio:.2f}x smaller" if ratio >= 1 else
                  f"{1 / ratio:.2f}x larger: the cache keeps the model's {report['effective_bits']:.0f}-bit dtype")
        lines.append(
            f"KV cache peak {report['cache_mib']:.2f} MiB ({kind}, {report['effective_bits']:.3g} bits/element) "
            f"vs {report['bf16_mib']:.2f} MiB in BF16 ({versus})."
        )
    else:
        lines.append("Nothing was cached (a single chunk).")
    corr = report["correction"]
    lines.append(f"Jensen correction: {corr}" + (f" x{report['strength']:g}." if corr != "off" else "."))
    secs = report["seconds_per_chunk"]
    if secs:
        lines.append(f"{sum(secs):.1f} s total, {sum(secs) / len(secs):.2f} s per chunk (last {secs[-1]:.2f} s).")
    return "\n".join(lines)


def run_chunked_ar(model, positive, negative, latent: dict, *, seed: int, cfg: float, sampler, sigmas: torch.Tensor,
                   chunk_frames: int, window_chunks: int = 0, context_noise: float = 0.0, observer=None,
                   step_callback: Callable[[int, int, int], None] | None = None,
                   progress: bool = True) -> ChunkedARResult:
    """Sample a whole Wan video chunk by chunk with a (quantized) KV cache.

    ``model`` is never modified: the patches go on a clone that lives for this call only and are
    removed, and the cache freed, in ``finally`` (after success, an exception or an interrupt).
    ``context_noise`` is the noise level of the cache-writing forward as a fraction of the model's
    maximum sigma (Wan's flow matching has sigma_max = 1, so it *is* the sigma: 0 = clean).
    ``step_callback(chunk, step, steps)`` runs after every denoising step (tests, UIs).
    """
    import comfy.sample
    import comfy.samplers
    import comfy.utils

    samples = _validate(latent, sigmas, cfg, window_chunks, context_noise)
    adapter = detect(model)
    config = get_config(model.model_options) or JensenKVConfig()
    config.check_head_dim(adapter.head_dim)
    for name, cond in (("positive", positive), ("negative", negative)):
        if not isinstance(cond, list) or len(cond) != 1:
            raise ValueError(
                f"{name} conditioning has {len(cond) if isinstance(cond, list) else type(cond).__name__} entries; the "
                "Chunked AR sampler keeps one KV cache per CFG branch and needs exactly one: merge them with "
                "ConditioningConcat or ConditioningAverage"
            )

    latent_image = comfy.sample.fix_empty_latent_channels(model, samples)
    if latent_image.shape[1] != 16:
        raise ValueError(f"the latent has {latent_image.shape[1]} channels; Wan 2.1 latents have 16")
    batch_inds = latent.get("batch_index")
    noise = comfy.sample.prepare_noise(latent_image, seed, batch_inds)
    plan = ChunkPlan(latent_image.shape[2], chunk_frames)
    bounds = plan.bounds()
    steps = sigmas.numel() - 1
    sigma_max = float(model.get_model_object("model_sampling").sigma_max)
    ctx_sigma = float(context_noise) * sigma_max
    write_sigmas = torch.tensor([ctx_sigma, 0.0], dtype=torch.float32)
    if ctx_sigma > 0:
        ctx_noise = comfy.sample.prepare_noise(latent_image, (seed + 1) & _SEED_MASK, batch_inds)
    else:
        ctx_noise = torch.zeros_like(latent_image)
    write_sampler = comfy.samplers.KSAMPLER(_write_once)
    tokens_per_frame = (latent_image.shape[-2] // 2) * (latent_image.shape[-1] // 2)

    diagnostics = make_diagnostics(model.model_options, num_layers=adapter.num_layers, heads=adapter.heads,
                                   steps=steps, window_chunks=window_chunks, correction=config.effective_correction,
                                   strength=config.strength, keys_quantized=config.keys_quantized)
    run = CacheRun(config, window_chunks, adapter.num_layers, observer=combine_observers(observer, diagnostics))
    work = model.clone()
    out = latent_image.clone()
    seconds: list[float] = []
    denoise_seconds: list[float] = []
    pbar = comfy.utils.ProgressBar(plan.chunks * steps) if progress else None
    try:
        adapter.install(work, run)
        for c, (f0, f1) in enumerate(bounds):
            _interrupt_check()
            t0 = time.perf_counter()
            run.begin(c, f0, PHASE_DENOISE)

            def on_step(step, x0, x, total, _c=c):
                run.step = step + 1
                if pbar is not None:
                    pbar.update_absolute(_c * steps + step + 1)
                if step_callback is not None:
                    step_callback(_c, step, steps)
                _interrupt_check()

            chunk = comfy.sample.sample_custom(
                work, noise[:, :, f0:f1], cfg, sampler, sigmas, positive, negative, latent_image[:, :, f0:f1],
                callback=on_step, disable_pbar=True, seed=seed,
            )
            out[:, :, f0:f1] = chunk.to(out.dtype)
            denoise_seconds.append(time.perf_counter() - t0)
            if c < plan.chunks - 1:
                _interrupt_check()
                run.begin(c, f0, PHASE_WRITE)
                comfy.sample.sample_custom(
                    work, ctx_noise[:, :, f0:f1], cfg, write_sampler, write_sigmas, positive, negative,
                    out[:, :, f0:f1], disable_pbar=True, seed=seed,
                )
                run.end_write()
            seconds.append(time.perf_counter() - t0)
            logger.debug("jensen_kv: chunk %d/%d (frames %d-%d) took %.3f s", c + 1, plan.chunks, f0, f1 - 1, seconds[-1])
    finally:
        adapter.remove(work)
        run.free()
        if diagnostics is not None:
            diagnostics.free()
    report = build_report(run, adapter, config, plan, window_chunks=window_chunks, seconds=seconds, cfg=cfg,
                          tokens_per_frame=tokens_per_frame, model_dtype=model.model_dtype())
    if diagnostics is not None:
        report["diagnostics"] = diagnostics.summary()
    return ChunkedARResult(samples=out, report=report, seconds_per_chunk=seconds, denoise_seconds=denoise_seconds)
