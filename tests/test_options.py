"""A run's options as values (issue 30, item 4): the option groups check themselves, the cache's shape and precision
are what the planner, the caches and a saved run take, and the recipe a request gets. No ComfyUI needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support.pack import load_pack_module

from jensen_core import CachePrecision, CacheShape, ChunkCache, QuantSpec
from jensen_core.geometry import LatentGeometry
from jensen_core.planner import block_in_flight_bytes, plan_cache
from jensen_core.tiers import AgeTiers
from jensen_testing.planning import plan_by_fields

options = load_pack_module("runtime.options")
schedules = load_pack_module("runtime.schedules")
recipes = load_pack_module("runtime.recipes")

GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8)
SPEC = QuantSpec(bits=2, group_size=32, rotation="hadamard")
TIERS = AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8)


# ------------------------------------------------------------------------------------------ option groups
def test_a_causal_forcing_preset_carries_its_first_chunk_schedule_and_a_copy_loses_it():
    two = schedules.ar_sigmas("causal_forcing_framewise_2step")
    four = schedules.ar_sigmas("causal_forcing_framewise_4step")
    s = options.Sampling(seed=1, cfg=1.0, sampler=None, sigmas=two)
    assert torch.equal(s.first_chunk_sigmas, four) and s.first_chunk_from == "preset"
    assert torch.equal(s.sigmas_of(0, resumed=False), four)
    assert torch.equal(s.sigmas_of(0, resumed=True), two) and torch.equal(s.sigmas_of(1, resumed=False), two)
    given = options.Sampling(seed=1, cfg=1.0, sampler=None, sigmas=two, first_chunk_sigmas=two[:2])
    assert given.first_chunk_from == "given" and torch.equal(given.first_chunk_sigmas, two[:2])
    lost = options.Sampling(seed=1, cfg=1.0, sampler=None, sigmas=two.clone())
    assert lost.first_chunk_sigmas is None and lost.first_chunk_from is None
    assert schedules.lost_first_chunk(two.clone()) == "causal_forcing_framewise_2step"
    assert schedules.lost_first_chunk(schedules.ar_sigmas("self_forcing_4step")) is None
    # a preset without a first-chunk schedule carries none
    assert options.Sampling(seed=1, cfg=1.0, sampler=None, sigmas=four).first_chunk_sigmas is None


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: options.Sampling(1, 1.0, None, torch.tensor([1.0])), "SIGMAS must be a 1-D schedule"),
        (lambda: options.Sampling(1, 1.0, None, torch.tensor([1.0, float("nan")])), "SIGMAS contains NaN"),
        (lambda: options.Sampling(1, -1.0, None, torch.tensor([1.0, 0.0])), "cfg=-1.0 must be a non-negative"),
        (
            lambda: options.Sampling(1, 1.0, None, torch.tensor([1.0, 0.0]), torch.tensor([1.0])),
            "first_chunk_sigmas must be a 1-D schedule.*leave it unconnected",
        ),
        (lambda: options.Chunking(3, first_chunk_frames=4), "first_chunk_frames=4 is longer than chunk_frames=3"),
        (lambda: options.Chunking(3, window_chunks=-1), "window_chunks=-1 must be 0"),
        (lambda: options.Chunking(3, sink_chunks=-2), "sink_chunks=-2 must be 0"),
        (lambda: options.Continuation(prefix={}, resume=object()), "not both"),
        (lambda: options.RecipeOptions(context_noise=1.5), "context_noise=1.5 must be between 0"),
        (lambda: options.RecipeOptions(recache_mode="joint"), "recache_mode='joint' is not known.*causal, longlive"),
        (lambda: options.RecipeOptions(context_noise_mode="x"), "context_noise_mode='x' is not known"),
        (lambda: options.RecipeOptions(recompute_frames=-1), "recompute_frames=-1 must be 0"),
        (lambda: options.RecipeOptions(vae=object()), "a VAE is used only with recompute_frames > 0"),
        (lambda: options.RecipeOptions(attention_bias=0.0), "kv_cache_attention_bias=0.0 must be a number"),
    ],
)
def test_each_option_group_refuses_a_bad_value_naming_it(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_default_prompt_switch_re_caches_as_longlive_does():
    assert options.RecipeOptions().recache_mode == "longlive"
    assert options.Chunking(3).retention.window_chunks is None  # window 0: every chunk


# ------------------------------------------------------------------------------------------ the recipe
def _request(positive=("a",), recache_mode="longlive", sigmas=None, chunk_frames=3, **recipe):
    sigmas = torch.tensor([1.0, 0.5, 0.0]) if sigmas is None else sigmas
    return SimpleNamespace(
        model=None,
        positive=list(positive),
        recipe=options.RecipeOptions(recache_mode=recache_mode, **recipe),
        sampling=options.Sampling(1, 1.0, None, sigmas),
        chunking=options.Chunking(chunk_frames),
        continuation=options.Continuation(),
    )


@pytest.mark.parametrize(
    "kw,want",
    [
        ({}, "SelfForcing"),
        ({"positive": ("a", "b")}, "LongLive"),
        ({"positive": ("a", "b"), "recache_mode": "causal"}, "SelfForcing"),
        ({"positive": ("a", "b"), "recache_on_switch": False}, "SelfForcing"),
        ({"recompute_frames": 3}, "Krea"),
        ({"context_noise_mode": "skyreels", "context_noise": 0.1}, "SkyReels"),
        ({"sigmas": schedules.ar_sigmas("causal_forcing_framewise_2step"), "chunk_frames": 1}, "CausalForcing"),
        # the preset's values without its first schedule: picked, to say so
        ({"sigmas": schedules.ar_sigmas("causal_forcing_framewise_2step").clone(), "chunk_frames": 1}, "CausalForcing"),
        ({"sigmas": schedules.ar_sigmas("causal_forcing_framewise_2step").clone(), "chunk_frames": 3}, "SelfForcing"),
    ],
)
def test_the_request_picks_its_recipe(kw, want):
    assert recipes.recipe_type(_request(**kw)).__name__ == want


def test_the_recipes_re_cache_as_recache_mode_says():
    assert isinstance(recipes.recipe_for(_request(positive=("a", "b"))).recache, recipes.LongLiveRecache)
    assert isinstance(recipes.recipe_for(_request(recache_mode="causal")).recache, recipes.CausalRecache)
    sky = recipes.recipe_for(_request(context_noise_mode="skyreels", context_noise=0.1))
    assert isinstance(sky.recache, recipes.LongLiveRecache) and not sky.relabels
    assert recipes.recipe_for(_request()).report() == {"recipe": "plain", "recache_mode": "longlive"}


def test_krea_owns_what_its_recompute_cannot_be_combined_with():
    req = _request(recompute_frames=3)
    recipes.Krea.check(req)  # alone: fine
    req.chunking = options.Chunking(3, window_chunks=2, sink_chunks=1)
    req.continuation = options.Continuation(keep_state=True)
    with pytest.raises(ValueError, match="window_chunks=2, sink_chunks=1, the kv_cache output: set window_chunks"):
        recipes.Krea.check(req)
    krea = recipes.Krea(options.RecipeOptions(recompute_frames=5))
    assert krea.planned_window(options.Chunking(2)) == 3  # 5 frames in pieces of 2
    assert krea.report()["anchor_frame"] == "latent" and "no VAE connected" in krea.report()["recipe_notes"][0]


# ------------------------------------------------------------------------------------------ shape and precision
def _loose(**kw):
    video = dict(latent_frames=9, latent_height=8, latent_width=12)
    return dict(**video, chunk_frames=3, window_chunks=1, sink_chunks=1, write_last=True, **kw)


def test_the_planner_takes_one_signature_a_shape_and_a_precision():
    """plan_cache and block_in_flight_bytes take a CacheShape and a CachePrecision, and nothing else: the same fields
    given one by one are refused (a test that states them so puts them into the two values,
    jensen_testing.planning)."""
    shape = CacheShape(4, 8, 64, GEOMETRY, kv_heads=2, cfg_branches=2, batch=3, full_bytes=2, ranks=2)
    precision = CachePrecision(SPEC, QuantSpec(bits=4, group_size=32), TIERS)
    by_value = plan_cache(**_loose(shape=shape, precision=precision))
    by_field = plan_by_fields(
        **_loose(
            layers=4,
            heads=8,
            kv_heads=2,
            head_dim=64,
            geometry=GEOMETRY,
            cfg_branches=2,
            batch=3,
            full_bytes=2,
            ranks=2,
            spec_k=SPEC,
            spec_v=QuantSpec(bits=4, group_size=32),
            tiers=TIERS,
        )
    )
    assert by_value == by_field and by_value.quantized_bytes > 0 and by_value.chunk_bits_k[-1] == 4
    # one fewer K/V head per rank halves the bytes: the shape's kv_heads is what is counted
    fewer = plan_cache(
        **_loose(shape=CacheShape(4, 8, 64, GEOMETRY, kv_heads=1, cfg_branches=2, batch=3), precision=precision)
    )
    assert fewer.quantized_bytes_all_ranks * 2 == by_value.quantized_bytes_all_ranks
    flight = block_in_flight_bytes(block_tokens=48, shape=shape, precision=precision)
    assert flight == block_in_flight_bytes(
        block_tokens=48, shape=CacheShape(4, 8, 64, kv_heads=2, cfg_branches=2, batch=3),
        precision=CachePrecision(SPEC, QuantSpec(bits=4, group_size=32), TIERS),
    )  # fmt: skip
    with pytest.raises(TypeError, match="unexpected keyword argument 'layers'"):
        plan_cache(**_loose(shape=shape, precision=precision, layers=4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'layer'"):
        plan_cache(**_loose(layer=4, heads=8, head_dim=64, geometry=GEOMETRY))


def test_the_shape_and_precision_check_themselves():
    with pytest.raises(ValueError, match="kv_heads=3 must be a whole number >= 1 that divides heads=8"):
        CacheShape(2, 8, 64, GEOMETRY, kv_heads=3)
    with pytest.raises(ValueError, match="layers=0 must be a whole number >= 1"):
        CacheShape(0, 8, 64, GEOMETRY)
    with pytest.raises(TypeError, match="spec_k must be a QuantSpec"):
        CachePrecision("2 bits")
    assert CacheShape(2, 8, 64, GEOMETRY).cached_heads == 8 and CacheShape(2, 8, 64, None, kv_heads=4).cached_heads == 4
    run = CacheShape(2, 8, 64, GEOMETRY).for_run(cfg_branches=2, batch=3, full_bytes=4)
    assert (run.cfg_branches, run.batch, run.full_bytes, run.layers) == (2, 3, 4, 2)


def test_a_cache_and_a_saved_run_take_the_precision():
    precision = CachePrecision(SPEC, None, TIERS)
    cache = ChunkCache.with_precision(precision, 2, 1, head_offset=3)
    assert (cache.spec_k, cache.spec_v, cache.tiers, cache.window_chunks, cache.sink_chunks, cache.head_offset) == (
        SPEC,
        None,
        TIERS,
        2,
        1,
        3,
    )
    assert cache.precision == precision
    # the saved run is the pack's module (its own jensen_core classes, as ComfyUI imports it)
    saved_run, jk = load_pack_module("runtime.saved_run"), load_pack_module("jensen_core")
    tiers = load_pack_module("jensen_core.tiers").AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8)
    spec = jk.QuantSpec(bits=2, group_size=32, rotation="hadamard")
    precision = jk.CachePrecision(spec, None, tiers)
    state = saved_run.SavedRun(
        fingerprint={"family": "f", "layers": 1, "heads": 1, "head_dim": 64},
        spec_k=spec,
        spec_v=None,
        tiers=tiers,
        chunk_frames=3,
        window_chunks=2,
        sink_chunks=1,
        latent_shape=(1, 16, 8, 8),
        next_chunk=0,
        next_frame=0,
        branches=[0],
        active_prompt="",
        caches={},
    )
    assert state.precision == precision
    same = dict(
        fingerprint=state.fingerprint, chunk_frames=3, window_chunks=2, sink_chunks=1, latent_shape=(1, 16, 8, 8),
        branches=[0],
    )  # fmt: skip
    state.check_compatible(precision=precision, **same)
    state.check_compatible(spec_k=spec, spec_v=None, tiers=tiers, **same)  # the fields one by one, as before
    with pytest.raises(ValueError, match="age tiers"):
        state.check_compatible(precision=jk.CachePrecision(spec, None, None), **same)
    with pytest.raises(TypeError, match="not both"):
        state.check_compatible(precision=precision, spec_k=spec, **same)


def test_the_values_take_the_same_classes_of_the_pack_as_comfyui_imports_it():
    """ComfyUI imports the pack as comfyui_jensen_kv (its own jensen_core classes); a value built here from them is
    accepted, anything else is not."""
    jk, geo = load_pack_module("jensen_core"), load_pack_module("jensen_core.geometry")
    pack_geometry = geo.LatentGeometry(patch=(1, 2, 2), latent_channels=16)
    assert type(pack_geometry) is not LatentGeometry
    plan = plan_cache(
        **_loose(shape=CacheShape(2, 8, 64, pack_geometry), precision=CachePrecision(jk.QuantSpec(bits=2)))
    )
    assert plan == plan_cache(**_loose(shape=CacheShape(2, 8, 64, GEOMETRY), precision=CachePrecision(SPEC)))
    with pytest.raises(TypeError, match="geometry must be a LatentGeometry"):
        CacheShape(2, 8, 64, (1, 2, 2))
