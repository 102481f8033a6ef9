"""The quantization methods behind one dispatch (jensen_core/methods.py): every method answers the same questions."""

import pytest
import torch

from jensen_core import QuantSpec, StoredTensor, method_of, quantize
from jensen_core.methods import QVG, REGISTRY, RTN
from jensen_core.quant import cat_quantized
from jensen_core.spec import METHOD_KNOBS, METHODS

SPECS = {
    "rtn": QuantSpec(bits=3, group_size=16, rotation="hadamard", seed=1),
    "qvg": QuantSpec(method="qvg", bits=3, group_size=16, rotation="hadamard", seed=1, qvg_stages=2, qvg_centroids=5),
}


def test_every_method_quantspec_knows_has_an_object():
    assert tuple(REGISTRY) == METHODS == tuple(METHOD_KNOBS) == tuple(SPECS)
    assert (method_of("rtn"), method_of(SPECS["qvg"])) == (RTN, QVG)
    with pytest.raises(ValueError, match=r"method='vq' is not supported; use one of \('rtn', 'qvg'\)"):
        method_of("vq")


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("tokens", [3, 40])  # fewer and more tokens than QVG's K=5
def test_quantize_concatenate_and_count_through_the_method_object(name, tokens):
    spec, method = SPECS[name], REGISTRY[name]
    x = [torch.randn(2, 3, tokens, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    parts = [quantize(t, spec) for t in x]
    assert all(type(p) is method.tensor_type and isinstance(p, StoredTensor) for p in parts)
    assert parts[0].nbytes == method.chunk_nbytes(spec, 6, tokens, 32)
    assert parts[0].effective_bits == pytest.approx(method.effective_bits_for(spec, 32, tokens))
    assert (parts[0].effective_bits == pytest.approx(spec.effective_bits)) is method.exact_spec_bits
    cat = cat_quantized(parts)
    assert type(cat) is method.tensor_type and cat.tokens == 2 * tokens and cat.nbytes == sum(p.nbytes for p in parts)
    torch.testing.assert_close(
        cat.dequantize(torch.float32), torch.cat([p.dequantize(torch.float32) for p in parts], dim=-2)
    )
    # the RTN part is what the Jensen correction reads: the same step sizes
    assert torch.equal(method.residual(cat).step_sizes(), cat.step_sizes())


def test_qvg_holds_its_residual_and_moves_it_with_its_centroids():
    qt = quantize(torch.randn(1, 2, 12, 32), SPECS["qvg"])
    assert type(qt.residual) is RTN.tensor_type and qt.residual.spec == qt.spec and qt.residual.shape == qt.shape
    moved = qt.to("meta")
    assert {moved.residual.device.type, moved.centroids.device.type, moved.ids.device.type} == {"meta"}


def test_qvg_bits_breakdown_adds_up_to_the_exact_bits():
    spec = QuantSpec(method="qvg", bits=2, group_size=64, qvg_stages=2, qvg_centroids=100)
    full = QVG.bits_breakdown(spec, 128, 1000)
    assert full["exact"] and "note" not in full
    assert full["residual_bits"] + full["id_bits"] + full["centroid_bits"] == pytest.approx(full["effective_bits"])
    assert (
        full["effective_bits"]
        == QVG.effective_bits_for(spec, 128, 1000)
        == pytest.approx(2.375 + 8 * 2 / 128 + 16 * 2 * 100 / 1000)
    )
    partial = QVG.bits_breakdown(spec, 128)
    assert not partial["exact"] and partial["centroid_bits"] is None and "16*2*K" in partial["note"]
    assert RTN.bits_breakdown(spec) == {} and RTN.chunk_extra_bytes(spec, 1000, 128) == 0
