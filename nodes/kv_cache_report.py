"""KV Cache Report: the report of the Jensen KV cache after ComfyUI's own AR sampler ran a MODEL."""

from __future__ import annotations

from comfy_api.latest import io

from ..runtime.core_ar import last_report
from ..runtime.report import report_text
from .common import CATEGORY, UI_REPORT_KEY, JensenKVReport


class JensenKVCacheReport(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVCacheReport",
            display_name="KV Cache Report",
            category=CATEGORY,
            description=(
                "What the Jensen KV cache cost on ComfyUI's own AR sampler (SamplerCustom / SamplerCustomAdvanced + "
                "SamplerARVideo): peak bytes, effective bits, the planner's figure and, with KV Cache Diagnostics, the "
                "attention diagnostics. The Chunked AR Video Sampler has a report output of its own."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The same MODEL the sampler (its guider) was given."),
                io.Latent.Input("samples", tooltip="The sampler's output: connects this node after the sampling run."),
            ],
            outputs=[JensenKVReport.Output(display_name="report", tooltip="For KV Cache Diagnostics Plot.")],
            is_output_node=True,
        )

    @classmethod
    def fingerprint_inputs(cls, model, samples):
        return float("nan")  # a new run of the same MODEL may have a new report: never reuse the cached output

    @classmethod
    def execute(cls, model, samples) -> io.NodeOutput:
        report = last_report(model)
        if report is None:
            raise ValueError(
                "no Jensen KV cache report for this MODEL: connect the MODEL that went into the guider of a SamplerCustom "
                "/ SamplerCustomAdvanced with SamplerARVideo (after Quantize KV Cache, Jensen Bias Correction, AR Cache "
                "Window or KV Cache Diagnostics) and that sampler's output to 'samples'"
            )
        text = report_text(report)
        return io.NodeOutput(report, ui={UI_REPORT_KEY: [report], "text": [text]})
