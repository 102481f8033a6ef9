"""Save KV Cache: write a Chunked AR run's state (JENSEN_KV_CACHE) to ComfyUI's output folder."""

from __future__ import annotations

import os
import time

from comfy_api.latest import io

from ..runtime.saved_run import SavedRun
from .common import CATEGORY, JensenKVCache, logger


def prefix_problem(filename_prefix) -> str | None:
    """Why ``filename_prefix`` cannot name a file (None when it can): its last part must be a name, not empty or
    only dots (``""``, ``"."`` and ``".."`` would make hidden ``._00001_.safetensors`` files)."""
    if not isinstance(filename_prefix, str):
        return f"filename_prefix must be text, got {type(filename_prefix).__name__}"
    name = os.path.basename(os.path.normpath(filename_prefix)) if filename_prefix.strip() else ""
    if not name.strip(". "):
        return (
            f"filename_prefix {filename_prefix!r} names no file: its last part is empty or only dots; give a "
            "name such as jensen_kv/kv_cache"
        )
    return None


def _expand_vars(prefix: str) -> str:
    """``%year%``, ``%month%``, ... as ComfyUI's get_save_image_path expands them (width and height 0)."""
    if "%" not in prefix:
        return prefix
    now = time.localtime()
    values = {
        "width": 0,
        "height": 0,
        "year": now.tm_year,
        "month": f"{now.tm_mon:02}",
        "day": f"{now.tm_mday:02}",
        "hour": f"{now.tm_hour:02}",
        "minute": f"{now.tm_min:02}",
        "second": f"{now.tm_sec:02}",
    }
    for key, value in values.items():
        prefix = prefix.replace(f"%{key}%", str(value))
    return prefix


def _inside(base: str, path: str) -> bool:
    return os.path.commonpath((base, path)) == base


def target_path(filename_prefix: str, out_dir: str) -> tuple[str, str, str]:
    """(the file to write, its name, its subfolder) for ``filename_prefix`` under ``out_dir``.

    ComfyUI's own check compares absolute paths, so a symlink inside output/ (a folder, or a dangling link
    named like the next file) would lead the write elsewhere; this one compares REAL paths, before any
    folder is made and again once it exists."""
    import folder_paths

    problem = prefix_problem(filename_prefix)
    if problem:
        raise ValueError(problem)
    real_out = os.path.realpath(out_dir)

    def refuse(path):
        raise ValueError(
            f"filename_prefix {filename_prefix!r} leads outside ComfyUI's output folder (to "
            f"{os.path.realpath(path)}, through a symlink or '..'); Save KV Cache writes only inside "
            f"{real_out}"
        )

    # before ComfyUI's get_save_image_path, which makes a missing folder (through any symlink on the way)
    subfolder = os.path.dirname(os.path.normpath(_expand_vars(filename_prefix)))
    if not _inside(real_out, os.path.realpath(os.path.join(out_dir, subfolder))):
        refuse(os.path.join(out_dir, subfolder))
    try:
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(filename_prefix, out_dir)
    except Exception as exc:  # noqa: BLE001 - ComfyUI raises a bare Exception for a path outside output/
        raise ValueError(f"filename_prefix {filename_prefix!r}: {str(exc).strip().splitlines()[0]}") from None
    if not _inside(real_out, os.path.realpath(folder)):
        refuse(folder)
    os.makedirs(folder, exist_ok=True)
    file = f"{name}_{counter:05}_.safetensors"
    path = os.path.join(folder, file)
    if not _inside(real_out, os.path.realpath(path)):
        refuse(path)
    return path, file, subfolder


class JensenKVSaveKVCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVSaveKVCache",
            display_name="Save KV Cache",
            category=CATEGORY,
            description=(
                "Save everything a Chunked AR run needs to continue later - the quantized KV cache of every "
                "layer and CFG branch, the sink, the next frame, the prompt - as one .safetensors file "
                "(data only, never code) in ComfyUI's output folder. Load it with Load KV Cache."
            ),
            inputs=[
                JensenKVCache.Input("kv_cache", tooltip="The kv_cache output of a Chunked AR sampler."),
                io.String.Input(
                    "filename_prefix",
                    default="jensen_kv/kv_cache",
                    tooltip="File name prefix under the output folder (a counter and .safetensors are "
                    "added). It must stay inside the output folder (symlinks are followed to "
                    "check) and end in a name, not only dots.",
                ),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def validate_inputs(cls, filename_prefix=None):
        if filename_prefix is None:  # linked from another node: checked when it runs
            return True
        return prefix_problem(filename_prefix) or True

    @classmethod
    def execute(cls, kv_cache, filename_prefix) -> io.NodeOutput:
        import folder_paths

        if not isinstance(kv_cache, SavedRun):
            raise ValueError(f"kv_cache must be a Chunked AR sampler's kv_cache output, got {type(kv_cache).__name__}")
        path, file, subfolder = target_path(filename_prefix, folder_paths.get_output_directory())
        size = kv_cache.save(path)
        rel = os.path.join(subfolder, file) if subfolder else file
        text = f"saved {rel} ({size / 2**20:.2f} MiB): {kv_cache.describe()}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(
            ui={
                "text": [text],
                "jensen_kv_cache_files": [{"filename": file, "subfolder": subfolder, "type": "output", "bytes": size}],
            }
        )
