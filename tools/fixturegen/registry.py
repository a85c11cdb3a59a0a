"""The list of cases: each generator module registers its builders with `@case(...)`."""

from __future__ import annotations

import dataclasses
from typing import Callable

from .case import Case


@dataclasses.dataclass(frozen=True)
class Ctx:
    """Where the case runs: `device` is "cuda" or "cpu"; `device_name` for provenance."""

    device: str
    device_name: str


@dataclasses.dataclass(frozen=True)
class CaseDef:
    op: str
    name: str
    needs_cuda: bool
    build: Callable[[Ctx], Case]
    # A Python module the case imports (e.g. "flash_qla"); without it the case is skipped.
    needs_module: str | None = None


CASES: list[CaseDef] = []


def case(op: str, name: str, needs_cuda: bool = False, needs_module: str | None = None):
    """Registers `build(ctx) -> Case` as the case `fixtures/<op>/<name>.safetensors`."""

    def deco(build):
        CASES.append(CaseDef(op, name, needs_cuda, build, needs_module))
        return build

    return deco
