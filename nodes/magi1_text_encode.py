"""MAGI-1 Text Encode: a prompt through a T5-XXL CLIP (type pixart) with MAGI-1's caption rules."""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.families import MAGI1
from .load_magi1 import MAGI1_CATEGORY


class JensenKVMagi1TextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVMagi1TextEncode",
            display_name="MAGI-1 Text Encode",
            category=MAGI1_CATEGORY,
            description=(
                "Encode a prompt for MAGI-1 with T5-XXL: load t5xxl with CLIPLoader type 'pixart' (no padding). The "
                "prompt is lower-cased as MAGI-1's own prompt cleaning does and cut at 800 tokens; the HQ and "
                "DURATION special tokens are put in front of it per chunk by the MAGI-1 sampler."
            ),
            inputs=[
                io.Clip.Input("clip", tooltip="T5-XXL loaded with CLIPLoader, type pixart."),
                io.String.Input("text", multiline=True, dynamic_prompts=True, tooltip="The prompt."),
                io.Boolean.Input(
                    "clean",
                    default=True,
                    tooltip="Lower-case and collapse whitespace, as MAGI-1's own prompt cleaning does.",
                ),
            ],
            outputs=[io.Conditioning.Output(tooltip="The prompt's T5 embeddings (valid tokens only).")],
        )

    @classmethod
    def execute(cls, clip, text, clean=True) -> io.NodeOutput:
        return io.NodeOutput(MAGI1.encode(clip, text, bool(clean)))
