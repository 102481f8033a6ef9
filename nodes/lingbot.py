"""LingBot-World 2.0's nodes: Load LingBot-World, LingBot-World Camera and LingBot-World AR Sampler (the family's
package: ``runtime/families/lingbot/``)."""

from __future__ import annotations

import os

from comfy_api.latest import io, ui

from ..runtime.families.lingbot.loader import WEIGHT_DTYPES, describe, is_lingbot_folder, load_lingbot
from ..runtime.families.lingbot.model.camera import CameraError, CameraPath, path_from_arrays, path_from_keys
from ..runtime.families.lingbot.model.schedule import DEFAULT_INDICES, DEFAULT_SHIFT, parse_indices
from ..runtime.families.lingbot.model.window import DEFAULT_CHUNK, DEFAULT_LOCAL_ATTN, DEFAULT_SINK
from ..runtime.families.lingbot.recipe import LingBotRequest, report_text, run
from .common import (
    CATEGORY,
    Combo,
    JensenKVReport,
    advanced,
    check_model_file,
    diffusion_model_path,
    diffusion_models_with_folders,
    logger,
    model_file_fingerprint,
    sampled_output,
)

NO_FILES = "(no file in models/diffusion_models)"


def lingbot_choices() -> list[str]:
    """Load LingBot-World's list: the release's folders as published (``transformers/``: config.json and shards,
    LingBot's tensors; shown as ``name/``) and the files of models/diffusion_models (a merged file)."""
    return diffusion_models_with_folders(is_lingbot_folder)


INDICES_TEXT = ",".join(map(str, DEFAULT_INDICES))
#: the camera path between LingBot-World Camera and LingBot-World AR Sampler
LingBotCamera = io.Custom("LINGBOT_WORLD_CAMERA")


class JensenKVLoadLingBot(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLoadLingBot",
            display_name="Load LingBot-World",
            category=CATEGORY,
            description=(
                "LingBot-World 2.0 (Robbyant, causal-fast 1.3B or 14B) on ComfyUI's Wan 2.1 blocks with its camera "
                "layers: the release's transformers/ folder as published (config.json and its shards, listed as "
                "name/), or one merged .safetensors. UNETLoader reads the file as plain Wan 2.1 and drops the "
                "camera layers; use this node."
            ),
            inputs=[
                Combo(
                    "unet_name",
                    options=lingbot_choices() or [NO_FILES],
                    tooltip="lingbot-world-v2-*-causal-fast as downloaded (its transformers/ folder, ending in /) or "
                    "its DiT merged into one .safetensors, in models/diffusion_models.",
                ),
                Combo(
                    "weight_dtype",
                    options=list(WEIGHT_DTYPES),
                    default="default",
                    tooltip="default: what ComfyUI picks for the device (BF16 on most GPUs; the file is FP32); "
                    "fp8_*: FP8 weights, half the memory.",
                ),
            ],
            outputs=[io.Model.Output(tooltip="LingBot-World: sample it with LingBot-World AR Sampler.")],
        )

    @classmethod
    def fingerprint_inputs(cls, unet_name, weight_dtype):
        return model_file_fingerprint(unet_name, weight_dtype)

    @classmethod
    def validate_inputs(cls, unet_name=None):
        return check_model_file(
            unet_name,
            NO_FILES,
            "download lingbot-world-v2-1.3b-causal-fast (huggingface robbyant) into ComfyUI's models/diffusion_models "
            "and press R",
            lingbot_choices,
        )

    @classmethod
    def execute(cls, unet_name, weight_dtype="default") -> io.NodeOutput:
        model = load_lingbot(diffusion_model_path(unet_name), weight_dtype)
        text = f"{unet_name}: {describe(model)}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(model, ui=ui.PreviewText(text))


def camera_of(path: str, pose_folder: str = "") -> CameraPath:
    """The camera path of the node's inputs: a pose folder (``poses.npy`` and ``intrinsics.npy``) when given, else
    the typed path. CameraError naming the value and the fix."""
    folder = str(pose_folder or "").strip()
    if not folder:
        return path_from_keys(path)
    import numpy as np

    poses_file, k_file = os.path.join(folder, "poses.npy"), os.path.join(folder, "intrinsics.npy")
    if not os.path.isfile(poses_file):
        raise CameraError(
            f"pose_folder {folder!r} has no poses.npy (N x 4 x 4 camera-to-world, OpenCV, one per video frame): give "
            "a folder like the reference's examples/00, or leave pose_folder empty to use the typed path"
        )
    poses = np.load(poses_file, allow_pickle=False)
    k = np.load(k_file, allow_pickle=False) if os.path.isfile(k_file) else None
    return path_from_arrays(poses, k, source=f"pose folder {folder!r}")


def _length(camera: CameraPath, chunk: int = DEFAULT_CHUNK) -> int:
    """WanImageToVideo's length for the whole chunks the path covers."""
    latents = camera.latents_available() // chunk * chunk
    return 4 * (latents - 1) + 1 if latents else 0


class JensenKVLingBotCamera(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLingBotCamera",
            display_name="LingBot-World Camera",
            category=CATEGORY,
            description=(
                "The camera path of a LingBot-World video: typed keys (w/s forward/back, a/d right/left, left/right "
                "yaw, up/down pitch; the number after the dash is latent frames, e.g. 'w-15, w+right-16') or the "
                "reference's pose folder (poses.npy + intrinsics.npy). LingBot-World 2.0 takes no action labels."
            ),
            inputs=[
                io.String.Input(
                    "path",
                    default="w-15",
                    multiline=True,
                    tooltip="Keys held for N latent frames, e.g. 'w-15' (16 latents, 61 frames) or 'w-7, w+right-8'. "
                    "Steps: 0.05 on the ground plane, yaw 6 deg, pitch 4 deg.",
                ),
                advanced(
                    io.String.Input(
                        "pose_folder",
                        default="",
                        tooltip="A folder with poses.npy (camera-to-world, one per video frame) and intrinsics.npy "
                        "(fx, fy, cx, cy at 480x832). Empty: use path.",
                    )
                ),
            ],
            outputs=[
                LingBotCamera.Output(display_name="camera", tooltip="The checked camera path."),
                io.Int.Output(
                    display_name="length",
                    tooltip="Video frames of the whole chunks of 4 the path covers: WanImageToVideo's length.",
                ),
                io.String.Output(display_name="info", tooltip="What the path holds."),
            ],
        )

    @classmethod
    def validate_inputs(cls, path=None, pose_folder=None):
        if not isinstance(path, str) or not isinstance(pose_folder or "", str):
            return True
        try:
            camera_of(path, pose_folder or "")
        except (CameraError, OSError, ValueError) as exc:
            return str(exc)
        return True

    @classmethod
    def execute(cls, path, pose_folder="") -> io.NodeOutput:
        camera = camera_of(path, pose_folder)
        text = camera.describe()
        logger.info("jensen_kv: LingBot-World camera: %s", text)
        return io.NodeOutput(camera, _length(camera), text, ui=ui.PreviewText(text))


DESCRIPTION = (
    "LingBot-World 2.0's causal-fast rollout: chunks of 4 latent frames, each denoised in 4 DMD steps (t = 999, 967, "
    "908, 768; no CFG), then written to the cache by one clean pass. The window and sink are the reference's 18 and 6 "
    "latent frames. Without Quantize KV Cache upstream the cache is full precision (the A/B baseline)."
)


class JensenKVLingBotARSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVLingBotARSampler",
            display_name="LingBot-World AR Sampler",
            category=CATEGORY,
            description=DESCRIPTION,
            inputs=[
                io.Model.Input(
                    "model",
                    tooltip="LingBot-World from Load LingBot-World, optionally through Quantize KV Cache and Jensen "
                    "Bias Correction.",
                ),
                io.Conditioning.Input(
                    "positive",
                    tooltip="The prompt with the start image: WanImageToVideo's positive output (one entry).",
                ),
                io.Latent.Input(
                    "latent",
                    tooltip="WanImageToVideo's latent, its length the camera's length output (whole chunks).",
                ),
                LingBotCamera.Input("camera", tooltip="The camera path from LingBot-World Camera."),
                io.Int.Input(
                    "seed",
                    default=42,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="Noise seed: the video's noise and every re-noise come from one generator (the "
                    "reference's 42).",
                ),
                io.Int.Input(
                    "local_attn_size",
                    default=DEFAULT_LOCAL_ATTN,
                    min=-1,
                    max=1024,
                    tooltip="Window in latent frames, sink and current chunk included (reference: 18). -1: keep "
                    "every frame.",
                ),
                io.Int.Input(
                    "sink_size",
                    default=DEFAULT_SINK,
                    min=0,
                    max=1024,
                    tooltip="Latent frames at the start that stay cached for good (reference: 6).",
                ),
                advanced(
                    io.Int.Input(
                        "chunk_frames",
                        default=DEFAULT_CHUNK,
                        min=1,
                        max=64,
                        tooltip="Latent frames per chunk (the reference's CLI: 4; its API default: 3).",
                    )
                ),
                advanced(
                    io.String.Input(
                        "timestep_indices",
                        default=INDICES_TEXT,
                        tooltip="Entries of the 1000-step table per chunk (reference CLI: 0,250,500,750; SGLang: "
                        "0,179,358,679).",
                    )
                ),
                advanced(
                    io.Float.Input(
                        "shift",
                        default=DEFAULT_SHIFT,
                        min=0.1,
                        max=100.0,
                        step=0.1,
                        tooltip="Timestep shift of that table (reference: 10).",
                    )
                ),
            ],
            outputs=[
                io.Latent.Output(display_name="LATENT", tooltip="The whole video's latent (VAEDecode it)."),
                JensenKVReport.Output(
                    display_name="report", tooltip="What the cache cost: bytes, effective bits, window and entries."
                ),
            ],
        )

    @classmethod
    def validate_inputs(cls, timestep_indices=None):
        if isinstance(timestep_indices, str):
            try:
                parse_indices(timestep_indices)
            except ValueError as exc:
                return str(exc)
        return True

    @classmethod
    def execute(
        cls,
        model,
        positive,
        latent,
        camera,
        seed,
        local_attn_size=DEFAULT_LOCAL_ATTN,
        sink_size=DEFAULT_SINK,
        chunk_frames=DEFAULT_CHUNK,
        timestep_indices=INDICES_TEXT,
        shift=DEFAULT_SHIFT,
    ) -> io.NodeOutput:
        request = LingBotRequest.from_options(
            model,
            positive,
            latent,
            camera,
            seed,
            local_attn_size=int(local_attn_size),
            sink_size=int(sink_size),
            chunk_frames=int(chunk_frames),
            timestep_indices=parse_indices(timestep_indices),
            shift=float(shift),
        )
        result = run(request)
        return sampled_output(latent, result, report_text(result.report))


#: the family's nodes, in the order ComfyUI lists them (nodes/__init__.py finds this file by the family's key)
NODES: list[type[io.ComfyNode]] = [JensenKVLoadLingBot, JensenKVLingBotCamera, JensenKVLingBotARSampler]
