"""Tiny AR Prompt: the conditioning of one of the scenes the pack's tiny AR model was trained on."""

from __future__ import annotations

from comfy_api.latest import io

from ..jensen_core import toy_video
from .common import Combo

DEMO_CATEGORY = "jensen_kv/demo"


class JensenKVTinyARPrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVTinyARPrompt",
            display_name="Tiny AR Prompt",
            category=DEMO_CATEGORY,
            description=(
                "Conditioning for the pack's tiny chunk-wise AR model (models/tiny_ar, loaded with Load "
                "Diffusion Model): it knows only these scene/motion prompts, each a fixed embedding, so no "
                "text encoder is needed. For real Wan checkpoints use CLIPTextEncode."
            ),
            inputs=[
                Combo(
                    "prompt",
                    options=list(toy_video.PROMPT_TEXTS),
                    default=toy_video.PROMPT_TEXTS[0],
                    tooltip="The scene: how many balls, how fast, over which texture.",
                ),
            ],
            outputs=[
                io.Conditioning.Output(tooltip="A one-entry CONDITIONING (8 tokens x 4096, as a UMT5 embedding).")
            ],
        )

    @classmethod
    def validate_inputs(cls, prompt=None):
        if prompt is not None and prompt not in toy_video.PROMPT_TEXTS:
            return (
                f"prompt {prompt!r} is not one the tiny model was trained on; use one of {list(toy_video.PROMPT_TEXTS)}"
            )
        return True

    @classmethod
    def execute(cls, prompt) -> io.NodeOutput:
        return io.NodeOutput([[toy_video.prompt_embedding(prompt), {}]])
