"""The latent geometry the planner takes: validated, used for tokens and the saved latents, Wan's from its family."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from support.pack import load_pack_module

from jensen_core import QuantSpec
from jensen_core.planner import CachePrecision, CacheShape, LatentGeometry, plan_cache
from jensen_testing.planning import plan_by_fields


def _plan(geometry: LatentGeometry, **kw):
    base = dict(
        latent_frames=6,
        latent_height=8,
        latent_width=12,
        chunk_frames=2,
        window_chunks=0,
        layers=2,
        heads=2,
        head_dim=64,
        spec_k=QuantSpec(bits=2, group_size=32),
        spec_v=None,
        write_last=True,
    )
    return plan_by_fields(**{**base, **kw}, geometry=geometry)


def test_wan_family_provides_its_geometry():
    wan = load_pack_module("runtime.families.wan.family")
    # (the pack-under-test's own LatentGeometry class: compare the fields)
    assert astuple(wan.GEOMETRY) == ((1, 2, 2), 16, 4, 8, True)
    assert wan.WanFamily.geometry is wan.GEOMETRY and wan.WanFamily.latent_channels == 16
    # 832 x 480 x 81 frames -> 21 latent frames of 60 x 104, 1560 tokens each
    assert wan.GEOMETRY.latent_shape(832, 480, 81) == (21, 60, 104)
    assert wan.GEOMETRY.tokens_per_frame(60, 104) == 1560
    assert wan.GEOMETRY.latent_shape(64, 48, 12) == (3, 6, 8)  # 12 frames: (12 - 1) // 4 + 1


def test_magi1_family_provides_its_geometry():
    """MAGI-1's VAE: 4 frames of every latent frame (no causal first frame), 8 x 8 pixels, 16 channels; 2 x 2
    patches. 96 frames (the reference's default) are 24 latent frames, 240 frames 60; 720p is 45 x 80 tokens."""
    family = load_pack_module("runtime.families.magi1.family").Magi1Family
    g = family.geometry
    assert astuple(g) == ((1, 2, 2), 16, 4, 8, False)
    assert g.latent_shape(1280, 720, 96) == (24, 90, 160) and g.latent_shape(1280, 720, 240)[0] == 60
    assert g.latent_shape(1280, 720, 97)[0] == 25  # a last partial latent frame counts
    assert g.tokens_per_frame(90, 160) == 45 * 80 and family.latent_channels == 16


def test_the_planner_counts_tokens_and_saved_latents_with_the_given_geometry():
    wan_like = _plan(LatentGeometry(patch=(1, 2, 2), latent_channels=16))
    fine = _plan(LatentGeometry(patch=(1, 1, 1), latent_channels=16))
    wide = _plan(LatentGeometry(patch=(1, 2, 2), latent_channels=48))
    assert wan_like.tokens_per_latent_frame == 4 * 6 and fine.tokens_per_latent_frame == 8 * 12
    assert fine.quantized_bytes == 4 * wan_like.quantized_bytes and fine.bf16_bytes == 4 * wan_like.bf16_bytes
    # same cache, latents of 48 instead of 16 channels: 3 chunks x 2 frames x 8 x 12 x (48 - 16) x 4 bytes more
    assert wide.quantized_bytes == wan_like.quantized_bytes
    assert wide.state_file_bytes - wan_like.state_file_bytes == 3 * 2 * 8 * 12 * 32 * 4


@pytest.mark.parametrize(
    "kw, bad",
    [
        (dict(patch=(1, 2), latent_channels=16), "patch"),
        (dict(patch=(1, 0, 2), latent_channels=16), "patch"),
        (dict(patch=(1, 2, 2), latent_channels=0), "latent_channels=0"),
        (dict(patch=(1, 2, 2), latent_channels=16, vae_space_stride=2.5), "vae_space_stride=2.5"),
    ],
)
def test_a_bad_geometry_is_refused_naming_the_value(kw, bad):
    with pytest.raises(ValueError, match=bad):
        LatentGeometry(**kw)


def test_the_planner_needs_a_geometry():
    with pytest.raises(TypeError, match="geometry"):
        plan_cache(
            latent_frames=6,
            latent_height=8,
            latent_width=12,
            chunk_frames=2,
            window_chunks=0,
            shape=CacheShape(layers=2, heads=2, head_dim=64),
            precision=CachePrecision(spec_k=None, spec_v=None),
        )
