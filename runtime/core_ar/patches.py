"""How a MODEL that carries the pack's settings reaches ComfyUI's own AR video sampler, and never silently not.

The pack's nodes call :func:`attach` on the clone they return. It adds (on that clone only, through
the ModelPatcher, so ComfyUI applies and undoes them with the model's other patches):

- three wrappers, keyed ``jensen_kv_core_ar``:
  ``SAMPLER_SAMPLE`` starts a :class:`CoreARSession` when the sampler is core's ``sample_ar_video``
  (SamplerARVideo), and otherwise refuses to run a sampler that would ignore the settings;
  ``CALC_COND_BATCH`` marks the start and end of each sampler model call (core's ``end`` protocol);
  ``APPLY_MODEL`` tells the session which CFG branches a call batches (``cond_or_uncond``),
  since core's ``forward_block`` passes no ``transformer_options`` to the blocks;
- the family's own object patches for core's path, where the model's family has one
  (:meth:`runtime.families.ModelFamily.attach_core_ar`: Wan's replace ``init_kv_caches``,
  ``init_crossattn_caches`` and every block's self-attention). They call core's own code when no session is
  running, so the same MODEL in the pack's Chunked AR sampler, or anywhere else, is untouched by them.

This room knows no model: it asks ``runtime.families`` which family serves core's path on a MODEL, whether a
patch is the pack's own loop's, and whether the family's patches are in place. The running session is found
through a context variable set by the ``SAMPLER_SAMPLE`` wrapper for the duration of that one sampling call and
reset in ``finally``; the family's patches get it as ``active_session``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import weakref
from dataclasses import replace

import torch

from ..config import WINDOW_KEY, CacheWindow, JensenKVConfig, get_config, get_window, set_window
from ..families import UnusedSettingsError, core_ar_family, is_pack_loop
from ..shift_observer import REQUEST_KEY, make_diagnostics
from .session import CoreARGeometry, CoreARProtocolError, CoreARSession

logger = logging.getLogger("jensen_kv")

WRAPPER_KEY = "jensen_kv_core_ar"
_ACTIVE: contextvars.ContextVar[CoreARSession | None] = contextvars.ContextVar("jensen_kv_core_ar", default=None)
#: the report of the last core-path run of each MODEL (read by KV Cache Report)
_REPORTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

USE_INSTEAD = (
    "Sample it with the pack's Chunked AR Video Sampler, or with SamplerCustom / SamplerCustomAdvanced + "
    "SamplerARVideo on a causal-AR checkpoint (WAN21_CausalAR, ComfyUI v0.27+; tools/convert_checkpoint.py --causal "
    "marks one), or take the MODEL from before the Jensen KV nodes for this sampler."
)


def carries_settings(model_options: dict | None) -> bool:
    to = (model_options or {}).get("transformer_options", {})
    return any(to.get(k) is not None for k in ("jensen_kv", REQUEST_KEY, WINDOW_KEY))


def last_report(model_patcher) -> dict | None:
    """The report of the last run of ``model_patcher`` on core's AR path (None if there was none)."""
    return _REPORTS.get(model_patcher)


def sampler_label(sampler) -> str:
    """The sampler as a ComfyUI user names it: "the sampler 'euler'" (KSampler's sampler_name, not k-diffusion's
    ``sample_euler``), or "this sampler" when it has no such name (another pack's sampler object)."""
    name = getattr(getattr(sampler, "sampler_function", None), "__name__", "")
    if name.startswith("sample_") and name != "sample_":
        return f"the sampler {name.removeprefix('sample_')!r}"
    return "this sampler"


def _is_ar_video(sampler) -> bool:
    fn = getattr(sampler, "sampler_function", None)
    return getattr(fn, "__name__", None) == "sample_ar_video"


# ---------------------------------------------------------------------------------------------- wrappers
def _calc_cond_batch_wrapper(executor, model, conds, x_in, timestep, model_options):
    session = _ACTIVE.get()
    ar_state = (model_options or {}).get("transformer_options", {}).get("ar_state")
    if session is None or ar_state is None or ar_state.get("kv_caches") is not session.layers:
        return executor(model, conds, x_in, timestep, model_options)
    session.begin_call()
    out = executor(model, conds, x_in, timestep, model_options)
    session.end_call()
    return out


def _apply_model_wrapper(
    executor, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options=None, **kwargs
):
    session = _ACTIVE.get()
    if session is None:
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
    session.labels = list((transformer_options or {}).get("cond_or_uncond") or [0])
    try:
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
    finally:
        session.labels = None


def _sampler_sample_wrapper(
    executor, guider, sigmas, extra_args, callback, noise, latent_image=None, denoise_mask=None, disable_pbar=False
):
    sampler = executor.class_obj
    model_options = (extra_args or {}).get("model_options", {})
    patcher = guider.model_patcher
    if not carries_settings(model_options) or is_pack_loop(patcher):
        return executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
    fn = sampler_label(sampler)
    if not _is_ar_video(sampler):
        raise UnusedSettingsError(
            f"this MODEL carries Jensen KV cache settings (Quantize KV Cache, Jensen Bias Correction), but {fn} "
            "denoises the whole video at once and keeps no KV cache (KSampler and its samplers do; another pack's AR "
            f"sampler keeps its own cache): the settings would do nothing. {USE_INSTEAD}"
        )
    family = core_ar_family(patcher)
    if family is None:
        raise UnusedSettingsError(
            f"SamplerARVideo needs a causal-AR model (ComfyUI's WAN21_CausalAR / CausalWanModel); this MODEL is "
            f"{type(patcher.model).__name__} ({type(getattr(patcher.model, 'diffusion_model', None)).__name__}). Load a "
            "checkpoint whose metadata marks it causal (tools/convert_checkpoint.py --causal), or use the pack's "
            "Chunked AR Video Sampler, which drives plain Wan 2.1 checkpoints."
        )
    family.check_core_ar_patched(patcher)
    session = start_session(patcher, model_options, sigmas, noise, sampler)
    token = _ACTIVE.set(session)
    ok = False
    try:
        out = executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
        if not session.layers or session.calls == 0:
            raise UnusedSettingsError(
                f"{fn} never asked the model for its KV caches: it bypasses core's init_kv_caches, so the "
                f"Jensen KV settings took no effect. {USE_INSTEAD}"
            )
        ok = True
    finally:
        _ACTIVE.reset(token)
        report = finish_session(session, ok)
        session.free()
    if report is not None:
        _REPORTS[patcher] = report
    return out


def start_session(patcher, model_options: dict, sigmas, noise, sampler) -> CoreARSession:
    from ..families import attention_override_notice, detect

    adapter = detect(patcher)
    notice = attention_override_notice(model_options)
    if notice is not None:
        logger.warning("jensen_kv: %s", notice)
    config = get_config(model_options) or JensenKVConfig()
    config.check_head_dim(adapter.head_dim)
    window = get_window(model_options) or CacheWindow()
    if noise.ndim != 5:
        raise ValueError(f"core's AR sampler needs a 5-D video latent, got shape {tuple(noise.shape)}")
    # whole patches only: core's causal Wan pads a partial patch and does not crop it again, so its sampler
    # would fail deep inside (measured on v0.27 and v0.33); the family's own check names the fix
    adapter.check_latent(noise)
    bs, _, lat_t, lat_h, lat_w = noise.shape
    patch = adapter.geometry.patch  # core's Wan pads the latent to whole patches
    frame_tokens = math.ceil(lat_h / patch[1]) * math.ceil(lat_w / patch[2])
    steps = int(sigmas.shape[-1]) - 1
    diagnostics = make_diagnostics(
        model_options,
        num_layers=adapter.num_layers,
        heads=adapter.heads,
        steps=steps,
        window_chunks=window.window_chunks,
        correction=config.effective_correction,
        strength=config.strength,
        guard=config.guard,
        keys_quantized=config.keys_quantized,
        sink_chunks=window.sink_chunks,
    )
    session = CoreARSession(
        config,
        num_layers=adapter.num_layers,
        window_chunks=window.window_chunks,
        sink_chunks=window.sink_chunks,
        observer=diagnostics,
    )
    session.geometry = CoreARGeometry(
        batch=int(bs),
        frame_tokens=int(frame_tokens),
        latent_frames=int(lat_t),
        latent_height=int(lat_h),
        latent_width=int(lat_w),
    )
    session.diagnostics = diagnostics
    session.adapter = adapter
    session.block_frames = int(getattr(sampler, "extra_options", {}).get("num_frame_per_block", 1))
    to = model_options.get("transformer_options", {})
    initial = (to.get("ar_config") or {}).get("initial_latent")
    session.prefix_frames = int(initial.shape[2]) if initial is not None else 0
    session.model_dtype = patcher.model_dtype()
    logger.info("jensen_kv: core AR sampler with the Jensen KV cache: %s; %s", config.describe(), window.describe())
    return session


def finish_session(session: CoreARSession, ok: bool) -> dict | None:
    """The run's report (same keys as the Chunked AR sampler's where they mean the same), or None after a failure."""
    if not ok:
        return None
    from ...jensen_core.planner import block_in_flight_bytes, plan_cache
    from ..session import base_report

    g, cfg_branches = session.geometry, max(len(session.run.branches), 1)
    adapter, config = session.adapter, session.config
    full_bytes = torch.finfo(session.model_dtype).bits // 8
    shape = replace(
        adapter.cache_shape().for_run(cfg_branches=cfg_branches, batch=g.batch, full_bytes=full_bytes),
        ranks=session.ranks,
    )
    generated = g.latent_frames - session.prefix_frames
    planned = None
    if generated >= 1:
        planned = plan_cache(
            latent_frames=generated,
            latent_height=g.latent_height,
            latent_width=g.latent_width,
            chunk_frames=session.block_frames,
            window_chunks=session.window_chunks,
            shape=shape,
            precision=config.precision,
            sink_chunks=session.sink_chunks,
            write_last=False,
            prefix_frames=session.prefix_frames,
        )
    chunks = session.commits + (1 if session.pending_start is not None or session.pending else 0)
    report = base_report(
        session.run,
        config,
        shape,
        chunks=chunks,
        chunk_frames=session.block_frames,
        window_chunks=session.window_chunks,
        sink_chunks=session.sink_chunks,
        seconds=[],
        tokens_per_frame=g.frame_tokens,
        model_dtype=session.model_dtype,
        planned_bytes=None if planned is None else planned.quantized_bytes,
    )
    report["sampler"] = "core sample_ar_video"
    report["prefix_frames"] = session.prefix_frames
    report["model_calls"] = session.calls
    # the last call's block, held (quantized like the cache, QVG and diagnostics: model dtype) until the next
    # call shows whether it is final; not in cache_bytes / planned_bytes
    report["in_flight_bytes"] = int(session.in_flight_peak_bytes)
    # one rank's heads (a sequence-parallel rank holds heads / ranks of every layer)
    rank_shape = replace(
        shape,
        heads=shape.heads // session.ranks,
        kv_heads=None if shape.kv_heads is None else shape.kv_heads // session.ranks,
        ranks=1,
    )
    report["planned_in_flight_bytes"] = block_in_flight_bytes(
        block_tokens=session.block_frames * g.frame_tokens, shape=rank_shape, precision=config.precision
    )
    if session.diagnostics is not None:
        report["diagnostics"] = session.diagnostics.summary()
    if session.ranks > 1:
        # sequence parallelism: cache_bytes, bf16_bytes and planned_bytes are this rank's; every rank holds as many
        # heads of the same tokens, so all ranks together hold ranks times as much
        report["ranks"], report["rank"] = session.ranks, int(session.shard.rank)
        report["heads_per_rank"], report["head_offset"] = int(session.shard.local_heads), int(session.shard.head_offset)
        report["cache_bytes_all_ranks"] = report["cache_bytes"] * session.ranks
        report["bf16_bytes_all_ranks"] = report["bf16_bytes"] * session.ranks
        report["planned_bytes_all_ranks"] = None if planned is None else planned.quantized_bytes_all_ranks
    logger.info(
        "jensen_kv: core AR run: cache peak %.2f MiB (BF16 would be %.2f MiB), planned %s MiB",
        report["cache_mib"],
        report["bf16_mib"],
        "?" if planned is None or planned.quantized_bytes is None else f"{planned.quantized_bytes / 2**20:.2f}",
    )
    return report


# ---------------------------------------------------------------------------------------------- attach
def attach(model_patcher) -> None:
    """Make a clone that carries the pack's settings serve (or refuse) core's samplers; idempotent.

    Call it on the clone a node returns, after storing the settings. Refuses (ValueError) when
    another pack already patches the causal model's self-attention or ``init_kv_caches``.
    """
    import comfy.patcher_extension as pe

    for kind, fn in (
        (pe.WrappersMP.SAMPLER_SAMPLE, _sampler_sample_wrapper),
        (pe.WrappersMP.CALC_COND_BATCH, _calc_cond_batch_wrapper),
        (pe.WrappersMP.APPLY_MODEL, _apply_model_wrapper),
    ):
        model_patcher.remove_wrappers_with_key(kind, WRAPPER_KEY)
        model_patcher.add_wrapper_with_key(kind, WRAPPER_KEY, fn)
    family = core_ar_family(model_patcher)
    if family is not None:
        family.attach_core_ar(model_patcher, _ACTIVE.get)


__all__ = [
    "CacheWindow",
    "CoreARProtocolError",
    "UnusedSettingsError",
    "attach",
    "carries_settings",
    "get_window",
    "last_report",
    "set_window",
]
