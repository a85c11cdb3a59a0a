"""NumPy arrays and torch tensors to the wire tuples of ``_native`` and back.

A wire tuple is ``(name, dtype, shape, data)``: the dtype's spec name (``"float64"``,
``"float32"``, ``"bfloat16"``, ``"float16"``, ``"int32"``, ``"int64"``), the shape, and the
elements in row-major order, little-endian: the encoding of a case file's tensors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

#: The dtypes of the case format, by their spec names.
DTYPES = ("float64", "float32", "bfloat16", "float16", "int32", "int64")

_NUMPY = {name: np.dtype(name) for name in DTYPES if name != "bfloat16"}
_NUMPY["bfloat16"] = np.dtype(ml_dtypes.bfloat16)

Wire = tuple[str, str, tuple[int, ...], bytes]


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def _from_torch(label: str, name: str, t: Any) -> Wire:
    import torch

    names = {
        torch.float64: "float64",
        torch.float32: "float32",
        torch.bfloat16: "bfloat16",
        torch.float16: "float16",
        torch.int32: "int32",
        torch.int64: "int64",
    }
    dtype = names.get(t.dtype)
    if dtype is None:
        raise TypeError(f"{label}: dtype {t.dtype} is not a case dtype ({', '.join(DTYPES)})")
    try:
        host = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
    except (RuntimeError, NotImplementedError) as e:
        raise TypeError(f"{label}: cannot copy this tensor to the host: {e}") from None
    # torch.bfloat16 has no NumPy dtype: its bits travel as int16
    bits = host.view(torch.int16) if dtype == "bfloat16" else host
    return name, dtype, tuple(host.shape), _le_bytes(bits.numpy())


def _from_numpy(label: str, name: str, a: np.ndarray) -> Wire:
    native = a.dtype.newbyteorder("=")
    dtype = next((n for n, d in _NUMPY.items() if native == d), None)
    if dtype is None:
        raise TypeError(f"{label}: dtype {a.dtype} is not a case dtype ({', '.join(DTYPES)})")
    bits = a.view(np.uint16) if dtype == "bfloat16" else a
    return name, dtype, tuple(a.shape), _le_bytes(bits)


def _le_bytes(a: np.ndarray) -> bytes:
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(order="C")


def to_wire(arg: str, tensors: Any) -> list[Wire]:
    """The tensors of argument ``arg`` (a dict of name to array or tensor) as wire tuples."""
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"{arg}: expected a dict of name -> numpy.ndarray or torch.Tensor, "
            f"got {type(tensors).__name__}"
        )
    wires = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"{arg}: names are str, got {name!r}")
        label = f"{arg}[{name!r}]"
        if _is_torch(value):
            wires.append(_from_torch(label, name, value))
        elif isinstance(value, (np.ndarray, np.generic)):
            wires.append(_from_numpy(label, name, np.asarray(value)))
        elif hasattr(value, "__dlpack__"):
            try:
                host = np.from_dlpack(value)
            except (TypeError, ValueError, RuntimeError, BufferError) as e:
                raise TypeError(f"{label}: cannot read it through DLPack: {e}") from None
            wires.append(_from_numpy(label, name, host))
        else:
            raise TypeError(
                f"{label}: expected a numpy.ndarray or a torch.Tensor, got {type(value).__name__}"
            )
    return wires


def from_wire(wire: Wire) -> np.ndarray:
    """A wire tuple as a writable NumPy array (bfloat16 as ``ml_dtypes.bfloat16``)."""
    _, dtype, shape, data = wire
    le = _NUMPY[dtype].newbyteorder("<")
    return np.frombuffer(data, dtype=le).astype(_NUMPY[dtype]).reshape(shape)


def _json_value(arg: str, key: str, v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{arg}[{key!r}]: {type(v).__name__} is not a JSON value")


def to_json(arg: str, obj: Any) -> str:
    """A dict argument (``params``, ``source``) as JSON text; ``None`` is ``{}``."""
    if obj is None:
        return "{}"
    if not isinstance(obj, Mapping):
        raise TypeError(f"{arg}: expected a dict, got {type(obj).__name__}")
    out = {}
    for key, v in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"{arg}: keys are str, got {key!r}")
        try:
            out[key] = json.loads(
                json.dumps(v, allow_nan=False, default=lambda x, k=key: _json_value(arg, k, x))
            )
        except ValueError as e:
            raise ValueError(f"{arg}[{key!r}]: {e}") from None
    return json.dumps(out)


def to_tolerance(tolerance: Any) -> dict[str, float]:
    """``tolerance`` (a dict of output name to threshold, or ``None``) checked for types."""
    if tolerance is None:
        return {}
    if not isinstance(tolerance, Mapping):
        raise TypeError(f"tolerance: expected a dict, got {type(tolerance).__name__}")
    out = {}
    for key, v in tolerance.items():
        if not isinstance(key, str):
            raise TypeError(f"tolerance: keys are output names (str), got {key!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"tolerance[{key!r}]: expected a number, got {type(v).__name__}")
        out[key] = float(v)
    return out
