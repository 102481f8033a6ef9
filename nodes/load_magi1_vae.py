"""Load MAGI-1 VAE: MAGI-1's ViT VAE decoder from models/vae (one file, or Sand AI's ckpt/vae folder)."""

from __future__ import annotations

from comfy_api.latest import io

from ..magi1.checkpoint import CheckpointError
from ..runtime.families import MAGI1
from .common import check_combo_values
from .load_magi1 import MAGI1_CATEGORY

Magi1VAEType = io.Custom("MAGI1_VAE")
NONE_FOUND = "(no MAGI-1 VAE in models/vae)"


class JensenKVLoadMagi1VAE(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        names = MAGI1.files.choices("vae")
        return io.Schema(
            node_id="JensenKVLoadMagi1VAE",
            display_name="Load MAGI-1 VAE",
            category=MAGI1_CATEGORY,
            description=(
                "Load MAGI-1's ViT VAE decoder (8 x 8 pixels and 4 frames per latent pixel, 16 channels): Sand AI's "
                "ckpt/vae folder (config.json + diffusion_pytorch_model.safetensors) or one file from "
                "tools/convert_checkpoint.py --magi1-vae. Decodes with MAGI-1 VAE Decode."
            ),
            inputs=[
                io.Combo.Input(
                    "vae_name",
                    options=names or [NONE_FOUND],
                    tooltip="A file, or a folder (ending in /) with config.json, under models/vae.",
                ),
                io.Combo.Input(
                    "dtype",
                    options=list(MAGI1.vae_dtypes),
                    default="auto",
                    tooltip="Weights and compute: auto (bf16 where the device has it, as the reference), bf16 or fp32.",
                ),
            ],
            outputs=[Magi1VAEType.Output(display_name="magi1_vae", tooltip="The decoder, for MAGI-1 VAE Decode.")],
        )

    @classmethod
    def validate_inputs(cls, vae_name, dtype):
        return check_combo_values(cls, vae_name=vae_name, dtype=dtype)

    @classmethod
    def fingerprint_inputs(cls, vae_name, dtype):
        try:
            return f"{MAGI1.files.version(MAGI1.files.resolve(vae_name, 'vae'))}|{dtype}"
        except (ValueError, OSError):
            return vae_name

    @classmethod
    def execute(cls, vae_name, dtype="auto") -> io.NodeOutput:
        if vae_name == NONE_FOUND:
            raise ValueError("Load MAGI-1 VAE: no MAGI-1 VAE in models/vae; put Sand AI's ckpt/vae folder there")
        try:
            return io.NodeOutput(MAGI1.load_vae(MAGI1.files.resolve(vae_name, "vae"), dtype))
        except CheckpointError as exc:
            raise ValueError(f"Load MAGI-1 VAE: {exc}") from None
