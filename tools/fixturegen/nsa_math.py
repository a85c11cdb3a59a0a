"""Float64 transcriptions of `conformance/spec/ops-nsa.md` §2-§7 (the `mslk-formula-torch`
implementation).

Plain loops over sequences, rows and heads on `torch.float64` tensors, written from the spec's
formulas (no FLA code). They compute the `mslk-formula-torch` fixtures, the float64 oracle of
every NSA case, the margin checks of §10, and the given `block_indices` of bf16 cases.

Layout: `[B, T, H, D]`; with `cu` (a list of ints) `B = 1` and sequence `n` is tokens
`cu[n] .. cu[n+1]`. Compressed rows of sequence `n` start at `base[n]` (`cmp_offsets`).
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64
NEG = float("-inf")


def seqs(b: int, t: int, cu: list[int] | None) -> list[tuple[int, int, int]]:
    """`(batch, bos, eos)` of every sequence."""
    if cu is None:
        return [(n, 0, t) for n in range(b)]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def n_rows(length: int, bs: int, partial: str) -> int:
    """`TC_n`: `ceil(L / BS)` for `"mean_of_valid"`, `floor(L / BS)` for `"drop"`."""
    return -(-length // bs) if partial == "mean_of_valid" else length // bs


def layout(b: int, t: int, cu, bs: int, partial: str):
    """`(seqs, tc, base, rows)`: per-sequence `TC_n` and first compressed row, and dim 1."""
    ss = seqs(b, t, cu)
    tc = [n_rows(e - s, bs, partial) for _, s, e in ss]
    if cu is None:
        return ss, tc, [0] * len(ss), n_rows(t, bs, partial)
    base = [sum(tc[:n]) for n in range(len(tc))]
    return ss, tc, base, sum(tc)


def compress_kv(x, bs, partial="mean_of_valid", cu=None, w=None):
    """§2: `pooled[c] = mean of x[c*BS : c*BS + n_c]`, then `pooled @ w[h]` when `w` is given."""
    x = x.to(F64)
    b, t, h, d = x.shape
    ss, tc, base, rows = layout(b, t, cu, bs, partial)
    e = d if w is None else w.shape[2]
    out = torch.zeros(1 if cu is not None else b, rows, h, e, dtype=F64)
    for n, (bb, bos, eos) in enumerate(ss):
        for c in range(tc[n]):
            s0 = bos + c * bs
            s1 = min(s0 + bs, eos)
            pooled = x[bb, s0:s1].mean(0)  # [H, D]
            if w is not None:
                pooled = torch.einsum("hd,hde->he", pooled, w.to(F64))
            out[bb, base[n] + c] = pooled
    return out


def attend(qg, keys, vals, scale):
    """Softmax attention of `qg` `[G, K]` over `keys` `[n, K]`, `vals` `[n, V]` (multiset):
    returns `(o [G, V], lse [G])`; no key gives `(0, -inf)`."""
    if keys.shape[0] == 0:
        return torch.zeros(qg.shape[0], vals.shape[1], dtype=F64), torch.full((qg.shape[0],), NEG,
                                                                               dtype=F64)
    z = scale * qg @ keys.T
    lse = torch.logsumexp(z, dim=1)
    return torch.exp(z - lse[:, None]) @ vals, lse


def visible(vis: str, p: int, bs: int, tc: int) -> int:
    """§3: number of visible compressed blocks (a prefix) at position `p`."""
    if vis == "complete":
        return min((p + 1) // bs, tc)
    if vis == "started":
        return min(p // bs + 1, tc)
    return tc


def compression_attention(q, kc, vc, bs, scale, visibility="complete", partial="mean_of_valid",
                          cu=None, empty_lse="-inf"):
    """§3: `(o, lse)` of each query over its visible compressed blocks."""
    q, kc, vc = q.to(F64), kc.to(F64), vc.to(F64)
    b, t, hq, _ = q.shape
    h = kc.shape[2]
    g = hq // h
    ss, tc, base, _ = layout(b, t, cu, bs, partial)
    o = torch.zeros(b, t, hq, vc.shape[3], dtype=F64)
    lse = torch.zeros(b, t, hq, dtype=F64)
    for n, (bb, bos, eos) in enumerate(ss):
        for tt in range(bos, eos):
            m = visible(visibility, tt - bos, bs, tc[n])
            for hh in range(h):
                oo, ll = attend(q[bb, tt, hh * g:(hh + 1) * g], kc[bb, base[n]:base[n] + m, hh],
                                vc[bb, base[n]:base[n] + m, hh], scale)
                o[bb, tt, hh * g:(hh + 1) * g] = oo
                lse[bb, tt, hh * g:(hh + 1) * g] = ll
    if empty_lse == "zero":
        lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return o, lse


def _rank(entries):
    """Score descending, ties by block index ascending."""
    return sorted(entries, key=lambda e: (-e[0], e[1]))


def select_fla(q, kc, counts, bs, scale, cu=None):
    """§4.1: `(block_indices [B, T, H, S] long, scores [B, T, H, W])`; `counts` an int or a
    `[B, T, H]` tensor. Scores: mean group probability, 1 for forced blocks, -inf for
    non-candidates."""
    q, kc = q.to(F64), kc.to(F64)
    b, t, hq, _ = q.shape
    h = kc.shape[2]
    g = hq // h
    ss, tc, base, _ = layout(b, t, cu, bs, "mean_of_valid")
    w = max(tc) if tc else 0
    s = counts if isinstance(counts, int) else int(max(int(counts.max()), 0)) if counts.numel() else 0
    idx = torch.full((b, t, h, s), -1, dtype=torch.long)
    scores = torch.full((b, t, h, w), NEG, dtype=F64)
    for n, (bb, bos, eos) in enumerate(ss):
        for tt in range(bos, eos):
            p = tt - bos
            ic, nc = p // bs, (p + 1) // bs
            for hh in range(h):
                sc = scores[bb, tt, hh]
                if nc > 0:
                    z = scale * q[bb, tt, hh * g:(hh + 1) * g] @ kc[bb, base[n]:base[n] + nc, hh].T
                    sc[:nc] = torch.softmax(z, dim=1).mean(0)
                for c in {0, ic - 1, ic}:
                    if 0 <= c <= ic:
                        sc[c] = 1.0
                n_sel = counts if isinstance(counts, int) else int(counts[bb, tt, hh])
                ranked = _rank([(float(sc[c]), c) for c in range(ic + 1)])
                m = min(n_sel, ic + 1, s)
                for i in range(m):
                    idx[bb, tt, hh, i] = ranked[i][1]
    return idx, scores


def select_tile(q, kc, count, bs, scale, qt, causal=True, cu=None):
    """§4.2: `(rows [B, NQ, HQ, S_m] long, scores [B, NQ, HQ, W])` of the tile-mean mode."""
    q, kc = q.to(F64), kc.to(F64)
    b, t, hq, _ = q.shape
    h = kc.shape[2]
    g = hq // h
    ss, tc, base, _ = layout(b, t, cu, bs, "drop")
    w = max(tc) if tc else 0
    s_m = min(count, w)
    tiles = [(n, i) for n, (_, bos, eos) in enumerate(ss) for i in range((eos - bos) // qt)]
    out_b, nq = (1, len(tiles)) if cu is not None else (b, t // qt)
    rows = torch.zeros(out_b, nq, hq, s_m, dtype=torch.long)
    scores = torch.full((out_b, nq, hq, w), NEG, dtype=F64)
    for r, (n, i) in enumerate(tiles):
        bb, bos, _ = ss[n]
        ob, oi = (0, r) if cu is not None else (bb, r - bb * nq)
        for hh in range(hq):
            qbar = q[bb, bos + i * qt:bos + (i + 1) * qt, hh].mean(0)
            z = scale * kc[bb, base[n]:base[n] + tc[n], hh // g] @ qbar
            entries = []
            for j in range(max(tc[n], s_m)):
                allowed = j < tc[n] and (not causal or j * bs < (i + 1) * qt)
                sj = float(z[j]) if allowed else NEG
                if allowed:
                    scores[ob, oi, hh, j] = sj
                entries.append((sj, j))
            top = _rank(entries)[:s_m]
            row = sorted(0 if sj == NEG else j for sj, j in top)
            rows[ob, oi, hh] = torch.tensor(row, dtype=torch.long)
    return rows, scores


def selection_attention(q, k, v, idx, bs, scale, cu=None, counts=None):
    """§5: `(o, lse)` over the tokens of the valid slots (multiset, token-causal); `counts` a
    `[B, T, H]` tensor of per-row quotas or `None` (all slots)."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    b, t, hq, _ = q.shape
    h = k.shape[2]
    g = hq // h
    s = idx.shape[3]
    o = torch.zeros(b, t, hq, v.shape[3], dtype=F64)
    lse = torch.zeros(b, t, hq, dtype=F64)
    for bb, bos, eos in seqs(b, t, cu):
        for tt in range(bos, eos):
            p = tt - bos
            for hh in range(h):
                n_sel = s if counts is None else int(counts[bb, tt, hh])
                toks = []
                for sl in range(n_sel):
                    c = int(idx[bb, tt, hh, sl])
                    if 0 <= c <= p // bs:
                        toks.extend(range(bos + c * bs, bos + min(c * bs + bs, p + 1)))
                ti = torch.tensor(toks, dtype=torch.long)
                oo, ll = attend(q[bb, tt, hh * g:(hh + 1) * g], k[bb, ti, hh], v[bb, ti, hh], scale)
                o[bb, tt, hh * g:(hh + 1) * g] = oo
                lse[bb, tt, hh * g:(hh + 1) * g] = ll
    return o, lse


def window(q, k, v, w, scale, cu=None):
    """§7 step 5: causal sliding window of `w` keys `max(0, p - w + 1) .. p` of the sequence."""
    q, k, v = q.to(F64), k.to(F64), v.to(F64)
    b, t, hq, _ = q.shape
    h = k.shape[2]
    g = hq // h
    o = torch.zeros(b, t, hq, v.shape[3], dtype=F64)
    for bb, bos, eos in seqs(b, t, cu):
        for tt in range(bos, eos):
            lo = max(bos, tt - w + 1)
            for hh in range(h):
                oo, _ = attend(q[bb, tt, hh * g:(hh + 1) * g], k[bb, lo:tt + 1, hh],
                               v[bb, lo:tt + 1, hh], scale)
                o[bb, tt, hh * g:(hh + 1) * g] = oo
    return o


def sigmoid(x):
    """Overflow-safe logistic."""
    return torch.where(x >= 0, 1 / (1 + torch.exp(-x.abs())), torch.exp(-x.abs()) / (1 + torch.exp(-x.abs())))


def gate_combine(o_cmp, o_slc, o_swa, q=None, weight=None, g=None):
    """§6: `(o, gates [B, T, HQ, 3])` in float64; W form with `weight`, G form with `g`, else U."""
    o3 = [x.to(F64) for x in (o_cmp, o_slc, o_swa)]
    if weight is not None:
        gates = sigmoid(torch.einsum("bthd,hcd->bthc", q.to(F64), weight.to(F64)))
    elif g is not None:
        gates = torch.stack([x.to(F64) for x in g], -1)
    else:
        gates = torch.full((*o3[0].shape[:3], 3), 1 / 3, dtype=F64)
    o = sum(gates[..., c:c + 1] * o3[c] for c in range(3))
    return o, gates


def fwd(q, k, v, g_cmp=None, g_slc=None, g_swa=None, block_indices=None, block_counts=16,
        block_size=64, window_size=0, scale=None, cu=None):
    """§7: `(o, block_indices or None, scores or None)` of the whole FLA forward in float64."""
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    kc = compress_kv(k, block_size, "mean_of_valid", cu)
    vc = compress_kv(v, block_size, "mean_of_valid", cu)
    o = torch.zeros(*q.shape[:3], v.shape[3], dtype=F64)
    computed, scores, counts_slc = None, None, None
    if g_cmp is not None:
        o_cmp, _ = compression_attention(q, kc, vc, block_size, scale, cu=cu)
        o = o + g_cmp.to(F64)[..., None] * o_cmp
        if block_indices is None:
            computed, scores = select_fla(q, kc, block_counts, block_size, scale, cu)
            block_indices = computed
            if not isinstance(block_counts, int):
                counts_slc = block_counts
    elif not isinstance(block_counts, int):
        counts_slc = block_counts
    o_slc, _ = selection_attention(q, k, v, block_indices, block_size, scale, cu, counts_slc)
    o = o + (o_slc if g_slc is None else g_slc.to(F64)[..., None] * o_slc)
    if window_size > 0:
        # FLA calls flash-attn without softmax_scale: the window uses K ** -0.5, not `scale`
        o = o + g_swa.to(F64)[..., None] * window(q, k, v, window_size, k.shape[-1] ** -0.5, cu)
    return o, computed, scores


def fla_margin(idx, scores, counts, cu_rows=None) -> float:
    """The smallest relative gap `(s_cut - s_next) / s_cut` over the rows of an `"fla"`
    selection (`inf` where every candidate is selected); also `-1` when a row's quota is below 3
    (§10 margin rule: every row has `n_sel >= 3`)."""
    worst = math.inf
    b, t, h, _ = idx.shape
    for bb in range(b):
        for tt in range(t):
            for hh in range(h):
                n_sel = counts if isinstance(counts, int) else int(counts[bb, tt, hh])
                if n_sel < 3:
                    return -1.0
                sel = [int(c) for c in idx[bb, tt, hh] if c >= 0]
                sc = scores[bb, tt, hh]
                cand = [c for c in range(sc.shape[0]) if sc[c] != NEG]
                rest = [float(sc[c]) for c in cand if c not in sel]
                if not rest or not sel:
                    continue
                cut = min(float(sc[c]) for c in sel)
                worst = min(worst, (cut - max(rest)) / cut)
    return worst


def tile_margin(rows, scores) -> float:
    """The smallest gap `(s_cut - s_next) / max(1, |s_cut|)` over the rows of a tile-mean
    selection, over real (finite) entries."""
    worst = math.inf
    b, nq, hq, _ = rows.shape
    for bb in range(b):
        for i in range(nq):
            for hh in range(hq):
                sc = scores[bb, i, hh]
                sel = set(int(c) for c in rows[bb, i, hh])
                fin = [c for c in range(sc.shape[0]) if sc[c] != NEG]
                chosen = [float(sc[c]) for c in fin if c in sel]
                rest = [float(sc[c]) for c in fin if c not in sel]
                if not rest or not chosen:
                    continue
                cut = min(chosen)
                worst = min(worst, (cut - max(rest)) / max(1.0, abs(cut)))
    return worst


def same_sets(a, b) -> bool:
    """Row by row, the valid entries as sets and the same number of `-1` (§9, mode `"fla"`)."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    fa, fb = a.reshape(-1, a.shape[-1]).tolist(), b.reshape(-1, b.shape[-1]).tolist()
    for ra, rb in zip(fa, fb):
        if sorted(x for x in ra if x >= 0) != sorted(x for x in rb if x >= 0):
            return False
        if ra.count(-1) != rb.count(-1):
            return False
    return True
