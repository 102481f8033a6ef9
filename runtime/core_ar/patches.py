"""How a MODEL that carries the pack's settings reaches ComfyUI's own AR video sampler, and never silently not.

The pack's nodes call :func:`attach` on the clone they return. It adds (on that clone only, through
the ModelPatcher, so ComfyUI applies and undoes them with the model's other patches):

- three wrappers, keyed ``jensen_kv_core_ar``:
  ``SAMPLER_SAMPLE`` starts a :class:`CoreARSession` when the sampler is core's ``sample_ar_video``
  (SamplerARVideo), and otherwise refuses to run a sampler that would ignore the settings;
  ``CALC_COND_BATCH`` marks the start and end of each sampler model call (core's ``end`` protocol);
  ``APPLY_MODEL`` tells the session which CFG branches a call batches (``cond_or_uncond``),
  since core's ``forward_block`` passes no ``transformer_options`` to the blocks;
- on a causal model (``CausalWanModel``, with ``init_kv_caches``), object patches on
  ``diffusion_model.init_kv_caches`` (returns the session's small per-layer dicts instead of the
  whole-video K/V), on ``diffusion_model.init_crossattn_caches`` (the text K/V cached per CFG
  branch, so cond and uncond run as separate calls do not share it) and on every ``diffusion_model.blocks.{i}.self_attn.forward`` (reads the pack's
  cache). Both call core's own code unchanged when no session is running, so the same MODEL in the
  pack's Chunked AR sampler, or anywhere else, is untouched by them.

The running session is found through a context variable set by the ``SAMPLER_SAMPLE`` wrapper for
the duration of that one sampling call and reset in ``finally``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import weakref

import torch

from ..config import WINDOW_KEY, CacheWindow, JensenKVConfig, get_config, get_window, set_window
from ..shift_observer import REQUEST_KEY, make_diagnostics
from .session import CoreARGeometry, CoreARProtocolError, CoreARSession, CoreLayerCache

logger = logging.getLogger("jensen_kv")

WRAPPER_KEY = "jensen_kv_core_ar"
INIT_KEY = "diffusion_model.init_kv_caches"
CROSS_INIT_KEY = "diffusion_model.init_crossattn_caches"
SELF_ATTN_KEY = "diffusion_model.blocks.{}.self_attn.forward"

_ACTIVE: contextvars.ContextVar[CoreARSession | None] = contextvars.ContextVar("jensen_kv_core_ar", default=None)
#: the report of the last core-path run of each MODEL (read by KV Cache Report)
_REPORTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

USE_INSTEAD = (
    "Sample it with the pack's Chunked AR Video Sampler, or with SamplerCustom / SamplerCustomAdvanced + "
    "SamplerARVideo on a causal-AR checkpoint (WAN21_CausalAR, ComfyUI v0.27+; tools/convert_checkpoint.py --causal "
    "marks one), or take the MODEL from before the Jensen KV nodes for this sampler."
)


class UnusedSettingsError(RuntimeError):
    """A MODEL with the pack's settings was sent to a sampler that would ignore them."""


def carries_settings(model_options: dict | None) -> bool:
    to = (model_options or {}).get("transformer_options", {})
    return any(to.get(k) is not None for k in ("jensen_kv", REQUEST_KEY, WINDOW_KEY))


def last_report(model_patcher) -> dict | None:
    """The report of the last run of ``model_patcher`` on core's AR path (None if there was none)."""
    return _REPORTS.get(model_patcher)


# ---------------------------------------------------------------------------------------------- model probing
def causal_diffusion_model(model_patcher):
    """The model's ``CausalWanModel``-like diffusion model (has ``init_kv_caches``), else None."""
    dm = getattr(getattr(model_patcher, "model", None), "diffusion_model", None)
    if dm is None or not callable(getattr(dm, "init_kv_caches", None)) or getattr(dm, "blocks", None) is None:
        return None
    return dm


def _is_ar_video(sampler) -> bool:
    fn = getattr(sampler, "sampler_function", None)
    return getattr(fn, "__name__", None) == "sample_ar_video"


def _is_own_loop(model_patcher) -> bool:
    """Whether the pack's own Chunked AR loop patched this clone (its samplings pass through untouched)."""
    from ..families.wan import CachedSelfAttention

    return any(isinstance(p, CachedSelfAttention) for p in getattr(model_patcher, "object_patches", {}).values())


# ---------------------------------------------------------------------------------------------- object patches
class InitKVCaches:
    """Stands in for ``CausalWanModel.init_kv_caches``: the session's small dicts while one runs, else core's."""

    jensen_kv_patch = True

    def __init__(self, dm):
        self.dm = dm

    def __call__(self, batch_size, max_seq_len, device, dtype):
        session = _ACTIVE.get()
        if session is None:
            return type(self.dm).init_kv_caches(self.dm, batch_size, max_seq_len, device, dtype)
        return session.init_caches(int(batch_size), int(max_seq_len))


class InitCrossAttnCaches:
    """Stands in for ``CausalWanModel.init_crossattn_caches``: per-CFG-branch text K/V while a session runs."""

    jensen_kv_patch = True

    def __init__(self, dm):
        self.dm = dm

    def __call__(self, batch_size, device, dtype):
        session = _ACTIVE.get()
        if session is None:
            return type(self.dm).init_crossattn_caches(self.dm, batch_size, device, dtype)
        return session.init_crossattn_caches()


class CoreARSelfAttention:
    """Stands in for ``CausalWanSelfAttention.forward`` of one layer: the pack's cache when core hands it one."""

    jensen_kv_patch = True

    def __init__(self, layer: int, module: torch.nn.Module):
        self.layer, self.module = layer, module

    def __call__(self, x, freqs, kv_cache=None, transformer_options=None):
        if not isinstance(kv_cache, CoreLayerCache):
            return type(self.module).forward(
                self.module,
                x,
                freqs,
                kv_cache=kv_cache,
                transformer_options={} if transformer_options is None else transformer_options,
            )
        from ..families.wan import self_attention_via

        session = kv_cache.session
        labels = session.labels if session.labels is not None else [0]
        # exactly core's q, k, v (RoPE with core's absolute frequencies); the pack's cache instead of core's
        return self_attention_via(self.module, x, freqs, lambda q, k, v: session.attend(self.layer, q, k, v, labels))


class PackAttention:
    """One layer's attention of a running session, for a sequence-parallel composition (runtime/families).

    ``attend(q, k, v, shard)``: q, k, v post-RoPE in SDPA layout for the heads ``shard`` says this rank
    holds (``shard.head_offset`` on, ``shard.ranks`` ranks); the session's store and corrected attention.
    """

    def __init__(self, session: CoreARSession, layer: int):
        self.session, self.layer = session, layer

    @property
    def config(self) -> JensenKVConfig:
        return self.session.config

    def __call__(self, q, k, v, shard):
        session = self.session
        session.use_shard(shard)
        labels = session.labels if session.labels is not None else [0]
        return session.attend(self.layer, q, k, v, labels)


def pack_attention(layer: int, kv_cache) -> PackAttention | None:
    """The pack's attention for ``kv_cache`` when it is a session's (core's AR sampler with the pack), else None."""
    return PackAttention(kv_cache.session, layer) if isinstance(kv_cache, CoreLayerCache) else None


def compose_foreign_attention(model_patcher, *_load_args) -> None:
    """ON_LOAD (and again at session start): wrap a sequence-parallel self-attention another pack put on the blocks.

    ComfyUI runs ON_LOAD callbacks after the object patches, so a pack that injects there (Raylight's
    Ulysses ``usp_causal_ar_self_attn_forward``) replaces the pack's patch; the family's composition
    (runtime/families/wan_raylight.py) goes over it and routes the sharded heads through the session.
    Nothing happens for a MODEL without the pack's settings or without such a forward.
    """
    if not carries_settings(model_patcher.model_options):
        return
    dm = causal_diffusion_model(model_patcher)
    if dm is None:
        return
    from ..families import wan_raylight

    wan_raylight.compose(dm, pack_attention)


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


def _foreign_name(fn) -> str:
    what = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{what} (from {module})"


def _check_patched(dm, patcher) -> None:
    """The model as loaded must carry the pack's patches, and they must not have displaced another pack's.

    A patch another pack put on the module itself (``types.MethodType`` on the instance, as Raylight's
    sequence-parallel patch does) is what ComfyUI backed up when it applied the pack's object patch:
    the pack would silently drop it, so it refuses instead.
    """
    backup = getattr(patcher, "object_patches_backup", {}) or {}
    for i, block in enumerate(dm.blocks):
        old = backup.get(SELF_ATTN_KEY.format(i))
        if getattr(block.self_attn.__dict__.get("forward"), "serves_core_ar", False):
            continue  # a sequence-parallel forward the family's composition routes through the pack's session
        if (
            old is not None
            and not getattr(old, "jensen_kv_patch", False)
            and getattr(old, "__func__", None) is not type(block.self_attn).forward
        ):
            raise UnusedSettingsError(
                f"block {i}'s self-attention carried {_foreign_name(getattr(old, '__func__', old))}, put on the module by "
                "another node pack (e.g. a sequence-parallel patch of CausalWanSelfAttention.forward); the Jensen KV "
                "cache replaces that attention on core's AR path and will not silently drop the other patch. Use one "
                "of the two on this MODEL."
            )
    init = getattr(dm, "init_kv_caches", None)
    if not isinstance(init, InitKVCaches):
        raise UnusedSettingsError(
            f"the causal model's init_kv_caches is {getattr(init, '__qualname__', type(init).__qualname__)}, not the "
            "Jensen KV cache's: another node replaced it, and core's AR sampler would keep its own full-precision cache. "
            "Remove that node or the Jensen KV nodes."
        )
    for i, block in enumerate(dm.blocks):
        fwd = block.self_attn.__dict__.get("forward")
        if not isinstance(fwd, CoreARSelfAttention) and not getattr(fwd, "serves_core_ar", False):
            what = getattr(fwd, "__qualname__", None) or (type(fwd).__qualname__ if fwd is not None else "core's own")
            module = getattr(fwd, "__module__", None) or (type(fwd).__module__ if fwd is not None else "comfy")
            raise UnusedSettingsError(
                f"block {i}'s self-attention runs {what} (from {module}), not the Jensen KV cache's: another node pack "
                "patches the same attention (e.g. a sequence-parallel patch of CausalWanSelfAttention.forward), and the "
                "pack's cache would be ignored there. Use one of the two on this MODEL."
            )


def _sampler_sample_wrapper(
    executor, guider, sigmas, extra_args, callback, noise, latent_image=None, denoise_mask=None, disable_pbar=False
):
    sampler = executor.class_obj
    model_options = (extra_args or {}).get("model_options", {})
    patcher = guider.model_patcher
    if not carries_settings(model_options) or _is_own_loop(patcher):
        return executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
    fn = getattr(getattr(sampler, "sampler_function", None), "__name__", type(sampler).__name__)
    if not _is_ar_video(sampler):
        raise UnusedSettingsError(
            f"this MODEL carries Jensen KV cache settings, but the sampler {fn!r} is not one the pack serves (a plain "
            "sampler denoises the whole video at once and has no KV cache; another pack's AR sampler keeps its own): "
            f"the settings would do nothing. {USE_INSTEAD}"
        )
    dm = causal_diffusion_model(patcher)
    if dm is None:
        raise UnusedSettingsError(
            f"SamplerARVideo needs a causal-AR model (ComfyUI's WAN21_CausalAR / CausalWanModel); this MODEL is "
            f"{type(patcher.model).__name__} ({type(getattr(patcher.model, 'diffusion_model', None)).__name__}). Load a "
            "checkpoint whose metadata marks it causal (tools/convert_checkpoint.py --causal), or use the pack's "
            "Chunked AR Video Sampler, which drives plain Wan 2.1 checkpoints."
        )
    compose_foreign_attention(patcher)
    _check_patched(dm, patcher)
    session = start_session(patcher, model_options, sigmas, noise, sampler)
    token = _ACTIVE.set(session)
    ok = False
    try:
        out = executor(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
        if not session.layers or session.calls == 0:
            raise UnusedSettingsError(
                f"the sampler {fn!r} never asked the model for its KV caches: it bypasses core's init_kv_caches, so the "
                f"Jensen KV settings took no effect. {USE_INSTEAD}"
            )
        ok = True
    finally:
        _ACTIVE.reset(token)
        report = finish_session(session, ok)
        session.free()
        if session.diagnostics is not None:
            session.diagnostics.free()
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
    from ..report import build_report

    g, cfg_branches = session.geometry, max(len(session.run.branches), 1)
    adapter, config = session.adapter, session.config
    generated = g.latent_frames - session.prefix_frames
    planned = None
    if generated >= 1:
        planned = plan_cache(
            latent_frames=generated,
            latent_height=g.latent_height,
            latent_width=g.latent_width,
            chunk_frames=session.block_frames,
            window_chunks=session.window_chunks,
            layers=adapter.num_layers,
            heads=adapter.heads,
            kv_heads=adapter.kv_heads,
            head_dim=adapter.head_dim,
            spec_k=config.spec_k,
            spec_v=config.spec_v,
            cfg_branches=cfg_branches,
            batch=g.batch,
            full_bytes=torch.finfo(session.model_dtype).bits // 8,
            sink_chunks=session.sink_chunks,
            write_last=False,
            prefix_frames=session.prefix_frames,
            geometry=adapter.geometry,
            tiers=config.tiers,
            ranks=session.ranks,
        )
    chunks = session.commits + (1 if session.pending_start is not None or session.pending else 0)
    report = build_report(
        session.run,
        adapter,
        config,
        chunks=chunks,
        chunk_frames=session.block_frames,
        window_chunks=session.window_chunks,
        sink_chunks=session.sink_chunks,
        seconds=[],
        cfg=1.0 if cfg_branches == 1 else 2.0,
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
    report["planned_in_flight_bytes"] = block_in_flight_bytes(
        block_tokens=session.block_frames * g.frame_tokens,
        layers=adapter.num_layers,
        heads=adapter.heads // session.ranks,
        kv_heads=adapter.kv_heads // session.ranks,
        head_dim=adapter.head_dim,
        spec_k=config.spec_k,
        spec_v=config.spec_v,
        cfg_branches=cfg_branches,
        batch=g.batch,
        full_bytes=torch.finfo(session.model_dtype).bits // 8,
        tiers=config.tiers,
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
    model_patcher.remove_callbacks_with_key(pe.CallbacksMP.ON_LOAD, WRAPPER_KEY)
    model_patcher.add_callback_with_key(pe.CallbacksMP.ON_LOAD, WRAPPER_KEY, compose_foreign_attention)
    dm = causal_diffusion_model(model_patcher)
    if dm is None:
        return
    keys = [INIT_KEY, CROSS_INIT_KEY] + [SELF_ATTN_KEY.format(i) for i in range(len(dm.blocks))]
    ours = (InitKVCaches, InitCrossAttnCaches, CoreARSelfAttention)
    foreign = [
        (k, model_patcher.object_patches[k])
        for k in keys
        if k in model_patcher.object_patches and not isinstance(model_patcher.object_patches[k], ours)
    ]
    if foreign:
        key, patch = foreign[0]
        what = getattr(patch, "__qualname__", None) or type(patch).__qualname__
        raise ValueError(
            f"the MODEL already carries an object patch on {key} ({what}), put there by another node pack; the Jensen "
            "KV cache must serve that attention on core's AR path and will not silently drop the other patch. Apply "
            "the Jensen KV nodes to the MODEL before that node's patch is added, or remove one of the two."
        )
    if INIT_KEY not in model_patcher.object_patches:
        model_patcher.add_object_patch(INIT_KEY, InitKVCaches(dm))
    if CROSS_INIT_KEY not in model_patcher.object_patches and callable(getattr(dm, "init_crossattn_caches", None)):
        model_patcher.add_object_patch(CROSS_INIT_KEY, InitCrossAttnCaches(dm))
    for i in range(len(dm.blocks)):
        key = SELF_ATTN_KEY.format(i)
        if key not in model_patcher.object_patches:
            module = model_patcher.get_model_object(f"diffusion_model.blocks.{i}.self_attn")
            model_patcher.add_object_patch(key, CoreARSelfAttention(i, module))


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
