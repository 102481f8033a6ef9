"""Projected KV-cache size of a chunk-wise autoregressive video run, before anything runs.

One source for the numbers the UI shows: the web extension asks the server, which calls
:func:`plan_cache`. The byte counts are exact for the cache :class:`ChunkCache` keeps (packed
codes + scales + zero-points per token and group; for QVG also the centroids and cluster ids of
every chunk, which depend on the tokens per chunk).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .cache import chunk_bytes
from .cache_values import CachePrecision, CacheShape
from .geometry import LatentGeometry as LatentGeometry  # re-exported: callers build the geometry from here
from .head_bits import HeadBits, head_bits_key_bytes
from .methods import method_of
from .retention import Retention
from .spec import QuantSpec
from .tiers import AgeTiers

#: bytes per element of the clean latents a saved run state keeps (float32)
STATE_LATENT_BYTES = 4


@dataclass(frozen=True)
class CachePlan:
    latent_frames: int
    tokens_per_latent_frame: int
    chunks: int
    cached_chunks_peak: int
    cached_tokens_peak: int
    bf16_bytes: int
    quantized_bytes: int | None  # None when ``errors`` say the run cannot start
    effective_bits_k: float
    effective_bits_v: float
    effective_bits: float
    compression: float
    warnings: tuple[str, ...]
    errors: tuple[str, ...] = ()
    #: what Save KV Cache writes when the sampler hands its cache on: the cache at the end of the run
    #: (last chunk included) plus the clean fp32 latents of the chunks it holds; None when it cannot run
    state_file_bytes: int | None = None
    sink_chunks: int = 0
    #: the age tiers' string form (``"recent2@4+sink@8"``), None without them
    tiers: str | None = None
    #: bits of each chunk held at the peak, oldest first, keys and values (0 = kept in the model's dtype)
    chunk_bits_k: tuple[int, ...] = ()
    chunk_bits_v: tuple[int, ...] = ()
    #: sequence-parallel ranks sharing every layer's heads (Ulysses): the byte counts above are one rank's,
    #: these two every rank's together (each rank holds ``heads / ranks`` heads of every token)
    ranks: int = 1
    bf16_bytes_all_ranks: int = 0
    quantized_bytes_all_ranks: int | None = None
    #: precision by head's string form (``"0.25@4"``: a quarter of the heads' keys at 4 bits), None without it
    head_bits: str | None = None
    #: K/V heads per layer (per rank) whose keys are kept at the head bits (0 without precision by head)
    promoted_heads: int = 0

    @property
    def runnable(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        d["chunk_bits_k"] = list(self.chunk_bits_k)
        d["chunk_bits_v"] = list(self.chunk_bits_v)
        d["errors"] = list(self.errors)
        d["runnable"] = self.runnable
        d["bf16_mib"] = self.bf16_bytes / 2**20
        d["quantized_mib"] = None if self.quantized_bytes is None else self.quantized_bytes / 2**20
        d["state_file_mib"] = None if self.state_file_bytes is None else self.state_file_bytes / 2**20
        return d


def head_dim_problems(spec_k: QuantSpec | None, spec_v: QuantSpec | None, head_dim: int) -> list[str]:
    """What stops a cache with these specs from holding ``head_dim``-wide heads (one line per distinct problem)."""
    found: dict[str, list[str]] = {}
    for side, spec in (("key", spec_k), ("value", spec_v)):
        if spec is None:
            continue
        try:
            spec.check_head_dim(head_dim)
        except ValueError as exc:
            found.setdefault(str(exc), []).append(side)
    return [f"{' and '.join(sides)} cache: {msg}" for msg, sides in found.items()]


def check_kv_heads(heads: int, kv_heads: int | None) -> int:
    """The K/V heads of an attention with ``heads`` query heads (None: as many); a ValueError unless they divide."""
    if kv_heads is None:
        return heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"kv_heads={kv_heads!r} must be a whole number >= 1 that divides heads={heads} (grouped-query attention: "
            "each K/V head serves heads / kv_heads query heads); leave it unset when there are as many K/V heads"
        )
    return kv_heads


def _check_values(shape: CacheShape, precision: CachePrecision, fn: str) -> None:
    """``shape`` must be a :class:`CacheShape` and ``precision`` a :class:`CachePrecision` (TypeError otherwise)."""
    if not isinstance(shape, CacheShape) or not isinstance(precision, CachePrecision):
        raise TypeError(
            f"{fn}(): shape must be a CacheShape and precision a CachePrecision, got {type(shape).__name__} and "
            f"{type(precision).__name__}"
        )


def plan_cache(
    *,
    latent_frames: int,
    latent_height: int,
    latent_width: int,
    chunk_frames: int,
    window_chunks: int,
    shape: CacheShape,
    precision: CachePrecision,
    sink_chunks: int = 0,
    write_last: bool = False,
    prefix_frames: int = 0,
) -> CachePlan:
    """Peak bytes of the cache over a run (every layer and CFG branch, keys and values).

    ``heads`` are the attention's query heads and ``kv_heads`` its K/V heads (grouped-query attention:
    fewer K/V heads, ``heads`` a multiple of them; None: as many as ``heads``). The cache holds K/V
    heads only, so every byte here counts ``kv_heads``.

    The last chunk is written to the cache only when the run hands its cache on (``write_last``:
    the sampler's KV cache output is connected); otherwise nothing reads it. With a window the peak
    holds ``min(sink + window, written chunks)`` chunks: the first ``sink_chunks`` stay for good,
    the last ``window_chunks`` roll. ``prefix_frames`` latent frames of an existing clip are
    prefilled into the cache as chunks before the ``latent_frames`` to generate. Each chunk holds
    ``chunk_frames`` latent frames (QVG stores a centroid table per chunk, layer, branch, batch item
    and head). ``geometry`` is the model family's latent layout (tokens per latent frame, latent
    channels of the saved clean latents). ``full_bytes`` is the element size of a side that is not
    quantized (the cache keeps it in the model's dtype: 2 for BF16/FP16 models, 4 for FP32).
    Problems come back for the UI to show rather than as exceptions: ``errors`` would stop the run
    (then ``quantized_bytes`` is None), ``warnings`` are surprises that would not.

    ``tiers`` (:class:`~jensen_core.tiers.AgeTiers`) counts each held chunk at its own bits: the sink
    and the newest chunks at the tiers' bits, the rest at the specs'. The effective bits are then the
    average over the chunks held at the peak.

    ``ranks``: sequence-parallel ranks that share every layer's heads (Raylight's Ulysses degree); each
    holds ``heads / ranks`` heads of every cached token, so ``bf16_bytes`` and ``quantized_bytes`` are
    one rank's and ``*_all_ranks`` the sum (a head count that does not divide by ``ranks`` is an error);
    ``state_file_bytes`` stays the single-process file's (Save KV Cache runs on one GPU).

    The model's and the run's facts come as ``shape`` (:class:`~jensen_core.cache_values.CacheShape`: layers,
    heads, kv_heads, head_dim, geometry, cfg_branches, batch, full_bytes, ranks) and the storage as ``precision``
    (:class:`~jensen_core.cache_values.CachePrecision`: spec_k, spec_v, tiers): one signature.
    """
    _check_values(shape, precision, "plan_cache")
    layers, heads, head_dim, geometry = shape.layers, shape.heads, shape.head_dim, shape.geometry
    cfg_branches, batch, full_bytes, ranks = shape.cfg_branches, shape.batch, shape.full_bytes, shape.ranks
    kv_heads = shape.kv_heads
    spec_k, spec_v, tiers = precision.spec_k, precision.spec_v, precision.tiers
    for name, v in (("latent_frames", latent_frames), ("chunk_frames", chunk_frames)):
        if v < 1:
            raise ValueError(f"{name}={v} must be at least 1")
    kv_heads = shape.cached_heads
    if window_chunks < 0:
        raise ValueError(f"window_chunks={window_chunks} must be 0 (all) or positive")
    if sink_chunks < 0 or prefix_frames < 0:
        raise ValueError(f"sink_chunks={sink_chunks} and prefix_frames={prefix_frames} must be 0 or positive")
    warnings: list[str] = []
    tokens_per_frame = shape.tokens_per_frame(latent_height, latent_width)
    prefix_chunks = math.ceil(prefix_frames / chunk_frames)
    chunks = math.ceil(latent_frames / chunk_frames)
    written = prefix_chunks + chunks - (0 if write_last else 1)
    retention = Retention(window_chunks, sink_chunks)
    held = retention.count(written)  # chunks never leave faster than they come: the end of the run is the peak
    if window_chunks and window_chunks + sink_chunks >= prefix_chunks + chunks:
        warnings.append(
            f"window of {window_chunks} chunks{f' plus a sink of {sink_chunks}' if sink_chunks else ''} is not "
            f"smaller than the video's {prefix_chunks + chunks} chunks: every chunk stays cached (same as window 0)"
        )
    if sink_chunks and not window_chunks:
        warnings.append(f"sink of {sink_chunks} chunks has no effect without a window: every chunk stays cached")
    if latent_frames % chunk_frames:
        warnings.append(
            f"{latent_frames} latent frames do not split into chunks of {chunk_frames}: the last chunk has "
            f"{latent_frames % chunk_frames} frame(s)"
        )
    errors = head_dim_problems(spec_k, spec_v, head_dim)
    if heads % ranks or kv_heads % ranks:
        what = f"{heads} heads" + (f" ({kv_heads} K/V heads)" if kv_heads != heads else "")
        errors.append(f"{what} do not divide by {ranks} ranks: each rank must hold whole heads")
    # tokens of each held chunk (a short last chunk is counted full: an upper bound by < one chunk)
    chunk_tokens = chunk_frames * tokens_per_frame
    held_tokens = held * chunk_tokens
    per_side = held_tokens * kv_heads * head_dim * layers * cfg_branches * batch
    bf16 = 2 * per_side * 2
    lead = batch * kv_heads

    def held_specs(n: int, sink_held: int) -> list[tuple[QuantSpec | None, QuantSpec | None]]:
        """The (key, value) spec of each of ``n`` held chunks, oldest first."""
        if tiers is None:
            return [(spec_k, spec_v)] * n
        return list(zip(tiers.specs_for(spec_k, n, sink_held, "k"), tiers.specs_for(spec_v, n, sink_held, "v")))

    head_bits = precision.head_bits
    rank_heads = kv_heads // ranks if kv_heads % ranks == 0 else kv_heads

    def one_chunk(pair: tuple[QuantSpec | None, QuantSpec | None]) -> int:
        """Bytes of one held chunk of one (layer, branch) cache, every rank's."""
        if head_bits is None or pair[0] is None:
            return chunk_bytes(*pair, lead, chunk_tokens, head_dim, full_bytes=full_bytes)
        # precision by head: each rank's caches keep count(its heads) of them at the head bits
        keys = ranks * head_bits_key_bytes(pair[0], head_bits, batch, rank_heads, chunk_tokens, head_dim)
        return keys + chunk_bytes(pair[1], pair[1], lead, chunk_tokens, head_dim, full_bytes=full_bytes) // 2

    def held_bytes(n: int, sink_held: int) -> int:
        """Bytes of ``n`` held chunks of one (layer, branch) cache: each chunk at its own specs."""
        sizes: dict[tuple, int] = {}
        total = 0
        for pair in held_specs(n, sink_held):
            if pair not in sizes:
                sizes[pair] = one_chunk(pair)
            total += sizes[pair]
        return total

    peak_specs = held_specs(held, retention.sink_held(written))
    quant = None if errors else layers * cfg_branches * held_bytes(held, retention.sink_held(written))
    total_chunks = prefix_chunks + chunks
    end_held = retention.count(total_chunks)
    latents = (
        end_held * chunk_frames * latent_height * latent_width * geometry.latent_channels * batch * STATE_LATENT_BYTES
    )
    state_file = (
        None if errors else layers * cfg_branches * held_bytes(end_held, retention.sink_held(total_chunks)) + latents
    )

    def spec_bits(spec: QuantSpec | None) -> float:
        if spec is None:
            return 8.0 * full_bytes
        return spec.effective_bits if errors else method_of(spec).effective_bits_for(spec, head_dim, chunk_tokens)

    def side_bits(spec: QuantSpec | None, side: int) -> float:
        """The side's stored bits per element: its spec's, or under tiers the average over the peak's chunks (under
        precision by head, the keys' average over the heads)."""
        if head_bits is not None and side == 0 and spec is not None:
            if errors:
                n = head_bits.count(rank_heads)
                return (
                    n * head_bits.spec_for(spec).effective_bits + (rank_heads - n) * spec.effective_bits
                ) / rank_heads
            return head_bits.key_bits_mean(spec, rank_heads, head_dim, chunk_tokens)
        if tiers is None or not peak_specs:
            return spec_bits(spec)
        return sum(spec_bits(pair[side]) for pair in peak_specs) / len(peak_specs)

    ebk, ebv = side_bits(spec_k, 0), side_bits(spec_v, 1)
    eb = (ebk + ebv) / 2
    if tiers is not None:
        warnings.extend(_tier_warnings(tiers, spec_k, spec_v, retention, held, peak_specs))
    if head_bits is not None:
        warnings.extend(_head_bits_warnings(head_bits, rank_heads))
    for side, spec in (("key", spec_k), ("value", spec_v)):
        if spec is not None and not errors:
            warnings.extend(method_of(spec).plan_warnings(spec, side, chunk_tokens))
    return CachePlan(
        latent_frames=latent_frames,
        tokens_per_latent_frame=tokens_per_frame,
        chunks=chunks,
        cached_chunks_peak=held,
        cached_tokens_peak=held_tokens,
        bf16_bytes=bf16 // ranks,
        quantized_bytes=None if quant is None else quant // ranks,
        state_file_bytes=state_file,
        sink_chunks=sink_chunks,
        effective_bits_k=ebk,
        effective_bits_v=ebv,
        effective_bits=eb,
        compression=16.0 / eb,
        warnings=tuple(warnings),
        errors=tuple(errors),
        tiers=None if tiers is None else str(tiers),
        chunk_bits_k=tuple(0 if k is None else k.bits for k, _ in peak_specs),
        chunk_bits_v=tuple(0 if v is None else v.bits for _, v in peak_specs),
        ranks=ranks,
        bf16_bytes_all_ranks=bf16,
        quantized_bytes_all_ranks=quant,
        head_bits=None if head_bits is None else str(head_bits),
        promoted_heads=0 if head_bits is None else head_bits.count(rank_heads),
    )


def _head_bits_warnings(head_bits: HeadBits, kv_heads: int) -> list[str]:
    """Precision by head that promotes every head: the same as uniform keys at the head bits."""
    if head_bits.count(kv_heads) == kv_heads:
        return [
            f"head_fraction {head_bits.fraction:g} of {kv_heads} K/V head(s) keeps every head's keys at "
            f"{head_bits.bits} bits: the same as key_bits {head_bits.bits}"
        ]
    return []


def _tier_warnings(
    tiers: AgeTiers,
    spec_k: QuantSpec | None,
    spec_v: QuantSpec | None,
    retention: Retention,
    held: int,
    peak_specs: list,
) -> list[str]:
    """Age tiers that change nothing, or everything."""
    out = []
    sides = [(side, s.bits) for side, s in (("k", spec_k), ("v", spec_v)) if s is not None]
    if not sides:
        return ["age tiers have no effect: neither keys nor values are quantized"]
    if all(max(tiers.recent_side_bits(side), tiers.sink_bits) <= b for side, b in sides):
        out.append(
            f"age tiers {str(tiers)!r} keep no chunk at more bits than the cache's "
            f"INT{max(b for _, b in sides)}: they change nothing"
        )
    for side, base in sides:
        high = tiers.recent_side_bits(side)
        if base < high < 8 and (2**high - 1) % (2**base - 1):
            name = "keys" if side == "k" else "values"
            out.append(
                f"{name} at INT{base} with a {high}-bit recent tier: a {high}-bit grid does not nest in a {base}-bit "
                f"one, so requantizing an aging chunk adds to its reconstruction error (4 over INT3: about 40%, "
                "benchmarks/tiers.py); use 8 bits, or 4 over INT2"
            )
    if tiers.sink_bits and not retention.sink_chunks:
        out.append(f"sink_bits={tiers.sink_bits} has no effect without a sink (sink_chunks 0)")
    base = [(spec.bits, side) for side, spec in enumerate((spec_k, spec_v)) if spec is not None]
    if held and peak_specs and all(pair[side].bits > b for pair in peak_specs for b, side in base):
        out.append(
            f"age tiers {str(tiers)!r} keep all {held} chunks the cache holds above the cache's bits (the recent "
            "tier and the sink cover the window): the same as a uniform cache at the tiers' bits"
        )
    return out


def block_in_flight_bytes(
    *,
    block_tokens: int,
    shape: CacheShape,
    precision: CachePrecision,
) -> int:
    """Bytes of the block a run on ComfyUI core's AR sampler holds until the next model call says it is final.

    One block of ``block_tokens`` per layer and CFG branch, stored as the cache will store it; a QVG
    side waits in the model's precision (``full_bytes``: its k-means runs once, at commit). Add it to
    :func:`plan_cache`'s ``quantized_bytes`` for the run's peak on that path. Under age tiers the block
    is held at the newest chunk's bits (a sink chunk's while the sink fills): the higher tier's bits here.
    ``kv_heads`` as in :func:`plan_cache` (the block holds K/V heads); ``shape`` and ``precision`` as there.
    """
    _check_values(shape, precision, "block_in_flight_bytes")
    spec_k, spec_v, tiers = precision.spec_k, precision.spec_v, precision.tiers
    layers, cfg_branches, batch, kv_heads = shape.layers, shape.cfg_branches, shape.batch, shape.cached_heads
    head_dim, full_bytes = shape.head_dim, shape.full_bytes
    if tiers is not None:
        spec_k, spec_v = (
            None if s is None else tiers.spec_at(s, tiers.newest_bits(s.bits, side, bool(tiers.sink_bits)))
            for side, s in (("k", spec_k), ("v", spec_v))
        )
    early = all(s is None or method_of(s).quantizes_early for s in (spec_k, spec_v))
    k, v = (spec_k, spec_v) if early else (None, None)
    head_bits = precision.head_bits
    if head_bits is not None and k is not None:  # the block is prepared with the promoted heads' keys at more bits
        keys = head_bits_key_bytes(k, head_bits, batch, kv_heads, block_tokens, head_dim)
        values = chunk_bytes(v, v, batch * kv_heads, block_tokens, head_dim, full_bytes=full_bytes) // 2
        return layers * cfg_branches * (keys + values)
    return layers * cfg_branches * chunk_bytes(k, v, batch * kv_heads, block_tokens, head_dim, full_bytes=full_bytes)
