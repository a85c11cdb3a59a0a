"""Case files (`attn-case/1`), the comparison rule, provenance and the manifest.

A case is one call of one operation: inputs `in.<arg>`, outputs `out.<name>` and the JSON
metadata of `conformance/spec/fixture-format.md`. Every case carries the float64 oracle of its
outputs; `write` compares each stored output with it by the spec's rule
(`conformance/spec/README.md`, "Comparison") and refuses to write a case that disagrees:

    max_abs = max |ref - x|,   ratio = RMS(ref - x) / (RMS(ref) + 1e-8)
    pass  <=>  no NaN/Inf where ref is finite, non-finite ref values matched exactly,
               and (max_abs <= 1e-6 or ratio <= threshold)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

FORMAT = "attn-case/1"
MANIFEST_FORMAT = "attn-fixtures/1"
ABS_FLOOR = 1e-6

# The comparison table of `conformance/spec/README.md`, by the precision the candidate was computed
# in.
THRESHOLD = {"float64": 1e-10, "float32": 1e-5, "tf32": 2e-3, "half": 5e-3}


class RefusedCase(Exception):
    """A case whose outputs disagree with the float64 oracle (never written)."""


@dataclasses.dataclass
class Case:
    """One call of one op, ready to be written.

    `outputs` are the stored outputs, `oracle` the float64 values they are checked against
    (same keys), `threshold` the ratio threshold per output (`None` = exact, bit for bit; a
    dict `{label: (index, threshold)}` checks named parts of one output separately).
    `tolerance` is written into the metadata when set.
    """

    op: str
    name: str
    inputs: dict
    params: dict
    outputs: dict
    oracle: dict
    threshold: dict
    source: dict
    description: str
    tolerance: dict | None = None
    note: str | None = None
    # Extra agreements required before writing: (label, reference, candidate, threshold),
    # e.g. the generator's float64 transcription against FLA's naive function.
    cross: list = dataclasses.field(default_factory=list)
    # Write the case even when it disagrees with the oracle, with the refusal in the metadata key
    # `known_failure` (upstream implementations whose failure the fixtures must show, e.g.
    # FlashQLA); the test suite then requires the case to keep failing.
    keep_failing: bool = False


def compare(ref: torch.Tensor, x: torch.Tensor) -> tuple[float, float, bool, str]:
    """The spec's comparison of candidate `x` against reference `ref` (both widened to f64).

    Returns `(max_abs, ratio, finite_ok, why)`; `finite_ok` is false when `x` has NaN/Inf
    where `ref` is finite or a non-finite `ref` value is not matched exactly.
    """
    if tuple(ref.shape) != tuple(x.shape):
        return math.inf, math.inf, False, f"shape {tuple(x.shape)} != {tuple(ref.shape)}"
    r = ref.detach().to("cpu", torch.float64)
    c = x.detach().to("cpu", torch.float64)
    fin = torch.isfinite(r)
    if bool((~torch.isfinite(c) & fin).any()):
        return math.inf, math.inf, False, "non-finite candidate where the reference is finite"
    nf = ~fin
    if bool(nf.any()):
        same = (torch.isnan(r[nf]) & torch.isnan(c[nf])) | (r[nf] == c[nf])
        if not bool(same.all()):
            return math.inf, math.inf, False, "non-finite reference values not matched"
    if r.numel() == 0 or not bool(fin.any()):
        return 0.0, 0.0, True, ""
    d = (r[fin] - c[fin]).abs()
    max_abs = float(d.max())
    rms_d = float(torch.sqrt((d * d).mean()))
    rms_r = float(torch.sqrt((r[fin] * r[fin]).mean()))
    return max_abs, rms_d / (rms_r + 1e-8), True, ""


def check(case: Case) -> list[str]:
    """Compares every stored output with its oracle; returns one line per output.

    Raises `RefusedCase` on the first failure.
    """
    lines = []
    if set(case.outputs) != set(case.oracle):
        raise RefusedCase(f"{case.op}/{case.name}: outputs {sorted(case.outputs)} "
                          f"but oracle {sorted(case.oracle)}")
    for key, out in case.outputs.items():
        ref = case.oracle[key]
        thr = case.threshold[key]
        if thr is None:
            ok = tuple(ref.shape) == tuple(out.shape) and ref.dtype == out.dtype and bool(
                (ref.view(-1).view(torch.uint8) == out.view(-1).view(torch.uint8)).all()
                if ref.numel() else True)
            lines.append(f"  out.{key} {tuple(out.shape)} {out.dtype}: bit-exact {ok}")
            if not ok:
                raise RefusedCase(f"{case.op}/{case.name}: out.{key} not bit-exact")
            continue
        # A dict threshold compares named parts separately: {"hm.b": (index, thr), ...}.
        parts = thr.items() if isinstance(thr, dict) else [(key, (Ellipsis, thr))]
        for label, (idx, t) in parts:
            max_abs, ratio, fin_ok, why = compare(ref[idx], out[idx])
            ok = fin_ok and (max_abs <= ABS_FLOOR or ratio <= t)
            lines.append(f"  out.{label} {tuple(out[idx].shape)} {out.dtype}: "
                         f"max_abs={max_abs:.3e} ratio={ratio:.3e} thr={t:g} "
                         f"{'PASS' if ok else 'FAIL'} {why}")
            if not ok:
                raise RefusedCase(f"{case.op}/{case.name}: out.{label} disagrees with the "
                                  f"float64 oracle (max_abs={max_abs:.3e}, ratio={ratio:.3e}, "
                                  f"threshold={t:g}) {why}")
    for label, ref, x, thr in case.cross:
        max_abs, ratio, fin_ok, why = compare(ref, x)
        ok = fin_ok and (max_abs <= ABS_FLOOR or ratio <= thr)
        lines.append(f"  cross-check {label}: max_abs={max_abs:.3e} ratio={ratio:.3e} "
                     f"thr={thr:g} {'PASS' if ok else 'FAIL'} {why}")
        if not ok:
            raise RefusedCase(f"{case.op}/{case.name}: cross-check {label} failed "
                              f"(max_abs={max_abs:.3e}, ratio={ratio:.3e}, threshold={thr:g})")
    return lines


KNOWN_FAILURE = "known_failure"


def write(case: Case, root: Path) -> Path:
    """Checks `case` against its oracle, then writes `root/<op>/<name>.safetensors`.

    A disagreeing case raises `RefusedCase`, unless `case.keep_failing`: then it is written with
    the reason in the metadata key `known_failure`."""
    known_failure = None
    try:
        lines = check(case)
    except RefusedCase as e:
        if not case.keep_failing:
            raise
        known_failure = str(e)
        lines = [f"  KNOWN FAILURE (kept): {e}"]
    tensors = {}
    for k, v in case.inputs.items():
        tensors[f"in.{k}"] = v.detach().to("cpu").contiguous()
    for k, v in case.outputs.items():
        tensors[f"out.{k}"] = v.detach().to("cpu").contiguous()
    meta = {
        "format": FORMAT,
        "op": case.op,
        "params": json.dumps(case.params),
        "source": json.dumps(case.source),
        "description": case.description,
    }
    if case.tolerance:
        meta["tolerance"] = json.dumps(case.tolerance)
    if case.note:
        meta["note"] = case.note
    if known_failure:
        meta[KNOWN_FAILURE] = known_failure
    path = root / case.op / f"{case.name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    canonicalize(tmp)
    os.replace(tmp, path)
    size = path.stat().st_size
    print(f"wrote {case.op}/{case.name}.safetensors ({size / 1024:.0f} KB, "
          f"impl {case.source['impl']})")
    for line in lines:
        print(line)
    return path


def canonicalize(path: Path) -> None:
    """Rewrites the safetensors header in a fixed key order (metadata keys sorted, then the
    tensors by name), so that the same case always gives the same bytes and sha256
    (`save_file` writes the metadata map in hash order). The data section is unchanged."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    ordered = {}
    if meta is not None:
        ordered["__metadata__"] = dict(sorted(meta.items()))
    for name in sorted(header):
        ordered[name] = header[name]
    text = json.dumps(ordered, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def read_metadata(path: Path) -> dict:
    """The `__metadata__` map of a safetensors file (header only)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return header.get("__metadata__", {})


def write_manifest(root: Path) -> Path:
    """Rebuilds `root/MANIFEST.json` from every case file under `root` (sorted by path)."""
    files = []
    for path in sorted(root.glob("*/*.safetensors")):
        meta = read_metadata(path)
        files.append({
            "path": path.relative_to(root).as_posix(),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "op": meta["op"],
            "impl": json.loads(meta["source"])["impl"],
            "description": meta.get("description", ""),
        })
    files.sort(key=lambda e: e["path"])
    out = root / "MANIFEST.json"
    out.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1) + "\n")
    return out


#: Set by `gen_fixtures.py --quick-autotune`; recorded in the `source` of FLA cases.
AUTOTUNE_ENV = "ATTN_FIXTURES_AUTOTUNE"


def provenance(impl: str, seed: int, function: str, device: str, **extra) -> dict:
    """`source` metadata: who computed the outputs, with versions, device and seed."""
    src = {"impl": impl, "function": function, "torch": torch.__version__, "device": device,
           "seed": seed, "generator": "tools/gen_fixtures.py"}
    if impl.startswith("fla"):
        src["version"] = "fla-core " + fla_version()
        try:
            import triton
            src["triton"] = triton.__version__
        except ImportError:
            pass
        if os.environ.get(AUTOTUNE_ENV):
            src["autotune"] = os.environ[AUTOTUNE_ENV]
    src.update(extra)
    return src


def fla_version() -> str:
    import fla
    return fla.__version__


def device_name(device: str) -> str:
    """A human name of the device the outputs were computed on."""
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return "cpu"


def gen(seed: int) -> torch.Generator:
    """The CPU generator every case draws its inputs from (independent of the GPU's RNG)."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(gen_: torch.Generator, *shape: int) -> torch.Tensor:
    """`randn` in float32 on the CPU from `gen_`."""
    return torch.randn(*shape, generator=gen_, dtype=torch.float32)
