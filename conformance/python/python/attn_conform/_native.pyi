"""The compiled half of attn_conform (PyO3). Tensors travel as wire tuples: ``(name, dtype,
shape, data)``, the dtype's spec name and the row-major little-endian bytes. Use the functions
of ``attn_conform``; these are its plumbing."""

Wire = tuple[str, str, list[int] | tuple[int, ...], bytes]

def reference(
    op: str, inputs: list[Wire], params: str, device: str, gpus: int | None = None
) -> list[Wire]:
    """The op's outputs on the float64 CPU reference (``"cpu"``) or this project's CUDA kernel
    (``"gpu"``; with ``gpus``, its context-parallel path over that many GPUs); ``params`` is a
    JSON object."""

def check(
    op: str, inputs: list[Wire], outputs: list[Wire], params: str, tolerance: dict[str, float]
) -> str:
    """The rows of ``attn-conform verify --json`` for this call, as JSON text."""

def save_case(
    path: str,
    op: str,
    inputs: list[Wire],
    outputs: list[Wire],
    params: str,
    source: str,
    tolerance: dict[str, float],
    note: str | None,
) -> None:
    """Writes an ``attn-case/1`` file after checking it against the op."""

def load_case(
    path: str,
) -> tuple[str, str, str, dict[str, float], str | None, list[Wire], list[Wire]]:
    """``(op, params JSON, source JSON, tolerance, note, inputs, outputs)`` of a case file."""

def ops() -> str:
    """The registry as ``attn-conform list --json`` shows it, as JSON text."""

def ops_text(op: str | None = None) -> str:
    """The text of ``attn-conform list`` (every op), or of ``attn-conform list OP``."""
