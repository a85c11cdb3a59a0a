# Emulates kda_intra_pipe.cu's pipe_diag_fma (the diagonal blocks without safe_gate) and the held
# Aqk blocks' copy into the staging, in float32 on a byte image of shared memory (indexing, the
# steps' swizzle, the reduce-scatter over key groups), against a direct f64 computation of the
# diagonal blocks (Aqk compared with bf16(reference): 0 expected; L relative). No GPU needed:
#   python3 tools/sim_pipe_diag.py
import numpy as np
rng = np.random.default_rng(1)
BT, K, GP = 64, 128, 132
def bf16(x):
    x = np.asarray(x, np.float32).copy(); u = x.view(np.uint32)
    u[:] = ((u.astype(np.uint64) + 0x7fff + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return x
def run(nc, regime):
    q = np.zeros((BT, K), np.float32); k = np.zeros((BT, K), np.float32)
    q[:nc] = bf16(rng.standard_normal((nc, K)) / np.sqrt(K)); k[:nc] = bf16(rng.standard_normal((nc, K)) / np.sqrt(K))
    if regime == 'strong':   # logsigmoid(randn)
        x = rng.standard_normal((nc, K)); g = -np.log1p(np.exp(-x))
    elif regime == 'trained':
        g = -np.exp(rng.uniform(0, 2.5, K)) * np.log1p(np.exp(rng.standard_normal((nc, K)) - 2))
    else:
        g = rng.uniform(-1e-3, 0, (nc, K))
    gg = np.zeros((BT, K)); gg[:nc] = g
    G = (np.cumsum(gg, 0) / np.log(2)).astype(np.float32)  # rows >= nc: G of nc-1
    beta = np.zeros(BT, np.float32); beta[:nc] = rng.uniform(0, 1, nc)
    scale = np.float32(K ** -0.5)
    # shared memory as a byte array
    sm = bytearray(200000)
    def stf(addr, v): sm[addr:addr+4] = np.float32(v).tobytes()
    def ldf(addr): return np.frombuffer(sm, np.float32, 1, addr)[0]
    QX, KV, Gb, F = 0, 16384, 32768, 32768 + BT * GP * 4
    S = F + 18432; SMALL = S + 20480
    def tile(r, c): return r * 256 + ((c ^ (r & 7)) << 4)
    for r in range(BT):
        for c in range(16):
            sm[QX+tile(r,c):QX+tile(r,c)+16] = bf16(q[r, 8*c:8*c+8]).view(np.uint32).astype('<u4').view(np.uint16)[1::2].tobytes()
            sm[KV+tile(r,c):KV+tile(r,c)+16] = bf16(k[r, 8*c:8*c+8]).view(np.uint32).astype('<u4').view(np.uint16)[1::2].tobytes()
        for d in range(K): stf(Gb + (r*GP + d)*4, G[r, d])
        stf(SMALL + r*4, beta[r])
    def lds_bf8(addr):
        h = np.frombuffer(sm, np.uint16, 8, addr).astype(np.uint32) << 16
        return h.view(np.float32)
    def step_at(r, u): return r*512 + ((u ^ ((u >> 3) & 1)) << 4)
    ex2 = lambda x: np.float32(2.0) ** np.float32(x)
    steps = F; hold = S + 6*2048; L = F
    written = set()
    for warp in range(8):
        for lane in range(32):
            r0 = 8*warp
            prev = [ldf(Gb + ((r0-1)*GP + 4*lane + e)*4) for e in range(4)] if warp & 1 else [0]*4
            for i in range(8):
                r = r0 + i
                cur = [ldf(Gb + (r*GP + 4*lane + e)*4) for e in range(4)]
                if i > 0 or warp & 1:
                    for e in range(4):
                        a = steps + step_at(r, lane) + 4*e
                        assert a not in written; written.add(a)
                        stf(a, ex2(np.float32(cur[e] - prev[e])))
                prev = cur
    # FMA per lane, then the reduce-scatter across the 8 lanes of a group
    res = {}
    for warp in range(8):
        for s in range(2):
            j = warp if s == 0 else 15 - warp
            V = np.zeros((32, 32), np.float32)  # [lane][v]
            for lane in range(32):
                db, kq = lane >> 3, lane & 7
                e = np.zeros(16, np.float32); v = V[lane]
                for r in range(16):
                    if r < j: continue
                    R = 16*db + r
                    at = db*4096 + 256*r + ((kq ^ (r & 7)) << 4)   # = tile(R, kq + 8 h) - 128 h
                    qq = np.concatenate([lds_bf8(QX + at + 128*h) for h in range(2)])
                    kk = np.concatenate([lds_bf8(KV + at + 128*h) for h in range(2)])
                    if r == j: e = kk.copy()
                    else:
                        sp = [steps + db*8192 + ((2*kq + (p ^ (kq >> 2))) << 4) for p in range(2)]  # = step_at(R, 16 h + 2 kq + p) - 512 r - 256 h
                        st = np.concatenate([np.frombuffer(sm, np.float32, 4, sp[p] + 512*r + 256*h) for h in range(2) for p in range(2)])
                        e = (e * st).astype(np.float32)
                        for x in range(16): v[16+r] = np.float32(kk[x]*e[x] + v[16+r])
                    for x in range(16): v[r] = np.float32(qq[x]*e[x] + v[r])
            for (bit, n, m) in [(4, 16, 4), (2, 8, 2), (1, 4, 1)]:
                Vn = V.copy()
                for lane in range(32):
                    b = (lane & 7 & bit) != 0; p = lane ^ m
                    bp = not b
                    for x in range(n):
                        send_p = V[p][x] if bp else V[p][x + n]
                        keep = V[lane][x + n] if b else V[lane][x]
                        Vn[lane][x] = np.float32(keep + send_p)
                V = Vn
            for lane in range(32):
                res[(warp, lane, s)] = V[lane][:4].copy()
    for warp in range(8):
        for lane in range(32):
            db, kq = lane >> 3, lane & 7
            for s in range(2):
                j = warp if s == 0 else 15 - warp; J = 16*db + j
                for x in range(4):
                    r = 4*(kq & 3) + x; R = 16*db + r; v = res[(warp, lane, s)][x]
                    if not (kq & 4): stf(hold + ((16*db + r)*17 + j)*4, scale*v if (R < nc and j <= r) else 0.0)
                    else: stf(L + (R*65 + J)*4, ldf(SMALL + R*4)*v if (R < nc and j < r) else 0.0)
    # hold -> staging (QX first 8 KB, 128-byte rows)
    for x in range(128):
        db, r, h = x >> 5, (x >> 1) & 15, x & 1; R = 16*db + r; c = 2*db + h
        v = [ldf(hold + ((16*db + r)*17 + 8*h + e)*4) for e in range(8)]
        sm[QX + R*128 + ((c ^ (R & 7)) << 4): QX + R*128 + ((c ^ (R & 7)) << 4) + 16] = bf16(v).view(np.uint32).astype('<u4').view(np.uint16)[1::2].tobytes()
    # reference (f64), diagonal blocks
    worst_a = worst_l = 0.0; ea = []; ra = []
    for b in range(4):
        for r in range(16):
            R = 16*b + r
            for jj in range(16):
                Jc = 16*b + jj
                f = np.exp2(G[R].astype(np.float64) - G[Jc].astype(np.float64))
                aq = scale * np.sum(q[R].astype(np.float64) * k[Jc] * f) if (R < nc and jj <= r) else 0.0
                lv = beta[R] * np.sum(k[R].astype(np.float64) * k[Jc] * f) if (R < nc and jj < r) else 0.0
                c = Jc >> 3
                got_a = (np.frombuffer(sm, np.uint16, 1, QX + R*128 + ((c ^ (R & 7)) << 4) + (Jc & 7)*2).astype(np.uint32) << 16).view(np.float32)[0]
                got_l = ldf(L + (R*65 + Jc)*4)
                ea.append(got_a - bf16([aq])[0]); ra.append(aq)
                worst_l = max(worst_l, abs(got_l - lv) / (abs(lv) + 1e-3))
                if aq == 0.0: assert got_a == 0.0, (R, Jc, got_a)
                if lv == 0.0: assert got_l == 0.0, (R, Jc, got_l)
    ea, ra = np.array(ea), np.array(ra)
    print(f"nc={nc:2d} {regime:8s}: Aqk rel RMS {np.sqrt(np.mean(ea**2))/np.sqrt(np.mean(ra**2)):.2e} (vs bf16(ref)), L max rel {worst_l:.2e}")
for nc, regime in [(64, 'strong'), (64, 'trained'), (37, 'strong'), (1, 'long'), (17, 'trained')]:
    run(nc, regime)
