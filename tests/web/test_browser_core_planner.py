"""The planner on Quantize KV Cache follows a graph on ComfyUI's own AR sampler (v0.27+), in the real front end.

On core's path the numbers come from other nodes than on the pack's sampler: the chunk is SamplerARVideo's
``num_frame_per_block``, window and sink are AR Cache Window's, cfg is the guider's, the size is
EmptyARVideoLatent's. Loads the shipped chunk-wise workflow and changes those widgets.
"""

from __future__ import annotations

import json

import pytest
from test_browser import QUANT, UI, WORKFLOW_DIR, _plan_bytes  # noqa: F401 - UI: the page helpers
from test_browser import ui as _ui_fixture  # noqa: F401 - the module's server + browser fixture

pytestmark = [pytest.mark.comfyui, pytest.mark.server, pytest.mark.browser, pytest.mark.slow, pytest.mark.core_ar]

ui = _ui_fixture
WAN13 = dict(width=832, height=480, frames=81, layers=30, heads=12, head_dim=128)


def test_planner_follows_sampler_ar_video_ar_cache_window_and_the_guider(ui):
    ui.load(json.loads((WORKFLOW_DIR / "13 Core AR sampler, chunk-wise.json").read_text()))
    ui.focus(QUANT)
    int2 = dict(key_bits="2", value_bits="2", group_size=32)
    expect = _plan_bytes(**int2, **WAN13, chunk_frames=3, window_chunks=0)
    r = ui.wait_planner(f"el.querySelector('[data-jkv=quant]')?.dataset.bytes === '{expect[1]}'")
    assert (r["bf16_bytes"], r["quant_bytes"]) == expect

    ui.set_widget("SamplerARVideo", "num_frame_per_block", 1)  # frame-wise: 21 chunks of 1 frame
    expect = _plan_bytes(**int2, **WAN13, chunk_frames=1, window_chunks=0)
    r = ui.wait_planner(f"el.querySelector('[data-jkv=quant]')?.dataset.bytes === '{expect[1]}'")
    assert (r["bf16_bytes"], r["quant_bytes"]) == expect

    ui.set_widget("JensenKVARCacheWindow", "window_chunks", 4)
    ui.set_widget("JensenKVARCacheWindow", "sink_chunks", 1)
    expect = _plan_bytes(**int2, **WAN13, chunk_frames=1, window_chunks=4, sink_chunks=1)
    r = ui.wait_planner(f"el.querySelector('[data-jkv=quant]')?.dataset.bytes === '{expect[1]}'")
    assert (r["bf16_bytes"], r["quant_bytes"]) == expect

    ui.set_widget("CFGGuider", "cfg", 3.0)  # both CFG branches cached
    expect = _plan_bytes(**int2, **WAN13, chunk_frames=1, window_chunks=4, sink_chunks=1, cfg_branches=2)
    r = ui.wait_planner(f"el.querySelector('[data-jkv=quant]')?.dataset.bytes === '{expect[1]}'")
    assert (r["bf16_bytes"], r["quant_bytes"]) == expect
    ui.shot("20_planner_on_core_ar_path")
