"""Prompt Schedule: change the prompt mid-video (which prompt starts at which chunk), chainable."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..runtime.prompt_schedule import PromptSchedule, add_to_schedule
from .common import CATEGORY, logger


class JensenKVPromptSchedule(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVPromptSchedule",
            display_name="Prompt Schedule (by chunk)",
            category=CATEGORY,
            description=(
                "Build a story: this prompt starts at start_chunk; chain one node per prompt (the first at "
                "chunk 0) and plug the result into a Chunked AR sampler's positive. On each switch the "
                "sampler re-caches the chunks it keeps under the new prompt (LongLive)."
            ),
            inputs=[
                io.Conditioning.Input(
                    "conditioning", tooltip="The prompt (one CONDITIONING entry, e.g. CLIPTextEncode)."
                ),
                io.Int.Input(
                    "start_chunk",
                    default=0,
                    min=0,
                    max=100000,
                    tooltip="First chunk made with this prompt (0 = the first chunk of the video; a prefix "
                    "clip's and a continued run's chunks count too).",
                ),
                io.String.Input(
                    "label",
                    default="",
                    optional=True,
                    tooltip="A name for the report (default: prompt 1, prompt 2, ...).",
                ),
                io.Conditioning.Input(
                    "schedule",
                    optional=True,
                    tooltip="The schedule so far (another Prompt Schedule's output); empty starts a "
                    "new schedule, whose first prompt must start at chunk 0.",
                ),
            ],
            outputs=[
                io.Conditioning.Output(
                    display_name="schedule", tooltip="The prompts by chunk; connect to a Chunked AR sampler's positive."
                )
            ],
        )

    @classmethod
    def execute(cls, conditioning, start_chunk, label="", schedule=None) -> io.NodeOutput:
        out = add_to_schedule(schedule, conditioning, int(start_chunk), label or "")
        parsed = PromptSchedule.from_conditioning(out, "schedule")
        text = "; ".join(f"{p.label} from chunk {p.start_chunk}" for p in parsed.prompts)
        logger.info("jensen_kv: prompt schedule: %s", text)
        return io.NodeOutput(out, ui=ui.PreviewText(text))
