"""AR Cache Window: the window and attention sink of the Jensen KV cache on ComfyUI's own AR sampler."""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.config import CHUNK_DEFAULTS
from ..runtime.core_ar import CacheWindow, set_window
from .common import CATEGORY, patched_model


class JensenKVARCacheWindow(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVARCacheWindow",
            display_name="AR Cache Window",
            category=CATEGORY,
            description=(
                "Bound the KV cache of ComfyUI's own AR sampler (SamplerARVideo): keep the first sink chunks and the "
                "last window chunks (a chunk is one SamplerARVideo block). The Chunked AR Video Sampler has these "
                "inputs itself. Returns a copy of the model."
            ),
            inputs=[
                io.Model.Input(
                    "model", tooltip="A causal-AR Wan model (WAN21_CausalAR), before or after Quantize KV Cache."
                ),
                io.Int.Input(
                    "window_chunks",
                    default=CHUNK_DEFAULTS["window_chunks"],
                    min=0,
                    max=4096,
                    tooltip="Finished chunks (blocks) kept in the cache; 0 keeps every chunk.",
                ),
                io.Int.Input(
                    "sink_chunks",
                    default=CHUNK_DEFAULTS["sink_chunks"],
                    min=0,
                    max=4096,
                    tooltip="First chunks kept for good besides the window (attention sink); 0 = none.",
                ),
            ],
            outputs=[
                io.Model.Output(tooltip="A clone of the model whose cache on core's AR sampler keeps this window.")
            ],
        )

    @classmethod
    def execute(cls, model, window_chunks, sink_chunks) -> io.NodeOutput:
        window = CacheWindow(int(window_chunks), int(sink_chunks))
        return patched_model(model, window, set_window, f"KV cache on core's AR sampler: {window.describe()}")
