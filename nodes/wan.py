"""Wan 2.1's node: Load AR Video Checkpoint, the chunk-wise AR checkpoints as their authors publish them (the family's
package: ``runtime/families/wan/``; the sampler nodes serve every family)."""

from __future__ import annotations

import os

from comfy_api.latest import io, ui

from ..runtime.families.wan.loader import WEIGHT_DTYPES, WEIGHTS, load_ar_checkpoint
from .common import CATEGORY, Combo, advanced, logger

#: the file kinds the authors publish: training checkpoints (.pt / .pth) and Krea's safetensors
EXTENSIONS = (".pt", ".pth", ".safetensors", ".sft")
NO_FILES = "(no .pt or .safetensors file in models/diffusion_models)"
NO_LORA = "none"


def checkpoint_files() -> list[str]:
    import folder_paths

    return [n for n in folder_paths.get_filename_list("diffusion_models") if n.lower().endswith(EXTENSIONS)]


def lora_files() -> list[str]:
    """LongLive's lora.pt goes beside its base in models/diffusion_models: it is half of that one model (a PEFT LoRA
    of its generator, merged at load), not a LoRA Load LoRA applies to any Wan."""
    return checkpoint_files()


def _stamp(folder: str, name: str) -> str:
    import folder_paths

    try:
        st = os.stat(folder_paths.get_full_path_or_raise(folder, name))
    except Exception:  # noqa: BLE001 - an unknown name is validate_inputs' to report
        return name
    return f"{name}|{st.st_size}|{st.st_mtime_ns}"


class JensenKVLoadARCheckpoint(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLoadARCheckpoint",
            display_name="Load AR Video Checkpoint",
            category=CATEGORY,
            description=(
                "Reads Self-Forcing / CausVid / LongLive / Causal Forcing / Krea checkpoints as published: no "
                "conversion step. Converts in memory with tools/convert_checkpoint.py's own checks (a .pt is loaded "
                "with weights_only=True) and loads the Wan 2.1 model UNETLoader would load from the converted file."
            ),
            inputs=[
                Combo(
                    "ckpt_name",
                    options=checkpoint_files() or [NO_FILES],
                    tooltip="The checkpoint as downloaded (self_forcing_dmd.pt, Krea's .safetensors, ...), in "
                    "models/diffusion_models.",
                ),
                Combo(
                    "lora_name",
                    options=[NO_LORA, *lora_files()],
                    default=NO_LORA,
                    tooltip="A LoRA merged at load (LongLive's lora.pt, in models/diffusion_models); none for the others.",
                ),
                Combo(
                    "weights",
                    options=list(WEIGHTS),
                    default="auto",
                    tooltip="Which weights of a .pt: auto takes generator_ema (what Self-Forcing samples with), else "
                    "generator; with a LoRA, generator.",
                ),
                advanced(
                    Combo(
                        "weight_dtype",
                        options=list(WEIGHT_DTYPES),
                        default="default",
                        tooltip="As Load Diffusion Model: default keeps BF16 where the device has it; fp8_*: half "
                        "the memory.",
                    )
                ),
                io.Boolean.Input(
                    "causal",
                    default=False,
                    tooltip="Load as core's causal model (WAN21_CausalAR) for SamplerARVideo; ComfyUI v0.27+. Off "
                    "for the pack's samplers.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="The Wan 2.1 model, for the Chunked AR samplers (or core's, causal).")],
        )

    @classmethod
    def fingerprint_inputs(cls, ckpt_name, lora_name=NO_LORA, weights="auto", weight_dtype="default", causal=False):
        lora = NO_LORA if lora_name == NO_LORA else _stamp("diffusion_models", lora_name)
        return f"{_stamp('diffusion_models', ckpt_name)}|{weights}|{weight_dtype}|{lora}|{causal}"

    @classmethod
    def validate_inputs(cls, ckpt_name=None, lora_name=None):
        # only the file names: ComfyUI attaches a failure to every input named here (and leaves their own checks out)
        if ckpt_name == NO_FILES:
            return "put the checkpoint (e.g. self_forcing_dmd.pt) into ComfyUI's models/diffusion_models and press R"
        if ckpt_name is not None and ckpt_name not in checkpoint_files():
            return f"{ckpt_name!r} is not in ComfyUI's models/diffusion_models: put it there and press R"
        if lora_name not in (None, NO_LORA) and lora_name not in lora_files():
            return (
                f"{lora_name!r} is not in ComfyUI's models/diffusion_models: put it there and press R (or choose none)"
            )
        return True

    @classmethod
    def execute(cls, ckpt_name, lora_name=NO_LORA, weights="auto", weight_dtype="default", causal=False):
        import folder_paths

        path = folder_paths.get_full_path_or_raise("diffusion_models", ckpt_name)
        lora = None if lora_name == NO_LORA else folder_paths.get_full_path_or_raise("diffusion_models", lora_name)
        model, text = load_ar_checkpoint(path, weights, weight_dtype, lora, bool(causal))
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(model, ui=ui.PreviewText(text))


NODES: list[type[io.ComfyNode]] = [JensenKVLoadARCheckpoint]
