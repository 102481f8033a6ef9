"""MAGI-1 VAE Decode: a MAGI-1 video LATENT as images, decoded in the reference's tiles, with a progress bar."""

from __future__ import annotations

from comfy_api.latest import io

from .common import advanced
from .load_magi1 import MAGI1_CATEGORY
from .load_magi1_vae import Magi1VAEType


class JensenKVMagi1VAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVMagi1VAEDecode",
            display_name="MAGI-1 VAE Decode",
            category=MAGI1_CATEGORY,
            description=(
                "Decode a MAGI-1 LATENT (16 channels) into frames: 4 per latent frame, 8 x 8 pixels per latent "
                "pixel, in tiles as Sand AI's pipeline decodes (256 px with a quarter overlap, 12 frames each)."
            ),
            inputs=[
                Magi1VAEType.Input("magi1_vae", tooltip="From Load MAGI-1 VAE."),
                io.Latent.Input("samples", tooltip="A MAGI-1 video LATENT (batch, 16, frames, height, width)."),
                advanced(
                    io.Int.Input(
                        "tile_pixels",
                        default=256,
                        min=64,
                        max=4096,
                        step=8,
                        tooltip="Tile side in pixels (256: the reference).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "tile_frames",
                        default=12,
                        min=4,
                        max=240,
                        step=4,
                        tooltip="Frames per tile (12: the reference at 24 fps).",
                    )
                ),
                advanced(
                    io.Float.Input(
                        "overlap",
                        default=0.25,
                        min=0.0,
                        max=0.75,
                        step=0.05,
                        tooltip="Spatial tile overlap, blended linearly (0.25: the reference).",
                    )
                ),
            ],
            outputs=[io.Image.Output(tooltip="The frames of every video in the batch, in order.")],
        )

    @classmethod
    def execute(cls, magi1_vae, samples, tile_pixels=256, tile_frames=12, overlap=0.25) -> io.NodeOutput:
        import comfy.model_management
        import comfy.utils

        bar = {}

        def progress(done, total):
            comfy.model_management.throw_exception_if_processing_interrupted()
            if "bar" not in bar:
                bar["bar"] = comfy.utils.ProgressBar(total)
            bar["bar"].update_absolute(done, total)

        images = magi1_vae.decode(samples["samples"], int(tile_pixels), int(tile_frames), float(overlap), progress)
        return io.NodeOutput(images)
