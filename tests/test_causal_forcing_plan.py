"""The planner on Causal Forcing's frame-wise layout: chunk_frames 1, so a chunk is one latent frame's tokens.

Wan 2.1 1.3B at 832x480 (latent 104 x 60, patches of 2 x 2: 52 x 30 = 1560 tokens per latent frame, the
reference's ``frame_seq_length`` at pipeline/causal_inference.py:47), 81 video frames = 21 latent frames = 21 blocks.
"""

from __future__ import annotations

from jensen_core import QuantSpec
from jensen_core.planner import LatentGeometry
from jensen_testing.planning import plan_by_fields

WAN_1_3B = dict(layers=30, heads=12, head_dim=128)
TOKENS_PER_FRAME = 1560


def _plan(**kw):
    video = dict(latent=(21, 60, 104), chunk_frames=1, window_chunks=0)
    model = dict(spec_k=None, spec_v=None, geometry=LatentGeometry(patch=(1, 2, 2), latent_channels=16), **WAN_1_3B)
    args = {**video, **model}
    return plan_by_fields(**{**args, **kw})


def test_a_framewise_chunk_is_one_latent_frame():
    p = _plan()
    assert p.tokens_per_latent_frame == TOKENS_PER_FRAME and p.chunks == 21
    # every frame but the last is written (nothing reads the last one): 20 frames of 1560 tokens at the peak
    assert p.cached_chunks_peak == 20 and p.cached_tokens_peak == 20 * TOKENS_PER_FRAME
    assert p.bf16_bytes == 2 * 20 * TOKENS_PER_FRAME * 12 * 128 * 30 * 2  # k and v, bf16
    assert not p.warnings  # 21 frames split into blocks of 1 with no short last block
    # the same frames in chunk-wise blocks of 3 hold the same tokens less the last block's 3 frames
    assert _plan(chunk_frames=3).cached_tokens_peak == 18 * TOKENS_PER_FRAME


def test_a_framewise_window_counts_frames():
    """A long frame-wise video with a window: window_chunks and sink_chunks are latent frames here."""
    p = _plan(latent_frames=120, window_chunks=17, sink_chunks=3)
    assert p.cached_chunks_peak == 20 and p.cached_tokens_peak == 20 * TOKENS_PER_FRAME
    int2 = _plan(latent_frames=120, window_chunks=17, sink_chunks=3, spec_k=QuantSpec(bits=2), spec_v=QuantSpec(bits=2))
    assert int2.quantized_bytes < p.bf16_bytes / 5  # INT2 at 2.75 bits/element: 5.8x smaller than BF16
