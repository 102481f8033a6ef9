"""Load MAGI-1 Model: a MAGI-1 DiT from models/diffusion_models (one file, or Sand AI's sharded folder) as a MODEL."""

from __future__ import annotations

from comfy_api.latest import io

from ..magi1.checkpoint import CheckpointError
from ..runtime.families import MAGI1
from .common import CATEGORY, check_combo_values

MAGI1_CATEGORY = f"{CATEGORY}/MAGI-1"
NONE_FOUND = "(no MAGI-1 checkpoint in models/diffusion_models)"


class JensenKVLoadMagi1(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = MAGI1.files.choices("diffusion_models")
        return io.Schema(
            node_id="JensenKVLoadMagi1",
            display_name="Load MAGI-1 Model",
            category=MAGI1_CATEGORY,
            description=(
                "Load Sand AI's MAGI-1 (4.5B or 24B, base or distill) as a MODEL: a .safetensors file (e.g. made by "
                "tools/convert_checkpoint.py --magi1) or Sand AI's folder with model.safetensors.index.json and its "
                "shards. Refused with the reason: other models, .zst shards (decompress them first) and the "
                "distill_quant fp8 weights (use the distill weights with weight_dtype fp8_e4m3fn)."
            ),
            inputs=[
                io.Combo.Input(
                    "model_name",
                    options=names or [NONE_FOUND],
                    tooltip="A file, or a folder (ending in /) holding an index and its shards, under models/diffusion_models.",
                ),
                io.Combo.Input(
                    "weight_dtype",
                    options=list(MAGI1.weight_dtypes),
                    default="default",
                    tooltip="How the weights are stored in memory: default (as ComfyUI picks), fp8_e4m3fn (half of bf16) or bf16.",
                ),
                io.Combo.Input(
                    "variant",
                    options=list(MAGI1.variants),
                    default="auto",
                    tooltip="base (64 steps, cfg 3) or distill (fewer steps, cfg 1); auto reads the file's metadata or 'distill' in its path.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The MAGI-1 DiT; sample it with MAGI-1's chunk sampler.")],
        )

    @classmethod
    def validate_inputs(cls, model_name, weight_dtype, variant):
        return check_combo_values(cls, model_name=model_name, weight_dtype=weight_dtype, variant=variant)

    @classmethod
    def fingerprint_inputs(cls, model_name, weight_dtype, variant):
        try:
            return f"{MAGI1.files.version(MAGI1.files.resolve(model_name))}|{weight_dtype}|{variant}"
        except (ValueError, OSError):
            return model_name

    @classmethod
    def execute(cls, model_name, weight_dtype="default", variant="auto") -> io.NodeOutput:
        if model_name == NONE_FOUND:
            raise ValueError(
                "Load MAGI-1 Model: no MAGI-1 checkpoint in models/diffusion_models. Put Sand AI's "
                "inference_weight folder there, or a file from tools/convert_checkpoint.py --magi1"
            )
        path = MAGI1.files.resolve(model_name, "diffusion_models")
        try:
            return io.NodeOutput(MAGI1.load(path, weight_dtype, variant))
        except CheckpointError as exc:
            raise ValueError(f"Load MAGI-1 Model: {exc}") from None
