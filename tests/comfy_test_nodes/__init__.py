"""Test-only ComfyUI nodes, loaded only by the test server (never shipped, never in user workflows).

- ``JensenKVTestConditioning``: random CONDITIONING (1, tokens, width) from a seed, standing in for a
  text encoder (the test checkpoint is a random tiny Wan; a real UMT5 would be 10 GB); ``magi1_caption`` marks it
  as MAGI-1 Text Encode marks its output (a tiny MAGI-1's T5 stand-in).
- ``JensenKVTestPatchProbe``: reports whether any Wan block's ``self_attn.forward`` is still patched
  on the model ComfyUI holds (after a run, an error or an interrupt).
"""

from __future__ import annotations

import math


async def comfy_entrypoint():
    import torch
    from comfy_api.latest import ComfyExtension, io, ui

    class JensenKVTestConditioning(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id="JensenKVTestConditioning",
                display_name="Random Conditioning (jensen_kv tests)",
                category="jensen_kv/testing",
                inputs=[
                    io.Int.Input("seed", default=0, min=0, max=2**31 - 1, tooltip="Seed of the random embedding."),
                    io.Int.Input("tokens", default=512, min=1, max=4096, tooltip="Number of text tokens."),
                    io.Int.Input("width", default=4096, min=1, max=8192, tooltip="Embedding width (UMT5-XXL: 4096)."),
                    io.Boolean.Input(
                        "magi1_caption", default=False, optional=True, tooltip="Mark it as MAGI-1 Text Encode does."
                    ),
                ],
                outputs=[io.Conditioning.Output()],
            )

        @classmethod
        def execute(cls, seed, tokens, width, magi1_caption=False):
            g = torch.Generator().manual_seed(seed)
            extra = {"magi1_caption": True} if magi1_caption else {}
            return io.NodeOutput([[torch.randn(1, tokens, width, generator=g), extra]])

    class JensenKVTestPatchProbe(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id="JensenKVTestPatchProbe",
                display_name="Wan Patch Probe (jensen_kv tests)",
                category="jensen_kv/testing",
                inputs=[io.Model.Input("model", tooltip="The model whose Wan blocks are inspected.")],
                outputs=[io.String.Output()],
                is_output_node=True,
            )

        @classmethod
        def fingerprint_inputs(cls, model):
            return math.nan  # never cached: every prompt looks again

        @classmethod
        def execute(cls, model):
            from comfy.ldm.wan.model import WanSelfAttention

            patched = []
            for i, blk in enumerate(model.model.diffusion_model.blocks):
                fwd = blk.self_attn.forward
                if getattr(fwd, "__func__", None) is not WanSelfAttention.forward or fwd.__self__ is not blk.self_attn:
                    patched.append(f"block {i}: {type(fwd).__name__}")
            text = "unpatched" if not patched else "patched: " + ", ".join(patched)
            return io.NodeOutput(text, ui=ui.PreviewText(text))

    class TestNodes(ComfyExtension):
        async def get_node_list(self):
            return [JensenKVTestConditioning, JensenKVTestPatchProbe]

    return TestNodes()
