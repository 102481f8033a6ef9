"""Load HY-WorldPlay: the official checkpoint (``ar_distilled_action_model/model.safetensors``) as a MODEL."""

from __future__ import annotations

import os

from comfy_api.latest import io, ui

from ..runtime.families import WORLDPLAY
from .common import CATEGORY, check_combo_values, logger

NO_FILES = "(no file in models/diffusion_models)"
NEEDS = (
    "Load HY-WorldPlay needs ComfyUI's HunyuanVideo 1.5 (ComfyUI v0.27 or newer); this ComfyUI has none: update ComfyUI"
)


def _model_files() -> list[str]:
    import folder_paths

    return folder_paths.get_filename_list("diffusion_models")


def _path(name: str) -> str:
    import folder_paths

    return folder_paths.get_full_path_or_raise("diffusion_models", name)


def has_hunyuan15() -> bool:
    import comfy.supported_models

    return hasattr(comfy.supported_models, "HunyuanVideo15")


class JensenKVLoadWorldPlay(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLoadWorldPlay",
            display_name="Load HY-WorldPlay",
            category=CATEGORY,
            description=(
                "HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay) on ComfyUI's HunyuanVideo 1.5: its official checkpoint "
                "with the action embedding and the PRoPE camera stream. UNETLoader reads it as plain HunyuanVideo 1.5 "
                "and loses those; use this node."
            ),
            inputs=[
                io.Combo.Input(
                    "unet_name",
                    options=_model_files() or [NO_FILES],
                    tooltip="HY-WorldPlay's ar_distilled_action_model/model.safetensors, in models/diffusion_models.",
                ),
                io.Combo.Input(
                    "weight_dtype",
                    options=list(WORLDPLAY.weight_dtypes),
                    default="default",
                    tooltip="default: the file's precision (BF16) where the device has it; fp8_*: store the "
                    "weights in FP8 (half the memory), compute in the manual-cast dtype.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="HY-WorldPlay (sample it with shift 5: the worldplay_4step schedule).")],
        )

    @classmethod
    def fingerprint_inputs(cls, unet_name, weight_dtype):
        try:
            st = os.stat(_path(unet_name))
        except Exception:  # noqa: BLE001 - an unknown name is validate_inputs' to report
            return f"{unet_name}|{weight_dtype}"
        return f"{unet_name}|{weight_dtype}|{st.st_size}|{st.st_mtime_ns}"

    @classmethod
    def validate_inputs(cls, unet_name=None, weight_dtype=None):
        checked = check_combo_values(cls, weight_dtype=weight_dtype)
        if checked is not True:
            return checked
        if unet_name == NO_FILES:
            return "put HY-WorldPlay's model.safetensors into ComfyUI's models/diffusion_models and press R"
        return True

    @classmethod
    def execute(cls, unet_name, weight_dtype="default") -> io.NodeOutput:
        if not has_hunyuan15():
            raise RuntimeError(NEEDS)
        model = WORLDPLAY.load(_path(unet_name), weight_dtype)
        text = f"{unet_name}: {WORLDPLAY.describe(model)}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(model, ui=ui.PreviewText(text))
