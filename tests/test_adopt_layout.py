"""``adopt_layout``: a sequence-parallel rank runs the Taylor layout rank 0 chose instead of choosing its own."""

from __future__ import annotations

import pytest
import torch

from jensen_core.correction_layouts import (
    Layout,
    adopt_layout,
    kernel_choices,
    set_layout_preference,
    taylor_layout,
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh():
    set_layout_preference(None)
    yield
    set_layout_preference(None)


def test_an_adopted_layout_is_used_instead_of_a_choice():
    set_layout_preference("flex")  # this process would ask for FlexAttention (and compile it) on its own
    adopt_layout(CPU, torch.float32, 32, 2, Layout("pad", 40))
    assert taylor_layout(CPU, torch.float32, 32, 2) == Layout("pad", 40)  # no choice, no compilation
    assert kernel_choices() == {"cpu/torch.float32 d32 G2": "q,k,v padded to 40"}


def test_adopting_none_is_the_one_buffer_path():
    adopt_layout(CPU, torch.float32, 32, 2, None)
    assert taylor_layout(CPU, torch.float32, 32, 2) is None


def test_a_layout_this_device_does_not_offer_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"q,k width 40, v width 32 \(split\) .* not offered .* JENSEN_KV_TAYLOR_LAYOUT"
    ):
        adopt_layout(CPU, torch.float32, 32, 2, Layout("split", 40))  # CUDA's narrower-v layout
    with pytest.raises(ValueError, match="not offered"):
        adopt_layout(CPU, torch.float32, 32, 2, Layout("pad", 48))  # not a width this device uses
    assert "cpu/torch.float32 d32 G2" not in kernel_choices()
