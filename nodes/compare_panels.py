"""Compare Panels: two or three videos side by side, each labelled, with its PSNR against the first beside it."""

from __future__ import annotations

import math

import numpy as np
import torch
from comfy_api.latest import io, ui

from .tiny_ar_prompt import DEMO_CATEGORY

LABEL_HEIGHT = 30  # pixels of the label strip above the panels (two lines of PIL's default font)
SPACING = 4  # white pixels between panels, as the demo's ImageStitch had


def psnr(reference: torch.Tensor, x: torch.Tensor) -> float:
    """PSNR in dB of ``x`` against ``reference`` (images in 0..1, peak 1) over every frame; inf when equal."""
    mse = float((x.double() - reference.double()).square().mean())
    return 10 * math.log10(1.0 / mse) if mse > 0 else float("inf")


def _caption(label: str, value: float | None) -> tuple[str, str]:
    if value is None:
        return label, "reference"
    return label, ("identical" if math.isinf(value) else f"PSNR {value:.1f} dB")


def compare(images: list[torch.Tensor], labels: list[str]) -> tuple[torch.Tensor, list[float | None]]:
    """``images`` (each (frames, H, W, 3) in 0..1, the same size) side by side with a label strip on top: each
    panel's label, and its PSNR against the first (the first says "reference"). Returns the frames and the PSNRs
    (None for the first)."""
    from PIL import Image, ImageDraw

    first = images[0]
    for i, img in enumerate(images[1:], 2):
        if img.shape != first.shape:
            raise ValueError(
                f"Compare Panels: image {i} is {tuple(img.shape)} (frames, height, width, channels), image 1 is "
                f"{tuple(first.shape)}: compare videos of the same length and size"
            )
    values = [None] + [psnr(first, img) for img in images[1:]]
    frames, h, w, _ = first.shape
    width = len(images) * w + (len(images) - 1) * SPACING
    strip = Image.new("RGB", (width, LABEL_HEIGHT), "white")
    draw = ImageDraw.Draw(strip)
    for i, (label, value) in enumerate(zip(labels, values)):
        top, bottom = _caption(label, value)
        x = i * (w + SPACING) + 3
        draw.text((x, 2), top, fill=(20, 20, 20))
        draw.text((x, 15), bottom, fill=(20, 20, 20) if value is None else (160, 30, 30))
    head = torch.from_numpy(np.asarray(strip, dtype=np.float32) / 255.0)
    out = torch.ones(frames, LABEL_HEIGHT + h, width, 3)
    out[:, :LABEL_HEIGHT] = head
    for i, img in enumerate(images):
        x0 = i * (w + SPACING)
        out[:, LABEL_HEIGHT:, x0 : x0 + w] = img.float().cpu()
    return out, values


class JensenKVComparePanels(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVComparePanels",
            display_name="Compare Panels",
            category=DEMO_CATEGORY,
            description=(
                "Shows two or three videos side by side with a label over each and how close each is to the first "
                "(PSNR in dB against it, over every frame: higher is closer, 'identical' when equal). For an A/B of "
                "caches: full precision first."
            ),
            inputs=[
                io.Image.Input("image_a", tooltip="The reference video (full precision), shown first."),
                io.Image.Input("image_b", tooltip="A video to compare with the reference (e.g. the INT2 cache's)."),
                io.Image.Input(
                    "image_c", optional=True, tooltip="Optional third video (e.g. INT2 + Jensen), shown last."
                ),
                io.String.Input("label_a", default="full precision", tooltip="The first panel's label."),
                io.String.Input("label_b", default="INT2", tooltip="The second panel's label."),
                io.String.Input("label_c", default="INT2 + Jensen", tooltip="The third panel's label."),
            ],
            outputs=[io.Image.Output(tooltip="The labelled panels side by side, one image per frame.")],
        )

    @classmethod
    def execute(cls, image_a, image_b, label_a, label_b, label_c, image_c=None) -> io.NodeOutput:
        images = [image_a, image_b] + ([] if image_c is None else [image_c])
        labels = [label_a, label_b, label_c][: len(images)]
        out, values = compare(images, labels)
        text = (
            "PSNR against "
            + label_a
            + ": "
            + ", ".join(
                f"{label} {_caption(label, v)[1].removeprefix('PSNR ')}" for label, v in zip(labels[1:], values[1:])
            )
        )
        return io.NodeOutput(out, ui=ui.PreviewText(text))
