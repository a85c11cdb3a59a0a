"""Shared fixtures of the attn_conform tests: the committed case files and the `attn-conform`
command they are checked against."""

from __future__ import annotations

import json
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
        torch_line = "attn_conform: torch is not installed: the torch tests (test_torch.py) do not run"
    else:
        cuda = "with CUDA" if torch.cuda.is_available() else "without CUDA"
        torch_line = f"attn_conform: torch {torch.__version__} {cuda}"
    path, where = find_cli()
    cli_line = f"attn-conform: {where}" if path else f"attn-conform: not found ({where})"
    return [torch_line, cli_line]


BUILD_HINT = "`cargo build -p attn-conformance` or set ATTN_CONFORM=/path/to/attn-conform"


def find_cli() -> tuple[Path | None, str]:
    """The `attn-conform` binary and where it was found: $ATTN_CONFORM, else target/debug and
    target/release of this checkout (or of $CARGO_TARGET_DIR), else on PATH; or None and where
    it was looked for."""
    given = os.environ.get("ATTN_CONFORM")
    if given:
        return Path(given), f"$ATTN_CONFORM = {given}"
    targets = [REPO / "target"]
    if os.environ.get("CARGO_TARGET_DIR"):
        targets.insert(0, Path(os.environ["CARGO_TARGET_DIR"]))
    tried = []
    for target in targets:
        for profile in ("debug", "release"):
            path = target / profile / "attn-conform"
            if path.is_file():
                return path, f"{path} (a cargo build)"
            tried.append(str(path))
    found = shutil.which("attn-conform")
    if found:
        return Path(found), f"{found} (on PATH)"
    return None, f"looked in {', '.join(tried)} and on PATH"


CLI_TESTS: set[str] = set()  # the node ids of the collected tests that need `attn-conform`


def pytest_report_collectionfinish(config, start_path, items):
    """Under the header: how many collected tests compare with `attn-conform`, and whether they
    can (the skips they get without it are otherwise explained only under -rs)."""
    CLI_TESTS.update(i.nodeid for i in items if "cli" in getattr(i, "fixturenames", ()))
    n = len(CLI_TESTS)
    path, where = find_cli()
    if path:
        return f"attn-conform: {n} tests compare with {path}"
    return (
        f"attn-conform: not found ({where}): {n} tests that compare with it will be skipped; "
        f"to run them: {BUILD_HINT}"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The same reason beside the final count, when the binary was missing."""
    path, where = find_cli()
    if path is None:
        skipped = terminalreporter.stats.get("skipped", [])
        n = sum(r.nodeid in CLI_TESTS for r in skipped)
        terminalreporter.write_line(
            f"attn-conform: not found ({where}): {n} tests skipped for it; to run them: {BUILD_HINT}",
            yellow=True,
        )


def fixture_files() -> list[Path]:
    """Every committed case file."""
    return sorted(FIXTURES.glob("*/*.safetensors"))


def known_failure(path: Path) -> str | None:
    """The `known_failure` metadata of a case file (a fixture kept to show an upstream
    implementation's failure, e.g. FlashQLA's; `conformance/spec/fixture-format.md`)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n)).get("__metadata__", {})
    return meta.get("known_failure")


def smallest_per_op() -> list[Path]:
    """The smallest committed case file of each op that is not a known failure."""
    best: dict[str, Path] = {}
    for f in fixture_files():
        if known_failure(f):
            continue
        op = f.parent.name
        if op not in best or f.stat().st_size < best[op].stat().st_size:
            best[op] = f
    return sorted(best.values())


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `attn-conform` binary (see `find_cli`)."""
    path, where = find_cli()
    if path is None:
        pytest.skip(f"no attn-conform binary ({where}): {BUILD_HINT}")
    if not path.is_file():
        pytest.fail(f"{where} is not a file")
    return path


def run_cli(cli: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(cli), *args], capture_output=True, text=True, check=False)
