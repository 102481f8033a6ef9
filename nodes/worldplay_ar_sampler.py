"""HY-WorldPlay AR Sampler: a HY-WorldPlay video chunk by chunk, along a camera path, with a (quantized) KV cache."""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.families import WORLDPLAY
from .common import CATEGORY, UI_REPORT_KEY, JensenKVReport, WorldPlayTrajectory, logger

DESCRIPTION = (
    "HY-WorldPlay's AR rollout: chunks of 4 latent frames, each denoised with ComfyUI's sampler (Euler, AR Video "
    "Schedule worldplay_4step) after the cache is rebuilt from up to 20 context frames chosen by view overlap, "
    "re-encoded at t = 14 with renumbered RoPE. Both vision streams read the cache; the prompt stays in full "
    "precision beside it. Without Quantize KV Cache upstream the cache is full precision (the A/B baseline)."
)


class JensenKVWorldPlayARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVWorldPlayARSampler",
            display_name="HY-WorldPlay AR Sampler",
            category=CATEGORY,
            description=DESCRIPTION,
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="HY-WorldPlay from Load HY-WorldPlay, optionally through Quantize KV Cache and Jensen "
                    "Bias Correction.",
                ),
                io.Conditioning.Input(
                    "positive",
                    tooltip="The prompt with the start image: HunyuanVideo15ImageToVideo's positive output (one "
                    "entry; its clip_vision_output is the SigLIP image).",
                ),
                io.Latent.Input(
                    "latent",
                    tooltip="HunyuanVideo15ImageToVideo's latent, its length the trajectory's length output (a "
                    "multiple of 4 latent frames).",
                ),
                WorldPlayTrajectory.Input(
                    "trajectory",
                    tooltip="The camera path from HY-WorldPlay Trajectory (one pose per latent frame).",
                ),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="Noise seed; also seeds the view-overlap points that choose each chunk's context.",
                ),
                io.Sampler.Input("sampler", tooltip="A ComfyUI sampler (KSamplerSelect euler: the reference's)."),
                io.Sigmas.Input(
                    "sigmas",
                    tooltip="One chunk's schedule: AR Video Schedule worldplay_4step (4 Euler steps at shift 5).",
                ),
            ],
            outputs=[
                io.Latent.Output(display_name="LATENT", tooltip="The whole video's latent (VAEDecode it)."),
                JensenKVReport.Output(
                    display_name="report",
                    tooltip="What the cache cost: bytes, effective bits, context frames per chunk, text prefix.",
                ),
            ],
        )

    @classmethod
    def execute(cls, model, positive, latent, trajectory, seed, sampler, sigmas) -> io.NodeOutput:
        result = WORLDPLAY.run(WORLDPLAY.request(model, positive, latent, trajectory, seed, sampler, sigmas))
        out = latent.copy()
        out.pop("downscale_ratio_spacial", None)
        out["samples"] = result.samples
        text = WORLDPLAY.report_text(result.report)
        logger.info("jensen_kv: %s", text.replace("\n", " "))
        return io.NodeOutput(out, result.report, ui={UI_REPORT_KEY: [result.report], "text": [text]})
