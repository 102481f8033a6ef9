"""Raylight's Ulysses sequence parallelism on core's causal Wan, with the pack's cache for each rank's heads.

Raylight (komikndr/raylight) runs ComfyUI's own model and core's ``sample_ar_video`` in Ray actors,
one per GPU. For ``WAN21_CausalAR`` its ON_LOAD callback (``USPInjectRegistry.inject``) puts
``usp_causal_ar_self_attn_forward`` on every block's ``self_attn.forward`` (``types.MethodType`` on
the instance, after ComfyUI applied the pack's object patches, so the pack's attention is replaced).
``usp_causal_ar_forward_block`` hands each rank a shard of the block's tokens (zero-padded to a
multiple of the rank count) with all heads, and ``transformer_options["usp_ar_block_seq_len"]``,
the block's real token count.

:func:`compose` puts :class:`UlyssesSelfAttention` over Raylight's forward, for a MODEL that carries
the pack's settings. While a pack session serves core's AR sampler it:

1. computes q, k, v of the rank's token shard exactly as Raylight does (projections, RMS norms, RoPE);
2. sends them through one Ulysses all-to-all (yunchang's, over Raylight's Ulysses process group): each
   rank then holds every token of the block for ``heads / N`` heads (rank r: heads ``[r H/N, (r+1) H/N)``);
3. drops Raylight's zero padding (the tokens past ``usp_ar_block_seq_len``), which Raylight itself
   caches and attends;
4. attends with the pack's session (its quantized store and corrected attention, exactly the
   single-GPU code, on this rank's heads; the caches know their global first head);
5. pads the output back and returns it through the inverse all-to-all, then the output projection.

Only the current block crosses ranks; the quantized cache never does. Every rank holds ``1/N`` of
the cache. RTN groups, the Hadamard signs and every correction mode are per head, so the result
equals the single-process pack; rank 0 chooses the Taylor correction's kernel layout and the other
ranks adopt it (:func:`agree_taylor_layout`), so every rank runs the same kernel.

Refused (:class:`RaylightCompositionError`), because not exact: Ring degree > 1 (a Ring rank holds a
sequence shard of each head's keys, so ``chunk_mean`` / ``per_channel`` statistics would need an
all-reduce); a call without ``usp_ar_block_seq_len`` (padding cannot be told from tokens); a head
count that does not divide by the Ulysses degree. Anything else (no pack session, Raylight's other
calls) runs Raylight's own forward. xfuser, yunchang and Raylight are imported only when a sharded
call runs: without them this module is never imported past its top.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

logger = logging.getLogger("jensen_kv")

#: where Raylight's causal-AR self-attention lives, and its name (read off Raylight c0495710)
RAYLIGHT_MODULE = "raylight.diffusion_models.wan.xdit_context_parallel"
RAYLIGHT_SELF_ATTN = "usp_causal_ar_self_attn_forward"
#: the block's real (unpadded) token count that Raylight's ``usp_causal_ar_forward_block`` sets
SEQ_LEN_KEY = "usp_ar_block_seq_len"


class RaylightCompositionError(RuntimeError):
    """The pack cannot serve this sequence-parallel call exactly (the message names what and the fix)."""


def is_raylight_forward(fwd) -> bool:
    """Whether ``fwd`` is Raylight's causal-AR self-attention bound to a module (as its injection puts it)."""
    fn = getattr(fwd, "__func__", None)
    return getattr(fn, "__module__", None) == RAYLIGHT_MODULE and getattr(fn, "__name__", None) == RAYLIGHT_SELF_ATTN


@dataclass(frozen=True)
class HeadShard:
    """This rank's share of one layer's heads under Ulysses: rank ``rank`` of ``ranks`` holds ``heads / ranks``."""

    ranks: int
    rank: int
    heads: int
    group: object = field(default=None, compare=False, repr=False)
    use_sync: bool = field(default=False, compare=False, repr=False)

    @property
    def local_heads(self) -> int:
        return self.heads // self.ranks

    @property
    def head_offset(self) -> int:
        """Global index of this rank's first head (yunchang's all-to-all gives rank r a contiguous run)."""
        return self.rank * self.local_heads

    def to_heads(self, x: Tensor) -> Tensor:
        """(batch, tokens / N, heads, d) -> (batch, tokens, heads / N, d): the Ulysses all-to-all in."""
        from yunchang.comm.all_to_all import all_to_all_4D

        return all_to_all_4D(x.contiguous(), 2, 1, group=self.group, use_sync=self.use_sync)

    def to_tokens(self, x: Tensor) -> Tensor:
        """(batch, tokens, heads / N, d) -> (batch, tokens / N, heads, d): the all-to-all back."""
        from yunchang.comm.all_to_all import all_to_all_4D

        return all_to_all_4D(x.contiguous(), 1, 2, group=self.group, use_sync=self.use_sync)


def ulysses_shard(heads: int) -> HeadShard:
    """This rank's :class:`HeadShard` in Raylight's process groups; refuses what is not exact (see module doc)."""
    import torch.distributed as dist
    from yunchang.globals import PROCESS_GROUP

    ring_pg, ulysses_pg = PROCESS_GROUP.RING_PG, PROCESS_GROUP.ULYSSES_PG
    ring = dist.get_world_size(ring_pg) if ring_pg is not None else 1
    if ring > 1:
        raise RaylightCompositionError(
            f"Raylight runs Ring attention (ring_degree {ring}): a Ring rank holds only a sequence shard of each head's "
            "cached keys, so the Jensen KV cache's per-chunk statistics (chunk_mean, per_channel) would need an "
            "all-reduce across ranks, which the pack does not do. Use ring_degree 1 and ulysses_degree N in Raylight's "
            "initializer with the Jensen KV cache (or remove Quantize KV Cache / Jensen Bias Correction)."
        )
    if ulysses_pg is None:
        raise RaylightCompositionError(
            "Raylight's self-attention ran without a Ulysses process group (yunchang's set_seq_parallel_pg was not "
            "called): initialise Raylight's parallel groups (Ray actors node) before sampling with the Jensen KV cache"
        )
    ranks, rank = dist.get_world_size(ulysses_pg), dist.get_rank(ulysses_pg)
    if heads % ranks:
        fits = [n for n in range(1, heads + 1) if heads % n == 0]
        raise RaylightCompositionError(
            f"the model's {heads} attention heads do not divide by Raylight's Ulysses degree {ranks}: each rank must "
            f"hold whole heads of the Jensen KV cache. Use a ulysses_degree that divides {heads} "
            f"({', '.join(map(str, fits[:8]))}{' ...' if len(fits) > 8 else ''})."
        )
    try:  # Raylight's own setting (torch.cuda.synchronize after each all-to-all); off where it is unset
        from raylight.distributed_modules.attention import get_sync_ulysses

        use_sync = bool(get_sync_ulysses())
    except (ImportError, RuntimeError):
        use_sync = False
    return HeadShard(ranks=ranks, rank=rank, heads=heads, group=ulysses_pg, use_sync=use_sync)


def agree_taylor_layout(shard: HeadShard, q: Tensor, group_size: int, tokens: int) -> None:
    """Rank 0 chooses the Taylor correction's kernel layout for this query's key; every other rank adopts it.

    The choice times the candidates where several pass their check (CUDA), so ranks choosing alone
    could run different kernels; one broadcast over the Ulysses group makes them run rank 0's.
    """
    import torch.distributed as dist

    from ....jensen_core.correction_layouts import Layout, adopt_layout, taylor_layout

    D = int(q.shape[-1])
    G = D // int(group_size)
    payload = [None]
    if shard.rank == 0:
        chosen = taylor_layout(q.device, q.dtype, D, G, (shard.local_heads, tokens, tokens))
        payload = [None if chosen is None else (chosen.kind, chosen.width, chosen.sink)]
    dist.broadcast_object_list(payload, src=dist.get_global_rank(shard.group, 0), group=shard.group)
    if shard.rank != 0:
        adopt_layout(q.device, q.dtype, D, G, None if payload[0] is None else Layout(*payload[0]))


class UlyssesSelfAttention:
    """Stands in for Raylight's ``usp_causal_ar_self_attn_forward`` of one layer (see the module doc).

    ``pack_attention(layer, kv_cache)`` (:func:`pack_attention`) returns, when ``kv_cache`` is a
    running pack session's, a callable ``attend(q, k, v, shard)`` with ``config`` and ``session``
    attributes; else None, and Raylight's own forward runs.
    """

    jensen_kv_patch = True
    #: core's AR path accepts this forward on a block where it expects its own (runtime/core_ar/patches.py)
    serves_core_ar = True

    def __init__(self, layer: int, module: torch.nn.Module, raylight_forward, pack_attention):
        self.layer, self.module = layer, module
        self.raylight_forward, self.pack_attention = raylight_forward, pack_attention
        self._agreed = None  # the pack call of the session whose Taylor layout this layer agreed on

    def __call__(self, x: Tensor, freqs: Tensor, kv_cache=None, transformer_options=None) -> Tensor:
        attend = self.pack_attention(self.layer, kv_cache)
        to = {} if transformer_options is None else transformer_options
        if attend is None:
            return self.raylight_forward(x, freqs, kv_cache=kv_cache, transformer_options=to)
        full = to.get(SEQ_LEN_KEY)
        if full is None:
            raise RaylightCompositionError(
                f"layer {self.layer}'s sequence-parallel self-attention was called without Raylight's "
                f"transformer_options[{SEQ_LEN_KEY!r}] (set by Raylight's usp_causal_ar_forward_block): the Jensen KV "
                "cache cannot tell Raylight's zero padding from the block's tokens. Sample through Raylight's "
                "injected forward (core's SamplerARVideo in Raylight's samplers), or remove the Jensen KV nodes."
            )
        m = self.module
        shard = ulysses_shard(int(m.num_heads))
        b, s = x.shape[:2]
        n, d = m.num_heads, m.head_dim
        full = int(full)
        if not 0 < full <= s * shard.ranks < full + shard.ranks:
            raise RaylightCompositionError(
                f"layer {self.layer} holds {s} tokens on each of {shard.ranks} ranks, which is not the block's "
                f"{full} tokens ({SEQ_LEN_KEY}) padded to a multiple of {shard.ranks}: Raylight's sharding and its "
                "sequence-length information disagree"
            )
        from comfy.ldm.flux.math import apply_rope1

        q = apply_rope1(m.norm_q(m.q(x)).view(b, s, n, d), freqs)
        k = apply_rope1(m.norm_k(m.k(x)).view(b, s, n, d), freqs)
        v = m.v(x).view(b, s, n, d)
        # one all-to-all for q, k and v (stacked on the batch axis); the padded tail dropped
        qkv = shard.to_heads(torch.cat([q, k, v.to(q.dtype)], 0))[:, :full]
        qh, kh, vh = (t.transpose(1, 2) for t in qkv.split(b, 0))  # (batch, heads / N, tokens, d)
        config = getattr(attend, "config", None)
        session = getattr(attend, "session", None)
        seen = None if self._agreed is None else self._agreed()
        if config is not None and config.effective_correction == "taylor" and seen is not session:
            agree_taylor_layout(shard, qh, config.spec_k.group_size, full)
            self._agreed = None if session is None else weakref.ref(session)
        out = attend(qh, kh, vh, shard).transpose(1, 2)  # (batch, tokens, heads / N, d)
        pad = s * shard.ranks - full
        if pad:
            out = torch.cat([out, out.new_zeros(b, pad, *out.shape[2:])], 1)
        return m.o(shard.to_tokens(out).reshape(b, s, n * d))


class PackAttention:
    """One layer's attention of a running core-path session (``runtime/core_ar/session.py``, reached through the
    per-layer dict core hands the block): ``attend(q, k, v, shard)`` on the heads ``shard`` says this rank holds."""

    def __init__(self, session, layer: int):
        self.session, self.layer = session, layer

    @property
    def config(self):
        return self.session.config

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, shard: HeadShard) -> Tensor:
        session = self.session
        session.use_shard(shard)
        labels = session.labels if session.labels is not None else [0]
        return session.attend(self.layer, q, k, v, labels)


def pack_attention(layer: int, kv_cache) -> PackAttention | None:
    """The pack's attention when ``kv_cache`` is a running session's per-layer dict, else None (Raylight's own)."""
    return PackAttention(kv_cache.session, layer) if getattr(kv_cache, "jensen_kv_layer", False) else None


def compose(dm, pack_attention) -> int:
    """Put :class:`UlyssesSelfAttention` over every block whose self-attention is Raylight's; returns how many.

    Idempotent (a block already composed keeps its composition). The attribute is the one Raylight's
    injection set on the module instance, under the pack's own object-patch key, so ComfyUI's unpatch
    restores what it backed up there (core's forward) when the model is unloaded.
    """
    composed = 0
    for i, block in enumerate(getattr(dm, "blocks", None) or []):
        attn = getattr(block, "self_attn", None)
        fwd = None if attn is None else attn.__dict__.get("forward")
        if isinstance(fwd, UlyssesSelfAttention):
            composed += 1
        elif is_raylight_forward(fwd):
            attn.forward = UlyssesSelfAttention(i, attn, fwd, pack_attention)
            composed += 1
    if composed:
        logger.info(
            "jensen_kv: Raylight's Ulysses self-attention composed with the Jensen KV cache on %d blocks", composed
        )
    return composed
