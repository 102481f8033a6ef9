"""The tiny AR model's decoder (jensen_core/tiny_decoder.py, models/tiny_decoder/jensen-kv-tiny-decoder.safetensors)
and the RGB renderer it is trained on (toy_video.render_rgb): no ComfyUI needed.

- the renderer draws the same scene as the latents: averaged over each 8x8 block it is the latents'
  preview colours;
- the shipped decoder is small (<= 2 MB, fp16), gives (T, 128, 128, 3) frames in 0..1 for any latents,
  and on held-out frames is closer to the 128x128 rendering than the blocky preview colours, also
  for noisy latents.
"""

from __future__ import annotations

import math

import pytest
import torch

from jensen_core import tiny_decoder as td
from jensen_core import toy_video as tv
from jensen_testing.comfyui import PACK_ROOT

DECODER_PATH = PACK_ROOT / "models" / "tiny_decoder" / "jensen-kv-tiny-decoder.safetensors"


@pytest.fixture(scope="module")
def decoder():
    return td.load(DECODER_PATH)


def test_render_rgb_is_the_latents_scene_at_8x():
    scene = tv.make_scene(3, 1_000_007)
    rgb = tv.render_rgb(scene, 10, 3)
    assert rgb.shape == (3, 128, 128, 3) and float(rgb.min()) >= 0 and float(rgb.max()) <= 1
    blocks = torch.nn.functional.avg_pool2d(rgb.permute(0, 3, 1, 2), 8).permute(0, 2, 3, 1)
    preview = tv.to_rgb(tv.render(scene, 10, 3))
    assert float((blocks - preview).abs().mean()) < 0.01  # same discs, colours and texture
    assert float((blocks - preview).abs().max()) < 0.15  # only the disc edges differ (finer anti-aliasing)
    # the discs move: consecutive frames differ
    assert float((rgb[1] - rgb[0]).abs().max()) > 0.3
    with pytest.raises(ValueError, match="scale"):
        tv.render_rgb(scene, 0, 1, scale=0)


def test_shipped_decoder_is_small_half_precision_and_tagged():
    from safetensors import safe_open

    assert DECODER_PATH.stat().st_size <= 2 * 2**20
    with safe_open(str(DECODER_PATH), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        meta = f.metadata()
    assert dtypes == {"F16"} and meta["format"] == td.FORMAT and int(meta["step"]) == int(meta["steps"])


def test_decoder_output_shape_and_range(decoder):
    g = torch.Generator().manual_seed(0)
    video = tv.render(tv.make_scene(1, 1_000_001), 0, 5)
    out = td.decode_video(decoder, video)
    assert out.shape == (5, 128, 128, 3) and out.dtype == torch.float32
    batch = td.decode_video(decoder, torch.stack([video, video]))
    assert batch.shape == (2, 5, 128, 128, 3)
    torch.testing.assert_close(batch[1], out)
    wild = torch.randn(16, 2, 16, 16, generator=g) * 50  # far outside anything the model produces
    w = td.decode_video(decoder, wild)
    assert w.shape == (2, 128, 128, 3) and float(w.min()) >= 0 and float(w.max()) <= 1 and torch.isfinite(w).all()
    odd = td.decode_video(decoder, torch.zeros(16, 1, 6, 10))
    assert odd.shape == (1, 48, 80, 3)
    with pytest.raises(ValueError, match="16, frames"):
        td.decode_video(decoder, torch.zeros(4, 1, 16, 16))


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_decoder_draws_the_scene_better_than_the_preview_colours(decoder, noise):
    """Held-out scenes (seeds >= 1,000,000): PSNR against the 128x128 rendering, decoder vs 8x8 preview blocks."""
    g = torch.Generator().manual_seed(1)
    gains = []
    for i in range(6):
        scene = tv.make_scene(i, 1_000_100 + i)
        lat = tv.render(scene, 7 * i, 2)
        lat = lat + noise * torch.randn(lat.shape, generator=g)
        target = tv.render_rgb(scene, 7 * i, 2)
        dec = td.decode_video(decoder, lat)
        blocks = tv.to_rgb(lat).repeat_interleave(8, 1).repeat_interleave(8, 2)

        gains.append(_psnr(dec, target) - _psnr(blocks, target))
    # the trained decoder gains 4.0-5.9 dB (noise 0) and 5.6-7.8 dB (noise 0.2); its fixed bilinear base alone
    # (an untrained correction) 1.1-1.6 and 2.1-2.8 dB
    assert min(gains) > 3.0, gains
    assert sum(gains) / len(gains) > 3.5, gains


def _psnr(x, ref):
    return 10 * math.log10(1 / float((x - ref).square().mean()))


def test_load_refuses_a_missing_file_and_another_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_tiny_decoder"):
        td.load(tmp_path / "nope.safetensors")
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(other), metadata={"format": "something_else"})
    with pytest.raises(ValueError, match="not a tiny AR decoder"):
        td.load(other)


def test_the_diffusion_models_folder_holds_only_diffusion_models():
    """models/tiny_ar is added to ComfyUI's diffusion_models list: the decoder must not show up there."""
    from safetensors import safe_open

    folder = PACK_ROOT / "models" / "tiny_ar"
    files = sorted(folder.glob("*.safetensors"))
    assert files
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
        assert any(k.startswith("blocks.0.self_attn.") for k in keys), f"{path.name} is not a Wan diffusion model"
    assert not (folder / DECODER_PATH.name).exists()
