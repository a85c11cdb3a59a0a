"""Check attention kernels against the attn-conformance float64 reference, in-process.

See the module docstring of ``attn_conform/__init__.py``; the docstrings of ``reference``,
``check``, ``assert_conforms`` and ``save_case`` list every op with its inputs' and outputs'
shapes and dtypes and its parameters at run time (``help(attn_conform.check)``), from the same
registry as ``ops()`` and ``attn-conform list``."""

import os
from typing import Any, Mapping, TypedDict, Union

import numpy as np

#: A NumPy array (``ml_dtypes.bfloat16`` for bfloat16) or a torch tensor, CPU or CUDA.
ArrayLike = Any
Tensors = Mapping[str, ArrayLike]
Params = Mapping[str, Any]

DTYPES: tuple[str, ...]

class Worst(TypedDict):
    index: list[int]
    reference: float
    candidate: float

class NonFinite(TypedDict):
    count: int
    first_index: list[int]
    reference: str
    candidate: str

class Diagnostics(TypedDict):
    worst: Worst | None
    over_threshold: int
    counted: str
    elements: int
    nonfinite: NonFinite | None

Row = TypedDict(
    "Row",
    {
        "file": str,
        "op": str,
        "device": str,
        "output": str,
        "shape": list[int],
        "dtype": str,
        "max_abs": float | None,
        "ratio": float | None,
        "threshold": float | None,
        "pass": bool,
        "reason": str | None,
        "diagnostics": Diagnostics | None,
    },
)

class InputInfo(TypedDict):
    name: str
    required: bool
    kind: str  # "float" or "index"
    shape: str  # the layout, e.g. "[B, T, H, K]"
    dtype: str  # the accepted dtypes in words, e.g. "int32|int64"

ParamInfo = TypedDict(
    "ParamInfo", {"name": str, "type": str, "required": bool, "default": Any}
)

class ThresholdInfo(TypedDict):
    name: str  # the compared row: the output, or "<output>.<part>"
    rule: str  # "threshold" (ratio, with the 1e-6 absolute floor), "exact" or "index"
    half: float | None  # bfloat16 / float16 inputs
    half_long: float | None  # the same, a sequence over 4096 tokens
    float32: float | None
    float64: float | None

class OutputInfo(TypedDict):
    name: str
    shape: str
    dtype: str
    present: str  # when the op produces it, e.g. "when output_final_state"
    optional: bool  # whether a case may leave it out
    thresholds: list[ThresholdInfo]  # how it is compared, by the dtype of the inputs

class OpInfo(TypedDict):
    op: str
    summary: str
    inputs: list[InputInfo]
    params: list[ParamInfo]
    outputs: list[OutputInfo]
    devices: list[str]
    spec: str  # "conformance/spec/<file>.md §N"

def ops() -> list[OpInfo]:
    """Every op: ``op``, ``summary``, ``inputs`` and ``outputs`` with their shapes and dtypes,
    ``params``, ``devices``, ``spec``; ``help(attn_conform.check)`` lists them as text."""

def contract(op: str) -> str:
    """The whole contract of ``op``, as ``attn-conform list OP`` prints it."""

def reference(
    op: str,
    inputs: Tensors,
    params: Params | None = None,
    device: str = "cpu",
    gpus: int | None = None,
) -> dict[str, np.ndarray]:
    """The op's outputs: the float64 CPU reference, or this project's CUDA kernel (with
    ``gpus=N``, its context-parallel path over ``N`` GPUs)."""

def check(
    op: str,
    inputs: Tensors,
    outputs: Tensors,
    params: Params | None = None,
    tolerance: Mapping[str, float] | None = None,
) -> list[Row]:
    """The rows ``attn-conform verify --json`` gives for this call."""

def assert_conforms(
    op: str,
    inputs: Tensors,
    outputs: Tensors,
    params: Params | None = None,
    tolerance: Mapping[str, float] | None = None,
) -> list[Row]:
    """``check``, raising ``AssertionError`` with the rows and diagnostics on a failure."""

def format_rows(rows: list[Row]) -> str:
    """The rows as text, with the diagnostics of each failure."""

def save_case(
    path: Union[str, os.PathLike[str]],
    op: str,
    inputs: Tensors,
    outputs: Tensors,
    params: Params | None = None,
    source: Mapping[str, Any] | str | None = None,
    tolerance: Mapping[str, float] | None = None,
    note: str | None = None,
) -> str:
    """Writes the call as an ``attn-case/1`` file; returns the path."""

class Case:
    op: str
    params: dict[str, Any]
    source: dict[str, Any]
    tolerance: dict[str, float]
    note: str | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    def __init__(
        self,
        op: str,
        params: dict[str, Any],
        source: dict[str, Any],
        tolerance: dict[str, float],
        note: str | None,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
    ) -> None: ...

def load_case(path: Union[str, os.PathLike[str]]) -> Case:
    """Reads and checks a case file as ``attn-conform verify`` does."""
