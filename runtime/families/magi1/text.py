"""MAGI-1's text path in ComfyUI: a T5-XXL CLIP (CLIPLoader type ``pixart``) and the reference's caption rules.

What matches the reference (``T5Embedder.get_text_embeddings``: DeepFloyd/t5-v1_1-xxl, 800 tokens, float32,
padded to 800 with an attention mask; only the valid tokens reach the DiT): ComfyUI's ``pixart`` CLIP type
runs the same architecture (``comfy/text_encoders/t5_config_xxl.json``: T5 v1.1 XXL encoder, gated GELU) with
the same SentencePiece vocabulary, and pads nothing (``min_length=1``), so the valid tokens' embeddings are
the same computation as the reference's masked run: every token and its EOS, no pad tokens. Types that pad
(``sd3`` to 77 without a mask, ``ltxv`` 128, ``mochi`` 256) are refused here, ``wan``'s UMT5 is another model.

What does not match: the reference cleans the prompt (``clean_caption``, twice) and this applies only its
lower-casing and whitespace rules (:func:`runtime.families.magi1.model.caption.clean_text`); the weights are whatever file the CLIP
loads (the reference's ``ckpt/t5`` is DeepFloyd's t5-v1_1-xxl; ComfyUI's ``t5xxl_fp16.safetensors`` is the
same model by name, unverified here bit for bit) and in its dtype (fp16 / fp8 instead of the reference's
float32). Prompts over 800 tokens are cut to 799 + EOS before encoding, as the reference's tokenizer cuts them.
The special tokens (HQ, DURATION) are added per chunk by the sampler (``runtime.families.magi1.model.caption.chunk_captions``).
"""

from __future__ import annotations

import torch

from .model.caption import MAX_TOKENS, clean_text

T5_KEY = "t5xxl"
EOS, PAD = 1, 0


class CaptionError(ValueError):
    """A CLIP or prompt MAGI-1's caption glue cannot use (the message names the fix)."""


def _token_id(t) -> int | None:
    tok = t[0]
    return (
        int(tok)
        if isinstance(tok, int) or (torch.is_tensor(tok) and tok.numel() == 1 and not tok.is_floating_point())
        else None
    )


def tokenize(clip, text: str, clean: bool = True) -> dict:
    """The CLIP's tokens for ``text`` (cleaned as the reference cleans it), checked and cut to 800."""
    prompt = clean_text(text) if clean else text
    tokens = clip.tokenize(prompt)
    if set(tokens) != {T5_KEY}:
        raise CaptionError(
            f"MAGI-1 needs a T5-XXL text encoder alone; this CLIP tokenizes for {sorted(tokens)}. Load "
            "t5xxl (fp16 or fp32) with CLIPLoader, type 'pixart'"
        )
    batches = tokens[T5_KEY]
    if len(batches) != 1:
        raise CaptionError(f"the T5 tokenizer split the prompt into {len(batches)} parts; MAGI-1 takes one sequence")
    seq = list(batches[0])
    ids = [_token_id(t) for t in seq]
    if PAD in ids:
        raise CaptionError(
            "this T5 CLIP pads the prompt (types sd3, ltxv and mochi pad to 77-256 tokens), which changes every "
            "embedding; load the T5 with CLIPLoader type 'pixart' (no padding)"
        )
    if len(seq) > MAX_TOKENS:
        seq = seq[: MAX_TOKENS - 1] + [(EOS, *seq[-1][1:])]  # the reference's tokenizer keeps 799 tokens + EOS
    return {T5_KEY: [seq]}


def encode(clip, text: str, clean: bool = True):
    """CONDITIONING [[(1, tokens, 4096), {"magi1_caption": True}]] of the prompt's valid T5 tokens."""
    tokens = tokenize(clip, text, clean)
    out = clip.encode_from_tokens(tokens, return_dict=True)
    cond = out.pop("cond")
    mask = out.get("attention_mask")
    if mask is not None:
        cond = cond[:, mask[0].bool().to(cond.device)]
    return [[cond, {"magi1_caption": True}]]
