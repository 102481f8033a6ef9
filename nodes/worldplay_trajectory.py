"""HY-WorldPlay Trajectory: a pose string or pose JSON -> a checked camera path (one pose per latent frame)."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..worldplay.trajectory import TrajectoryError, parse_trajectory
from .common import CATEGORY, WorldPlayTrajectory, advanced, logger


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
