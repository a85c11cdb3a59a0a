"""The README's Triton example, run as written: the code block is read from README.md, so the
example a user copies is the one tested. It needs torch with CUDA and Triton; without them it
says why it did not run (and fails under ATTN_REQUIRE_GPU=1, as the Rust GPU tests do)."""

from __future__ import annotations

import os
import re

import pytest

from conftest import REPO

README = REPO / "README.md"


def readme_triton_example() -> str:
    """The first ```python block of README.md that defines a Triton kernel."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "@triton.jit" in b]
    assert found, "README.md has no ```python block with a @triton.jit kernel"
    return found[0]


def needs_cuda_triton():
    why = None
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        why = f"torch and triton are needed: {e}"
    else:
        if not torch.cuda.is_available():
            why = "no CUDA device: torch.cuda.is_available() is false"
    if why:
        if os.environ.get("ATTN_REQUIRE_GPU") == "1":
            pytest.fail(f"ATTN_REQUIRE_GPU=1 but {why}")
        pytest.skip(why)


def test_readme_triton_example_conforms_and_a_broken_kernel_is_caught(tmp_path):
    needs_cuda_triton()
    # Triton reads the kernel's source from its file: write the block out and import it.
    src = tmp_path / "readme_example.py"
    src.write_text(readme_triton_example(), encoding="utf-8")
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_example", src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [name for name in vars(module) if name.startswith("test_")]
    assert tests, "the README example defines no test_ function"
    for name in tests:
        getattr(module, name)()  # raises AssertionError if the kernel does not conform

    # The same kernel with one element changed must fail with the element's index.
    import torch

    import attn_conform

    x = torch.randn(8, 1024, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(8, 1024, dtype=torch.float32, device="cuda")
    module.cumsum_kernel[(8,)](x, y, T=1024)
    y[5, 700] += 1.0
    params = {"dim": 1, "output_dtype": "float32"}
    with pytest.raises(AssertionError, match=r"worst element \[5, 700\]"):
        attn_conform.assert_conforms("cumsum", {"x": x}, {"y": y}, params)
