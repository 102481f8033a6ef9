"""Test-only ComfyUI nodes, loaded only by the test server (never shipped, never in user workflows).

- ``JensenKVTestConditioning``: random CONDITIONING (1, tokens, width) from a seed, standing in for a
  text encoder (the test checkpoint is a random tiny Wan; a real UMT5 would be 10 GB); ``magi1_caption`` marks it
  as MAGI-1 Text Encode marks its output (a tiny MAGI-1's T5 stand-in).
- ``JensenKVTestPatchProbe``: reports whether any Wan block's ``self_attn.forward`` is still patched
  on the model ComfyUI holds (after a run, an error or an interrupt).
- ``JensenKVTestWorldPlayPrompt``: a random HunyuanVideo 1.5 prompt for the tiny HY-WorldPlay (LLM tokens and
  ByT5 features, ``pooled_output`` None as core's text encoders leave it), standing in for Qwen2.5-VL + ByT5.
- ``JensenKVTestTinyVAE``: a VAE stand-in with HunyuanVideo 1.5's layout for HunyuanVideo15ImageToVideo: every
  16 x 16 pixel patch through a fixed random projection to 32 channels (the first frame, then every 4th).
- ``JensenKVTestTinyWanVAE``: the same with Wan 2.1's layout (8 x 8 pixels -> 16 channels) for WanImageToVideo (the
  tiny LingBot-World).
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

    class JensenKVTestWorldPlayPrompt(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id="JensenKVTestWorldPlayPrompt",
                display_name="Random HY-WorldPlay Prompt (jensen_kv tests)",
                category="jensen_kv/testing",
                inputs=[
                    io.Int.Input("seed", default=0, min=0, max=2**31 - 1, tooltip="Seed of the random embedding."),
                    io.Int.Input("tokens", default=7, min=1, max=4096, tooltip="Number of LLM text tokens."),
                    io.Int.Input("width", default=32, min=1, max=8192, tooltip="LLM width (Qwen2.5-VL 7B: 3584)."),
                ],
                outputs=[io.Conditioning.Output()],
            )

        @classmethod
        def execute(cls, seed, tokens, width):
            g = torch.Generator().manual_seed(seed)
            text = torch.randn(1, tokens, width, generator=g)
            byt5 = torch.randn(1, 3, 1472, generator=g)
            return io.NodeOutput([[text, {"conditioning_byt5small": byt5, "pooled_output": None}]])

    class TinyVAE:
        def __init__(self, seed):
            g = torch.Generator().manual_seed(seed)
            self.proj = torch.randn(32, 3 * 16 * 16, generator=g) / math.sqrt(3 * 16 * 16)

        def encode(self, pixels):
            frames = pixels[::4, :, :, :3].float()  # (t, H, W, 3): the first frame, then every 4th
            t, h, w = frames.shape[0], frames.shape[1] // 16, frames.shape[2] // 16
            patches = frames[:, : h * 16, : w * 16].reshape(t, h, 16, w, 16, 3).permute(0, 1, 3, 5, 2, 4)
            latent = patches.reshape(t, h, w, -1) @ self.proj.T  # (t, h, w, 32)
            return latent.permute(3, 0, 1, 2).unsqueeze(0)  # (1, 32, t, h, w)

    class JensenKVTestTinyVAE(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id="JensenKVTestTinyVAE",
                display_name="Tiny HunyuanVideo 1.5 VAE (jensen_kv tests)",
                category="jensen_kv/testing",
                inputs=[io.Int.Input("seed", default=0, min=0, max=2**31 - 1, tooltip="Seed of the projection.")],
                outputs=[io.Vae.Output()],
            )

        @classmethod
        def execute(cls, seed):
            return io.NodeOutput(TinyVAE(seed))

    class TinyWanVAE:
        """Wan 2.1's latent layout (16 channels, 8 x 8 pixels and 4 frames per latent) from a fixed random projection."""

        def __init__(self, seed):
            g = torch.Generator().manual_seed(seed)
            self.proj = torch.randn(16, 3 * 8 * 8, generator=g) / math.sqrt(3 * 8 * 8)

        def encode(self, pixels):
            frames = pixels[::4, :, :, :3].float()
            t, h, w = frames.shape[0], frames.shape[1] // 8, frames.shape[2] // 8
            patches = frames[:, : h * 8, : w * 8].reshape(t, h, 8, w, 8, 3).permute(0, 1, 3, 5, 2, 4)
            latent = patches.reshape(t, h, w, -1) @ self.proj.T  # (t, h, w, 16)
            return latent.permute(3, 0, 1, 2).unsqueeze(0)  # (1, 16, t, h, w)

    class JensenKVTestTinyWanVAE(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(
                node_id="JensenKVTestTinyWanVAE",
                display_name="Tiny Wan 2.1 VAE (jensen_kv tests)",
                category="jensen_kv/testing",
                inputs=[io.Int.Input("seed", default=0, min=0, max=2**31 - 1, tooltip="Seed of the projection.")],
                outputs=[io.Vae.Output()],
            )

        @classmethod
        def execute(cls, seed):
            return io.NodeOutput(TinyWanVAE(seed))

    class TestNodes(ComfyExtension):
        async def get_node_list(self):
            return [
                JensenKVTestConditioning,
                JensenKVTestPatchProbe,
                JensenKVTestWorldPlayPrompt,
                JensenKVTestTinyVAE,
                JensenKVTestTinyWanVAE,
            ]

    return TestNodes()
