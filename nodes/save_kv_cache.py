"""Save KV Cache: write a Chunked AR run's state (JENSEN_KV_CACHE) to ComfyUI's output folder."""
from __future__ import annotations

import os

from comfy_api.latest import io

from ..runtime.run_state import RunState
from .common import CATEGORY, JensenKVCache, logger


class JensenKVSaveKVCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVSaveKVCache",
            display_name="Save KV Cache",
            category=CATEGORY,
            description=("Save everything a Chunked AR run needs to continue later - the quantized KV cache of every "
                         "layer and CFG branch, the sink, the next frame, the prompt - as one .safetensors file "
                         "(data only, never code) in ComfyUI's output folder. Load it with Load KV Cache."),
            inputs=[
                JensenKVCache.Input("kv_cache", tooltip="The kv_cache output of a Chunked AR sampler."),
                io.String.Input("filename_prefix", default="jensen_kv/kv_cache",
                                tooltip="File name prefix under the output folder (a counter and .safetensors are added)."),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, kv_cache, filename_prefix) -> io.NodeOutput:
        import folder_paths

        if not isinstance(kv_cache, RunState):
            raise ValueError(f"kv_cache must be a Chunked AR sampler's kv_cache output, got {type(kv_cache).__name__}")
        out_dir = folder_paths.get_output_directory()
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(filename_prefix, out_dir)
        os.makedirs(folder, exist_ok=True)
        file = f"{name}_{counter:05}_.safetensors"
        size = kv_cache.save(os.path.join(folder, file))
        rel = os.path.join(subfolder, file) if subfolder else file
        text = f"saved {rel} ({size / 2**20:.2f} MiB): {kv_cache.describe()}"
        logger.info("jensen_kv: %s", text)
        return io.NodeOutput(ui={"text": [text], "jensen_kv_cache_files": [{"filename": file, "subfolder": subfolder,
                                                                            "type": "output", "bytes": size}]})
