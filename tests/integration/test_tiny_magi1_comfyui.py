"""The trained tiny MAGI-1 (models/tiny_magi1) in ComfyUI: Load MAGI-1 Model's loader reads the committed file as
it is, and the MAGI-1 AR Sampler's recipe (full-precision cache, chunks of 6 frames) gives the pure-torch sampler's
rollout (``jensen_testing.magi1_trained.rollout``) on it."""

from __future__ import annotations

import importlib

import pytest
import torch
from support import comfyui as support_comfyui

from jensen_core import toy_video as tv
from jensen_testing import magi1_trained as mt

SCALE = 0.18215  # the MAGI-1 LATENT is the DiT's latent / 0.18215


@pytest.fixture(scope="module")
def patcher(magi1):
    if not mt.MODEL_PATH.is_file():
        pytest.fail(f"{mt.MODEL_PATH} is missing (it is committed; python tools/train_tiny_magi1.py makes it)")
    comfy_model = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.families.magi1.comfy_model")
    return comfy_model.load_magi1(str(mt.MODEL_PATH), "default", "auto")


def test_the_loader_reads_the_committed_file(patcher):
    dm = patcher.model.diffusion_model
    assert dm.config.to_json() == mt.CONFIG.to_json()  # the pack's own copy of the MagiConfig class
    assert sorted(dm.special_tokens) == sorted(mt.SPECIAL_NAMES)
    for name, tok in mt.special_tokens().items():
        assert torch.equal(dm.special_tokens[name].float(), tok)


@pytest.mark.parametrize("window", [4, 1])
def test_the_magi1_ar_sampler_recipe_gives_the_pure_rollout(magi1, patcher, window):
    prompt, chunks, seed = 2, 3, 5
    positive = [[tv.prompt_embedding(prompt), {"magi1_caption": True}]]
    req = magi1.Magi1Request.from_options(
        patcher,
        positive,
        latent_frames=chunks * mt.CHUNK_FRAMES,
        latent_height=mt.LATENT_HW,
        latent_width=mt.LATENT_HW,
        seed=seed,
        num_steps=mt.STEPS,
        window_size=window,
        chunk_frames=mt.CHUNK_FRAMES,
        progress=False,
    )
    result = magi1.run(req)
    assert result.report["distill"] and result.report["cfg_number"] == 1
    dm = patcher.model.diffusion_model
    special = {k: v.float() for k, v in dm.special_tokens.items()}
    pure = mt.rollout(dm, special, prompt, chunks, window, seed)
    assert float((result.samples * SCALE - pure).abs().max()) <= 1e-5 * float(pure.abs().max())


def test_precision_by_head_on_magi1_stores_the_planned_bytes(magi1, patcher, nodes):
    """head_bits 4 on one of MAGI-1's 2 K/V heads per layer (4 query heads over 2: promotion is per K/V head): the run
    stores the planner's bytes, 0.5 bits per element more than uniform INT2 g32, and names one head per layer."""
    reports = {}
    for head_bits in ("off", "4"):
        m = nodes.JensenKVQuantizeKVCache.execute(
            patcher, "2", "2", "32", "hadamard", "fp8_e4m3", 0, "rtn", 1, 0, 2, "off", 2, "off", "same", head_bits, 0.5
        ).args[0]
        req = magi1.Magi1Request.from_options(
            m, [[tv.prompt_embedding(1), {"magi1_caption": True}]], latent_frames=3 * mt.CHUNK_FRAMES,
            latent_height=mt.LATENT_HW, latent_width=mt.LATENT_HW, seed=3, num_steps=4, window_size=4,
            chunk_frames=mt.CHUNK_FRAMES, progress=False,
        )  # fmt: skip
        reports[head_bits] = magi1.run(req).report
    rep, uniform = reports["4"], reports["off"]
    assert rep["cache_bytes"] == rep["planned_bytes"] > uniform["cache_bytes"] == uniform["planned_bytes"]
    assert rep["effective_bits"] == pytest.approx(uniform["effective_bits"] + 0.5)
    assert rep["kv_heads"] == 2 and [len(p) for p in rep["promoted_heads"]] == [1] * mt.CONFIG.num_layers
