"""AR Video Schedule: the few-step schedules of Self-Forcing, LongLive, CausVid, Causal Forcing and SkyReels-V2 DF as
SIGMAS."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..runtime.schedules import PRESET_HELP, PRESETS, ar_sigmas, describe, first_chunk_sigmas
from .common import CATEGORY, Combo, logger


class JensenKVARSchedule(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVARSchedule",
            display_name="AR Video Schedule",
            category=CATEGORY,
            description=(
                "The per-chunk noise schedule a chunk-wise AR checkpoint was distilled or trained with, as "
                "SIGMAS for the Chunked AR Video Sampler (it does not depend on ModelSamplingSD3's shift)."
            ),
            inputs=[
                Combo(
                    "preset",
                    options=list(PRESETS),
                    default="self_forcing_4step",
                    tooltip="; ".join(f"{k}: {v}" for k, v in PRESET_HELP.items()),
                ),
                io.Int.Input(
                    "steps",
                    default=30,
                    min=1,
                    max=1000,
                    tooltip="Steps per chunk for skyreels_v2_df (SkyReels-V2 uses 30; the pack's SkyReels path is an "
                    "experimental causal variant of SkyReels-V2 DF); other presets ignore it.",
                ),
                io.Float.Input(
                    "shift",
                    default=8.0,
                    min=0.01,
                    max=100.0,
                    step=0.1,
                    tooltip="Time shift for skyreels_v2_df (8 for T2V); other presets ignore it.",
                ),
                io.String.Input(
                    "manual",
                    default="1, 0.757, 0.522",
                    multiline=False,
                    tooltip="For preset manual: sigmas from 1 down, comma separated (a trailing 0 is "
                    "added); values above 1 are read as timesteps and divided by 1000.",
                ),
            ],
            outputs=[
                io.Sigmas.Output(
                    tooltip="Sigmas of one chunk, ending in 0; connect to the sampler's sigmas. The Causal Forcing++ "
                    "2-step / 1-step presets carry their first frame's 4-step schedule to the sampler."
                )
            ],
        )

    @classmethod
    def execute(cls, preset, steps=30, shift=8.0, manual="") -> io.NodeOutput:
        sigmas = ar_sigmas(preset, steps=int(steps), shift=float(shift), manual=manual)
        text = f"{preset}: {describe(sigmas)}"
        first = first_chunk_sigmas(preset)
        if first is not None:
            text += (
                f"; the reference's first frame: {describe(first)}, carried by these SIGMAS (the sampler's first "
                "chunk takes it unless its first_chunk_sigmas is connected; SplitSigmas and the like drop it)"
            )
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(sigmas, ui=ui.PreviewText(text))
