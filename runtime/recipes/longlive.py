"""LongLive 1.0 (NVlabs/LongLive): Self-Forcing's chunk loop with a frame sink, and its re-cache on a prompt switch.

:class:`LongLiveRecache` is ``_recache_after_switch`` (NVlabs/LongLive 2462895
``pipeline/interactive_causal_inference.py`` 34-96, ``global_sink: true``): the sink keeps the *old* prompt's K/V
and the frames after it are recomputed under the new prompt in one forward. It is the default re-cache of every
pack-loop recipe (``recache_mode="longlive"``); the pack's own ``causal`` re-cache (:mod:`.plain`) re-writes the sink
too and is not LongLive's.
"""

from __future__ import annotations

import logging

import torch

from ..saved_run import RetainedChunk
from .base import ChunkStep
from .plain import SelfForcing, interrupted

logger = logging.getLogger("jensen_kv")


class LongLiveRecache:
    """LongLive's re-cache; ``__call__`` returns how many chunks it re-cached.

    LongLive recomputes its last ``min(local_attn_size, current_start)`` frames in one forward at t = context_noise
    (54-90). Its ``local_attn_size`` is the pack's ``(sink + window + 1) x chunk_frames``
    (:meth:`Retention.from_local_attention`). In that forward (``wan/modules/causal_model.py`` 205-348) every
    recomputed frame attends, with no mask (``attention(...)``, 337-348), to the sink and to every recomputed frame
    that lands in the cache. When the recomputed frames start after frame 0 (``is_recompute``, 230) the sink keeps
    the old prompt's K/V (``write_start_index = max(..., sink_tokens)``, 295) and the frames that would land on it are
    left out, so they change nothing: what is recomputed is the window plus the chunk the next write evicts
    (LongLive's cache holds it until then, the pack's has dropped it). Otherwise (the switch within the first
    ``local_attn_size`` frames, or no window) everything is recomputed, the sink included. Each recomputed chunk is
    stored (and quantized) as its own entry, as a write stores it; ComfyUI keeps no cross-attention cache to reset
    (46-48, 93-96).
    """

    name = "longlive"

    def __call__(self, recipe, job, step: ChunkStep, index: int) -> int:
        run = job.run
        timeline = run.timeline
        kept = list(timeline.items)
        if not kept:
            return 0
        rule, sink = timeline.rule, timeline.sink_held
        chunk_frames = job.request.chunking.chunk_frames
        local_attn_frames = None if rule.window_chunks is None else chunk_frames * (rule.capacity + 1)
        keep_sink = local_attn_frames is not None and step.frame0 > local_attn_frames
        window, e = kept[sink:], run.evicted
        if e is not None and window and e.frame_offset + e.frames == window[0].frame_offset:
            window = [e, *window]
        chunks = window if keep_sink else kept[:sink] + window
        groups: list[list[RetainedChunk]] = []
        for c in chunks:  # consecutive chunks go into one forward (a saved state does not keep the evicted chunk)
            if groups and groups[-1][-1].frame_offset + groups[-1][-1].frames == c.frame_offset:
                groups[-1].append(c)
            else:
                groups.append([c])
        run.empty(keep_sink=keep_sink)
        out = job.out
        for group in groups:
            interrupted()
            clean = torch.cat([c.latent for c in group], dim=2).to(out.device, out.dtype)
            run.joint_write(group, recipe.write_pass(job, group[0].chunk, clean, step.prompt))
        n = sum(len(g) for g in groups)
        job.prompts_report[index]["recached_chunks"] += n
        prompt = job.setup.schedule.prompts[index]
        logger.info(
            "jensen_kv: prompt %r from chunk %d: LongLive re-cache of %d chunk(s) in %d forward(s), sink %s",
            prompt.label,
            prompt.start_chunk,
            n,
            len(groups),
            "kept" if keep_sink else "re-cached",
        )
        return n


class LongLive(SelfForcing):
    """LongLive 1.0: the plain recipe, whose prompt switches always re-cache as LongLive does."""

    name = "longlive"
    label = "LongLive: the plain recipe; a prompt switch keeps the old prompt's sink and recomputes the rest jointly"

    def __init__(self, options, recache=None):
        super().__init__(options, LongLiveRecache())
