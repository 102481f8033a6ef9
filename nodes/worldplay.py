"""HY-WorldPlay's nodes: Load HY-WorldPlay, HY-WorldPlay Trajectory, HY-WorldPlay Trajectory Preview and
HY-WorldPlay AR Sampler (the family's package: ``runtime/families/worldplay/``)."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..runtime.families.worldplay.loader import WEIGHT_DTYPES, describe, load_worldplay
from ..runtime.families.worldplay.model.preview import image_tensor, render_trajectory
from ..runtime.families.worldplay.model.trajectory import CHUNK_LATENTS, Trajectory, TrajectoryError, parse_trajectory
from ..runtime.families.worldplay.recipe import WorldPlayRequest, report_text, run
from .common import (
    CATEGORY,
    Combo,
    JensenKVReport,
    WorldPlayTrajectory,
    advanced,
    check_model_file,
    diffusion_model_files,
    diffusion_model_path,
    logger,
    model_file_fingerprint,
    sampled_output,
)

NO_FILES = "(no file in models/diffusion_models)"
NEEDS = (
    "Load HY-WorldPlay needs ComfyUI's HunyuanVideo 1.5 (ComfyUI v0.27 or newer); this ComfyUI has none: update ComfyUI"
)


def has_hunyuan15() -> bool:
    import comfy.supported_models

    return hasattr(comfy.supported_models, "HunyuanVideo15")


class JensenKVLoadWorldPlay(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLoadWorldPlay",
            display_name="Load HY-WorldPlay",
            category=CATEGORY,
            description=(
                "HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay) on ComfyUI's HunyuanVideo 1.5: its official checkpoint "
                "with the action embedding and the PRoPE camera stream. UNETLoader reads it as plain HunyuanVideo 1.5 "
                "and loses those; use this node."
            ),
            inputs=[
                Combo(
                    "unet_name",
                    options=diffusion_model_files() or [NO_FILES],
                    tooltip="HY-WorldPlay's ar_distilled_action_model/model.safetensors, in models/diffusion_models.",
                ),
                Combo(
                    "weight_dtype",
                    options=list(WEIGHT_DTYPES),
                    default="default",
                    tooltip="default: the file's precision (BF16) where the device has it; fp8_*: store the "
                    "weights in FP8 (half the memory), compute in the manual-cast dtype.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="HY-WorldPlay (sample it with shift 5: the worldplay_4step schedule).")],
        )

    @classmethod
    def fingerprint_inputs(cls, unet_name, weight_dtype):
        return model_file_fingerprint(unet_name, weight_dtype)

    @classmethod
    def validate_inputs(cls, unet_name=None):
        # only unet_name: ComfyUI attaches a failure to every input named here (and leaves their own checks out)
        return check_model_file(
            unet_name,
            NO_FILES,
            "put HY-WorldPlay's model.safetensors into ComfyUI's models/diffusion_models and press R",
        )

    @classmethod
    def execute(cls, unet_name, weight_dtype="default") -> io.NodeOutput:
        if not has_hunyuan15():
            raise RuntimeError(NEEDS)
        model = load_worldplay(diffusion_model_path(unet_name), weight_dtype)
        text = f"{unet_name}: {describe(model)}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(model, ui=ui.PreviewText(text))


class JensenKVWorldPlayTrajectory(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVWorldPlayTrajectory",
            display_name="HY-WorldPlay Trajectory",
            category=CATEGORY,
            description=(
                "The camera path of a HY-WorldPlay video: a pose string (w/s forward/back, a/d left/right, "
                "left/right yaw, up/down pitch; the number after the dash is latent frames, e.g. 'w-31, right-8') "
                "or the reference's pose JSON. Checked: WorldPlay needs a multiple of 4 latent frames."
            ),
            inputs=[
                io.String.Input(
                    "pose",
                    default="w-31",
                    multiline=True,
                    tooltip="A pose string such as 'w-31' (32 latents, 125 frames) or 'w-15, right-16', or a pose "
                    'JSON {"0": {"extrinsic": 4x4 camera-to-world, "K": 3x3 pixels}, ...}.',
                ),
                advanced(
                    io.Int.Input(
                        "latents",
                        default=0,
                        min=0,
                        max=4096,
                        tooltip="0: every pose; N: keep the first N poses (e.g. 32 of the reference's bundled "
                        "33-pose test_forward_32_latents.json).",
                    )
                ),
            ],
            outputs=[
                WorldPlayTrajectory.Output(display_name="trajectory", tooltip="The checked camera path."),
                io.Int.Output(
                    display_name="length",
                    tooltip="Video frames of the path (4 x latents - 3): the length of HunyuanVideo15ImageToVideo.",
                ),
                io.String.Output(display_name="info", tooltip="What the path holds."),
            ],
        )

    @classmethod
    def validate_inputs(cls, pose=None, latents=None):
        if not isinstance(pose, str) or not isinstance(latents, int):
            return True  # linked: checked when the node runs
        try:
            parse_trajectory(pose, latents)
        except TrajectoryError as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, pose, latents=0) -> io.NodeOutput:
        trajectory = parse_trajectory(pose, int(latents))
        text = trajectory.describe()
        logger.info("jensen_kv: HY-WorldPlay trajectory: %s", text)
        return io.NodeOutput(trajectory, trajectory.frames, text, ui=ui.PreviewText(text))


class JensenKVWorldPlayTrajectoryPreview(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVWorldPlayTrajectoryPreview",
            display_name="HY-WorldPlay Trajectory Preview",
            category=CATEGORY,
            description=(
                "A top-down picture of a HY-WorldPlay camera path: the camera's way (green start, red end), a dot "
                "per chunk of 4 latent frames and a 60-degree wedge of where that chunk starts looking."
            ),
            inputs=[
                WorldPlayTrajectory.Input("trajectory", tooltip="A camera path from HY-WorldPlay Trajectory."),
                advanced(
                    io.Int.Input(
                        "size",
                        default=512,
                        min=64,
                        max=4096,
                        step=8,
                        tooltip="Width and height of the picture in pixels.",
                    )
                ),
            ],
            outputs=[io.Image.Output(display_name="IMAGE", tooltip="The picture (1 x size x size x 3).")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, trajectory, size=512) -> io.NodeOutput:
        if not isinstance(trajectory, Trajectory):
            raise ValueError(f"trajectory must come from HY-WorldPlay Trajectory, got {type(trajectory).__name__}")
        image = image_tensor(render_trajectory(trajectory.c2w, int(size), CHUNK_LATENTS, trajectory.describe()))
        return io.NodeOutput(image, ui=ui.PreviewImage(image, cls=cls))


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
        result = run(WorldPlayRequest.from_options(model, positive, latent, trajectory, seed, sampler, sigmas))
        return sampled_output(latent, result, report_text(result.report))


#: the family's nodes, in the order ComfyUI lists them (nodes/__init__.py finds this file by the family's key)
NODES: list[type[io.ComfyNode]] = [
    JensenKVLoadWorldPlay,
    JensenKVWorldPlayTrajectory,
    JensenKVWorldPlayTrajectoryPreview,
    JensenKVWorldPlayARSampler,
]
