// The intra-chunk stage of the delta-rule forwards (conformance/spec/ops-delta-rule.md sections 6.4-6.5,
// 7.4, 8.5) and the output of the staged forward.
//
// intra: one CTA per (chunk, value head). With G the chunk-local cumulative gate in log2 units
// (read, or computed here from per-step gates: the natural-log decay, or the raw input of the
// KDA gate of gate.cuh), q, k optionally L2-normalised (rounded to the input dtype, as FLA
// stores them), beta optionally through a sigmoid (times 2 with allow_neg_eigval):
//
//   Aqk[r, j] = scale Σ_d q_rd k_jd exp2(G_rd - G_jd)          j <= r
//   L[r, j]   = β_r   Σ_d k_rd k_jd exp2(G_rd - G_jd)           j <  r
//   Akk       = (I + L)^-1                                       (unit lower triangular)
//   w_r = Σ_{j<=r} Akk[r, j] β_j k_j . exp2(G_j),   u_r = Σ_{j<=r} Akk[r, j] β_j v_j
//   kg_r = k_r . exp2(G_l - G_r) (or k_r),  qg_r = qg_scale q_r . exp2(G_r),  lam = exp2(G_l)
//
// A scalar gate (GDN) is the same with G broadcast over d. Rows r >= n_c are absent: every
// factor of theirs is selected to 0 (never 0 * exp2(.)), and they are not stored.
// `exp2(G_r - G_j)` is only formed for j <= r, where it is <= 1 for non-positive gates.
//
// intra_fma<T, Acc>: every product with FMAs in Acc (fp32 for half and fp32 data, fp64 for
// fp64 data), over key tiles of INTRA_KT columns recomputed from the inputs in each pass. The
// solve: the four diagonal 16 x 16 blocks by forward substitution, then the off-diagonal blocks
// X_ij = -X_ii Σ_{m=j}^{i-1} L_im X_mj by distance.

#define INTRA_THREADS 256
#define INTRA_BT 64
#define INTRA_KT 32
#define INTRA_P (INTRA_KT + 1)
#define RCP_LN2_D 1.4426950408889634

struct IntraArgs {
    u64 q, k, v, g, beta;  // inputs: q, k [rows][H][K], v [rows][HV][V], g (gate_mode), beta [rows][HV]
    GateArgs gate;         // the in-kernel gate (gate_mode 2)
    u64 chunks;            // i64 [NC][3]: first packed token row, rows n_c, global chunk index
    u64 w, u, kg, qg, aqk, akk, lam, gout;  // outputs (0: not written)
    i64 H, HV, K, V, bt;
    i64 g_dtype, beta_dtype;
    i64 gate_mode;    // 0: g is G; 1: g is the per-step natural-log gate; 2: g is the KDA gate input
    i64 scalar_gate;  // g (and gout) are [rows][HV] instead of [rows][HV][K]
    i64 l2norm;       // normalise q and k
    i64 beta_mode;    // 0: beta as given; 1: sigmoid(beta); 2: 2 sigmoid(beta)
    i64 kg_gated;     // kg = k . exp2(G_l - G_r) (1) or k (0)
    double scale;     // of Aqk
    double qg_scale;  // of qg
};

template <typename Acc> __device__ __forceinline__ Acc exp2_acc(Acc x);
template <> __device__ __forceinline__ float exp2_acc(float x) { return exp2f(x); }
template <> __device__ __forceinline__ double exp2_acc(double x) { return exp2(x); }

// x rounded to T and widened back (the rounding points of FLA's stored intermediates).
template <typename T, typename Acc> __device__ __forceinline__ Acc rnd(Acc x) {
    return (Acc)widen(Narrow<T>::from(x));
}

template <typename Acc> struct IntraSmem {
    Acc q[INTRA_BT][INTRA_P];   // normalised q of the key tile
    Acc k[INTRA_BT][INTRA_P];   // normalised k of the key tile
    Acc G[INTRA_BT][INTRA_P];   // cumulative gate of the key tile (log2 units)
    Acc x[INTRA_BT][INTRA_P];   // product operand of pass 2 / 3
    Acc L[INTRA_BT][INTRA_BT + 1];    // L, then (I + L)^-1
    Acc A[INTRA_BT][INTRA_BT + 1];    // Aqk
    Acc X[INTRA_BT][INTRA_BT + 1];    // Akk = (I + L)^-1
    Acc tmp[48][17];                  // Σ_m L_im X_mj of the off-diagonal blocks of one distance
    Acc invq[INTRA_BT], invk[INTRA_BT], beta[INTRA_BT], gs[INTRA_BT];
};

// One intra call's geometry for this CTA.
struct IntraChunk {
    i64 row0;  // first packed token row
    int nc;    // valid rows
    i64 cidx;  // global chunk index
    i64 hv, kh;
};

// Loads key tile [k0, k0 + INTRA_KT) of q, k (normalised, rounded to T) and the cumulative gate
// G into shared memory; columns >= K and rows >= n_c are 0 (G of such rows: G of row n_c - 1 is
// never used with them).
template <typename T, typename Acc, int FORM>
__device__ void intra_load_tile(const IntraArgs& a, IntraSmem<Acc>& sm, const IntraChunk& c, int k0) {
    const int tid = threadIdx.x;
    const T* qp = reinterpret_cast<const T*>(a.q);
    const T* kp = reinterpret_cast<const T*>(a.k);
    for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
        const int r = i / INTRA_KT, d = i % INTRA_KT;
        const bool ok = r < c.nc && k0 + d < a.K;
        const i64 off = ((c.row0 + r) * a.H + c.kh) * a.K + k0 + d;
        sm.q[r][d] = ok ? rnd<T, Acc>((Acc)widen(qp[off]) * sm.invq[r]) : Acc(0);
        sm.k[r][d] = ok ? rnd<T, Acc>((Acc)widen(kp[off]) * sm.invk[r]) : Acc(0);
    }
    if (a.scalar_gate) {
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            sm.G[r][d] = sm.gs[r];
        }
    } else {
        // the per-row gate values, then one thread per column sums its rows in order
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            Acc x[1] = {Acc(0)};
            if (r < c.nc && k0 + d < a.K) {
                x[0] = load_f<Acc>(reinterpret_cast<const void*>(a.g), a.g_dtype, ((c.row0 + r) * a.HV + c.hv) * a.K + k0 + d);
                if (a.gate_mode == 2) {
                    Gate<Acc, 1, FORM> gate;
                    gate.init(a.gate, c.hv * a.K + k0 + d);
                    gate.apply(x);
                }
            }
            sm.G[r][d] = x[0];
        }
        if (a.gate_mode != 0) {
            __syncthreads();
            for (int d = tid; d < INTRA_KT; d += INTRA_THREADS) {
                Acc run = Acc(0);
                for (int r = 0; r < INTRA_BT; ++r) {
                    run += sm.G[r][d];
                    sm.G[r][d] = run * (Acc)RCP_LN2_D;
                }
            }
        }
    }
    __syncthreads();
}

// Scalar gate: G of every row into sm.gs (one warp; rows in order).
template <typename Acc>
__device__ void intra_scalar_gate(const IntraArgs& a, IntraSmem<Acc>& sm, const IntraChunk& c) {
    const int tid = threadIdx.x;
    if (tid < INTRA_BT) {
        sm.gs[tid] = tid < c.nc ? load_f<Acc>(reinterpret_cast<const void*>(a.g), a.g_dtype, (c.row0 + tid) * a.HV + c.hv) : Acc(0);
    }
    __syncthreads();
    if (tid == 0 && a.gate_mode != 0) {
        Acc run = Acc(0);
        for (int r = 0; r < INTRA_BT; ++r) {
            run += sm.gs[r];
            sm.gs[r] = run * (Acc)RCP_LN2_D;
        }
    }
}

// Per row: 1 / sqrt(Σ q² + 1e-6) (1 without l2norm), the same for k, and β.
template <typename T, typename Acc>
__device__ void intra_rows(const IntraArgs& a, IntraSmem<Acc>& sm, const IntraChunk& c) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const T* qp = reinterpret_cast<const T*>(a.q);
    const T* kp = reinterpret_cast<const T*>(a.k);
    for (int r = warp; r < INTRA_BT; r += INTRA_THREADS / 32) {
        Acc sq = Acc(0), sk = Acc(0);
        if (a.l2norm && r < c.nc) {
            const i64 base = ((c.row0 + r) * a.H + c.kh) * a.K;
            for (i64 d = lane; d < a.K; d += 32) {
                const Acc x = (Acc)widen(qp[base + d]), y = (Acc)widen(kp[base + d]);
                sq = fma(x, x, sq);
                sk = fma(y, y, sk);
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
        }
        if (lane == 0) {
            sm.invq[r] = a.l2norm ? Acc(1) / sqrt(sq + Acc(1e-6)) : Acc(1);
            sm.invk[r] = a.l2norm ? Acc(1) / sqrt(sk + Acc(1e-6)) : Acc(1);
            Acc b = Acc(0);
            if (r < c.nc) {
                b = load_f<Acc>(reinterpret_cast<const void*>(a.beta), a.beta_dtype, (c.row0 + r) * a.HV + c.hv);
                if (a.beta_mode != 0) b = Acc(a.beta_mode) / (Acc(1) + exp(-b));
            }
            sm.beta[r] = b;
        }
    }
}

// Akk = (I + L)^-1 of the strictly lower L in sm.L, into sm.X (every element written).
template <typename Acc>
__device__ void intra_solve(IntraSmem<Acc>& sm) {
    const int tid = threadIdx.x;
    for (int i = tid; i < INTRA_BT * INTRA_BT; i += INTRA_THREADS) sm.X[i / INTRA_BT][i % INTRA_BT] = Acc(0);
    __syncthreads();
    if (tid < INTRA_BT) {  // column tid of its diagonal block, by forward substitution
        const int c = tid, end = (c / 16) * 16 + 16;
        sm.X[c][c] = Acc(1);
        for (int r = c + 1; r < end; ++r) {
            Acc s = Acc(0);
            for (int j = c; j < r; ++j) s = fma(sm.L[r][j], sm.X[j][c], s);
            sm.X[r][c] = -s;
        }
    }
    __syncthreads();
    for (int dist = 1; dist < 4; ++dist) {
        const int nblk = 4 - dist;
        for (int e = tid; e < nblk * 256; e += INTRA_THREADS) {
            const int bi = dist + e / 256, bj = bi - dist, rr = (e % 256) / 16, cc = e % 16;
            Acc s = Acc(0);
            for (int m = 16 * bj; m < 16 * bi; ++m) s = fma(sm.L[16 * bi + rr][m], sm.X[m][16 * bj + cc], s);
            sm.tmp[16 * (e / 256) + rr][cc] = s;
        }
        __syncthreads();
        for (int e = tid; e < nblk * 256; e += INTRA_THREADS) {
            const int bi = dist + e / 256, bj = bi - dist, rr = (e % 256) / 16, cc = e % 16;
            Acc s = Acc(0);
            for (int m = 0; m <= rr; ++m) s = fma(sm.X[16 * bi + rr][16 * bi + m], sm.tmp[16 * (e / 256) + m][cc], s);
            sm.X[16 * bi + rr][16 * bj + cc] = -s;
        }
        __syncthreads();
    }
}

template <typename T, typename Acc, int FORM>
__device__ void intra_fma(const IntraArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    IntraSmem<Acc>& sm = *reinterpret_cast<IntraSmem<Acc>*>(smem_raw);
    const int tid = threadIdx.x;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + blockIdx.x * 3;
    IntraChunk c;
    c.row0 = ch[0];
    c.nc = (int)ch[1];
    c.cidx = ch[2];
    c.hv = blockIdx.y;
    c.kh = c.hv / (a.HV / a.H);
    const int bt = (int)a.bt;

    intra_rows<T, Acc>(a, sm, c);
    if (a.scalar_gate) intra_scalar_gate<Acc>(a, sm, c);
    __syncthreads();

    // pass 1: the pair sums of L and Aqk over the key tiles; thread pairs (r, j) = p / 64, p % 64
    constexpr int PP = INTRA_BT * INTRA_BT / INTRA_THREADS;
    Acc accl[PP], acca[PP];
#pragma unroll
    for (int i = 0; i < PP; ++i) accl[i] = acca[i] = Acc(0);
    for (int k0 = 0; k0 < a.K; k0 += INTRA_KT) {
        intra_load_tile<T, Acc, FORM>(a, sm, c, k0);
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            const int p = tid + i * INTRA_THREADS, r = p / INTRA_BT, j = p % INTRA_BT;
            if (j <= r && r < c.nc) {
                Acc sl = Acc(0), sa = Acc(0);
                for (int d = 0; d < INTRA_KT; ++d) {
                    const Acc t = sm.k[j][d] * exp2_acc<Acc>(sm.G[r][d] - sm.G[j][d]);
                    sl = fma(sm.k[r][d], t, sl);
                    sa = fma(sm.q[r][d], t, sa);
                }
                accl[i] += sl;
                acca[i] += sa;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < PP; ++i) {
        const int p = tid + i * INTRA_THREADS, r = p / INTRA_BT, j = p % INTRA_BT;
        const bool in = r < c.nc;
        sm.L[r][j] = (in && j < r) ? sm.beta[r] * accl[i] : Acc(0);
        sm.A[r][j] = (in && j <= r) ? (Acc)a.scale * acca[i] : Acc(0);
    }
    __syncthreads();
    intra_solve<Acc>(sm);

    // Aqk and Akk rows (every column of the chunk width written; 0 above the diagonal)
    for (int i = tid; i < c.nc * bt; i += INTRA_THREADS) {
        const int r = i / bt, j = i % bt;
        const i64 o = ((c.row0 + r) * a.HV + c.hv) * a.bt + j;
        if (a.aqk != 0) reinterpret_cast<T*>(a.aqk)[o] = Narrow<T>::from(sm.A[r][j]);
        if (a.akk != 0) reinterpret_cast<T*>(a.akk)[o] = Narrow<T>::from(j <= r ? sm.X[r][j] : Acc(0));
    }

    // pass 2, per key tile: w, kg, qg, gout, lam
    const int l = c.nc - 1;
    for (int k0 = 0; k0 < a.K; k0 += INTRA_KT) {
        intra_load_tile<T, Acc, FORM>(a, sm, c, k0);
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            sm.x[r][d] = r < c.nc ? rnd<T, Acc>(sm.beta[r] * sm.k[r][d] * exp2_acc<Acc>(sm.G[r][d])) : Acc(0);
        }
        __syncthreads();
        for (int i = tid; i < c.nc * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            if (k0 + d >= a.K) continue;
            const i64 o = ((c.row0 + r) * a.HV + c.hv) * a.K + k0 + d;
            if (a.w != 0) {
                Acc s = Acc(0);
                for (int j = 0; j <= r; ++j) s = fma(rnd<T, Acc>(sm.X[r][j]), sm.x[j][d], s);
                reinterpret_cast<T*>(a.w)[o] = Narrow<T>::from(s);
            }
            if (a.kg != 0) {
                const Acc f = a.kg_gated ? exp2_acc<Acc>(sm.G[l][d] - sm.G[r][d]) : Acc(1);
                reinterpret_cast<T*>(a.kg)[o] = Narrow<T>::from(sm.k[r][d] * f);
            }
            if (a.qg != 0) {
                reinterpret_cast<T*>(a.qg)[o] = Narrow<T>::from((Acc)a.qg_scale * (sm.q[r][d] * exp2_acc<Acc>(sm.G[r][d])));
            }
            if (a.gout != 0) {
                if (!a.scalar_gate) reinterpret_cast<Acc*>(a.gout)[o] = sm.G[r][d];
                else if (k0 + d == 0) reinterpret_cast<Acc*>(a.gout)[(c.row0 + r) * a.HV + c.hv] = sm.G[r][0];
            }
        }
        if (a.lam != 0) {
            for (int d = tid; d < INTRA_KT; d += INTRA_THREADS) {
                if (k0 + d < a.K) reinterpret_cast<float*>(a.lam)[(c.cidx * a.HV + c.hv) * a.K + k0 + d] = (float)exp2_acc<Acc>(sm.G[l][d]);
            }
        }
        __syncthreads();
    }

    // pass 3, per value tile: u
    if (a.u != 0) {
        const T* vp = reinterpret_cast<const T*>(a.v);
        for (int v0 = 0; v0 < a.V; v0 += INTRA_KT) {
            for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
                const int r = i / INTRA_KT, e = i % INTRA_KT;
                const bool ok = r < c.nc && v0 + e < a.V;
                sm.x[r][e] = ok ? rnd<T, Acc>(sm.beta[r] * (Acc)widen(vp[((c.row0 + r) * a.HV + c.hv) * a.V + v0 + e])) : Acc(0);
            }
            __syncthreads();
            for (int i = tid; i < c.nc * INTRA_KT; i += INTRA_THREADS) {
                const int r = i / INTRA_KT, e = i % INTRA_KT;
                if (v0 + e >= a.V) continue;
                Acc s = Acc(0);
                for (int j = 0; j <= r; ++j) s = fma(rnd<T, Acc>(sm.X[r][j]), sm.x[j][e], s);
                reinterpret_cast<T*>(a.u)[((c.row0 + r) * a.HV + c.hv) * a.V + v0 + e] = Narrow<T>::from(s);
            }
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The output of the staged forward (`conformance/spec/ops-delta-rule.md` §6.5 step 5, 8.5 step 4), one CTA per (chunk, value
// head, block of OUT_BV value columns):
//   o_r = Σ_d qg_rd h[c]_d,: + Σ_{j<=r} Aqk[r, j] v_new_j          (qg carries the scale)
// qg, h, Aqk and v_new in their stored dtype T, products in Acc.

#define OUT_BV 32

struct OutArgs {
    u64 qg, h, aqk, v_new, o;
    u64 chunks;  // as IntraArgs::chunks
    i64 HV, K, V, bt;
    i64 v_first;  // h holds S^T
};

template <typename Acc> struct OutSmem {
    Acc a[INTRA_BT][INTRA_P];      // qg tile / Aqk tile
    Acc b[INTRA_KT][OUT_BV + 1];   // h tile / v_new tile
};

template <typename T, typename Acc>
__device__ void delta_output(const OutArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    OutSmem<Acc>& sm = *reinterpret_cast<OutSmem<Acc>*>(smem_raw);
    const int tid = threadIdx.x, col = tid % OUT_BV, rg = tid / OUT_BV;
    constexpr int RSTEP = INTRA_THREADS / OUT_BV;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + blockIdx.x * 3;
    const i64 row0 = ch[0], cidx = ch[2];
    const int nc = (int)ch[1];
    const i64 hv = blockIdx.y, c0 = (i64)blockIdx.z * OUT_BV;
    const T* qg = reinterpret_cast<const T*>(a.qg);
    const T* h = reinterpret_cast<const T*>(a.h) + (cidx * a.HV + hv) * a.K * a.V;
    const T* aq = reinterpret_cast<const T*>(a.aqk);
    const T* vn = reinterpret_cast<const T*>(a.v_new);
    Acc acc[INTRA_BT / RSTEP];
#pragma unroll
    for (int i = 0; i < INTRA_BT / RSTEP; ++i) acc[i] = Acc(0);
    auto step = [&](int kn) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < INTRA_BT / RSTEP; ++i) {
            const int r = rg + i * RSTEP;
            for (int d = 0; d < kn; ++d) acc[i] = fma(sm.a[r][d], sm.b[d][col], acc[i]);
        }
        __syncthreads();
    };
    for (i64 k0 = 0; k0 < a.K; k0 += INTRA_KT) {
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            sm.a[r][d] = (r < nc && k0 + d < a.K) ? (Acc)widen(qg[((row0 + r) * a.HV + hv) * a.K + k0 + d]) : Acc(0);
        }
        for (int i = tid; i < INTRA_KT * OUT_BV; i += INTRA_THREADS) {
            const int d = i / OUT_BV, e = i % OUT_BV;
            const i64 kk = k0 + d, cc = c0 + e;
            sm.b[d][e] = (kk < a.K && cc < a.V) ? (Acc)widen(h[a.v_first ? cc * a.K + kk : kk * a.V + cc]) : Acc(0);
        }
        step(INTRA_KT);
    }
    for (int j0 = 0; j0 < nc; j0 += INTRA_KT) {
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, j = i % INTRA_KT;
            sm.a[r][j] = (r < nc && j0 + j <= r) ? (Acc)widen(aq[((row0 + r) * a.HV + hv) * a.bt + j0 + j]) : Acc(0);
        }
        for (int i = tid; i < INTRA_KT * OUT_BV; i += INTRA_THREADS) {
            const int j = i / OUT_BV, e = i % OUT_BV;
            const i64 cc = c0 + e;
            sm.b[j][e] = (j0 + j < nc && cc < a.V) ? (Acc)widen(vn[((row0 + j0 + j) * a.HV + hv) * a.V + cc]) : Acc(0);
        }
        step(INTRA_KT);
    }
    if (c0 + col < a.V) {
#pragma unroll
        for (int i = 0; i < INTRA_BT / RSTEP; ++i) {
            const int r = rg + i * RSTEP;
            if (r < nc) reinterpret_cast<T*>(a.o)[((row0 + r) * a.HV + hv) * a.V + c0 + col] = Narrow<T>::from(acc[i]);
        }
    }
}

#define INTRA_KERNELS(T, ACC, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) kda_intra_fma_##TAG(const IntraArgs a) { \
        GATE_DISPATCH(a, (intra_fma<T, ACC, FORM>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) delta_output_fma_##TAG(const OutArgs a) { \
        delta_output<T, ACC>(a); \
    }

INTRA_KERNELS(float, float, f32)
INTRA_KERNELS(double, double, f64)
INTRA_KERNELS(bf16, float, bf16)
INTRA_KERNELS(f16, float, f16)
