"""Words for ComfyUI users (issue 41, item 7): the three main nodes' tooltips say what a setting does for the user
before any maths, every input has one, and the sampler shows only the settings most runs change."""

from __future__ import annotations

import re

import pytest

MAIN_NODES = ("JensenKVQuantizeKVCache", "JensenKVBiasCorrection", "JensenKVChunkedARSampler")
#: what a tooltip's first sentence must not hold: the paper's notation
MATHS = ("Δ", "∑", "Σ", "sinh", "‖", "α", "²", "·", "log(", "exp(", "sqrt", "1/", "*")
WIDGET_TYPES = ("INT", "FLOAT", "BOOLEAN", "COMBO", "STRING")


def first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]


def _node(nodes, node_id):
    return next(n for n in nodes.NODES if n.define_schema().node_id == node_id)


@pytest.mark.parametrize("node_id", MAIN_NODES)
def test_every_tooltip_says_what_the_setting_does_before_any_maths(nodes, node_id):
    schema = _node(nodes, node_id).define_schema()
    assert schema.description and not any(m in first_sentence(schema.description) for m in MATHS)
    for inp in schema.inputs:
        assert inp.tooltip, f"{node_id}.{inp.id} has no tooltip"
        head = first_sentence(inp.tooltip)
        maths = [m for m in MATHS if m in head]
        assert not maths, f"{node_id}.{inp.id}'s tooltip opens with maths {maths}: {head!r}"


def test_the_settings_that_matter_say_what_they_save(nodes):
    q = {i.id: i.tooltip for i in _node(nodes, "JensenKVQuantizeKVCache").define_schema().inputs}
    for name in ("key_bits", "value_bits"):
        assert "less memory" in first_sentence(q[name]) and "6x" in q[name], q[name]
    j = {i.id: i.tooltip for i in _node(nodes, "JensenKVBiasCorrection").define_schema().inputs}
    assert "stealing attention" in first_sentence(j["mode"])
    assert not any(m in j["mode"] for m in MATHS), "the formulas are on the help page, not in the tooltip"
    s = {i.id: i.tooltip for i in _node(nodes, "JensenKVChunkedARSampler").define_schema().inputs}
    assert "less memory" in s["window_chunks"] and "never forgets" in first_sentence(s["sink_chunks"])


def test_the_sampler_shows_only_the_widgets_most_runs_change(nodes):
    """The rest are advanced inputs (hidden until shown); marking them keeps the inputs' order, so saved widget
    values still land on the same widgets."""
    for node_id in ("JensenKVChunkedARSampler", "JensenKVChunkedARSamplerSimple"):
        schema = _node(nodes, node_id).define_schema()
        shown = [
            i.id
            for i in schema.inputs
            if i.get_io_type() in WIDGET_TYPES or isinstance(i.get_io_type(), list)
            if not i.as_dict().get("advanced")
        ]
        if node_id == "JensenKVChunkedARSampler":
            assert shown == ["seed", "cfg", "chunk_frames", "window_chunks", "sink_chunks"], shown
        advanced = {i.id for i in schema.inputs if i.as_dict().get("advanced")}
        assert {"recompute_frames", "kv_cache_attention_bias", "context_noise", "recache_mode"} <= advanced
