#!/usr/bin/env python3
"""Warm-up cases of `chunk_gated_delta_rule_fwd_h_split` (`conformance/spec/ops-delta-rule.md`
§5.9): `fixtures/chunk_gated_delta_rule_fwd_h_split/warmup_*.safetensors` + their MANIFEST rows.

    PYTHONPATH=<numpy> python3 tools/warmup_fixtures.py --out fixtures

No upstream implements warm-up pieces (FLA 0.6.0 and cuLA split with exact summaries only), so
the expected outputs cannot come from FLA. Each case takes the inputs of an existing split
fixture (made by tools/gen_fixtures.py: FLA-triton or torch-f64-spec inputs from the float64
intra stage), adds `in.warmup_chunks`, and computes `h`, `v_new`, `final_state` with the float64
numpy code below, written from §2.4 and §5.9 alone (independent of the Rust reference and of
tools/fixturegen): per sequence, the untruncated state at every chunk; a piece with `w = 0` starts
from it, a piece with `w > 0` from section 2's recurrence over chunks `max(0, c0 - w) .. c0 - 1`
started from zero (from `initial_state` when the warm-up reaches the start). `source.impl` is
`numpy-f64-spec`. Checks before writing: warm-ups that reach the start reproduce the untruncated
result to 1e-12, and a truncating warm-up changes it (the case is not vacuous).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
from pathlib import Path

import numpy as np

OP = "chunk_gated_delta_rule_fwd_h_split"
DT = {"F64": np.float64, "F32": np.float32, "I32": np.int32, "I64": np.int64}


def read(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    meta = head.pop("__metadata__")
    data = b[8 + n:]
    out = {}
    for name, v in head.items():
        lo, hi = v["data_offsets"]
        raw = data[lo:hi]
        if v["dtype"] == "BF16":
            x = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            arr = x.view(np.float32).astype(np.float64)
        elif v["dtype"] == "F16":
            arr = np.frombuffer(raw, np.float16).astype(np.float64)
        else:
            arr = np.frombuffer(raw, DT[v["dtype"]])
        out[name] = (v["dtype"], arr.reshape(v["shape"]))
    return meta, out


def encode(dtype, arr):
    if dtype == "BF16":
        x = np.ascontiguousarray(arr, np.float32).view(np.uint32).astype(np.uint64)
        x = (x + 0x7FFF + ((x >> 16) & 1)) >> 16  # round to nearest even
        return x.astype(np.uint16).tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(arr, np.float16).tobytes()
    return np.ascontiguousarray(arr, DT[dtype]).tobytes()


def write(path, meta, tensors):
    head, blobs, off = {"__metadata__": dict(sorted(meta.items()))}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = encode(dtype, arr)
        head[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def chunk_step(S, k, w, u, g, gk):
    """One chunk of §2.4 for one head: returns (D, next S). k, w: [n, K], u: [n, V]."""
    D = u - w @ S
    gl = g[-1] if g is not None else 0.0
    a = np.exp2(gl - g) if g is not None else np.ones(len(u))
    lam = np.exp2(gk[-1]) if gk is not None else np.ones(S.shape[0])
    S = np.exp2(gl) * lam[:, None] * S + k.T @ (a[:, None] * D)
    return D, S


def split_warm(inp, params, warm):
    """h, v_new, final_state of §5.9 in float64 (states key-first internally)."""
    k, w, u = (inp[n][1] for n in ("in.k", "in.w", "in.u"))
    g = inp["in.g"][1] if "in.g" in inp else None
    gk = inp["in.gk"][1] if "in.gk" in inp else None
    cu = inp["in.cu_seqlens"][1].astype(int)
    sub = inp["in.subseq_cu_seqlens"][1].astype(int)
    vf = params["state_v_first"]
    h0 = inp["in.initial_state"][1] if "in.initial_state" in inp else None
    bt = params["chunk_size"]
    _, t, hk, kd = k.shape
    hv, vd = u.shape[2], u.shape[3]
    nt = sum(-(-(cu[i + 1] - cu[i]) // bt) for i in range(len(cu) - 1))
    h = np.zeros((1, nt, hv, kd, vd))
    v_new = np.zeros((1, t, hv, vd))
    fs = np.zeros((len(cu) - 1, hv, kd, vd))
    hrow = 0
    for n in range(len(cu) - 1):
        bos, eos = cu[n], cu[n + 1]
        pieces = [j for j in range(len(sub) - 1) if bos <= sub[j] and sub[j + 1] <= eos
                  and not (sub[j] == sub[j + 1] and bos != eos)]
        for head in range(hv):
            kh = head // (hv // hk)

            def start():
                if h0 is None:
                    return np.zeros((kd, vd))
                s0 = h0[n, head]
                return s0.T.copy() if vf else s0.copy()

            def run(S, c_from, c_to, emit):
                for c in range(c_from, c_to):
                    a, e = bos + c * bt, min(bos + (c + 1) * bt, eos)
                    if emit:
                        h[0, hrow + c, head] = S
                    D, S = chunk_step(S, k[0, a:e, kh], w[0, a:e, head], u[0, a:e, head],
                                      None if g is None else g[0, a:e, head],
                                      None if gk is None else gk[0, a:e, head])
                    if emit:
                        v_new[0, a:e, head] = D
                return S

            exact = [start()]  # the untruncated state before every chunk
            for c in range(-(-(eos - bos) // bt)):
                exact.append(run(exact[-1], c, c + 1, False))
            S = exact[0]
            for j in pieces:
                c0, c1 = (sub[j] - bos) // bt, -(-(sub[j + 1] - bos) // bt)
                wj = int(warm[j])
                if wj == 0:
                    S = exact[c0]
                else:
                    cf = max(0, c0 - wj)
                    S = run(start() if cf == 0 else np.zeros((kd, vd)), cf, c0, False)
                S = run(S, c0, c1, True)
            fs[n, head] = S
        hrow += -(-(eos - bos) // bt)
    if vf:
        h = h.swapaxes(-1, -2)
        fs = fs.swapaxes(-1, -2)
    return h, v_new, fs


CASES = [
    # (new name, base fixture, what, gate divisor). The bases' realistic gates (§10.2) forget
    # below fp32 resolution within a chunk or two, so a warm-up there is exact in practice (the
    # regime the truncation policy relies on) and a kernel that ignored `warmup_chunks` would
    # pass. The cases divide the base's (chunk-local, log2) gates by the divisor: a slower decay
    # under which the warm-ups change `h` well beyond the tolerance.
    ("warmup_gdn_bf16_bt16", "gdn_bf16_bt16",
     "mixed: exact pieces after warm-ups, warm-ups reaching the start, one chunk", 100.0),
    ("warmup_kda_bf16_bt32_every_chunk", "kda_bf16_bt32_every_chunk",
     "one-chunk pieces, warm-ups of 1-3 chunks, state_v_first", 100.0),
    ("warmup_gva_f64", "gva_f64", "float64, GVA, g and gk, warm-ups beyond the start (clamped)", 20.0),
]


def warmups(name, sub, cu, bt):
    """Per piece: 0 on first pieces (those start at a sequence start), a pattern per case."""
    out = []
    for j in range(len(sub) - 1):
        bos = max(c for c in cu if c <= sub[j])
        c0 = (sub[j] - bos) // bt
        if c0 == 0:
            out.append(0)
        elif name.startswith("warmup_gdn"):
            out.append([2, c0, 0, 1][j % 4])
        elif name.startswith("warmup_kda"):
            out.append(1 + j % 3)
        else:
            out.append([c0 + 2, 1, 0][j % 3])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fixtures")
    args = ap.parse_args()
    root = Path(args.out)
    d = root / OP
    manifest_path = root / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    for name, base, what, div in CASES:
        meta, inp = read(d / f"{base}.safetensors")
        params = json.loads(meta["params"])
        cu = inp["in.cu_seqlens"][1].astype(int)
        sub = inp["in.subseq_cu_seqlens"][1].astype(int)
        warm = np.array(warmups(name, sub, cu, params["chunk_size"]), np.int32)
        zero = np.zeros_like(warm)
        reach = np.array([0 if x == 0 else 10**6 for x in warm], np.int32)
        tol = json.loads(meta["tolerance"])
        # the exact split agrees with the base case's outputs (FLA's or torch's) at its tolerance
        for key, want in zip(("out.h", "out.v_new", "out.final_state"), split_warm(inp, params, zero)):
            r = np.sqrt(np.mean((inp[key][1] - want) ** 2)) / (np.sqrt(np.mean(want**2)) + 1e-8)
            assert r <= tol[key.split(".")[1]], f"{name}: {key} of the base disagrees ({r:e})"
        for g in ("in.g", "in.gk"):
            if g in inp:
                dtype = inp[g][0]  # F32 or F64: the values the file will hold
                inp[g] = (dtype, (inp[g][1] / div).astype(DT[dtype]).astype(np.float64))
        ex = split_warm(inp, params, zero)
        rc = split_warm(inp, params, reach)
        got = split_warm(inp, params, warm)
        for a, b in zip(ex, rc):
            assert np.max(np.abs(a - b)) < 1e-12, f"{name}: reaching warm-ups are not exact"
        # a kernel that ignored warmup_chunks must fail the case
        a, b = ex[0], got[0]
        diff = np.sqrt(np.mean((a - b) ** 2)) / (np.sqrt(np.mean(a**2)) + 1e-8)
        print(f"{name}: relative change of h {diff:.3e} (tolerance {tol['h']:g})")
        assert diff > 3 * tol["h"], f"{name}: the warm-ups change h too little ({diff:e})"
        tensors = {k: v for k, v in inp.items() if k.startswith("in.")}
        tensors["in.warmup_chunks"] = ("I32", warm)
        for key, arr in zip(("out.h", "out.v_new", "out.final_state"), got):
            tensors[key] = (inp[key][0], arr)
        src = {"impl": "numpy-f64-spec", "function": "tools/warmup_fixtures.py split_warm (§2.4 + §5.9 in float64)",
               "numpy": np.__version__, "device": "cpu", "generator": "tools/warmup_fixtures.py",
               "inputs": f"those of {base}.safetensors ({json.loads(meta['source'])['impl']}) with "
                         f"g, gk divided by {div:g}; no upstream implements warm-up pieces"}
        desc = f"numpy-f64-spec {meta['description'].split(' ', 1)[1]}, gates / {div:g}, warmup_chunks {warm.tolist()} ({what})"
        new_meta = {"format": meta["format"], "op": OP, "params": meta["params"],
                    "source": json.dumps(src), "tolerance": json.dumps(tol), "description": desc}
        path = d / f"{name}.safetensors"
        write(path, new_meta, tensors)
        rel = f"{OP}/{name}.safetensors"
        row = {"path": rel, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "op": OP,
               "impl": "numpy-f64-spec", "description": desc}
        manifest["files"] = [f for f in manifest["files"] if f["path"] != rel] + [row]
    manifest["files"].sort(key=lambda f: f["path"])
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
