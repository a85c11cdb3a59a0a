"""attn_conform on torch tensors: every case dtype bit for bit (bfloat16 through its bits), CPU
and CUDA, any layout. Runs only where torch is installed; the skip says so where it is not."""

from __future__ import annotations

import os

import numpy as np
import pytest

import attn_conform as ac

torch = pytest.importorskip(
    "torch", reason="torch is not installed: the torch tests did not run (pip install torch)"
)

DEVICES = ["cpu", "cuda"]


@pytest.fixture(autouse=True)
def _needs_cuda(request):
    """A `cuda` case without a CUDA device says why it did not run (fails under
    ATTN_REQUIRE_GPU=1, as the Rust GPU tests do)."""
    callspec = getattr(request.node, "callspec", None)
    device = callspec.params.get("device") if callspec else None
    if device == "cuda" and not torch.cuda.is_available():
        why = "no CUDA device: torch.cuda.is_available() is false"
        if os.environ.get("ATTN_REQUIRE_GPU") == "1":
            pytest.fail(f"ATTN_REQUIRE_GPU=1 but {why}")
        pytest.skip(why)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20261124)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_tensors_round_trip_bit_exactly(dtype, device, tmp_path):
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).reshape(256, 256).to(device)
    path = tmp_path / "half.safetensors"
    ac.save_case(path, "cumsum", {"x": x}, {}, {"dim": 1})
    back = ac.load_case(path).inputs["x"]
    assert back.dtype.itemsize == 2
    assert np.array_equal(back.view(np.int16), bits.reshape(256, 256).numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_float_tensors_match_numpy(dtype, device, gen):
    x = torch.randn(3, 40, 2, generator=gen, dtype=dtype)
    want = ac.reference("cumsum", {"x": x.numpy()}, {"dim": 1})["y"]
    for same in (
        x.to(device),
        x.to(device).requires_grad_(True),
        x.transpose(0, 2).contiguous().transpose(0, 2).to(device),  # not contiguous
    ):
        got = ac.reference("cumsum", {"x": same}, {"dim": 1})["y"]
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("device", DEVICES)
def test_a_bfloat16_kernel_output_is_checked_and_a_changed_element_found(device, gen):
    x = torch.randn(2, 64, 3, generator=gen).to(device=device, dtype=torch.bfloat16)
    y = torch.cumsum(x.float(), dim=1)
    params = {"dim": 1, "output_dtype": "float32"}
    ac.assert_conforms("cumsum", {"x": x}, {"y": y}, params)
    y[1, 33, 2] += 4.0
    with pytest.raises(AssertionError, match=r"worst element \[1, 33, 2\]"):
        ac.assert_conforms("cumsum", {"x": x}, {"y": y}, params)


def test_index_tensors_and_bad_torch_dtypes(gen):
    g = torch.randn(1, 9, 2, generator=gen)
    for dtype in (torch.int32, torch.int64):
        cu = torch.tensor([0, 3, 9], dtype=dtype)
        out = ac.reference("chunk_local_cumsum", {"g": g, "cu_seqlens": cu}, {"chunk_size": 4})
        assert out["o"].shape == (1, 9, 2)
    with pytest.raises(TypeError, match=r"^inputs\['x'\]: dtype torch.uint8"):
        ac.reference("cumsum", {"x": torch.zeros(3, dtype=torch.uint8)}, {"dim": 0})
    with pytest.raises(TypeError, match=r"^inputs\['x'\]: dtype torch.complex64"):
        ac.reference("cumsum", {"x": torch.zeros(3, dtype=torch.complex64)}, {"dim": 0})
