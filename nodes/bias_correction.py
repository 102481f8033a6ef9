"""Jensen Bias Correction: subtract the Jensen bias from the scores of quantized cached keys."""

from __future__ import annotations

from comfy_api.latest import io, ui

from ..runtime.config import CORRECTION_CHOICES, STRENGTH_MAX, get_config, parse_correction, set_config
from .common import CATEGORY, Combo, advanced, logger, node_message, patched_model

NOTHING_TO_CORRECT = (
    "Jensen Bias Correction: nothing to correct - no Quantize KV Cache with quantized keys upstream, so the "
    "cache keeps full-precision keys. Put Quantize KV Cache (key_bits 2-8) before this node; the model passes "
    "through unchanged."
)


class JensenKVBiasCorrection(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVBiasCorrection",
            display_name="Jensen Bias Correction",
            category=CATEGORY,
            description=(
                "Keeps a low-bit KV cache from stealing attention: rounded keys make the past frames look more "
                "relevant than they are (Jensen's inequality inflates exp of noisy scores), so the video drifts. This "
                "subtracts the expected inflation from the scores of cached keys only. Needs Quantize KV Cache "
                "upstream."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The MODEL from Quantize KV Cache (key_bits 2-8)."),
                Combo(
                    "mode",
                    options=list(CORRECTION_CHOICES),
                    default="taylor",
                    tooltip="Which correction keeps past frames from stealing attention. taylor (recommended): the paper's, per cached score, a "
                    "few extra attention channels. chunk_mean: one offset per cached chunk, free on every attention "
                    "kernel (bf16 CPUs, GPU flash); nearly as good with rotation hadamard, weaker without. exact: "
                    "slow, for checks. per_channel: one shared bias per query. off: no correction (for an A/B). "
                    "head_mean: one bias per query and head. The formulas are on this node's help page.",
                ),
                io.Float.Input(
                    "strength",
                    default=1.0,
                    min=0.0,
                    max=STRENGTH_MAX,
                    step=0.05,
                    tooltip="How much of the correction to apply: 1.0 removes the bias on average, 0 turns it off.",
                ),
                advanced(
                    io.Boolean.Input(
                        "guard",
                        default=True,
                        optional=True,
                        tooltip="Keeps the correction from doing harm: where a head's attention sits on a few "
                        "cached tokens, the correction is scaled down so it never overshoots. Leave on; off is "
                        "the paper's unguarded formula.",
                    )
                ),
            ],
            outputs=[
                io.Model.Output(
                    tooltip="A clone of the model with the correction set (or the input model when "
                    "there is nothing to correct)."
                )
            ],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model, mode, strength, guard=True) -> io.NodeOutput:
        correction = parse_correction(mode)
        config = get_config(model.model_options)
        if config is None or not config.keys_quantized:
            logger.warning("jensen_kv: %s", NOTHING_TO_CORRECT)
            node_message(cls, NOTHING_TO_CORRECT)
            return io.NodeOutput(model, ui=ui.PreviewText(NOTHING_TO_CORRECT))
        if not isinstance(guard, bool):
            raise ValueError(f"guard={guard!r} must be true or false (true keeps the correction from overshooting)")
        config = config.with_correction(correction, strength, guard)
        return patched_model(model, config, set_config, f"KV cache: {config.describe()}")
