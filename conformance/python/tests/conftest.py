"""Shared fixtures of the attn_conform tests: the committed case files and the `attn-conform`
command they are checked against."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(os.environ.get("ATTN_FIXTURES") or REPO / "fixtures")


def pytest_report_header(config):
    try:
        import torch
    except ImportError:
        return "attn_conform: torch is not installed: the torch tests (test_torch.py) do not run"
    cuda = "with CUDA" if torch.cuda.is_available() else "without CUDA"
    return f"attn_conform: torch {torch.__version__} {cuda}"


def fixture_files() -> list[Path]:
    """Every committed case file."""
    return sorted(FIXTURES.glob("*/*.safetensors"))


def smallest_per_op() -> list[Path]:
    """The smallest committed case file of each op."""
    best: dict[str, Path] = {}
    for f in fixture_files():
        op = f.parent.name
        if op not in best or f.stat().st_size < best[op].stat().st_size:
            best[op] = f
    return sorted(best.values())


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `attn-conform` binary: $ATTN_CONFORM, else the workspace's target/{debug,release}."""
    given = os.environ.get("ATTN_CONFORM")
    if given:
        path = Path(given)
        if not path.is_file():
            pytest.fail(f"ATTN_CONFORM={given} is not a file")
        return path
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "attn-conform"
        if path.is_file():
            return path
    found = shutil.which("attn-conform")
    if found:
        return Path(found)
    pytest.skip("no attn-conform binary: `cargo build -p attn-conformance` or set ATTN_CONFORM")


def run_cli(cli: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(cli), *args], capture_output=True, text=True, check=False)
