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
//   kg_r = k_r . exp2(G_l - G_r) (or k_r),  lam = exp2(G_l),
//   qg_r = q_r . exp2(G_r) and qf_r = scale (per-key gate), qg_r = q_r and qf_r = scale exp2(G_r)
//   (scalar gate: the factor stays in fp32, as FLA's GDN output applies it), o_r = qf_r qg_r S + ...
//
// A scalar gate (GDN) is the same with G broadcast over d. Rows r >= n_c are absent: every
// factor of theirs is selected to 0 (never 0 * exp2(.)), and they are not stored.
// `exp2(G_r - G_j)` is only formed for j <= r, where it is <= 1 for non-positive gates.
//
// intra_mma<T> (bf16 / f16): the products on tensor cores (see its section below). Its FAST
// instances (kernels kda_intra_mma_fast_*: K and V multiples of 8, fp32 g;
// kda_intra_mma_scalar_fast_*: a scalar gate, K and V multiples of 8) drop the code of the other
// layouts: the kernel runs once per CTA as a straight line of ~7.6k instructions, and the cold
// code between them was three quarters of the program (S9: no_inst 31% of its stalls).
// gdn_intra<T, KP> (bf16 / f16, scalar gate, K <= 128): the lean stage of the fused GDN path.
// intra_fma<T, Acc> (fp32 / fp64 data): every product with FMAs in Acc (IEEE fp32, or fp64), over key tiles of INTRA_KT columns recomputed from the inputs in each pass. The
// solve: the four diagonal 16 x 16 blocks by forward substitution, then the off-diagonal blocks
// X_ij = -X_ii Σ_{m=j}^{i-1} L_im X_mj by distance.

#define INTRA_KT 32
#define INTRA_P (INTRA_KT + 1)
#define RCP_LN2_D 1.4426950408889634

// IntraArgs, INTRA_THREADS, INTRA_BT and the tensor-core solve intra_solve_tc: intra_args.cuh,
// intra_solve.cuh (shared with kda_intra_pipe.cu).

template <typename Acc> __device__ __forceinline__ Acc exp2_acc(Acc x);
template <> __device__ __forceinline__ float exp2_acc(float x) { return exp2f(x); }
template <> __device__ __forceinline__ double exp2_acc(double x) { return exp2(x); }

// Stores the N elements of v at p in pieces of at most 16 bytes (p aligned to them). Each piece
// is assembled element by element: reading v through a cast pointer would put it in local memory
// (S9: the stores of the intra kernels went through a 32-byte stack frame).
template <typename T, int N>
__device__ __forceinline__ void store_pieces(T* p, const Vec<T, N>& v) {
    constexpr int P = N < Piece<T>::N ? N : Piece<T>::N;
#pragma unroll
    for (int k = 0; k < N; k += P) {
        Vec<T, P> q;
#pragma unroll
        for (int j = 0; j < P; ++j) q.v[j] = v.v[k + j];
        *reinterpret_cast<Vec<T, P>*>(p + k) = q;
    }
}

// Stores the first n of the N elements of v at p: in whole pieces when `aligned` (p aligned
// to them and n == N), else one by one.
template <typename T, int N>
__device__ __forceinline__ void store_some(T* p, const Vec<T, N>& v, bool aligned, int n) {
    if (aligned && n == N) {
        store_pieces<T, N>(p, v);
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (e < n) p[e] = v.v[e];  // unrolled: a runtime bound would index v in local memory
    }
}

// 2^x as a kernel for T data computes it: the multi-function unit's approximation for half
// data (relative error ~1e-7, far inside the half thresholds; results below 2^-126 flushed),
// the accurate library functions for fp32 / fp64 data.
template <typename T, typename Acc> struct Ex2 {
    __device__ __forceinline__ static Acc of(Acc x) { return exp2_acc<Acc>(x); }
};
template <> struct Ex2<bf16, float> {
    __device__ __forceinline__ static float of(float x) { return ex2_ftz(x); }
};
template <> struct Ex2<f16, float> {
    __device__ __forceinline__ static float of(float x) { return ex2_ftz(x); }
};

// x rounded to T and widened back (the rounding points of FLA's stored intermediates).
template <typename T, typename Acc> __device__ __forceinline__ Acc rnd(Acc x) {
    return (Acc)widen(Narrow<T>::from(x));
}

// The cumulative gate is held in fp64 by the FMA kernels, so that exp2(G_r - G_j) of two large
// cumulative gates (hard forget: -1000 per step) keeps fp32 accuracy; the tensor-core kernel
// holds it in fp32 (its products round to T anyway).
template <typename Acc> struct IntraSmem {
    Acc q[INTRA_BT][INTRA_P];   // normalised q of the key tile
    Acc k[INTRA_BT][INTRA_P];   // normalised k of the key tile
    double G[INTRA_BT][INTRA_P];  // cumulative gate of the key tile (log2 units)
    Acc x[INTRA_BT][INTRA_P];   // product operand of pass 2 / 3
    Acc L[INTRA_BT][INTRA_BT + 1];    // L, then (I + L)^-1
    Acc A[INTRA_BT][INTRA_BT + 1];    // Aqk
    Acc X[INTRA_BT][INTRA_BT + 1];    // Akk = (I + L)^-1
    Acc tmp[48][17];                  // Σ_m L_im X_mj of the off-diagonal blocks of one distance
    Acc invq[INTRA_BT], invk[INTRA_BT], beta[INTRA_BT];
    double gs[INTRA_BT];
};

// One intra call's geometry for this CTA.
struct IntraChunk {
    i64 row0;  // first packed token row
    int nc;    // valid rows
    i64 cidx;  // global chunk index
    i64 hv, kh;
};

// An element of a q / k tile: the value rounded to T, held as E (T itself in the tensor-core
// kernel, the accumulator type in the FMA kernel).
template <typename E, typename T, typename Acc> struct Elem {
    __device__ __forceinline__ static E from(Acc v) { return (E)rnd<T, Acc>(v); }
};
template <typename T> struct Elem<T, T, float> {
    __device__ __forceinline__ static T from(float v) { return Narrow<T>::from(v); }
};

// Loads key tile [k0, k0 + KW) of q, k (normalised, rounded to T, stored as E) and the
// cumulative gate G (GT) into shared memory; columns >= K and rows >= n_c are 0 (G of such rows
// is G of row n_c - 1, or 0 for a read G, and never used with valid rows). Every thread first
// loads its 16-byte pieces (all in flight at once), then converts and stores them. The gate's
// running sum: each of INTRA_THREADS / KW row segments per column summed in order, then the
// totals of the segments before it added.
template <typename T, typename E, int FORM, int KW, int P, typename GT, typename Acc, int GP, bool FAST = false>
__device__ void intra_load_tile(const IntraArgs& a, const IntraChunk& c, int k0, E (*q)[P], E (*k)[P], GT (*G)[GP],
                                const Acc* invq, const Acc* invk, const GT* gs) {
    const int tid = threadIdx.x;
    const T* qp = reinterpret_cast<const T*>(a.q);
    const T* kp = reinterpret_cast<const T*>(a.k);
    constexpr int N = VMax<T>::N, VPR = KW / N, NV = INTRA_BT * VPR / INTRA_THREADS;
    if (FAST || a.K % N == 0) {
        Vec<T, N> vq[NV], vk[NV];
#pragma unroll
        for (int u = 0; u < NV; ++u) {
            const int i = tid + u * INTRA_THREADS, r = i / VPR, d0 = (i % VPR) * N;
            const bool ok = r < c.nc && k0 + d0 < a.K;
            const i64 off = ok ? ((c.row0 + r) * a.H + c.kh) * a.K + k0 + d0 : 0;
            vq[u] = ok ? *reinterpret_cast<const Vec<T, N>*>(qp + off) : Vec<T, N>{};
            vk[u] = ok ? *reinterpret_cast<const Vec<T, N>*>(kp + off) : Vec<T, N>{};
        }
#pragma unroll
        for (int u = 0; u < NV; ++u) {
            const int i = tid + u * INTRA_THREADS, r = i / VPR, d0 = (i % VPR) * N;
#pragma unroll
            for (int e = 0; e < N; ++e) {
                q[r][d0 + e] = Elem<E, T, Acc>::from((Acc)widen(vq[u].v[e]) * invq[r]);
                k[r][d0 + e] = Elem<E, T, Acc>::from((Acc)widen(vk[u].v[e]) * invk[r]);
            }
        }
    } else {
        for (int i = tid; i < INTRA_BT * KW; i += INTRA_THREADS) {
            const int r = i / KW, d = i % KW;
            const bool ok = r < c.nc && k0 + d < a.K;
            const i64 off = ((c.row0 + r) * a.H + c.kh) * a.K + k0 + d;
            q[r][d] = Elem<E, T, Acc>::from(ok ? (Acc)widen(qp[off]) * invq[r] : Acc(0));
            k[r][d] = Elem<E, T, Acc>::from(ok ? (Acc)widen(kp[off]) * invk[r] : Acc(0));
        }
    }
    if (a.scalar_gate) {
        for (int i = tid; i < INTRA_BT * KW; i += INTRA_THREADS) G[i / KW][i % KW] = gs[i / KW];
        __syncthreads();
        return;
    }
    // the per-row gate values: this thread's 4 columns (the same for all its rows)
    constexpr int GPR = KW / 4, GV = INTRA_BT * GPR / INTRA_THREADS;
    const int gd0 = (tid % GPR) * 4;
    const bool quads = FAST || a.K % 4 == 0, in_k = k0 + gd0 < a.K;  // whole 4-column groups
    Gate<GT, 4, FORM> gate;
    if (a.gate_mode == 2 && quads && in_k) gate.init(a.gate, c.hv * a.K + k0 + gd0);
    const bool gvec = FAST || (a.g_dtype == 1 && quads);
    GT gv[GV][4];
#pragma unroll
    for (int u = 0; u < GV; ++u) {
        const int r = (tid + u * INTRA_THREADS) / GPR;
        const i64 base = ((c.row0 + r) * a.HV + c.hv) * a.K + k0 + gd0;
        if (gvec) {
            const bool ok = r < c.nc && k0 + gd0 < a.K;
            const Vec<float, 4> x = ok ? *reinterpret_cast<const Vec<float, 4>*>(reinterpret_cast<const float*>(a.g) + base) : Vec<float, 4>{};
#pragma unroll
            for (int e = 0; e < 4; ++e) gv[u][e] = (GT)x.v[e];
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = r < c.nc && k0 + gd0 + e < a.K;
                gv[u][e] = ok ? load_f<GT>(reinterpret_cast<const void*>(a.g), a.g_dtype, base + e) : GT(0);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < GV; ++u) {
        const int r = (tid + u * INTRA_THREADS) / GPR;
        if (a.gate_mode == 2) {
            // the in-kernel gate (its constants belong to columns gd0 .. gd0 + 3, which exist
            // when K % 4 == 0; otherwise column by column)
            if (quads) {
                if (in_k) gate.apply(gv[u]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (k0 + gd0 + e < a.K) {
                        Gate<GT, 1, FORM> g1;
                        g1.init(a.gate, c.hv * a.K + k0 + gd0 + e);
                        GT x1[1] = {gv[u][e]};
                        g1.apply(x1);
                        gv[u][e] = x1[0];
                    }
                }
            }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool ok = r < c.nc && k0 + gd0 + e < a.K;
            G[r][gd0 + e] = ok ? gv[u][e] : GT(0);
        }
    }
    __syncthreads();
    if (a.gate_mode != 0) {
        constexpr int SEGS = INTRA_THREADS / KW, SR = INTRA_BT / SEGS;
        const int d = tid % KW, seg = tid / KW;
        GT run = GT(0);
#pragma unroll
        for (int r = seg * SR; r < seg * SR + SR; ++r) {
            run += G[r][d];
            G[r][d] = run;
        }
        __syncthreads();
        GT off = GT(0);
        for (int s = 0; s < seg; ++s) off += G[s * SR + SR - 1][d];
        __syncthreads();
#pragma unroll
        for (int r = seg * SR; r < seg * SR + SR; ++r) G[r][d] = (G[r][d] + off) * (GT)RCP_LN2_D;
    }
    __syncthreads();
}

// Scalar gate: G of every row into sm.gs (two warps: a scan of 32 rows each, the first warp's
// total added to the second's).
template <typename Acc, typename Sm>
__device__ void intra_scalar_gate(const IntraArgs& a, Sm& sm, const IntraChunk& c) {
    typedef decltype(+sm.gs[0]) GT;
    const int tid = threadIdx.x, lane = tid & 31;
    GT x = GT(0);
    if (tid < INTRA_BT) {
        x = tid < c.nc ? load_f<GT>(reinterpret_cast<const void*>(a.g), a.g_dtype, (c.row0 + tid) * a.HV + c.hv) : GT(0);
        if (a.gate_mode != 0) x = warp_incl_scan(x, lane);
        sm.gs[tid] = x;
    }
    __syncthreads();
    const GT first = sm.gs[31];  // the first warp's total
    __syncthreads();
    if (a.gate_mode != 0 && tid < INTRA_BT) sm.gs[tid] = (tid >= 32 ? x + first : x) * (GT)RCP_LN2_D;
}

// Per row: 1 / sqrt(Σ q² + 1e-6) (1 without l2norm), the same for k, and β. The sums: 4 lanes
// per row, each over a quarter of the keys in 16-byte pieces where K allows (all loads of a
// thread in flight at once), then over the 4 lanes.
template <typename T, typename Acc, typename Sm, bool FAST = false>
__device__ void intra_rows(const IntraArgs& a, Sm& sm, const IntraChunk& c) {
    const int tid = threadIdx.x, r = tid >> 2, part = tid & 3;
    const T* qp = reinterpret_cast<const T*>(a.q);
    const T* kp = reinterpret_cast<const T*>(a.k);
    Acc sq = Acc(0), sk = Acc(0);
    if (a.l2norm && r < c.nc) {
        const i64 base = ((c.row0 + r) * a.H + c.kh) * a.K;
        constexpr int N = VMax<T>::N, MAXV = 256 / N / 4, B = 4;  // pieces per lane for K <= 256, per batch
        if (FAST || a.K % N == 0) {
            const int nv = (int)(a.K / N);
#pragma unroll
            for (int u0 = 0; u0 < MAXV; u0 += B) {
                if (4 * u0 >= nv) break;  // a batch past K (K 128: the second) adds only 0 x 0
                Vec<T, N> vq[B], vk[B];
#pragma unroll
                for (int u = 0; u < B; ++u) {
                    const int v = part + 4 * (u0 + u);
                    vq[u] = v < nv ? *reinterpret_cast<const Vec<T, N>*>(qp + base + v * N) : Vec<T, N>{};
                    vk[u] = v < nv ? *reinterpret_cast<const Vec<T, N>*>(kp + base + v * N) : Vec<T, N>{};
                }
#pragma unroll
                for (int u = 0; u < B; ++u)
#pragma unroll
                    for (int e = 0; e < N; ++e) {
                        const Acc x = (Acc)widen(vq[u].v[e]), y = (Acc)widen(vk[u].v[e]);
                        sq = fma(x, x, sq);
                        sk = fma(y, y, sk);
                    }
            }
        } else {
            for (i64 d = part; d < a.K; d += 4) {
                const Acc x = (Acc)widen(qp[base + d]), y = (Acc)widen(kp[base + d]);
                sq = fma(x, x, sq);
                sk = fma(y, y, sk);
            }
        }
    }
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2);
    sk += __shfl_xor_sync(0xffffffffu, sk, 1);
    sk += __shfl_xor_sync(0xffffffffu, sk, 2);
    if (part == 0) {
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

// X = (I + L)^-1 of the strictly lower 64 x 64 L (every element of X written) with FMAs in Acc:
// the diagonal blocks (intra_solve_diag), then the off-diagonal blocks
// X_ij = -X_ii Σ_{m=j}^{i-1} L_im X_mj by distance, 16 terms at a time; tmp holds the sums of
// one distance's blocks.
template <typename Acc>
__device__ void intra_solve(Acc (*L)[INTRA_BT + 1], Acc (*X)[INTRA_BT + 1], Acc (*tmp)[17]) {
    const int tid = threadIdx.x;
    intra_solve_diag<Acc>(L, X);
    for (int dist = 1; dist < 4; ++dist) {
        const int nblk = 4 - dist;
        for (int e = tid; e < nblk * 256; e += INTRA_THREADS) {
            const int bi = dist + e / 256, bj = bi - dist, rr = (e % 256) / 16, cc = e % 16;
            Acc s = Acc(0);
            for (int mb = bj; mb < bi; ++mb) {
#pragma unroll
                for (int q = 0; q < 16; ++q) s = fma(L[16 * bi + rr][16 * mb + q], X[16 * mb + q][16 * bj + cc], s);
            }
            tmp[16 * (e / 256) + rr][cc] = s;
        }
        __syncthreads();
        for (int e = tid; e < nblk * 256; e += INTRA_THREADS) {
            const int bi = dist + e / 256, bj = bi - dist, rr = (e % 256) / 16, cc = e % 16;
            Acc s = Acc(0);
#pragma unroll
            for (int m = 0; m < 16; ++m) s = fma(X[16 * bi + rr][16 * bi + m], tmp[16 * (e / 256) + m][cc], s);
            X[16 * bi + rr][16 * bj + cc] = -s;
        }
        __syncthreads();
    }
}

// This CTA's chunk (grid x: the chunk table's row, grid y: the value head).
__device__ __forceinline__ IntraChunk intra_chunk(const IntraArgs& a) {
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + blockIdx.x * 3;
    IntraChunk c;
    c.row0 = ch[0];
    c.nc = (int)ch[1];
    c.cidx = ch[2];
    c.hv = blockIdx.y;
    c.kh = c.hv / (a.HV / a.H);
    return c;
}

// The Aqk and Akk rows of the chunk from A and X = Akk (every column of the chunk width
// written; 0 above the diagonal), in pieces of 8 columns (bt is 16, 32 or 64).
template <typename T, typename Acc>
__device__ void intra_store_a(const IntraArgs& a, const IntraChunk& c, Acc (*A)[INTRA_BT + 1], Acc (*X)[INTRA_BT + 1]) {
    const int pr = (int)a.bt / 8;  // pieces per row
    for (int i = threadIdx.x; i < c.nc * pr; i += INTRA_THREADS) {
        const int r = i / pr, j0 = (i % pr) * 8;
        const i64 o = ((c.row0 + r) * a.HV + c.hv) * a.bt + j0;
        Vec<T, 8> va, vx;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            va.v[e] = Narrow<T>::from(A[r][j0 + e]);
            vx.v[e] = Narrow<T>::from(j0 + e <= r ? X[r][j0 + e] : Acc(0));
        }
        if (a.aqk != 0) store_pieces<T, 8>(reinterpret_cast<T*>(a.aqk) + o, va);
        if (a.akk != 0) store_pieces<T, 8>(reinterpret_cast<T*>(a.akk) + o, vx);
    }
}

// kg, qg, G and lam of the loaded key tile k0 (KW columns), and qf with the first tile; kg and
// qg in pieces of N columns where K allows.
template <typename T, typename Acc, int KW, int P, typename E, typename GT, int GP, bool FAST = false>
__device__ void intra_store_tile(const IntraArgs& a, const IntraChunk& c, int k0, E (*q)[P], E (*k)[P], GT (*G)[GP]) {
    const int l = c.nc - 1;
    constexpr int N = VMax<T>::N, VPR = KW / N;
    const bool vec = FAST || a.K % N == 0;
    for (int i = threadIdx.x; i < c.nc * VPR; i += INTRA_THREADS) {
        const int r = i / VPR, d0 = (i % VPR) * N;
        if (k0 + d0 >= a.K) continue;
        const i64 o = ((c.row0 + r) * a.HV + c.hv) * a.K + k0 + d0;
        Vec<T, N> vk, vq;
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int d = d0 + e;
            const Acc fk = a.kg_gated ? Ex2<T, Acc>::of((Acc)(G[l][d] - G[r][d])) : Acc(1);
            const Acc fq = a.scalar_gate ? Acc(1) : Ex2<T, Acc>::of((Acc)G[r][d]);
            vk.v[e] = Narrow<T>::from((Acc)widen(k[r][d]) * fk);
            vq.v[e] = Narrow<T>::from((Acc)widen(q[r][d]) * fq);
        }
        const int n = (int)min((i64)N, a.K - k0 - d0);
        if (a.kg != 0) store_some<T, N>(reinterpret_cast<T*>(a.kg) + o, vk, vec, n);
        if (a.qg != 0) store_some<T, N>(reinterpret_cast<T*>(a.qg) + o, vq, vec, n);
        if (a.gout != 0 && !a.scalar_gate) {
            for (int e = 0; e < n; ++e) reinterpret_cast<Acc*>(a.gout)[o + e] = (Acc)G[r][d0 + e];
        }
    }
    if (k0 == 0) {
        for (int r = threadIdx.x; r < c.nc; r += INTRA_THREADS) {
            if (a.gout != 0 && a.scalar_gate) reinterpret_cast<Acc*>(a.gout)[(c.row0 + r) * a.HV + c.hv] = (Acc)G[r][0];
            if (a.qf != 0) {
                const Acc f = a.scalar_gate ? Ex2<T, Acc>::of((Acc)G[r][0]) : Acc(1);
                reinterpret_cast<float*>(a.qf)[(c.row0 + r) * a.HV + c.hv] = (float)((Acc)a.scale * f);
            }
        }
    }
    if (a.lam != 0) {
        for (int d = threadIdx.x; d < KW; d += INTRA_THREADS) {
            if (k0 + d < a.K) reinterpret_cast<float*>(a.lam)[(c.cidx * a.HV + c.hv) * a.K + k0 + d] = (float)Ex2<T, Acc>::of((Acc)G[l][d]);
        }
    }
}

template <typename T, typename Acc, int FORM>
__device__ void intra_fma(const IntraArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    IntraSmem<Acc>& sm = *reinterpret_cast<IntraSmem<Acc>*>(smem_raw);
    const int tid = threadIdx.x;
    const IntraChunk c = intra_chunk(a);
    auto load = [&](int k0) {
        intra_load_tile<T, Acc, FORM, INTRA_KT, INTRA_P>(a, c, k0, sm.q, sm.k, sm.G, sm.invq, sm.invk, sm.gs);
    };

    intra_rows<T, Acc>(a, sm, c);
    if (a.scalar_gate) intra_scalar_gate<Acc>(a, sm, c);
    __syncthreads();

    // pass 1: the pair sums of L and Aqk over the key tiles; thread pairs (r, j) = p / 64, p % 64
    constexpr int PP = INTRA_BT * INTRA_BT / INTRA_THREADS;
    Acc accl[PP], acca[PP];
#pragma unroll
    for (int i = 0; i < PP; ++i) accl[i] = acca[i] = Acc(0);
    for (int k0 = 0; k0 < a.K; k0 += INTRA_KT) {
        load(k0);
#pragma unroll
        for (int i = 0; i < PP; ++i) {
            const int p = tid + i * INTRA_THREADS, r = p / INTRA_BT, j = p % INTRA_BT;
            if (j <= r && r < c.nc) {
                Acc sl = Acc(0), sa = Acc(0);
                for (int d = 0; d < INTRA_KT; ++d) {
                    const Acc t = sm.k[j][d] * exp2_acc<Acc>((Acc)(sm.G[r][d] - sm.G[j][d]));
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
    intra_solve<Acc>(sm.L, sm.X, sm.tmp);
    intra_store_a<T, Acc>(a, c, sm.A, sm.X);

    // pass 2, per key tile: w, kg, qg, gout, lam
    for (int k0 = 0; k0 < a.K; k0 += INTRA_KT) {
        load(k0);
        for (int i = tid; i < INTRA_BT * INTRA_KT; i += INTRA_THREADS) {
            const int r = i / INTRA_KT, d = i % INTRA_KT;
            sm.x[r][d] = r < c.nc ? rnd<T, Acc>(sm.beta[r] * sm.k[r][d] * exp2_acc<Acc>((Acc)sm.G[r][d])) : Acc(0);
        }
        __syncthreads();
        if (a.w != 0) {
            for (int i = tid; i < c.nc * INTRA_KT; i += INTRA_THREADS) {
                const int r = i / INTRA_KT, d = i % INTRA_KT;
                if (k0 + d >= a.K) continue;
                Acc s = Acc(0);
                for (int j = 0; j <= r; ++j) s = fma(rnd<T, Acc>(sm.X[r][j]), sm.x[j][d], s);
                reinterpret_cast<T*>(a.w)[((c.row0 + r) * a.HV + c.hv) * a.K + k0 + d] = Narrow<T>::from(s);
            }
        }
        intra_store_tile<T, Acc, INTRA_KT, INTRA_P>(a, c, k0, sm.q, sm.k, sm.G);
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
// Tensor-core intra kernel (bf16 / f16), key tiles of 64 columns:
//  * off the diagonal 16 x 16 blocks (block rows bi > bj): with m = 16 bi (bj < m <= r),
//      exp2(G_r - G_j) = exp2(G_r - G_m) exp2(G_m - G_j), both factors <= 1,
//    so Aqk and L blocks are products of qe = q . exp2(G_r - G_m), ke = k . exp2(G_r - G_m) and
//    kf_bi = k_j . exp2(G_m - G_j) (mma.sync, fp32 accumulation; warps 0-5, one block pair
//    each). Each factored operand is held as hi + lo in T and the products take hi.hi + hi.lo
//    + lo.hi: about 16 bits of mantissa, above FLA's TF32 for these blocks;
//  * on the diagonal blocks (j <= r in one block b, m = 16 b) with safe_gate (bf16 data): every
//    per-step gate in [-5, 0] nats bounds G_m - G_j (m <= j < m + 16) by 15 . 5 / ln 2 < 109, so
//      exp2(G_r - G_j) = exp2(G_r - C) exp2(C - G_j),  C = G_m,
//    factors stay inside bf16's exponent range: the same products as off the diagonal, of qe, ke
//    and kd_j = k_j . exp2(G_m - G_j) (<= 2^109; warps 6, 7, two blocks each), the pairs j > r
//    (finite, up to 2^109 |q| |k| per key) selected away. The spec's C = G_m - 15 / ln 2 centres
//    the two ranges for fp32 operands; C = G_m keeps qe, ke those of the off-diagonal blocks;
//  * without safe_gate, or with f16 data (whose range 2^-24 .. 2^16 cannot hold kd): FMAs with
//    exp2(G_r - G_j) as the running product of the steps exp2(G_s - G_{s-1}), s = j+1 .. r (each
//    <= 1), one thread per (block, column j, 16 of the 64 keys as 8 pairs), branch-free,
//    reduced over the key groups at the end;
//  * a scalar gate (GDN) needs no factoring: every block is a product of the raw q, k (exact
//    in T), times exp2(G_r - G_j) in fp32 afterwards (as FLA's GDN kernels do);
//  * w = Akk (β k . exp2(G)) and u = Akk (β v) on tensor cores, Akk as hi + lo of T.

#define IM_KT 64
#define IM_P (IM_KT + 8)
#define IM_GP (IM_KT + 4)  // pitch of G: column pairs aligned to 8 bytes

// Pass 1's tiles (with safe_gate, q and k hold kd as hi + lo once the factors are formed); the
// solve reuses their space for L, Aqk, X and tmp, passes 2 and 3 for q, k, the product operand
// (x, over qe) and Akk as hi + lo of T (xa, xl over kf, kfl).
template <typename T> struct IntraMmaP1 {
    T q[INTRA_BT][IM_P], k[INTRA_BT][IM_P];
    T qe[INTRA_BT][IM_P], ke[INTRA_BT][IM_P], qel[INTRA_BT][IM_P], kel[INTRA_BT][IM_P];
    T kf[96][IM_P], kfl[96][IM_P];  // k_j . exp2(G_16i - G_j), i = 1 (rows 0-15), 2 (16-47), 3 (48-95)
};
struct IntraMmaSolve {
    float L[INTRA_BT][INTRA_BT + 1], A[INTRA_BT][INTRA_BT + 1], X[INTRA_BT][INTRA_BT + 1];
    float tmp[48][17];
};
template <typename T> struct IntraMmaSmem {
    union U {
        IntraMmaP1<T> p1;
        IntraMmaSolve sv;
    } u;
    float G[INTRA_BT][IM_GP];  // cumulative gate; then (FMA diagonal) the steps exp2(G_r - G_{r-1}), r % 16 != 0
    float invq[INTRA_BT], invk[INTRA_BT], beta[INTRA_BT], gs[INTRA_BT];
};

// C (64 x 64 lower block rows) = (xa + xl) (Akk as hi + lo of T) . x (64 x 64 operand): warp w owns row tile w / 2
// and column tiles (w % 2) * 4 .. + 3; stores the valid rows / columns (< ncols) of dst (row
// stride ld; column pairs stored as one word when `pair_ok`: dst and ld even).
template <typename T>
__device__ __forceinline__ void intra_akk_product(T (*xa)[IM_P], T (*xl)[IM_P], T (*x)[IM_P], int nc, T* dst, i64 ld, int ncols, bool pair_ok) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t4 = lane & 3;
    const int mt = warp >> 1;
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    for (int js = 0; js <= mt; ++js) {
        unsigned af[4], al[4];
        ldsm_x4(af, smem_u32(&xa[mt * 16 + (lane & 15)][js * 16 + (lane >> 4) * 8]));
        ldsm_x4(al, smem_u32(&xl[mt * 16 + (lane & 15)][js * 16 + (lane >> 4) * 8]));
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int nt = (warp & 1) * 4 + j;
            unsigned bf[2];
            ldsm_x2_t(bf, smem_u32(&x[js * 16 + (lane & 15)][nt * 8]));
            Mma<T>::run(acc[j], af, bf);
            Mma<T>::run(acc[j], al, bf);
        }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int nt = (warp & 1) * 4 + j;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = mt * 16 + gid + h * 8, col = nt * 8 + t4 * 2;
            if (r < nc) store_pair<T>(dst + r * ld + col, col, ncols, pair_ok, acc[j][2 * h], acc[j][2 * h + 1]);
        }
    }
}

// Splits x into hi + lo of T.
template <typename T>
__device__ __forceinline__ void split_store(T& hi, T& lo, float x) {
    hi = Narrow<T>::from(x);
    lo = Narrow<T>::from(x - widen(hi));
}

// Two values of T in one word, one conversion (x0 the low element).
template <typename T> __device__ __forceinline__ unsigned cvt2(float x0, float x1);
template <> __device__ __forceinline__ unsigned cvt2<bf16>(float x0, float x1) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
    return r;
}
template <> __device__ __forceinline__ unsigned cvt2<f16>(float x0, float x1) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));
    return r;
}

// The two elements of a word of T, widened.
__device__ __forceinline__ void widen2(unsigned w, float (&x)[2], bf16) {
    x[0] = __uint_as_float(w << 16);
    x[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void widen2(unsigned w, float (&x)[2], f16) {
    x[0] = widen(f16{(unsigned short)(w & 0xffffu)});
    x[1] = widen(f16{(unsigned short)(w >> 16)});
}
template <typename T> __device__ __forceinline__ void load2(const T* p, float (&x)[2]) {
    widen2(*reinterpret_cast<const unsigned*>(p), x, T{});
}

// Stores the pair x as hi + lo of T at hi, lo.
template <typename T> __device__ __forceinline__ void split_store2(T* hi, T* lo, const float (&x)[2]) {
    const unsigned h = cvt2<T>(x[0], x[1]);
    float w[2];
    widen2(h, w, T{});
    *reinterpret_cast<unsigned*>(hi) = h;
    *reinterpret_cast<unsigned*>(lo) = cvt2<T>(x[0] - w[0], x[1] - w[1]);
}

// Whether T's exponent range holds the safe_gate diagonal operands (about 2^-109 .. 2^109).
template <typename T> struct WideExp { static constexpr bool ok = false; };
template <> struct WideExp<bf16> { static constexpr bool ok = true; };

// The lean outputs of a scalar gate: Tb = Akk diag(β) (rows < n_c, every column of the chunk
// width: 0 above the diagonal) as hi + lo in T, in pieces of 8 columns, and G per row; X of row
// pitch LP (a multiple of 4: a piece's X read as two 16-byte loads).
template <typename T, int LP>
__device__ void intra_store_lean(const IntraArgs& a, const IntraChunk& c, float (*X)[LP], const float* beta, const float* gs) {
    static_assert(LP % 4 == 0, "X rows in 16-byte pieces");
    const int pr = (int)a.bt / 8;
    for (int i = threadIdx.x; i < c.nc * pr; i += INTRA_THREADS) {
        const int r = i / pr, j0 = (i % pr) * 8;
        const i64 o = ((c.row0 + r) * a.HV + c.hv) * a.bt + j0;
        const float4 x0 = *reinterpret_cast<const float4*>(&X[r][j0]), x1 = *reinterpret_cast<const float4*>(&X[r][j0 + 4]);
        const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        Vec<T, 8> hi, lo;
#pragma unroll
        for (int e = 0; e < 8; ++e) split_store<T>(hi.v[e], lo.v[e], j0 + e <= r ? x[e] * beta[j0 + e] : 0.f);
        store_pieces<T, 8>(reinterpret_cast<T*>(a.tbh) + o, hi);
        store_pieces<T, 8>(reinterpret_cast<T*>(a.tbl) + o, lo);
    }
    for (int r = threadIdx.x; r < c.nc; r += INTRA_THREADS) reinterpret_cast<float*>(a.gout)[(c.row0 + r) * a.HV + c.hv] = gs[r];
}

// FAST pass 1: the w operand of the loaded key tile, x_r = β_r k_r . exp2(G_r) rounded to T (rows
// < n_c, columns < K: K % 8 == 0 keeps a pair whole), written into w's own rows (row stride HV K),
// so that pass 2 reads it back instead of loading q, k, g and recomputing the gate and cumsum
// (S10: that second load was 14% of the kernel's samples). Thread: columns d, d + 1 of rows
// 8 warp .. 8 warp + 7, the values pass 2 formed before. (Folding it into intra_store_tile,
// whose qg factor is the same exp2(G_r), spilled 104 bytes.)
template <typename T>
__device__ __forceinline__ void intra_w_operand(const IntraArgs& a, const IntraChunk& c, int k0, T (*k)[IM_P], const float (*G)[IM_GP], const float* beta) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = 2 * lane;
    if (k0 + d >= a.K) return;
    T* wp = reinterpret_cast<T*>(a.w) + (c.row0 * a.HV + c.hv) * a.K + k0 + d;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = 8 * warp + i;
        if (r >= c.nc) break;
        float kv[2], v[2];
        load2(&k[r][d], kv);
        const Vec<float, 2> g = *reinterpret_cast<const Vec<float, 2>*>(&G[r][d]);
#pragma unroll
        for (int e = 0; e < 2; ++e) v[e] = beta[r] * kv[e] * ex2_ftz(g.v[e]);
        *reinterpret_cast<unsigned*>(wp + r * a.HV * a.K) = cvt2<T>(v[0], v[1]);
    }
}

// Rows < n_c, columns < cols of the [rows][row_stride] tile of T at src into x in 16-byte pieces
// (cols % N == 0 or beyond the tile; zeros elsewhere), each element as f(row, element): all of a
// thread's loads first, then its stores.
template <typename T, typename F>
__device__ __forceinline__ void intra_tile_load16(const T* src, i64 row_stride, int nc, i64 cols, T (*x)[IM_P], F f) {
    constexpr int N = VMax<T>::N, VPR = IM_KT / N, NV = INTRA_BT * VPR / INTRA_THREADS;
    Vec<T, N> vv[NV];
#pragma unroll
    for (int u = 0; u < NV; ++u) {
        const int i = threadIdx.x + u * INTRA_THREADS, r = i / VPR, e0 = (i % VPR) * N;
        const bool ok = r < nc && e0 < cols;
        vv[u] = ok ? *reinterpret_cast<const Vec<T, N>*>(src + r * row_stride + e0) : Vec<T, N>{};
    }
#pragma unroll
    for (int u = 0; u < NV; ++u) {
        const int i = threadIdx.x + u * INTRA_THREADS, r = i / VPR, e0 = (i % VPR) * N;
#pragma unroll
        for (int e = 0; e < N; ++e) x[r][e0 + e] = f(r, vv[u].v[e]);
    }
}

// FAST pass 2: the w operand of key tile k0 back from w's rows into x (rows >= n_c and columns
// >= K zero; K % 8 == 0).
template <typename T>
__device__ __forceinline__ void intra_w_operand_load(const IntraArgs& a, const IntraChunk& c, int k0, T (*x)[IM_P]) {
    const T* wp = reinterpret_cast<const T*>(a.w) + (c.row0 * a.HV + c.hv) * a.K + k0;
    intra_tile_load16<T>(wp, a.HV * a.K, c.nc, a.K - k0, x, [](int, T v) { return v; });
}

// Pass 1's factored operands of the loaded key tile, rows >= n_c selected to 0 (never 0 .
// exp2(.)). Thread: columns d, d + 1 (d = 2 lane) of rows r0 .. r0 + 7 of block b = warp / 2
// (m = 16 b, r0 = m or m + 8), so that q_r, k_r, G_r of its rows are read by it alone:
//   qe_r = q_r . exp2(G_r - G_m), ke_r = k_r . exp2(G_r - G_m)             (hi + lo)
//   kf_bi[r] = k_r . exp2(G_16bi - G_r), bi = b + 1 .. 3 (rows 8 bi (bi - 1) + r)  (hi + lo)
// and with `safe` the diagonal blocks' B operand kd_r = k_r . exp2(G_m - G_r), hi in q_r's
// place and lo in k_r's; else the steps exp2(G_r - G_{r-1}) in place of G_r for r != m (G_m
// stays: other blocks read it), row m + 7's after the barrier at the end (the block's other
// half reads that G).
template <typename T>
__device__ __forceinline__ void intra_mma_factors(IntraMmaP1<T>& p1, float (*G)[IM_GP], int nc, bool safe) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int d = 2 * lane, b = warp >> 1, m = 16 * b, r0 = m + 8 * (warp & 1);
    typedef Vec<float, 2> F2;
    auto g2 = [&](int r) { return *reinterpret_cast<const F2*>(&G[r][d]); };
    const F2 gm = g2(m);
    F2 gb[3];  // G_16bi, bi = 1 .. 3
#pragma unroll
    for (int bi = 1; bi < 4; ++bi) gb[bi - 1] = g2(16 * bi);
    F2 gp = g2(r0 > 0 ? r0 - 1 : 0), late = {};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = r0 + i;
        const bool ok = r < nc;
        const F2 g = g2(r);
        float qv[2], kv[2], x[2], y[2];
        load2(&p1.q[r][d], qv);
        load2(&p1.k[r][d], kv);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float f = ok ? ex2_ftz(g.v[e] - gm.v[e]) : 0.f;
            x[e] = qv[e] * f;
            y[e] = kv[e] * f;
        }
        split_store2(&p1.qe[r][d], &p1.qel[r][d], x);
        split_store2(&p1.ke[r][d], &p1.kel[r][d], y);
#pragma unroll
        for (int bi = 1; bi < 4; ++bi) {
            if (bi > b) {
                const bool okb = ok && 16 * bi < nc;
#pragma unroll
                for (int e = 0; e < 2; ++e) x[e] = okb ? kv[e] * ex2_ftz(gb[bi - 1].v[e] - g.v[e]) : 0.f;
                const int row = 8 * bi * (bi - 1) + r;
                split_store2(&p1.kf[row][d], &p1.kfl[row][d], x);
            }
        }
        if (safe) {
#pragma unroll
            for (int e = 0; e < 2; ++e) x[e] = ok ? kv[e] * ex2_ftz(gm.v[e] - g.v[e]) : 0.f;
            split_store2(&p1.q[r][d], &p1.k[r][d], x);
        } else if (i != 0 || r0 != m) {
            F2 st;
#pragma unroll
            for (int e = 0; e < 2; ++e) st.v[e] = ok ? ex2_ftz(g.v[e] - gp.v[e]) : 0.f;
            if (i == 7 && r0 == m)
                late = st;
            else
                *reinterpret_cast<F2*>(&G[r][d]) = st;
        }
        gp = g;
    }
    __syncthreads();
    if (!safe && r0 == m) *reinterpret_cast<F2*>(&G[m + 7][d]) = late;
}

template <typename T, int FORM, bool SCALAR, bool FAST = false>
__device__ void intra_mma(const IntraArgs& a) {
    using Sm = IntraMmaSmem<T>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
    IntraMmaP1<T>& p1 = sm.u.p1;
    IntraMmaSolve& sv = sm.u.sv;
    T (*xa)[IM_P] = p1.kf;   // Akk as hi + lo of T (passes 2, 3)
    T (*xl)[IM_P] = p1.kfl;
    T (*x)[IM_P] = p1.qe;   // the product operand (passes 2, 3)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, t4 = lane & 3;
    const IntraChunk c = intra_chunk(a);
    const int nc = c.nc;
    auto load = [&](int k0) {
        intra_load_tile<T, T, FORM, IM_KT, IM_P, float, float, IM_GP, FAST>(a, c, k0, p1.q, p1.k, sm.G, sm.invq, sm.invk, sm.gs);
    };

    intra_rows<T, float, Sm, FAST>(a, sm, c);
    if (SCALAR) intra_scalar_gate<float>(a, sm, c);
    __syncthreads();

    // the diagonal blocks on tensor cores: the scalar gate's, and bf16's with safe_gate
    const bool safe = !SCALAR && WideExp<T>::ok && a.safe_gate != 0;
    const bool diag_mma = SCALAR || safe;
    // off-diagonal block pair of warps 0-5: (bi, bj) = (1,0) (2,0) (2,1) (3,0) (3,1) (3,2)
    const int bi = warp < 1 ? 1 : (warp < 3 ? 2 : 3);
    const int bj = warp < 1 ? 0 : (warp < 3 ? warp - 1 : warp - 3);
    const int kf_base = 8 * bi * (bi - 1);
    float offa[2][4], offl[2][4];
    // the diagonal, Aqk and L: with diag_mma the fragments of warps 6, 7 (block 2 (warp - 6) + s:
    // [2 s + n], n the 8-column tile), else the FMA rows r of block db, column dj, keys of
    // pairs dg, dg + 4, ... of the tile ([r / 4][r % 4])
    const int db = tid >> 6, dj = (tid >> 2) & 15, dg = tid & 3;
    float da[4][4], dl[4][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) (&da[0][0])[i] = (&dl[0][0])[i] = 0.f;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) offa[n][e] = offl[n][e] = 0.f;

    // a 16 x 16 block of Aqk and of L on tensor cores: A rows ar0 .. ar0 + 15 of q, k (the
    // scalar gate's raw rows, else qe, ke as hi + lo), B rows br0 .. br0 + 15 of bh (+ bl);
    // the products hi.hi + hi.lo + lo.hi
    auto block_product = [&](int ar0, T (*bh)[IM_P], T (*bl)[IM_P], int br0, float (&a0)[4], float (&a1)[4],
                             float (&l0)[4], float (&l1)[4]) {
        T (*qa)[IM_P] = SCALAR ? p1.q : p1.qe;
        T (*ka)[IM_P] = SCALAR ? p1.k : p1.ke;
        // one operand pair's products: Aqk columns += x y, L columns += xk y
        auto quad = [&](const unsigned (&x)[4], const unsigned (&xk)[4], const unsigned (&y0)[2], const unsigned (&y1)[2]) {
            Mma<T>::run(a0, x, y0);
            Mma<T>::run(a1, x, y1);
            Mma<T>::run(l0, xk, y0);
            Mma<T>::run(l1, xk, y1);
        };
#pragma unroll
        for (int ks = 0; ks < IM_KT / 16; ++ks) {
            const int ar = ar0 + (lane & 15), ac = ks * 16 + (lane >> 4) * 8;
            const int br = br0 + (lane & 7) + ((lane >> 4) << 3), bc = ks * 16 + ((lane >> 3) & 1) * 8;
            unsigned qf[4], kef[4], bf[4];
            ldsm_x4(qf, smem_u32(&qa[ar][ac]));
            ldsm_x4(kef, smem_u32(&ka[ar][ac]));
            ldsm_x4(bf, smem_u32(&bh[br][bc]));
            const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            quad(qf, kef, b0, b1);  // hi . hi
            if (!SCALAR) {
                unsigned ql[4], kl[4], blf[4];
                ldsm_x4(ql, smem_u32(&p1.qel[ar][ac]));
                ldsm_x4(kl, smem_u32(&p1.kel[ar][ac]));
                ldsm_x4(blf, smem_u32(&bl[br][bc]));
                const unsigned c0[2] = {blf[0], blf[1]}, c1[2] = {blf[2], blf[3]};
                quad(qf, kef, c0, c1);  // hi . lo
                quad(ql, kl, b0, b1);   // lo . hi
            }
        }
    };

    for (int k0 = 0; k0 < a.K; k0 += IM_KT) {
        load(k0);
        if (FAST) {
            // while q, k and G are whole (the factors overwrite them): the w operand and the
            // tile's kg, qg, G, lam (pass 2 then loads nothing but the operand)
            if (a.w != 0) intra_w_operand<T>(a, c, k0, p1.k, sm.G, sm.beta);
            intra_store_tile<T, float, IM_KT, IM_P, T, float, IM_GP, FAST>(a, c, k0, p1.q, p1.k, sm.G);
            __syncthreads();
        }
        if (!SCALAR) intra_mma_factors<T>(p1, sm.G, nc, safe);  // ends with a barrier
        // tensor cores: the off-diagonal blocks (warps 0-5; the raw q, k with a scalar gate,
        // whose factor is applied in fp32 afterwards), and with diag_mma the diagonal blocks
        // (warps 6, 7: two blocks each; B = the raw k, or kd as hi + lo in q's and k's place)
        if (warp < 6) {
            block_product(bi * 16, SCALAR ? p1.k : p1.kf + kf_base, p1.kfl + kf_base, bj * 16, offa[0], offa[1], offl[0], offl[1]);
        } else if (diag_mma) {
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const int rb = 2 * (warp - 6) + s;
                block_product(rb * 16, SCALAR ? p1.k : p1.q, p1.k, rb * 16, da[2 * s], da[2 * s + 1], dl[2 * s], dl[2 * s + 1]);
            }
        }
        if (!diag_mma) {
            __syncthreads();  // the steps are visible
            // diagonal blocks: e_r = k_j Π_{s=j+1..r} exp2(G_s - G_{s-1}) by rows, selected (0
            // for r < j, k_j at r = j), two keys at a time
            const int jr = db * 16 + dj;
#pragma unroll 1
            for (int d = 2 * dg; d < IM_KT; d += 8) {
                float kj[2], e[2];
                load2(&p1.k[jr][d], kj);
#pragma unroll
                for (int r = 0; r < 16; ++r) {
                    const int row = db * 16 + r;
                    float kr[2], qr[2];
                    load2(&p1.k[row][d], kr);
                    load2(&p1.q[row][d], qr);
                    const Vec<float, 2> st = r > 0 ? *reinterpret_cast<const Vec<float, 2>*>(&sm.G[row][d]) : Vec<float, 2>{};
#pragma unroll
                    for (int c2 = 0; c2 < 2; ++c2) {
                        e[c2] = r == dj ? kj[c2] : (r > 0 ? e[c2] * st.v[c2] : 0.f);
                        dl[r / 4][r % 4] = fmaf(kr[c2], e[c2], dl[r / 4][r % 4]);
                        da[r / 4][r % 4] = fmaf(qr[c2], e[c2], da[r / 4][r % 4]);
                    }
                }
            }
        }
        __syncthreads();  // before the next tile overwrites
    }
    if (!diag_mma) {
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float& l = dl[r / 4][r % 4];
            float& q = da[r / 4][r % 4];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            q += __shfl_xor_sync(0xffffffffu, q, 1);
            q += __shfl_xor_sync(0xffffffffu, q, 2);
        }
    }
    for (int i = tid; i < 2 * INTRA_BT * (INTRA_BT + 1); i += INTRA_THREADS) (&sv.L[0][0])[i] = 0.f;
    __syncthreads();
    const float scale = (float)a.scale;
    // an (R, J) entry of Aqk and L (J > R selected away), with the scalar gate's factor exp2(G_R - G_J)
    auto put = [&](int R, int J, float va, float vl) {
        if (R >= nc || J > R) return;
        const float f = SCALAR ? ex2_ftz(sm.gs[R] - sm.gs[J]) : 1.f;
        sv.A[R][J] = scale * va * f;
        if (J < R) sv.L[R][J] = sm.beta[R] * vl * f;
    };
    if (!diag_mma && dg == 0) {
#pragma unroll
        for (int r = 0; r < 16; ++r) put(db * 16 + r, db * 16 + dj, da[r / 4][r % 4], dl[r / 4][r % 4]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int R0 = gid + (e >> 1) * 8, J0 = n * 8 + t4 * 2 + (e & 1);
            if (warp < 6) {
                put(bi * 16 + R0, bj * 16 + J0, offa[n][e], offl[n][e]);
            } else if (diag_mma) {
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const int rb = 2 * (warp - 6) + s;
                    put(rb * 16 + R0, rb * 16 + J0, da[2 * s + n][e], dl[2 * s + n][e]);
                }
            }
        }
    __syncthreads();
    intra_solve_tc(sv.L, sv.X, sv.tmp);
    intra_store_a<T, float>(a, c, sv.A, sv.X);
    for (int i = tid; i < INTRA_BT * INTRA_BT; i += INTRA_THREADS) {
        const int r = i / INTRA_BT, j = i % INTRA_BT;
        split_store<T>(xa[r][j], xl[r][j], sv.X[r][j]);
    }
    __syncthreads();  // xa visible; A, L, X no longer read

    // pass 2, per key tile: w = Akk (β k . exp2(G)); kg, qg, G, lam (FAST: the operand written
    // in pass 1 read back; kg, qg, G, lam were stored there)
    for (int k0 = 0; k0 < a.K; k0 += IM_KT) {
        if (FAST) {
            if (a.w != 0) {
                intra_w_operand_load<T>(a, c, k0, x);
                __syncthreads();
                T* wp = reinterpret_cast<T*>(a.w) + (c.row0 * a.HV + c.hv) * a.K + k0;
                intra_akk_product<T>(xa, xl, x, nc, wp, a.HV * a.K, (int)min((i64)IM_KT, a.K - k0), true);
                __syncthreads();
            }
            continue;
        }
        load(k0);
        {
            // thread: columns d, d + 1 of rows 8 warp .. 8 warp + 7
            const int d = 2 * lane;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int r = 8 * warp + i;
                float kv[2], v[2];
                load2(&p1.k[r][d], kv);
                const Vec<float, 2> g = *reinterpret_cast<const Vec<float, 2>*>(&sm.G[r][d]);
#pragma unroll
                for (int e = 0; e < 2; ++e) v[e] = r < nc ? sm.beta[r] * kv[e] * ex2_ftz(g.v[e]) : 0.f;
                *reinterpret_cast<unsigned*>(&x[r][d]) = cvt2<T>(v[0], v[1]);
            }
        }
        __syncthreads();
        if (a.w != 0) {
            T* wp = reinterpret_cast<T*>(a.w) + (c.row0 * a.HV + c.hv) * a.K + k0;
            intra_akk_product<T>(xa, xl, x, nc, wp, a.HV * a.K, (int)min((i64)IM_KT, a.K - k0), a.K % 2 == 0);
        }
        intra_store_tile<T, float, IM_KT, IM_P, T, float, IM_GP, FAST>(a, c, k0, p1.q, p1.k, sm.G);
        __syncthreads();
    }
    // pass 3, per value tile: u = Akk (β v), v read in 16-byte pieces where V allows
    if (a.u != 0) {
        const T* vp = reinterpret_cast<const T*>(a.v);
        constexpr int N = VMax<T>::N, VPR = IM_KT / N, NV = INTRA_BT * VPR / INTRA_THREADS;
        for (int v0 = 0; v0 < a.V; v0 += IM_KT) {
            if (FAST || a.V % N == 0) {
                intra_tile_load16<T>(vp + (c.row0 * a.HV + c.hv) * a.V + v0, a.HV * a.V, nc, a.V - v0, x,
                                     [&](int r, T v) { return Narrow<T>::from(sm.beta[r] * widen(v)); });
            } else {
                for (int i = tid; i < INTRA_BT * IM_KT; i += INTRA_THREADS) {
                    const int r = i / IM_KT, e = i % IM_KT;
                    const bool ok = r < nc && v0 + e < a.V;
                    x[r][e] = Narrow<T>::from(ok ? sm.beta[r] * widen(vp[((c.row0 + r) * a.HV + c.hv) * a.V + v0 + e]) : 0.f);
                }
            }
            __syncthreads();
            T* up = reinterpret_cast<T*>(a.u) + (c.row0 * a.HV + c.hv) * a.V + v0;
            intra_akk_product<T>(xa, xl, x, nc, up, a.HV * a.V, (int)min((i64)IM_KT, a.V - v0), a.V % 2 == 0);
            __syncthreads();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The lean intra kernel of a scalar gate (the fused GDN path; bf16 / f16, K <= KP <= 128): one
// CTA per (chunk, value head), or with GROUPED (HV > H) per (chunk, key head), loads q, k once
// (normalised in place with l2norm, and then written for the fused kernel), computes the lower
// 16 x 16 blocks of Q Kᵀ and K Kᵀ on tensor cores (raw products, exact in T; the pair's factor
// exp2(G_r - G_j) applied in fp32 afterwards), and then for each value head of the key head's group (HV / H of them, the products shared:
// the gate and β are the value head's) writes Aqk = scale (Q Kᵀ ⊙ exp2(G_r - G_j))_{j<=r} from
// the fragments (the blocks above the diagonal blocks are not written: the fused kernel never
// reads them), solves Akk = (I + L)^-1 and writes Tb = Akk diag(β) as hi + lo and G
// (intra_store_lean). Its footprint (39 KB, 64 registers) keeps four CTAs per SM; the GROUPED
// instance holds the products' fragments across the heads' solves (80 registers, three CTAs).

// The solve's pitches (intra_solve_tc: bank-conflict-free fragment loads; gpu/src/delta/intra.rs
// sizes the shared memory with them).
#define GDN_LP 68
#define GDN_TP 24
template <typename T, int KP> struct GdnIntraSmem {
    static constexpr int P = KP + 8;
    struct Tiles {
        T q[INTRA_BT][P], k[INTRA_BT][P];
    };
    struct Solve {
        float L[INTRA_BT][GDN_LP], X[INTRA_BT][GDN_LP];
        float tmp[48][GDN_TP];
    };
    union U {
        Tiles t;
        Solve sv;
    } u;
    float beta[INTRA_BT], gs[INTRA_BT];
};

// β and G (intra_scalar_gate) of value head c.hv into sm.beta, sm.gs.
template <typename Sm>
__device__ __forceinline__ void gdn_intra_head(const IntraArgs& a, Sm& sm, const IntraChunk& c) {
    const int tid = threadIdx.x;
    if (tid < INTRA_BT) {
        float b = 0.f;
        if (tid < c.nc) {
            b = load_f<float>(reinterpret_cast<const void*>(a.beta), a.beta_dtype, (c.row0 + tid) * a.HV + c.hv);
            if (a.beta_mode != 0) b = (float)a.beta_mode / (1.f + exp(-b));
        }
        sm.beta[tid] = b;
    }
    intra_scalar_gate<float>(a, sm, c);
}

template <typename T, int KP, bool GROUPED>
__device__ void gdn_intra(const IntraArgs& a) {
    using Sm = GdnIntraSmem<T, KP>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
    auto& t = sm.u.t;
    auto& sv = sm.u.sv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, t4 = lane & 3;
    // GROUPED: one CTA per (chunk, key head), the raw products once, then per value head of the
    // group its gate factors, solve and stores; else one CTA per (chunk, value head)
    const int group = GROUPED ? (int)(a.HV / a.H) : 1;
    IntraChunk c = intra_chunk(a);
    if (GROUPED) {
        c.kh = blockIdx.y;
        c.hv = c.kh * group;
    }
    const int nc = c.nc;

    // q, k tiles (rows >= n_c and columns >= K zero)
    const i64 rs = a.H * a.K;
    const T* qp = reinterpret_cast<const T*>(a.q) + (c.row0 * a.H + c.kh) * a.K;
    const T* kp = reinterpret_cast<const T*>(a.k) + (c.row0 * a.H + c.kh) * a.K;
    constexpr int SEG = KP / 8;
    if (a.K % 8 == 0) {
        for (int i = tid; i < INTRA_BT * SEG; i += INTRA_THREADS) {
            const int r = i / SEG, c8 = (i % SEG) * 8;
            const bool ok = r < nc && c8 < a.K;
            const i64 off = ok ? r * rs + c8 : 0;
            cp_async16(smem_u32(&t.q[r][c8]), qp + off, ok ? 16 : 0);
            cp_async16(smem_u32(&t.k[r][c8]), kp + off, ok ? 16 : 0);
        }
        cp_async_commit();
    } else {
        for (int i = tid; i < INTRA_BT * KP; i += INTRA_THREADS) {
            const int r = i / KP, e = i % KP;
            const bool ok = r < nc && e < a.K;
            t.q[r][e] = ok ? qp[r * rs + e] : T{0};
            t.k[r][e] = ok ? kp[r * rs + e] : T{0};
        }
    }
    // β and G of the group's first value head while the tiles load
    gdn_intra_head(a, sm, c);
    cp_async_wait_all();
    __syncthreads();  // tiles, β and G visible

    if (a.l2norm) {
        // x / sqrt(Σ x² + 1e-6) rounded to T, in place: 4 lanes per row, 16-byte pieces
        const int r = tid >> 2, part = tid & 3;
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int v = part; v < SEG; v += 4) {
            const Vec<T, 8> x = *reinterpret_cast<const Vec<T, 8>*>(&t.q[r][v * 8]);
            const Vec<T, 8> y = *reinterpret_cast<const Vec<T, 8>*>(&t.k[r][v * 8]);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                sq = fmaf(widen(x.v[e]), widen(x.v[e]), sq);
                sk = fmaf(widen(y.v[e]), widen(y.v[e]), sk);
            }
        }
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 2);
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 2);
        const float iq = 1.f / sqrt(sq + 1e-6f), ik = 1.f / sqrt(sk + 1e-6f);
#pragma unroll
        for (int v = part; v < SEG; v += 4) {
            Vec<T, 8> x = *reinterpret_cast<const Vec<T, 8>*>(&t.q[r][v * 8]);
            Vec<T, 8> y = *reinterpret_cast<const Vec<T, 8>*>(&t.k[r][v * 8]);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                x.v[e] = Narrow<T>::from(widen(x.v[e]) * iq);
                y.v[e] = Narrow<T>::from(widen(y.v[e]) * ik);
            }
            *reinterpret_cast<Vec<T, 8>*>(&t.q[r][v * 8]) = x;
            *reinterpret_cast<Vec<T, 8>*>(&t.k[r][v * 8]) = y;
            // the normalised rows for the fused kernel ([rows][H][K]: per key head, by the
            // CTA of the first of its value heads, or GROUPED by the key head's CTA)
            if (a.kg != 0 && r < nc && (GROUPED || c.hv % (a.HV / a.H) == 0)) {
                const i64 o = ((c.row0 + r) * a.H + c.kh) * a.K + v * 8;
                const int n = (int)min((i64)8, a.K - v * 8);
                if (n > 0) {
                    store_some<T, 8>(reinterpret_cast<T*>(a.qg) + o, x, a.K % 8 == 0, n);
                    store_some<T, 8>(reinterpret_cast<T*>(a.kg) + o, y, a.K % 8 == 0, n);
                }
            }
        }
        // the norms' reciprocals for the Hopper kernel ([rows][H][2]: 1 / ‖q‖, 1 / ‖k‖), which
        // reads the raw q, k
        if (a.rqk != 0 && part == 0 && r < nc && (GROUPED || c.hv % (a.HV / a.H) == 0))
            *reinterpret_cast<float2*>(reinterpret_cast<float*>(a.rqk) + ((c.row0 + r) * a.H + c.kh) * 2) = make_float2(iq, ik);
        __syncthreads();
    }

    // the lower blocks (bi, bj), bj <= bi < bt / 16, numbered p = bi (bi + 1) / 2 + bj: warp w
    // takes p = w and p = w + 8
    const int nbr = (int)a.bt / 16, npairs = nbr * (nbr + 1) / 2;
    float sqk[2][2][4], skk[2][2][4];
    int pbi[2], pbj[2];
#pragma unroll
    for (int slot = 0; slot < 2; ++slot) {
        const int p = warp + slot * 8;
        int bi = 0;
        while ((bi + 1) * (bi + 2) / 2 <= p) ++bi;
        pbi[slot] = bi;
        pbj[slot] = p - bi * (bi + 1) / 2;
#pragma unroll
        for (int e = 0; e < 16; ++e) (&sqk[slot][0][0])[e] = (&skk[slot][0][0])[e] = 0.f;
        if (p < npairs) {
            const int bj = pbj[slot];
#pragma unroll
            for (int ks = 0; ks < KP / 16; ++ks) {
                unsigned qf[4], kf[4], bf[4];
                ldsm_x4(qf, smem_u32(&t.q[bi * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]));
                ldsm_x4(kf, smem_u32(&t.k[bi * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]));
                ldsm_x4(bf, smem_u32(&t.k[bj * 16 + (lane & 7) + ((lane >> 4) << 3)][ks * 16 + ((lane >> 3) & 1) * 8]));
                const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
                Mma<T>::run(sqk[slot][0], qf, b0);
                Mma<T>::run(sqk[slot][1], qf, b1);
                Mma<T>::run(skk[slot][0], kf, b0);
                Mma<T>::run(skk[slot][1], kf, b1);
            }
        }
    }
    __syncthreads();  // the tiles are dead: the solve's space lies over them
    const float scale = (float)a.scale;
    T* aq = reinterpret_cast<T*>(a.aqk);
    for (int gi = 0; gi < group; ++gi) {
        if (gi > 0) {
            // the next value head's β and G (the previous head's stores have read them)
            c.hv = c.kh * group + gi;
            gdn_intra_head(a, sm, c);
        }
        // at chunk 64 (all 10 block pairs) the slots below write every element of L's lower
        // blocks, the only ones the solve reads; a shorter chunk leaves some of them: zero first
        if (npairs < 10)
            for (int i = tid; i < INTRA_BT * GDN_LP; i += INTRA_THREADS) (&sv.L[0][0])[i] = 0.f;
        __syncthreads();  // L's zeros, and a later head's β and G
        // Aqk (stored from the fragments, 0 above the diagonal) and L with the factor exp2(G_R - G_J)
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            if (warp + slot * 8 < npairs) {
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int R = pbi[slot] * 16 + gid + h * 8, J0 = pbj[slot] * 16 + n * 8 + t4 * 2;
                        float va[2];
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int J = J0 + e;
                            const bool in = R < nc && J <= R;
                            const float f = in ? ex2_ftz(sm.gs[R] - sm.gs[J]) : 0.f;
                            va[e] = scale * sqk[slot][n][2 * h + e] * f;
                            sv.L[R][J] = J < R ? sm.beta[R] * skk[slot][n][2 * h + e] * f : 0.f;
                        }
                        if (R < nc) *reinterpret_cast<Vec<T, 2>*>(aq + ((c.row0 + R) * a.HV + c.hv) * a.bt + J0) = pack2<T>(va[0], va[1]);
                    }
            }
        }
        __syncthreads();
        intra_solve_tc(sv.L, sv.X, sv.tmp);
        intra_store_lean<T>(a, c, sv.X, sm.beta, sm.gs);
        __syncthreads();  // β, G, L and X read before the next head writes them
    }
}

// Resident CTAs per multiprocessor the register allocator must allow: gdn_intra 4 (64
// registers, no spill; 3 gave 76 registers, 5 spills), the KDA mma intra 2 (128 registers, a
// few spilled bytes). Knobs for measurement (ATTN_NVRTC_OPTS=-DGDN_INTRA_MIN_BLOCKS=3).
#ifndef GDN_INTRA_MIN_BLOCKS
#define GDN_INTRA_MIN_BLOCKS 4
#endif
#ifndef GDN_INTRA_GROUPED_MIN_BLOCKS
#define GDN_INTRA_GROUPED_MIN_BLOCKS 3
#endif
#ifndef KDA_INTRA_MIN_BLOCKS
#define KDA_INTRA_MIN_BLOCKS 2
#endif

#define GDN_INTRA_KERNEL(T, TAG, KP) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, GDN_INTRA_MIN_BLOCKS) gdn_intra_##TAG##_k##KP(const IntraArgs a) { \
        gdn_intra<T, KP, false>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, GDN_INTRA_GROUPED_MIN_BLOCKS) gdn_intra_grouped_##TAG##_k##KP(const IntraArgs a) { \
        gdn_intra<T, KP, true>(a); \
    }
GDN_INTRA_KERNEL(bf16, bf16, 64)
GDN_INTRA_KERNEL(bf16, bf16, 128)
GDN_INTRA_KERNEL(f16, f16, 64)
GDN_INTRA_KERNEL(f16, f16, 128)

// ---------------------------------------------------------------------------------------------
// The output of the staged forward (`conformance/spec/ops-delta-rule.md` §6.5 step 5, 8.5 step 4), one CTA per (chunk, value
// head, block of OUT_BV value columns):
//   o_r = qf_r Σ_d qg_rd h[c]_d,: + Σ_{j<=r} Aqk[r, j] v_new_j       (qf_r fp32: the scale, GDN's decay)
// qg, h, Aqk and v_new in their stored dtype T, products in Acc.

#define OUT_BV 32

struct OutArgs {
    u64 qg, qf, h, aqk, v_new, o;
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
    const float* qf = reinterpret_cast<const float*>(a.qf) + row0 * a.HV + hv;
#pragma unroll
    for (int i = 0; i < INTRA_BT / RSTEP; ++i) {
        const int r = rg + i * RSTEP;
        if (r < nc) acc[i] *= (Acc)qf[r * a.HV];
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

// The same output on tensor cores (bf16 / f16 with K, V multiples of 8: 16-byte copies), one CTA
// per (chunk, value head, block of OUTM_BV = 64 value columns); warp w owns rows 16 (w % 4) ..
// + 15 and columns 32 (w / 4) .. + 31 of the 64 x 64 tile (4 m16n8k16 accumulators, fp32).
// Stage s < nk = ceil(K / 64) multiplies the key block [64 s, 64 s + 64) of qg (A) and h (B);
// after the last one the rows are scaled by qf; stage nk adds Aqk (A, zero above the diagonal by
// a mask on its fragments) times v_new (B). Two buffers: stage s + 2 loads (cp.async, zero fill
// past the valid rows and columns) while stage s computes. B is read [k][n] by ldmatrix.trans,
// or [n][k] (h with v_first: S^T) by ldmatrix.

#define OUTM_BV 64
#define OUTM_KB 64

template <typename T> struct OutMmaSmem {
    static constexpr int P = OUTM_KB + 8;  // element pitch (padded against bank conflicts)
    T a[2][INTRA_BT][P];
    T b[2][OUTM_KB][P];
};

// Issues one stage's copies into buffer buf (one cp.async group, committed by the caller).
template <typename T>
__device__ __forceinline__ void delta_output_load(const OutArgs& a, OutMmaSmem<T>& sm, int buf, int s, int nk, i64 row0,
                                                  int nc, i64 hv, i64 c0) {
    const int tid = threadIdx.x, seg = (tid % 8) * 8;
    const T* h = reinterpret_cast<const T*>(a.h);
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int r = tid / 8 + 32 * p;  // tile row
        const T *asrc, *bsrc;
        bool aok, bok;
        if (s < nk) {
            const i64 k0 = (i64)s * OUTM_KB;
            asrc = reinterpret_cast<const T*>(a.qg) + ((row0 + r) * a.HV + hv) * a.K + k0 + seg;
            aok = r < nc && k0 + seg < a.K;
            if (a.v_first) {
                bsrc = h + (c0 + r) * a.K + k0 + seg;
                bok = c0 + r < a.V && k0 + seg < a.K;
            } else {
                bsrc = h + (k0 + r) * a.V + c0 + seg;
                bok = k0 + r < a.K && c0 + seg < a.V;
            }
        } else {
            asrc = reinterpret_cast<const T*>(a.aqk) + ((row0 + r) * a.HV + hv) * a.bt + seg;
            aok = r < nc && seg < a.bt;
            bsrc = reinterpret_cast<const T*>(a.v_new) + ((row0 + r) * a.HV + hv) * a.V + c0 + seg;
            bok = r < nc && c0 + seg < a.V;
        }
        cp_async16(smem_u32(&sm.a[buf][r][seg]), aok ? asrc : h, aok ? 16 : 0);
        cp_async16(smem_u32(&sm.b[buf][r][seg]), bok ? bsrc : h, bok ? 16 : 0);
    }
}

// Stores a warp's 16 x 32 tile of 4 m16n8k16 accumulators (rows m0 .., columns n0 .. of a
// block at column c0) into rows < nc of dst (row pitch `pitch`), columns < width, in pairs.
template <typename T>
__device__ __forceinline__ void store_warp_tile(T* dst, i64 pitch, const float (&acc)[4][4], i64 c0, i64 width, int m0, int n0, int nc) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const i64 c = c0 + n0 + 8 * j + 2 * t4;
        if (c >= width) continue;
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int r = m0 + gid + 8 * h2;
            if (r < nc) *reinterpret_cast<Vec<T, 2>*>(dst + r * pitch + c) = pack2<T>(acc[j][2 * h2], acc[j][2 * h2 + 1]);
        }
    }
}

template <typename T>
__device__ void delta_output_mma(const OutArgs& a) {
    __shared__ __align__(16) OutMmaSmem<T> sm;
    using Sm = OutMmaSmem<T>;
    constexpr unsigned ROW = Sm::P * sizeof(T);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, t4 = lane & 3;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + blockIdx.x * 3;
    const i64 row0 = ch[0], cidx = ch[2];
    const int nc = (int)ch[1];
    const i64 hv = blockIdx.y, c0 = (i64)blockIdx.z * OUTM_BV;
    OutArgs at = a;
    at.h = a.h + (u64)((cidx * a.HV + hv) * a.K * a.V) * sizeof(T);
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    const int nk = (int)((a.K + OUTM_KB - 1) / OUTM_KB);
    const unsigned a_lane = (m0 + (lane & 15)) * ROW + (lane >> 4) * 16;
    // B fragments of two n8 tiles per ldmatrix.x4: [k][n] (.trans) or [n][k]
    const unsigned bt_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * ROW + (n0 + (lane >> 4) * 8) * sizeof(T);
    const unsigned bn_lane = (n0 + (lane & 7) + (lane >> 4) * 8) * ROW + ((lane >> 3) & 1) * 16;
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    delta_output_load<T>(at, sm, 0, 0, nk, row0, nc, hv, c0);
    cp_async_commit();
    delta_output_load<T>(at, sm, 1, 1, nk, row0, nc, hv, c0);
    cp_async_commit();
    for (int s = 0; s <= nk; ++s) {
        const int buf = s & 1;
        cp_async_wait<1>();
        __syncthreads();
        const bool last = s == nk;
        const bool n_major = !last && a.v_first;
        const int steps = last ? (int)((a.bt + 15) / 16) : OUTM_KB / 16;
        const unsigned as = smem_u32(&sm.a[buf][0][0]), bs = smem_u32(&sm.b[buf][0][0]);
        for (int kk = 0; kk < steps; ++kk) {
            unsigned af[4];
            ldsm_x4(af, as + a_lane + kk * 32);
            if (last) {
                // Aqk: zero above the diagonal (column j > row r): a0 (g, 2t..), a1 (g + 8, 2t..),
                // a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = m0 + gid + (e & 1) * 8, j = kk * 16 + 2 * t4 + (e >> 1) * 8;
                    const unsigned keep = (j <= r ? 0xffffu : 0u) | (j + 1 <= r ? 0xffff0000u : 0u);
                    af[e] &= keep;
                }
            }
#pragma unroll
            for (int hp = 0; hp < 2; ++hp) {
                unsigned bf[4];
                if (n_major) ldsm_x4(bf, bs + bn_lane + hp * 16 * ROW + kk * 32);
                else ldsm_x4_t(bf, bs + bt_lane + kk * 16 * ROW + hp * 16 * sizeof(T));
                const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
                Mma<T>::run(acc[2 * hp], af, b0);
                Mma<T>::run(acc[2 * hp + 1], af, b1);
            }
        }
        if (s == nk - 1) {
            const float* qf = reinterpret_cast<const float*>(a.qf) + row0 * a.HV + hv;
            const int r0 = m0 + gid, r1 = r0 + 8;
            const float f0 = r0 < nc ? qf[r0 * a.HV] : 0.f, f1 = r1 < nc ? qf[r1 * a.HV] : 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc[j][0] *= f0;
                acc[j][1] *= f0;
                acc[j][2] *= f1;
                acc[j][3] *= f1;
            }
        }
        __syncthreads();
        if (s + 2 <= nk) delta_output_load<T>(at, sm, buf, s + 2, nk, row0, nc, hv, c0);
        cp_async_commit();
    }
    store_warp_tile<T>(reinterpret_cast<T*>(a.o) + (row0 * a.HV + hv) * a.V, a.HV * a.V, acc, c0, a.V, m0, n0, nc);
}

// The staged GDN path's operands from the lean intra stage (the exact fallback of a lean fused
// plan: gdn_intra runs beside the warm-up policy either way; bf16 / f16, K and V multiples of 8):
// one CTA per (chunk, value head, block of 64 columns of [w | u]), from Tb = Akk diag(β) (hi + lo),
// G and the (normalised) q, k of gdn_intra:
//   w_r = Σ_{j<=r} Tb[r, j] (k_j exp2(G_j)),   u_r = Σ_{j<=r} Tb[r, j] v_j
// (B rounded to T, A as hi + lo, fp32 accumulation: the warps as in delta_output_mma); the key
// blocks also copy kg = k and qg = q per value head, and the first block writes qf =
// scale exp2(G_r) and the gate G, as the full intra stage does for a scalar gate.

struct ExpandArgs {
    u64 q, k, v, tbh, tbl, g, chunks;  // inputs (q, k: [rows][H][K], normalised with l2norm)
    u64 w, u, kg, qg, qf, gate;        // outputs
    i64 H, HV, K, V, bt;
    double scale;
};

template <typename T>
__device__ void gdn_expand(const ExpandArgs& a) {
    __shared__ __align__(16) OutMmaSmem<T> sm;  // a[0], a[1]: Tb hi, lo; b[0]: k exp2(G) or v
    using Sm = OutMmaSmem<T>;
    constexpr unsigned ROW = Sm::P * sizeof(T);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + blockIdx.x * 3;
    const i64 row0 = ch[0];
    const int nc = (int)ch[1];
    const i64 hv = blockIdx.y, kh = hv / (a.HV / a.H);
    const i64 nbk = (a.K + OUTM_BV - 1) / OUTM_BV;
    const bool keys = (i64)blockIdx.z < nbk;
    const i64 c0 = ((i64)blockIdx.z - (keys ? 0 : nbk)) * OUTM_BV, width = keys ? a.K : a.V;
    const T* tbh = reinterpret_cast<const T*>(a.tbh);
    const T* tbl = reinterpret_cast<const T*>(a.tbl);
    const i64 rs = keys ? a.H * a.K : a.HV * a.V;
    const T* src = keys ? reinterpret_cast<const T*>(a.k) + (row0 * a.H + kh) * a.K + c0
                        : reinterpret_cast<const T*>(a.v) + (row0 * a.HV + hv) * a.V + c0;
    const float* g = reinterpret_cast<const float*>(a.g) + row0 * a.HV + hv;
    const int seg = (tid % 8) * 8;
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const int r = tid / 8 + 32 * p;
        const bool aok = r < nc && seg < a.bt, bok = r < nc && c0 + seg < width;
        const i64 ao = ((row0 + r) * a.HV + hv) * a.bt + seg;
        cp_async16(smem_u32(&sm.a[0][r][seg]), aok ? tbh + ao : tbh, aok ? 16 : 0);
        cp_async16(smem_u32(&sm.a[1][r][seg]), aok ? tbl + ao : tbh, aok ? 16 : 0);
        cp_async16(smem_u32(&sm.b[0][r][seg]), bok ? src + r * rs + seg : tbh, bok ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait_all();
    if (keys) {
        // this thread's own pieces: k_j exp2(G_j) rounded to T (rows past n_c stay 0)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int r = tid / 8 + 32 * p;
            if (r >= nc) continue;
            const float f = ex2_ftz(g[r * a.HV]);
#pragma unroll
            for (int e = 0; e < 8; ++e) sm.b[0][r][seg + e] = Narrow<T>::from(widen(sm.b[0][r][seg + e]) * f);
        }
    }
    __syncthreads();
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    const unsigned a_lane = (m0 + (lane & 15)) * ROW + (lane >> 4) * 16;
    const unsigned bt_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * ROW + (n0 + (lane >> 4) * 8) * sizeof(T);
    const unsigned ah = smem_u32(&sm.a[0][0][0]), al = smem_u32(&sm.a[1][0][0]), bs = smem_u32(&sm.b[0][0][0]);
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    for (int kk = 0; kk < (int)((a.bt + 15) / 16); ++kk) {
        unsigned fh[4], fl[4];
        ldsm_x4(fh, ah + a_lane + kk * 32);
        ldsm_x4(fl, al + a_lane + kk * 32);
#pragma unroll
        for (int hp = 0; hp < 2; ++hp) {
            unsigned bf[4];
            ldsm_x4_t(bf, bs + bt_lane + kk * 16 * ROW + hp * 16 * sizeof(T));
            const unsigned b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            Mma<T>::run(acc[2 * hp], fh, b0);
            Mma<T>::run(acc[2 * hp], fl, b0);
            Mma<T>::run(acc[2 * hp + 1], fh, b1);
            Mma<T>::run(acc[2 * hp + 1], fl, b1);
        }
    }
    store_warp_tile<T>(reinterpret_cast<T*>(keys ? a.w : a.u) + (row0 * a.HV + hv) * width, a.HV * width, acc, c0, width, m0, n0, nc);
    if (keys) {
        for (int i = tid; i < nc * 8; i += INTRA_THREADS) {
            const int r = i / 8, sg = (i % 8) * 8;
            if (c0 + sg >= a.K) continue;
            const i64 from = ((row0 + r) * a.H + kh) * a.K + c0 + sg, to = ((row0 + r) * a.HV + hv) * a.K + c0 + sg;
            *reinterpret_cast<Vec<T, 8>*>(reinterpret_cast<T*>(a.kg) + to) = *reinterpret_cast<const Vec<T, 8>*>(reinterpret_cast<const T*>(a.k) + from);
            *reinterpret_cast<Vec<T, 8>*>(reinterpret_cast<T*>(a.qg) + to) = *reinterpret_cast<const Vec<T, 8>*>(reinterpret_cast<const T*>(a.q) + from);
        }
    }
    if (blockIdx.z == 0) {
        for (int r = tid; r < nc; r += INTRA_THREADS) {
            const float gr = g[r * a.HV];
            reinterpret_cast<float*>(a.qf)[(row0 + r) * a.HV + hv] = (float)a.scale * ex2_ftz(gr);
            reinterpret_cast<float*>(a.gate)[(row0 + r) * a.HV + hv] = gr;
        }
    }
}

#define INTRA_FMA_KERNEL(T, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) kda_intra_fma_##TAG(const IntraArgs a) { \
        GATE_DISPATCH(a, (intra_fma<T, T, FORM>(a))) \
    }
#define OUTPUT_KERNEL(T, ACC, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) delta_output_fma_##TAG(const OutArgs a) { \
        delta_output<T, ACC>(a); \
    }
#define GDN_EXPAND_KERNEL(T, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) gdn_expand_##TAG(const ExpandArgs a) { \
        gdn_expand<T>(a); \
    }
#define OUTPUT_MMA_KERNEL(T, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS) delta_output_mma_##TAG(const OutArgs a) { \
        delta_output_mma<T>(a); \
    }

#define INTRA_MMA_KERNEL(T, TAG) \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, KDA_INTRA_MIN_BLOCKS) kda_intra_mma_##TAG(const IntraArgs a) { \
        GATE_DISPATCH(a, (intra_mma<T, FORM, false>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, KDA_INTRA_MIN_BLOCKS) kda_intra_mma_fast_##TAG(const IntraArgs a) { \
        GATE_DISPATCH(a, (intra_mma<T, FORM, false, true>(a))) \
    } \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, KDA_INTRA_MIN_BLOCKS) kda_intra_mma_scalar_##TAG(const IntraArgs a) { \
        intra_mma<T, GATE_NONE, true>(a); \
    } \
    extern "C" __global__ void __launch_bounds__(INTRA_THREADS, KDA_INTRA_MIN_BLOCKS) kda_intra_mma_scalar_fast_##TAG(const IntraArgs a) { \
        intra_mma<T, GATE_NONE, true, true>(a); \
    }

INTRA_FMA_KERNEL(float, f32)
INTRA_FMA_KERNEL(double, f64)
INTRA_MMA_KERNEL(bf16, bf16)
INTRA_MMA_KERNEL(f16, f16)
OUTPUT_KERNEL(float, float, f32)
OUTPUT_KERNEL(double, double, f64)
OUTPUT_KERNEL(bf16, float, bf16)
OUTPUT_KERNEL(f16, float, f16)
OUTPUT_MMA_KERNEL(bf16, bf16)
OUTPUT_MMA_KERNEL(f16, f16)
GDN_EXPAND_KERNEL(bf16, bf16)
GDN_EXPAND_KERNEL(f16, f16)
