"""KV Cache Diagnostics (MODEL -> MODEL): ask the Chunked AR sampler for attention diagnostics.

The node marks a cloned MODEL; the Chunked AR sampler then compares, for the sampled layers, heads
and steps, the attention over its quantized cache (with and without the Jensen correction) against
full-precision attention on the same queries, and puts the numbers in its report under
``diagnostics`` (see ``runtime/shift_observer.py``). Without this node the sampler runs no
diagnostics and pays nothing. KV Cache Diagnostics Plot (``kv_cache_diagnostics_plot.py``) draws the report.
"""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.families import attention_shape
from ..runtime.shift_observer import SELECTION_HELP, DiagnosticsRequest, resolve_selection, set_request
from .common import CATEGORY, patched_model


class JensenKVDiagnostics(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVDiagnostics",
            display_name="KV Cache Diagnostics",
            category=CATEGORY,
            description=(
                "Measure what the quantized KV cache does to attention: the Chunked AR sampler compares its "
                "attention over the cache, without and with the Jensen correction, against full-precision "
                "attention on the same queries (attention-mass shift ΔP_S, JSD, output MSE) and adds the numbers "
                "to its report; feed the report to KV Cache Diagnostics Plot. Costs time and memory only when "
                "this node is in the graph."
            ),
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="The MODEL going to the Chunked AR sampler (anywhere on its path: "
                    "before or after Quantize KV Cache / Jensen Bias Correction).",
                ),
                io.String.Input(
                    "layers",
                    default="every 8",
                    tooltip=f"Transformer blocks to measure: {SELECTION_HELP}. Each sampled layer keeps "
                    "a full-precision copy of its cached K/V (sampled heads only) for the run.",
                ),
                io.String.Input(
                    "heads",
                    default="all",
                    tooltip=f"Attention heads to measure in each sampled layer: {SELECTION_HELP}.",
                ),
                io.String.Input(
                    "steps",
                    default="all",
                    tooltip=f"Denoising steps (0-based, per chunk) to measure: {SELECTION_HELP}. "
                    "Chunk 0 has no cache and is never measured.",
                ),
                io.Int.Input(
                    "query_stride",
                    default=4,
                    min=1,
                    max=4096,
                    tooltip="Measure every n-th query of the chunk (1 = all). The reference materialises "
                    "one (queries/n x cached keys) score matrix per head: raise n for long videos.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="A clone of the model that asks the Chunked AR sampler for diagnostics.")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, layers, heads, steps, query_stride) -> io.NodeOutput:
        request = DiagnosticsRequest(layers=layers, heads=heads, steps=steps, query_stride=int(query_stride))
        shape = attention_shape(model)
        if shape is not None:  # check the indices now rather than after a long run
            resolve_selection(request.layers, shape.layers, "layers")
            resolve_selection(request.heads, shape.heads, "heads")
        return patched_model(model, request, set_request, f"Attention diagnostics: {request.describe()}")
