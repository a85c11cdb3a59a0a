// `nsa_select_blocks` (`conformance/spec/ops-nsa.md` §4), both modes. Scores in Acc (fp32, fp64 for
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

// ---- mode "fla" on tensor cores (bf16 / f16, G a multiple of 16, K a multiple of 16) ----
//
// select_fla_mma<T, KS, MG>: a warp per (token, KV head) as select_fla, the logits of MG m16
// tiles of query heads against n8 tiles of 8 blocks by mma.sync m16n8k16 (fp32 accumulation:
// the products of the input values are exact), KS = K / 16 steps. The query fragments stay in
// registers for both passes; the key fragments are read from global memory (L1: the warps of a
// block are consecutive tokens of one head). Lane (group = lane / 4, quad = lane % 4) holds the
// logits of rows group, group + 8 of each m tile and columns 2 quad, 2 quad + 1 of the n tile.

template <typename T> __device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);
template <> __device__ __forceinline__ void mma16816<bf16>(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<f16>(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned ld32(const void* p) { return __ldg(reinterpret_cast<const unsigned*>(p)); }

// z[m][0..4] = the scaled logits of n tile c0 (columns past nc: -inf).
template <typename T, int KS, int MG>
__device__ __forceinline__ void tile_logits(const unsigned (&qa)[MG][KS][4], const T* __restrict__ kbase, i64 kstride,
                                            i64 c0, i64 nc, int group, int quad, float scale, float (&z)[MG][4]) {
#pragma unroll
    for (int m = 0; m < MG; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j) z[m][j] = 0.f;
    const i64 c = c0 + group;
    const T* kr = kbase + min(c, nc - 1) * kstride + quad * 2;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        const unsigned b0 = ld32(kr + s * 16), b1 = ld32(kr + s * 16 + 8);
#pragma unroll
        for (int m = 0; m < MG; ++m) mma16816<T>(z[m], qa[m][s], b0, b1);
    }
    const float ninf = neg_inf<float>();
    const bool ok0 = c0 + quad * 2 < nc, ok1 = c0 + quad * 2 + 1 < nc;
#pragma unroll
    for (int m = 0; m < MG; ++m) {
        z[m][0] = ok0 ? z[m][0] * scale : ninf;
        z[m][1] = ok1 ? z[m][1] * scale : ninf;
        z[m][2] = ok0 ? z[m][2] * scale : ninf;
        z[m][3] = ok1 ? z[m][3] * scale : ninf;
    }
}

__device__ __forceinline__ void online(float& m, float& s, float z) {
    if (z > m) { s = s * __expf(m - z) + 1.f; m = z; }
    else if (z != neg_inf<float>()) s += __expf(z - m);
}

template <typename T, int KS, int MG>
__device__ __forceinline__ void select_fla_mma(const SelectArgs& a) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    const int group = lane >> 2, quad = lane & 3;
    const i64 t = (i64)blockIdx.x * wpb + w;
    const i64 h = blockIdx.y;
    if (t >= a.rows) return;
    const i64* cu = reinterpret_cast<const i64*>(a.cu);
    const i64* cmp = reinterpret_cast<const i64*>(a.cmp);
    const i64 n = last_leq(cu, a.nseq, t);
    const i64 p = t - cu[n];
    const i64 ic = p / a.bs, nc = (p + 1) / a.bs;
    const i64 K = KS * 16, G = MG * 16;
    const T* q = reinterpret_cast<const T*>(a.q) + (t * a.hq + h * G) * K;
    unsigned qa[MG][KS][4];
#pragma unroll
    for (int m = 0; m < MG; ++m)
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            const T* r0 = q + (m * 16 + group) * K + s * 16 + quad * 2;
            const T* r1 = r0 + 8 * K;
            qa[m][s][0] = ld32(r0);
            qa[m][s][1] = ld32(r1);
            qa[m][s][2] = ld32(r0 + 8);
            qa[m][s][3] = ld32(r1 + 8);
        }
    const T* kbase = reinterpret_cast<const T*>(a.k_cmp) + (cmp[n] * a.h + h) * K;
    const i64 kstride = a.h * K;
    const float scale = (float)a.scale;
    const float ninf = neg_inf<float>();
    // pass 1: lse of rows (group, group + 8) of each m tile
    float mx[MG][2], sm[MG][2];
#pragma unroll
    for (int m = 0; m < MG; ++m) { mx[m][0] = mx[m][1] = ninf; sm[m][0] = sm[m][1] = 0.f; }
    for (i64 c0 = 0; c0 < nc; c0 += 8) {
        float z[MG][4];
        tile_logits<T, KS, MG>(qa, kbase, kstride, c0, nc, group, quad, scale, z);
#pragma unroll
        for (int m = 0; m < MG; ++m) {
            online(mx[m][0], sm[m][0], z[m][0]);
            online(mx[m][0], sm[m][0], z[m][1]);
            online(mx[m][1], sm[m][1], z[m][2]);
            online(mx[m][1], sm[m][1], z[m][3]);
        }
    }
    float lse[MG][2];
#pragma unroll
    for (int m = 0; m < MG; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float M = mx[m][r];
            M = max(M, __shfl_xor_sync(0xffffffffu, M, 1));
            M = max(M, __shfl_xor_sync(0xffffffffu, M, 2));
            float S = mx[m][r] == ninf ? 0.f : sm[m][r] * __expf(mx[m][r] - M);
            S += __shfl_xor_sync(0xffffffffu, S, 1);
            S += __shfl_xor_sync(0xffffffffu, S, 2);
            lse[m][r] = M + __logf(S);
        }
    // pass 2: column sums of exp(z - lse), 4 n tiles (32 candidates) per merge
    const float inv_g = 1.f / (float)G;
    Ranked<float> top{-1.f, 0x7fffffff};
    for (i64 c0 = 0; c0 <= ic; c0 += 32) {
        float sc[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            sc[i][0] = sc[i][1] = 0.f;
            const i64 ct = c0 + i * 8;
            if (ct < nc) {
                float z[MG][4];
                tile_logits<T, KS, MG>(qa, kbase, kstride, ct, nc, group, quad, scale, z);
#pragma unroll
                for (int m = 0; m < MG; ++m) {
                    sc[i][0] += __expf(z[m][0] - lse[m][0]) + __expf(z[m][2] - lse[m][1]);
                    sc[i][1] += __expf(z[m][1] - lse[m][0]) + __expf(z[m][3] - lse[m][1]);
                }
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    sc[i][j] += __shfl_xor_sync(0xffffffffu, sc[i][j], 4);
                    sc[i][j] += __shfl_xor_sync(0xffffffffu, sc[i][j], 8);
                    sc[i][j] += __shfl_xor_sync(0xffffffffu, sc[i][j], 16);
                }
            }
        }
        // lane L takes column L of the 32: tile L / 8, column L % 8, held by lane (L % 8) / 2
        float mine = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float v = __shfl_sync(0xffffffffu, sc[i][j], (lane & 7) >> 1);
                if ((lane >> 3) == i && (lane & 1) == j) mine = v;
            }
        const i64 c = c0 + lane;
        Ranked<float> e{-1.f, 0x7fffffff};
        if (c <= ic) {
            float score = c < nc ? mine * inv_g : 0.f;
            if (c == 0 || c == ic || c == ic - 1) score = 1.f;
            e = Ranked<float>{score, (int)c};
        }
        top = warp_merge_top(top, e, lane);
    }
    i64 n_sel = a.n_sel;
    if (a.counts) n_sel = reinterpret_cast<const i64*>(a.counts)[t * a.h + h];
    const i64 m_take = min(n_sel, ic + 1);
    int* out = reinterpret_cast<int*>(a.out) + (t * a.h + h) * a.s;
    if (lane < a.s) out[lane] = lane < m_take ? top.idx : -1;
}

#define SELECT_MMA_KERNEL(TIN, IN, KS, MG) \
    extern "C" __global__ void __launch_bounds__(256) nsa_select_blocks_fla_mma_k##KS##_m##MG##_##IN(const SelectArgs a) { \
        select_fla_mma<TIN, KS, MG>(a); \
    }
#define SELECT_MMA_KERNELS(TIN, IN)                                                   \
    SELECT_MMA_KERNEL(TIN, IN, 4, 1) SELECT_MMA_KERNEL(TIN, IN, 8, 1) SELECT_MMA_KERNEL(TIN, IN, 16, 1) \
    SELECT_MMA_KERNEL(TIN, IN, 4, 2) SELECT_MMA_KERNEL(TIN, IN, 8, 2) SELECT_MMA_KERNEL(TIN, IN, 4, 4)
SELECT_MMA_KERNELS(bf16, bf16)
SELECT_MMA_KERNELS(f16, f16)

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
