"""KV Cache Diagnostics Plot (report -> IMAGE, STRING): the paper's Fig. 4 from a sampler's report.

ΔP_S histograms before and after the correction and a text summary, drawn by
``runtime/shift_histogram.py`` from the ``diagnostics`` entry that KV Cache Diagnostics asks the
Chunked AR sampler to put in its report.
"""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..runtime.shift_histogram import diagnostics_text, image_tensor, render_histogram
from .common import CATEGORY, JensenKVReport, advanced, logger, node_message

NO_DIAGNOSTICS = (
    "KV Cache Diagnostics Plot: this report has no diagnostics. Put KV Cache Diagnostics on the MODEL "
    "before the Chunked AR sampler (e.g. after Jensen Bias Correction) and run it again."
)


class JensenKVDiagnosticsPlot(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVDiagnosticsPlot",
            display_name="KV Cache Diagnostics Plot",
            category=CATEGORY,
            description=(
                "ΔP_S histograms before (purple) and after (orange) the Jensen correction, like the paper's Fig. 4, "
                "and the numbers: median and IQR of ΔP_S, mean JSD and attention-output MSE against full precision."
            ),
            inputs=[
                JensenKVReport.Input(
                    "report",
                    tooltip="The report of a Chunked AR sampler whose MODEL went through KV Cache Diagnostics.",
                ),
                advanced(
                    io.Int.Input(
                        "width",
                        default=960,
                        min=320,
                        max=4096,
                        step=8,
                        tooltip="Width of the plot in pixels (the text scales with it).",
                    )
                ),
                advanced(
                    io.Int.Input(
                        "height", default=540, min=240, max=4096, step=8, tooltip="Height of the plot in pixels."
                    )
                ),
            ],
            outputs=[
                io.Image.Output(display_name="IMAGE", tooltip="The histogram plot (1 x H x W x 3)."),
                io.String.Output(display_name="STRING", tooltip="The numbers as text."),
            ],
            hidden=[io.Hidden.unique_id],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, report, width=960, height=540) -> io.NodeOutput:
        if not isinstance(report, dict):
            raise ValueError(f"report must be a Chunked AR sampler's report (a dict), got {type(report).__name__}")
        diag = report.get("diagnostics")
        if diag is None:
            raise ValueError(NO_DIAGNOSTICS)
        text = diagnostics_text(diag)
        image = image_tensor(render_histogram(diag, int(width), int(height)))
        logger.info("jensen_kv: %s", text.replace("\n", " | "))
        node_message(cls, text)
        preview = ui.PreviewImage(image, cls=cls).as_dict()
        return io.NodeOutput(image, text, ui={**preview, "text": [text]})
