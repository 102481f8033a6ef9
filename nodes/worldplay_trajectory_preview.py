"""HY-WorldPlay Trajectory Preview: the camera path seen from above, with where each chunk looks, as an IMAGE."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..worldplay.preview import image_tensor, render_trajectory
from ..worldplay.trajectory import CHUNK_LATENTS, Trajectory
from .common import CATEGORY, WorldPlayTrajectory, advanced


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
