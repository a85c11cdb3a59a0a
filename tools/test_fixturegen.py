"""Tests of the fixture generators: the comparison rule, refusal, deterministic files and the
float64 transcriptions' identities (`conformance/spec/ops-delta-rule.md` §3.6, §5.3, §6.5, §8.5).

    python3 -m pytest tools/test_fixturegen.py      (or: python3 tools/test_fixturegen.py)
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixturegen import cumsum as C  # noqa: E402
from fixturegen import decode as D  # noqa: E402
from fixturegen import delta_math as M  # noqa: E402
from fixturegen.case import (  # noqa: E402
    Case, RefusedCase, compare, read_metadata, write, write_manifest)


def rng(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def rand_case(seed, perturb):
    g = rng(seed)
    x = torch.randn(3, 50, generator=g)
    ref = torch.cumsum(x.double(), 1)
    y = (ref * (1 + perturb)).float()
    return Case(op="cumsum", name=f"t{seed}", inputs={"x": x},
                params={"dim": 1, "reverse": False, "output_dtype": None}, outputs={"y": y},
                oracle={"y": ref}, threshold={"y": 1e-5}, tolerance={"y": 1e-5},
                source={"impl": "test", "seed": seed}, description="test case")


def test_compare_rule():
    g = rng(1)
    ref = torch.randn(1000, generator=g, dtype=torch.float64) * 3
    noise = torch.randn(1000, generator=g, dtype=torch.float64)
    x = ref + 1e-3 * noise
    max_abs, ratio, ok, _ = compare(ref, x)
    assert ok
    assert abs(max_abs - 1e-3 * noise.abs().max().item()) < 1e-12
    expect = (1e-3 * noise).pow(2).mean().sqrt() / (ref.pow(2).mean().sqrt() + 1e-8)
    assert abs(ratio - expect.item()) < 1e-12
    bad = x.clone()
    bad[17] = math.nan
    assert not compare(ref, bad)[2]
    ref2 = ref.clone()
    ref2[3], ref2[4] = math.nan, math.inf
    x2 = x.clone()
    x2[3], x2[4] = math.nan, math.inf
    assert compare(ref2, x2)[2]
    x2[4] = -math.inf
    assert not compare(ref2, x2)[2]
    assert not compare(ref, x[:-1])[2]


def test_refuses_disagreeing_case_and_writes_agreeing_one():
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        try:
            write(rand_case(3, 1e-3), root)
            raise AssertionError("a ratio of 1e-3 against 1e-5 must be refused")
        except RefusedCase:
            pass
        assert not (root / "cumsum" / "t3.safetensors").exists()
        path = write(rand_case(4, 0.0), root)
        meta = read_metadata(path)
        assert meta["format"] == "attn-case/1" and meta["op"] == "cumsum"
        assert json.loads(meta["params"])["dim"] == 1
        assert json.loads(meta["tolerance"]) == {"y": 1e-5}


def test_files_are_deterministic_and_manifest_hashes_them():
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        p1 = write(rand_case(5, 0.0), Path(d1))
        p2 = write(rand_case(5, 0.0), Path(d2))
        assert p1.read_bytes() == p2.read_bytes()
        man = json.loads(write_manifest(Path(d1)).read_text())
        assert man["format"] == "attn-fixtures/1"
        (entry,) = man["files"]
        assert entry["path"] == "cumsum/t5.safetensors" and entry["impl"] == "test"
        assert entry["sha256"] == hashlib.sha256(p1.read_bytes()).hexdigest()


def test_chunk_cumsum_oracle():
    g = torch.randn(1, 300, 2, 3, generator=rng(6), dtype=torch.float64)
    cu = torch.tensor([0, 1, 1, 65, 300])  # a zero-length sequence; the last starts at 65
    o = C.chunk_cumsum_f64(g, 64, False, 2.0, cu)
    # global = local with a chunk longer than every sequence
    assert torch.allclose(C.chunk_cumsum_f64(g, None, True, None, cu),
                          C.chunk_cumsum_f64(g, 512, True, None, cu), atol=0, rtol=0)
    # chunks of the last sequence start at 65 and 129
    assert torch.allclose(o[0, 65], 2.0 * g[0, 65])
    assert torch.allclose(o[0, 128], 2.0 * g[0, 65:129].sum(0))
    assert torch.allclose(o[0, 129], 2.0 * g[0, 129])
    assert torch.allclose(o[0, 130], 2.0 * g[0, 129:131].sum(0))
    assert torch.allclose(o[0, 0], 2.0 * g[0, 0]) and torch.allclose(o[0, 1], 2.0 * g[0, 1])


def test_kda_gate_oracle_matches_fla_naive():
    g = torch.randn(2, 7, 3, 8, generator=rng(7)) * 10
    a_log, dt_bias = torch.randn(3, generator=rng(8)), torch.randn(24, generator=rng(9))
    for lb in (None, -5.0):
        ref = C.kda_gate_f64(g, a_log, dt_bias, lb)
        naive = C.fla_naive_gate(g, a_log, dt_bias, lb)
        assert compare(ref, naive)[1] < 1e-6


def test_decode_oracle_ignores_positions_past_the_prefix():
    g = rng(10)
    q = torch.randn(2, 3, 4, 16, generator=g)
    kc = torch.randn(2, 20, 2, 16, generator=g)
    vc = torch.randn(2, 20, 2, 16, generator=g)
    lens, rows = [5, 0], [1, 0]
    o1, e1, l1 = D.decode_oracle(q, D.poison(kc, lens, rows, "bshd"),
                                 D.poison(vc, lens, rows, "bshd"), lens, rows, 0.25, True, "bshd")
    o2, e2, l2 = D.decode_oracle(q, kc, vc, lens, rows, 0.25, True, "bshd")
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert torch.isinf(l1[1]).all() and (o1[1] == 0).all()
    # query 0 of row 0 sees keys 0..2 (n - L_q + 0 = 2): explicit check of one output
    s = (q[0, 0, 0].double() @ kc[1, :3, 0].double().T) * 0.25
    assert torch.allclose(o1[0, 0, 0], torch.softmax(s, 0) @ vc[1, :3, 0].double())
    assert torch.allclose(l1[0, 0, 0], torch.logsumexp(s, 0))


def delta_inputs(seed, hv=2, h=1, kdim=12, vdim=10):
    g = rng(seed)
    cu = torch.tensor([0, 15, 15, 50, 77])
    q = M.l2norm(torch.randn(1, 77, h, kdim, generator=g))
    k = M.l2norm(torch.randn(1, 77, h, kdim, generator=g))
    v = torch.randn(1, 77, hv, vdim, generator=g).double()
    a = F.logsigmoid(torch.randn(1, 77, hv, kdim, generator=g)).double()
    beta = torch.sigmoid(torch.randn(1, 77, hv, generator=g)).double()
    h0 = torch.randn(4, hv, kdim, vdim, generator=g).double()
    return cu, q, k, v, a, beta, h0


def test_chunked_kda_equals_recurrence():
    cu, q, k, v, a, beta, h0 = delta_inputs(11)
    bt = 16
    o, fs = M.kda_recurrent(q, k, v, a, beta, None, h0, cu)
    G = M.chunk_local_cumsum(a, bt, cu, M.RCP_LN2_EXACT)
    w, u, kg, aqk, akk = M.kda_intra(q, k, v, G, beta, None, cu, bt)
    h, v_new, fs2 = M.fwd_h(kg, w, u, None, G, h0, cu, bt)
    assert compare(fs, fs2)[0] < 1e-12
    kh, scale = M.kh_index(1, 2), 12 ** -0.5
    o2, ci = torch.zeros_like(o), 0
    for _, bos, eos in M.seq_ranges(1, 77, cu):
        for s, e in M.chunk_ranges(bos, eos, bt):
            inter = scale * torch.einsum("rhk,hkv->rhv",
                                         q[0, s:e][:, kh] * torch.exp2(G[0, s:e]), h[0, ci])
            o2[0, s:e] = inter + torch.einsum("rhj,jhv->rhv", aqk[0, s:e, :, :e - s],
                                              v_new[0, s:e])
            ci += 1
    assert compare(o, o2)[0] < 1e-12
    # the chunk at tokens 15..30: Akk (I + L) = I, entries above the diagonal exactly zero
    blk, bb = akk[0, 15:31, 0, :16], beta[0, 15:31, 0]
    kk = kg.new_zeros(16, 16)
    for r in range(16):
        for j in range(r):
            kk[r, j] = bb[r] * (k[0, 15 + r, 0] * k[0, 15 + j, 0]
                                * torch.exp2(G[0, 15 + r, 0] - G[0, 15 + j, 0])).sum()
    assert compare(torch.eye(16, dtype=torch.float64), blk @ (torch.eye(16) + kk))[0] < 1e-12
    assert (torch.triu(blk, 1) == 0).all()


def test_split_and_pre_scan_identities():
    cu, q, k, v, a, beta, h0 = delta_inputs(12)
    bt = 16
    G = M.chunk_local_cumsum(a, bt, cu, M.RCP_LN2_EXACT)
    w, u, kg, _, _ = M.kda_intra(q, k, v, G, beta, None, cu, bt)
    h, vn, fs = M.fwd_h(kg, w, u, None, G, h0, cu, bt)
    sub = torch.tensor([0, 15, 15, 31, 50, 66, 77])
    hm = M.pre_scan(kg, w, u, None, G, sub, bt)
    inits, fs_m = M.merge(hm, [0, 1, 2, 4, 6], h0)
    h2, vn2, _ = M.fwd_h(kg, w, u, None, G, inits, sub, bt)
    assert compare(fs, fs_m)[0] < 1e-12
    assert compare(h, h2)[0] < 1e-12 and compare(vn, vn2)[0] < 1e-12
    _, _, fs_sub = M.fwd_h(kg, w, u, None, G, inits, sub, bt)
    assert compare(fs_sub, hm[..., 10:] @ inits + hm[..., :10])[0] < 1e-12
    # state_v_first holds the transposes
    hs, _, fss = M.fwd_h(kg, w, u, None, G, h0.transpose(-1, -2), cu, bt, state_v_first=True)
    assert torch.equal(hs, h.transpose(-1, -2)) and torch.equal(fss, fs.transpose(-1, -2))


def test_gdn_equals_kda_with_broadcast_gate():
    cu, q, k, v, _, beta, h0 = delta_inputs(13)
    gs = F.logsigmoid(torch.randn(1, 77, 2, generator=rng(14))).double()
    bt = 32
    o, fs = M.kda_recurrent(q, k, v, gs[..., None].expand(1, 77, 2, 12), beta, None, h0, cu)
    G = M.chunk_local_cumsum(gs, bt, cu, M.RCP_LN2_EXACT)
    w, u, _, _, _ = M.kda_intra(q, k, v, G[..., None].expand(1, 77, 2, 12), beta, None, cu, bt)
    _, _, fs2 = M.fwd_h(k, w, u, G, None, h0, cu, bt)
    assert compare(fs, fs2)[0] < 1e-12


if __name__ == "__main__":
    tests = [f for n, f in sorted(globals().items()) if n.startswith("test_")]
    for t in tests:
        t()
        print(f"ok {t.__name__}")
    print(f"{len(tests)} passed")
