// `nsa_select_blocks` (spec ops-nsa.md section 4), both modes. Scores in Acc (fp32, fp64 for
// fp64) from exact products of the input values, `scale` applied to the fp32 dot product.
//
// Mode "fla" (select_fla): a warp per (token t, KV head h), WPB warps of consecutive tokens of
// one head per block (they read the same k_cmp rows). With p the token's position in its
// sequence, IC = p / BS, NC = (p + 1) / BS:
//   pass 1: lse[g] = log sum_{c < NC} exp(z[g, c]), z[g, c] = scale * q[t, h*G + g] . k_cmp[c, h],
//           lanes over c, query heads in groups of GB, an online (max, sum) per lane merged over
//           the warp;
//   pass 2: score[c] = (1/G) sum_g exp(z[g, c] - lse[g]) for the candidates c <= IC (recomputed),
//           1 for the forced blocks {0, IC-1, IC}; chunks of 32 candidates (one per lane) are
//           merged into a running top-32 list ordered by (score desc, index asc).
// The row is the first min(n_sel, IC + 1) entries, then -1 up to S.
//
// Mode "mslk_tile_mean" (select_tile_mean): a warp per (query tile i, query head hq): qbar = the
// tile's mean query (lanes over features), s[j] = scale * qbar . k_cmp[j, hq / G] for the
// sequence's blocks j, -inf where not allowed (causal: j*BS >= (i+1)*qt); the top S_m by
// (score desc, index asc), -inf entries (and phantoms, where the sequence has fewer than S_m
// blocks) become block 0, the row sorted ascending.
//
// Limits (typed errors on the host): S (and S_m) <= 32; the G query rows of a warp in shared
// memory (G * K * sizeof(T) <= 48 KiB).

#define SEL_GB 16

struct SelectArgs {
    u64 q;            // const T* [rows_q, HQ, K] (packed tokens)
    u64 k_cmp;        // const T* [rows_c, H, K]
    u64 cu;           // const i64* [nseq + 1] token offsets
    u64 cmp;          // const i64* [nseq + 1] compressed-row offsets
    u64 tiles;        // const i64* [nseq + 1] query-tile offsets (tile mode)
    u64 counts;       // const i64* [rows_q, H] per-token n_sel ("fla"; 0: the integer n_sel)
    u64 out;          // int* [rows_q or tiles, H or HQ, S]
    i64 nseq;
    i64 rows;         // tokens ("fla") or tiles (tile mode)
    i64 hq;
    i64 h;
    i64 k;
    i64 bs;
    i64 s;            // slots per row
    i64 n_sel;        // the integer block_counts
    i64 qt;           // q_tile_size
    i64 causal;
    double scale;
};

// A ranked entry: better = higher score, then lower index.
template <typename Acc> struct Ranked {
    Acc score;
    int idx;
};
template <typename Acc> __device__ __forceinline__ bool better(const Ranked<Acc>& x, const Ranked<Acc>& y) {
    return x.score > y.score || (x.score == y.score && x.idx < y.idx);
}
template <typename Acc> __device__ __forceinline__ Ranked<Acc> shfl_xor(const Ranked<Acc>& x, int m) {
    return Ranked<Acc>{__shfl_xor_sync(0xffffffffu, x.score, m), __shfl_xor_sync(0xffffffffu, x.idx, m)};
}
template <typename Acc> __device__ __forceinline__ Ranked<Acc> shfl(const Ranked<Acc>& x, int src) {
    return Ranked<Acc>{__shfl_sync(0xffffffffu, x.score, src), __shfl_sync(0xffffffffu, x.idx, src)};
}

// Bitonic sort of one entry per lane, best first.
template <typename Acc> __device__ __forceinline__ Ranked<Acc> warp_sort(Ranked<Acc> x, int lane) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const Ranked<Acc> o = shfl_xor(x, j);
            const bool keep_better = ((lane & j) == 0) == ((lane & k) == 0);
            if (keep_better ? better(o, x) : better(x, o)) x = o;
        }
    }
    return x;
}

// Merges the sorted lists top (best first, the running list) and chunk (one entry per lane,
// unsorted): the 32 best of both, best first.
template <typename Acc>
__device__ __forceinline__ Ranked<Acc> warp_merge_top(Ranked<Acc> top, Ranked<Acc> chunk, int lane) {
    chunk = warp_sort(chunk, lane);
    const Ranked<Acc> rev = shfl(chunk, 31 - lane);
    Ranked<Acc> x = better(rev, top) ? rev : top;  // a bitonic sequence holding the 32 best
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) {
        const Ranked<Acc> o = shfl_xor(x, j);
        const bool keep_better = (lane & j) == 0;
        if (keep_better ? better(o, x) : better(x, o)) x = o;
    }
    return x;
}

__device__ __forceinline__ i64 last_leq(const i64* __restrict__ off, i64 n, i64 r) {
    i64 lo = 0, hi = n - 1;
    while (lo < hi) {
        const i64 mid = (lo + hi + 1) >> 1;
        if (off[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename Acc> __device__ __forceinline__ Acc neg_inf();
template <> __device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf() { return __longlong_as_double(0xfff0000000000000ULL); }
template <typename Acc> __device__ __forceinline__ Acc exp_acc(Acc x);
template <> __device__ __forceinline__ float exp_acc(float x) { return expf(x); }
template <> __device__ __forceinline__ double exp_acc(double x) { return exp(x); }
template <typename Acc> __device__ __forceinline__ Acc log_acc(Acc x);
template <> __device__ __forceinline__ float log_acc(float x) { return logf(x); }
template <> __device__ __forceinline__ double log_acc(double x) { return log(x); }

// acc[g] = q_s[g0 + g] . kc[0..K) for g < GB (rows past G give 0), q_s in shared memory. With
// K a multiple of P (16 bytes of T), P features of the key row at a time, each query row's P
// features one 16-byte shared-memory load (a broadcast: every lane reads the same address).
template <typename T, typename Acc>
__device__ __forceinline__ void group_dots(const T* __restrict__ q_s, const T* __restrict__ kc, i64 k, int g0,
                                           int gn, Acc (&acc)[SEL_GB]) {
    constexpr int P = VMax<T>::N;
#pragma unroll
    for (int g = 0; g < SEL_GB; ++g) acc[g] = (Acc)0;
    if (k % P == 0) {
        for (i64 d = 0; d < k; d += P) {
            Acc kv[P];
            widen_vec(*reinterpret_cast<const Vec<T, P>*>(kc + d), kv);
#pragma unroll
            for (int g = 0; g < SEL_GB; ++g) {
                if (g < gn) {
                    Acc qv[P];
                    widen_vec(*reinterpret_cast<const Vec<T, P>*>(q_s + (g0 + g) * k + d), qv);
#pragma unroll
                    for (int j = 0; j < P; ++j) acc[g] += qv[j] * kv[j];
                }
            }
        }
        return;
    }
    for (i64 d = 0; d < k; ++d) {
        const Acc kv = (Acc)widen(kc[d]);
#pragma unroll
        for (int g = 0; g < SEL_GB; ++g)
            if (g < gn) acc[g] += (Acc)widen(q_s[(g0 + g) * k + d]) * kv;
    }
}

template <typename T, typename Acc>
__device__ __forceinline__ void select_fla(const SelectArgs& a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    const i64 G = a.hq / a.h;
    // [wpb][G] lse values, then (16-byte aligned) [wpb][G][K] query rows
    Acc* lse_s = reinterpret_cast<Acc*>(smem) + (i64)w * G;
    const i64 lse_bytes = ((i64)wpb * G * (i64)sizeof(Acc) + 15) & ~(i64)15;
    T* q_s = reinterpret_cast<T*>(smem + lse_bytes) + (i64)w * G * a.k;
    const i64 t = (i64)blockIdx.x * wpb + w;
    const i64 h = blockIdx.y;
    if (t >= a.rows) return;
    const i64* cu = reinterpret_cast<const i64*>(a.cu);
    const i64* cmp = reinterpret_cast<const i64*>(a.cmp);
    const i64 n = last_leq(cu, a.nseq, t);
    const i64 p = t - cu[n];
    const i64 ic = p / a.bs, nc = (p + 1) / a.bs;
    const T* q = reinterpret_cast<const T*>(a.q) + (t * a.hq + h * G) * a.k;
    for (i64 i = lane; i < G * a.k; i += 32) q_s[i] = q[i];
    __syncwarp();
    const T* kbase = reinterpret_cast<const T*>(a.k_cmp) + (cmp[n] * a.h + h) * a.k;
    const i64 kstride = a.h * a.k;
    const Acc scale = (Acc)a.scale;
    const Acc ninf = neg_inf<Acc>();
    // pass 1: lse per query head
    for (int g0 = 0; g0 < G; g0 += SEL_GB) {
        const int gn = (int)min((i64)SEL_GB, G - g0);
        Acc m[SEL_GB], s[SEL_GB];
#pragma unroll
        for (int g = 0; g < SEL_GB; ++g) { m[g] = ninf; s[g] = (Acc)0; }
        for (i64 c = lane; c < nc; c += 32) {
            Acc z[SEL_GB];
            group_dots<T, Acc>(q_s, kbase + c * kstride, a.k, g0, gn, z);
#pragma unroll
            for (int g = 0; g < SEL_GB; ++g) {
                const Acc zz = z[g] * scale;
                if (zz > m[g]) { s[g] = s[g] * exp_acc(m[g] - zz) + (Acc)1; m[g] = zz; }
                else s[g] += exp_acc(zz - m[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < SEL_GB; ++g) {
            Acc mx = m[g];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            Acc sum = (m[g] == ninf) ? (Acc)0 : s[g] * exp_acc(m[g] - mx);
            sum = warp_sum(sum);
            if (lane == 0 && g < gn) lse_s[g0 + g] = mx + log_acc(sum);
        }
    }
    __syncwarp();
    // pass 2: scores of the candidates 0..IC, merged into the running top-32
    Ranked<Acc> top{(Acc)-1, 0x7fffffff};
    for (i64 c0 = 0; c0 <= ic; c0 += 32) {
        const i64 c = c0 + lane;
        Ranked<Acc> e{(Acc)-1, 0x7fffffff};
        if (c <= ic) {
            Acc score = (Acc)0;
            if (c < nc) {
                for (int g0 = 0; g0 < G; g0 += SEL_GB) {
                    const int gn = (int)min((i64)SEL_GB, G - g0);
                    Acc z[SEL_GB];
                    group_dots<T, Acc>(q_s, kbase + c * kstride, a.k, g0, gn, z);
#pragma unroll
                    for (int g = 0; g < SEL_GB; ++g)
                        if (g < gn) score += exp_acc(z[g] * scale - lse_s[g0 + g]);
                }
                score /= (Acc)G;
            }
            if (c == 0 || c == ic || c == ic - 1) score = (Acc)1;
            e = Ranked<Acc>{score, (int)c};
        }
        top = warp_merge_top(top, e, lane);
    }
    i64 n_sel = a.n_sel;
    if (a.counts) n_sel = reinterpret_cast<const i64*>(a.counts)[t * a.h + h];
    const i64 m_take = min(n_sel, ic + 1);
    int* out = reinterpret_cast<int*>(a.out) + (t * a.h + h) * a.s;
    if (lane < a.s) out[lane] = lane < m_take ? top.idx : -1;
}

template <typename T, typename Acc>
__device__ __forceinline__ void select_tile_mean(const SelectArgs& a) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    Acc* qbar = reinterpret_cast<Acc*>(smem) + (i64)w * a.k;
    const i64 tile = (i64)blockIdx.x * wpb + w;
    const i64 hq = blockIdx.y;
    if (tile >= a.rows) return;
    const i64* cu = reinterpret_cast<const i64*>(a.cu);
    const i64* cmp = reinterpret_cast<const i64*>(a.cmp);
    const i64* tiles = reinterpret_cast<const i64*>(a.tiles);
    const i64 n = last_leq(tiles, a.nseq, tile);
    const i64 i = tile - tiles[n];
    const i64 tc = cmp[n + 1] - cmp[n];
    const i64 G = a.hq / a.h;
    const T* q = reinterpret_cast<const T*>(a.q) + ((cu[n] + i * a.qt) * a.hq + hq) * a.k;
    const Acc inv = (Acc)1 / (Acc)a.qt;
    for (i64 d = lane; d < a.k; d += 32) {
        Acc sum = (Acc)0;
        for (i64 r = 0; r < a.qt; ++r) sum += (Acc)widen(q[r * a.hq * a.k + d]);
        qbar[d] = sum * inv;
    }
    __syncwarp();
    const T* kbase = reinterpret_cast<const T*>(a.k_cmp) + (cmp[n] * a.h + hq / G) * a.k;
    const i64 kstride = a.h * a.k;
    const Acc scale = (Acc)a.scale;
    const Acc ninf = neg_inf<Acc>();
    Ranked<Acc> top{ninf, 0x7fffffff};
    for (i64 j0 = 0; j0 < tc; j0 += 32) {
        const i64 j = j0 + lane;
        Ranked<Acc> e{ninf, 0x7fffffff};
        if (j < tc) {
            Acc s = (Acc)0;
            const T* kc = kbase + j * kstride;
            for (i64 d = 0; d < a.k; ++d) s += qbar[d] * (Acc)widen(kc[d]);
            const bool allowed = !a.causal || j * a.bs < (i + 1) * a.qt;
            e = Ranked<Acc>{allowed ? s * scale : ninf, (int)j};
        }
        top = warp_merge_top(top, e, lane);
    }
    // taken -inf entries and phantoms become block 0; the row sorted ascending
    const int v = lane < a.s ? (top.score == ninf ? 0 : top.idx) : 0x7fffffff;
    Ranked<Acc> asc{(Acc)0, v};  // equal scores: ordered by index ascending
    asc = warp_sort(asc, lane);
    int* out = reinterpret_cast<int*>(a.out) + (tile * a.hq + hq) * a.s;
    if (lane < a.s) out[lane] = asc.idx;
}

#define SELECT_KERNELS(TIN, ACC, IN)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) nsa_select_blocks_fla_##IN(const SelectArgs a) { \
        select_fla<TIN, ACC>(a);                                                                      \
    }                                                                                                 \
    extern "C" __global__ void __launch_bounds__(256) nsa_select_blocks_tile_mean_##IN(const SelectArgs a) { \
        select_tile_mean<TIN, ACC>(a);                                                                \
    }

SELECT_KERNELS(float, float, f32)
SELECT_KERNELS(double, double, f64)
SELECT_KERNELS(bf16, float, bf16)
SELECT_KERNELS(f16, float, f16)
