"""The Chunked AR sampler's report: a JSON-ready dict (the JENSEN_KV_REPORT link) and its text."""

from __future__ import annotations

import torch

from ..jensen_core.cache_values import CachePrecision, CacheShape
from ..jensen_core.methods import REGISTRY, RTN, method_of
from .peak_memory import peak_text
from .run_caches import RunCaches

MIB = 2**20


def build_report(
    run: RunCaches,
    shape: CacheShape,
    precision: CachePrecision,
    *,
    correction: str,
    strength: float,
    guard: bool = True,
    chunks: int,
    chunk_frames: int,
    window_chunks: int,
    sink_chunks: int,
    seconds: list[float],
    tokens_per_frame: int,
    model_dtype: torch.dtype,
    first_chunk: int = 0,
    prefix_chunks: int = 0,
    prompts: list | None = None,
    memory_request: dict | None = None,
    planned_bytes: int | None = None,
    state_file_bytes: int | None = None,
    resumed: bool = False,
    peak_memory: dict | None = None,
) -> dict:
    """The report of a run whose caches are ``run``: ``shape`` (the model's layers, heads, head_dim; its
    ``cfg_branches`` counted when no cache was written) and ``precision`` (the specs and tiers) as the caches had
    them, the ``correction`` attention applied at ``strength``, and the run's own facts."""
    spec_k, spec_v, tiers = precision.spec_k, precision.spec_v, precision.tiers
    spec = precision.spec
    full_bits = torch.finfo(model_dtype).bits if model_dtype.is_floating_point else 16
    usage = run.usage
    peak, peak_bf16 = usage.peak_bytes, usage.peak_bf16_bytes
    cfg_branches = len(usage.branches) or shape.cfg_branches
    if peak_bf16:
        effective = 16.0 * peak / peak_bf16
    else:  # nothing was cached (a single chunk): what the specs would give on chunks of this size
        chunk_tokens = chunk_frames * tokens_per_frame

        def bits(s):
            return method_of(s).effective_bits_for(s, shape.head_dim, chunk_tokens) if s is not None else full_bits

        effective = (bits(spec_k) + bits(spec_v)) / 2
    return {
        "cache_bytes": int(peak),
        "bf16_bytes": int(peak_bf16),
        "cache_mib": peak / MIB,
        "bf16_mib": peak_bf16 / MIB,
        "planned_bytes": None if planned_bytes is None else int(planned_bytes),
        "effective_bits": float(effective),
        "chunks": int(chunks),
        "first_chunk": int(first_chunk),
        "prefix_chunks": int(prefix_chunks),
        "resumed": bool(resumed),
        "chunk_frames": int(chunk_frames),
        "window_chunks": int(window_chunks),
        "sink_chunks": int(sink_chunks),
        "seconds_per_chunk": [float(s) for s in seconds],
        "key_bits": spec_k.bits if spec_k else "off",
        "value_bits": spec_v.bits if spec_v else "off",
        "group_size": spec.group_size if spec else None,
        "rotation": spec.rotation if spec else "none",
        "method": spec.method if spec else "rtn",
        **(method_of(spec) if spec else RTN).report_fields(spec),
        **(method_of(spec).report_chunk_fields(spec, chunk_frames * tokens_per_frame) if spec else {}),
        "tiers": None if tiers is None else str(tiers),
        "recent_chunks_bits": tiers.recent_bits if tiers else 0,
        "recent_chunks": tiers.recent_chunks if tiers else 0,
        "sink_bits": tiers.sink_bits if tiers else 0,
        "recent_chunks_key_bits": tiers.recent_side_bits("k") if tiers else 0,
        "chunks_demoted": int(usage.chunks_demoted),
        **_head_bits_fields(run, precision, shape),
        "correction": correction,
        "strength": float(strength),
        "guard": bool(guard),
        "layers": shape.layers,
        "heads": shape.heads,
        "kv_heads": shape.cached_heads,  # what the cache stores per layer (fewer than heads under grouped-query attention)
        "head_dim": shape.head_dim,
        "cfg_branches": cfg_branches,
        "tokens_per_frame": int(tokens_per_frame),
        "prompts": list(prompts or []),
        "memory_request": memory_request,
        "state_file_bytes": None if state_file_bytes is None else int(state_file_bytes),
        "state_file_mib": None if state_file_bytes is None else state_file_bytes / MIB,
        "peak_memory": peak_memory,
    }


def _head_bits_fields(run: RunCaches, precision: CachePrecision, shape: CacheShape) -> dict:
    """Precision by head as the run kept it: the option, and per layer (the first branch written) the K/V heads whose
    keys were stored at the head bits (None for a layer that cached nothing)."""
    hb = getattr(precision, "head_bits", None)
    if hb is None:
        return {"head_bits": "off", "head_fraction": None, "promoted_heads": None}
    by_layer = run.usage.promoted_heads or {}
    return {
        "head_bits": hb.bits,
        "head_fraction": hb.fraction,
        "promoted_heads": [None if layer not in by_layer else list(by_layer[layer]) for layer in range(shape.layers)],
    }


def chunk_words(lengths: list[int] | None, chunk_frames: int) -> str:
    """How long the chunks were, in words that stay true when the first or last one is shorter: " of 5 latent
    frames", or ": 4 of 5 latent frames, the last of 4" (``lengths`` None: every chunk ``chunk_frames`` long)."""

    def frames(n: int) -> str:
        return f"{n} latent frame{'s' if n != 1 else ''}"

    if not lengths or all(n == chunk_frames for n in lengths):
        return f" of {frames(chunk_frames)}"
    if len(lengths) == 1:
        return f" of {frames(lengths[0])}"
    first, middle, last = lengths[0], lengths[1:-1], lengths[-1]
    parts = []
    if first != chunk_frames:
        parts.append(f"the first of {frames(first)}")
    full = len(middle) + (first == chunk_frames) + (last == chunk_frames)
    if full:
        parts.append(f"{full} of {frames(chunk_frames)}")
    if last != chunk_frames:
        parts.append(f"the last of {last}")
    return ": " + ", ".join(parts)


def report_text(report: dict) -> str:
    """One human paragraph for the node's UI."""
    w, s = report["window_chunks"], report.get("sink_chunks", 0)
    window = "all chunks" if w == 0 else f"last {w} chunks" + (f" + first {s} (sink)" if s else "")
    kb, vb = report["key_bits"], report["value_bits"]
    kind = "full-precision" if kb == "off" and vb == "off" else f"K INT{kb}/V INT{vb}".replace("INToff", "full")
    if kind != "full-precision":
        kind = REGISTRY.get(report.get("method"), RTN).report_kind(report, kind)
    if report.get("tiers"):
        tiers = []
        if report.get("recent_chunks_bits"):
            tiers.append(f"newest {report['recent_chunks']} chunk(s) at {report['recent_chunks_bits']} bits")
        if report.get("sink_bits"):
            tiers.append(f"sink at {report['sink_bits']} bits")
        kind += "; " + ", ".join(tiers)
    if report.get("head_bits", "off") != "off":
        kind += (
            f"; keys of the {report['head_fraction']:g} of heads with the largest bias at {report['head_bits']} bits"
        )
    start = report.get("first_chunk", 0)
    made = f"chunks {start}-{start + report['chunks'] - 1}" if start else f"{report['chunks']} chunks"
    lines = [
        f"{made}{chunk_words(report.get('chunk_lengths'), report['chunk_frames'])}, cache window {window}, "
        f"{report['cfg_branches']} CFG branch(es), {report['layers']} layers x {report['heads']} heads x {report['head_dim']}.",
    ]
    if report.get("prefix_chunks"):
        lines.append(f"Continued a prefix clip of {report['prefix_chunks']} chunk(s) written into the cache first.")
    if report.get("resumed"):
        lines.append(f"Continued from a saved KV cache at chunk {start}.")
    prompts = report.get("prompts") or []
    if len(prompts) > 1 or any(p.get("recached_chunks") for p in prompts):
        parts = []
        for p in prompts:
            extra = f", re-cached {p['recached_chunks']} chunk(s)" if p.get("recached_chunks") else ""
            parts.append(f"{p['label']} from chunk {p['start_chunk']}{extra}")
        lines.append("Prompts: " + "; ".join(parts) + ".")
    lines.extend(report.get("recipe_notes") or [])
    if report["bf16_bytes"]:
        ratio = report["bf16_bytes"] / report["cache_bytes"]
        versus = (
            f"{ratio:.2f}x smaller"
            if ratio >= 1
            else f"{1 / ratio:.2f}x larger: the cache keeps the model's {report['effective_bits']:.0f}-bit dtype"
        )
        lines.append(
            f"KV cache peak {report['cache_mib']:.2f} MiB ({kind}, {report['effective_bits']:.3g} bits/element) "
            f"vs {report['bf16_mib']:.2f} MiB in BF16 ({versus})."
        )
    else:
        lines.append("Nothing was cached (a single chunk).")
    if report.get("ranks", 1) > 1:
        lines.append(
            f"Sequence parallel: rank {report['rank']} of {report['ranks']} holds heads {report['head_offset']}-"
            f"{report['head_offset'] + report['heads_per_rank'] - 1} (the peak above is this rank's); all ranks "
            f"together {report['cache_bytes_all_ranks'] / 2**20:.2f} MiB."
        )
    promoted = [p for p in report.get("promoted_heads") or [] if p is not None]
    if promoted:
        shown = "; ".join(
            f"layer {i}: {', '.join(map(str, p))}" for i, p in enumerate(report["promoted_heads"][:4]) if p is not None
        )
        more = " ..." if len(report["promoted_heads"]) > 4 else ""
        lines.append(
            f"Precision by head: {len(promoted[0])} of {report['kv_heads']} K/V head(s) per layer kept their keys at "
            f"{report['head_bits']} bits ({shown}{more})."
        )
    peak = peak_text(report.get("peak_memory"))
    if peak:
        lines.append(peak)
    lines += [f"Warning: {w}." for w in report.get("warnings") or []]
    if report.get("state_file_bytes"):
        lines.append(f"KV cache output: {report['state_file_mib']:.2f} MiB as a file (Save KV Cache).")
    corr = report["correction"]
    unguarded = corr != "off" and not report.get("guard", True)
    lines.append(
        f"Jensen correction: {corr}"
        + (f" x{report['strength']:g}" if corr != "off" else "")
        + (", unguarded." if unguarded else ".")
    )
    secs = report["seconds_per_chunk"]
    if secs:
        lines.append(f"{sum(secs):.1f} s total, {sum(secs) / len(secs):.2f} s per chunk (last {secs[-1]:.2f} s).")
    return "\n".join(lines)
