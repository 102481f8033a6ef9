"""What runs while a Chunked AR video is sampled (imports ComfyUI lazily; never imports ``nodes``).

- ``config``: the frozen KV-cache configuration the patch nodes put on a MODEL;
- ``chunk_loop``: the chunk-wise loop that drives ComfyUI's own samplers;
- ``run_caches``: per-run caches of every (layer, CFG branch);
- ``families/``: one adapter per model family (detection, self-attention patch, RoPE offset, latent geometry);
- ``observer`` / ``shift_observer`` / ``shift_histogram``: the attention diagnostics.
"""
