"""Check attention kernels against the attn-conformance float64 reference, in-process.

The one line that goes in a pytest test::

    import attn_conform

    def test_my_cumsum():
        x = torch.randn(4, 1000, 2, dtype=torch.bfloat16, device="cuda")
        attn_conform.assert_conforms(
            "cumsum", {"x": x}, {"y": my_cumsum(x, dim=1)}, params={"dim": 1}
        )

Tensors are NumPy arrays or torch tensors (CPU or CUDA: copied to the host) of the case-file
dtypes: float64, float32, bfloat16 (``torch.bfloat16`` or ``ml_dtypes.bfloat16``), float16,
int32, int64. ``inputs`` and ``outputs`` map the op's argument and output names (``ops()``,
``attn-conform list``) to tensors; ``params`` maps its parameter names to JSON values. Bad
arguments raise ``TypeError`` or ``ValueError`` whose message starts with the argument
(``inputs['q']: ...``); a missing GPU for ``device="gpu"`` raises ``RuntimeError``.

The comparison is the spec's (``conformance/spec/README.md`` of the repository, "Comparison"):
``max_abs = max|ref - x|``, ``ratio = RMS(ref - x) / (RMS(ref) + 1e-8)``; an output passes
when it has no NaN/Inf where the reference is finite, and ``max_abs <= 1e-6`` or
``ratio <= threshold``, the threshold following the precision the candidate was computed in
(float64 1e-10, float32 1e-5, bfloat16/float16 5e-3) unless ``tolerance`` overrides it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from . import _native
from ._convert import DTYPES, from_wire, to_json, to_tolerance, to_wire

__all__ = [
    "DTYPES",
    "Case",
    "assert_conforms",
    "check",
    "contract",
    "format_rows",
    "load_case",
    "ops",
    "reference",
    "save_case",
]


def _op(op: Any) -> str:
    if not isinstance(op, str):
        raise TypeError(f"op: expected an op id (str), got {type(op).__name__}")
    return op


def ops() -> list[dict[str, Any]]:
    """Every op of the registry, as ``attn-conform list --json`` shows it.

    Each is a dict with ``op``, ``summary``, ``inputs`` (``name``, ``required``, ``kind``:
    ``float`` or ``index``, ``shape``: the layout such as ``[B, T, H, K]``, ``dtype``: the
    accepted dtypes in words), ``params`` (``name``, ``type``, ``required``, ``default``),
    ``outputs`` (``name``, ``shape``, ``dtype``, ``present``: when the op produces it,
    ``optional``: whether a case may leave it out, ``thresholds``: how it is compared, one
    entry per compared row with ``name``, ``rule`` (``threshold``, ``exact`` or ``index``) and
    the ratio thresholds ``half``, ``half_long`` (a sequence over 4096 tokens), ``float32`` and
    ``float64`` by the dtype of the inputs), ``devices`` and ``spec`` (the spec section,
    ``conformance/spec/<file>.md §N``).
    """
    return json.loads(_native.ops())


def contract(op: str) -> str:
    """The whole contract of ``op`` as ``attn-conform list OP`` prints it: its inputs with
    their shapes and dtypes, parameters with types and defaults, outputs with shapes, dtypes and
    when they are present, devices and spec section."""
    return _native.ops_text(_op(op))


def reference(
    op: str,
    inputs: dict[str, Any],
    params: dict[str, Any] | None = None,
    device: str = "cpu",
    gpus: int | None = None,
) -> dict[str, np.ndarray]:
    """The outputs of ``op`` on ``inputs``: the float64 CPU reference (``device="cpu"``), or
    this project's CUDA kernel where the op has one (``device="gpu"``).

    With ``device="gpu", gpus=N`` (``N >= 1``) the op runs on its context-parallel path over
    GPUs ``0 .. N`` of this host (NCCL), where it has one (``chunk_gated_delta_rule_fwd_h``,
    ``kda_fwd``, ``gdn_fwd``; ``ops()`` lists ``gpus`` among their ``devices``): the tokens are
    partitioned by chunks over the GPUs, scattered, run and gathered, as ``attn-conform verify
    --gpus N`` does. ``gpus`` below 1, ``gpus`` with ``device="cpu"``, or an op without the path
    raise ``ValueError`` naming ``gpus``; more GPUs than the host has, or no NCCL library, an
    error naming ``gpus`` too.

    Returns a dict of output name to NumPy array (float64 for the reference; a GPU kernel's
    bfloat16 outputs as ``ml_dtypes.bfloat16``).
    """
    if not isinstance(device, str):
        raise TypeError(f"device: expected \"cpu\" or \"gpu\", got {type(device).__name__}")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int)):
        raise TypeError(f"gpus: expected an int (a number of GPUs), got {type(gpus).__name__}")
    wires = _native.reference(
        _op(op), to_wire("inputs", inputs), to_json("params", params), device, gpus
    )
    return {w[0]: from_wire(w) for w in wires}


def check(
    op: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    params: dict[str, Any] | None = None,
    tolerance: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Compares ``outputs`` with the float64 reference on ``inputs``: the rows ``attn-conform
    verify --json`` gives, one per compared output.

    A row has ``output``, ``shape``, ``dtype``, ``max_abs``, ``ratio``, ``threshold``
    (``None``: bit-exact), ``pass`` and ``reason``; a failed one also ``diagnostics``: the
    ``worst`` element (``index``, ``reference``, ``candidate``), ``over_threshold`` (how many
    elements have ``|ref - x| > threshold × RMS(ref)``; under the exact rule, how many differ in
    their bits), ``counted`` (which of the two, in words), ``elements``, and ``nonfinite`` (the
    ``count`` of non-finite mismatches and the ``first_index``, with the kinds of value there).
    """
    rows = _native.check(
        _op(op),
        to_wire("inputs", inputs),
        to_wire("outputs", outputs),
        to_json("params", params),
        to_tolerance(tolerance),
    )
    return json.loads(rows)


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.3e}"


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows of ``check`` as text: one line per output, then the diagnostics of a failure."""
    lines = []
    for r in rows:
        threshold = "exact" if r["threshold"] is None else f"{r['threshold']:.0e}"
        verdict = "PASS" if r["pass"] else f"FAIL ({r['reason']})"
        lines.append(
            f"{r['output']}: shape {r['shape']} {r['dtype']}  max_abs {_num(r['max_abs'])}  "
            f"ratio {_num(r['ratio'])}  threshold {threshold}  {verdict}"
        )
        d = r.get("diagnostics")
        if d:
            w = d.get("worst")
            if w:
                lines.append(
                    f"    worst element {w['index']}: reference {w['reference']!r}, "
                    f"candidate {w['candidate']!r}"
                )
            lines.append(f"    {d['over_threshold']} of {d['elements']} elements: {d['counted']}")
            n = d.get("nonfinite")
            if n:
                lines.append(
                    f"    {n['count']} non-finite mismatches, the first at {n['first_index']} "
                    f"(reference {n['reference']}, candidate {n['candidate']})"
                )
    return "\n".join(lines)


def assert_conforms(
    op: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    params: dict[str, Any] | None = None,
    tolerance: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """``check``, raising ``AssertionError`` with every row and the diagnostics of each failed
    one when an output does not conform; returns the rows when all pass.

    Set ``ATTN_CONFORM_SAVE_DIR`` to have a failing call written there as a case file
    (``<op>-<n>.safetensors``, see ``save_case``) that ``attn-conform verify`` reproduces.
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this one
    rows = check(op, inputs, outputs, params, tolerance)
    failed = [r for r in rows if not r["pass"]]
    if not failed:
        return rows
    message = f"{op}: {len(failed)} of {len(rows)} outputs do not conform\n" + format_rows(rows)
    save_dir = os.environ.get("ATTN_CONFORM_SAVE_DIR")
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
        n = len([f for f in os.listdir(save_dir) if f.startswith(f"{op}-")])
        path = os.path.join(save_dir, f"{op}-{n}.safetensors")
        save_case(path, op, inputs, outputs, params, {"impl": "pytest"}, tolerance)
        message += f"\ncase written to {path} (attn-conform verify {path})"
    raise AssertionError(message)


def save_case(
    path: str | os.PathLike[str],
    op: str,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    params: dict[str, Any] | None = None,
    source: dict[str, Any] | str | None = None,
    tolerance: dict[str, float] | None = None,
    note: str | None = None,
) -> str:
    """Writes the call as an ``attn-case/1`` file (``conformance/spec/fixture-format.md``) for
    ``attn-conform verify`` and for sharing; returns ``path``.

    ``source`` says who computed ``outputs``: a dict with at least ``"impl"``, or just the impl
    name (default ``"python"``). The case is checked as ``check`` checks it (op, parameters,
    names, dtypes), without running the op.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    if source is None or isinstance(source, str):
        source = {"impl": source or "python"}
    if note is not None and not isinstance(note, str):
        raise TypeError(f"note: expected a str, got {type(note).__name__}")
    _native.save_case(
        os.fspath(path),
        _op(op),
        to_wire("inputs", inputs),
        to_wire("outputs", outputs),
        to_json("params", params),
        to_json("source", source),
        to_tolerance(tolerance),
        note,
    )
    return os.fspath(path)


class Case:
    """A case file as read by ``load_case``: ``op``, ``params``, ``source``, ``tolerance``,
    ``note``, and the ``inputs`` and ``outputs`` as NumPy arrays."""

    def __init__(
        self,
        op: str,
        params: dict[str, Any],
        source: dict[str, Any],
        tolerance: dict[str, float],
        note: str | None,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
    ) -> None:
        self.op = op
        self.params = params
        self.source = source
        self.tolerance = tolerance
        self.note = note
        self.inputs = inputs
        self.outputs = outputs

    def __repr__(self) -> str:
        return (
            f"Case(op={self.op!r}, params={self.params!r}, inputs={sorted(self.inputs)}, "
            f"outputs={sorted(self.outputs)})"
        )


def load_case(path: str | os.PathLike[str]) -> Case:
    """Reads and checks a case file as ``attn-conform verify`` does (e.g. one that
    ``attn-conform verify --dump-reference`` wrote)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    op, params, source, tolerance, note, inputs, outputs = _native.load_case(os.fspath(path))
    return Case(
        op,
        json.loads(params),
        json.loads(source),
        dict(tolerance),
        note,
        {w[0]: from_wire(w) for w in inputs},
        {w[0]: from_wire(w) for w in outputs},
    )


def _op_table() -> str:
    """Every op as ``attn-conform list`` prints it (``name?``: an optional input)."""
    lines = ["", "Ops (inputs and outputs with their shapes and dtypes; params with defaults):", ""]
    lines += ["    " + line for line in _native.ops_text().splitlines()]
    return "\n".join(lines)


for _f in (reference, check, assert_conforms, save_case):
    _f.__doc__ = (_f.__doc__ or "") + _op_table()
del _f
