// The attention pieces shared by the two `decode_attention` kernels (`conformance/spec/ops-decode.md`
// §2): the split-KV grid of decode_attention.cu and the persistent walk of decode_walk.cu.
//
// For batch row b (cache row r, n valid keys), query i of L_q and head h (KV head hk = h / G,
// G = H / H_kv): the visible keys are j < n, and with `causal` j <= n - L_q + i; with
// s_j = scale * q[b,i,h,:] . k[r,j,hk,:]: o = sum_j softmax(s)_j v[r,j,hk,:],
// lse = log sum_j exp(s_j); no visible key gives o = 0, lse = -inf. Scores are kept in log2
// units (q is scaled by scale * log2(e) once); fp32 accumulation (fp64 for fp64).
//
// A block handles one KV head's R = G * L_q query rows, RB at a time (a "pass"): the G heads
// of one KV head share every K/V load. DECODE_WARPS warps; a warp covers KPW keys per load
// instruction, LK lanes per key, each lane NV vectors of W elements (16 bytes) of a key row, so
// a key row is read as whole 16-byte pieces. A block step covers TK = DECODE_WARPS * KPW * U
// keys (U per lane group); each warp keeps its own online softmax per lane group (running max m,
// sum l, accumulator acc); the groups are merged by shuffles, the warps through shared memory.
//
// Partial results of a key range (o_s normalised, lse_s in log2 units) are merged in a fixed
// order: lse = log2 sum_s 2^lse_s, o = sum_s 2^(lse_s - lse) o_s (deterministic).
//
// Fused step (k_new != 0): n = cache_seqlens[b] + L_new; keys j >= cache_seqlens[b] are read from
// k_new/v_new [B, L_new, H_kv, D] and written into the caches by the lane that reads them.

// Keys per lane group per step for up to 4 query rows (8 rows: 2).
#ifndef DECODE_U
#define DECODE_U 4
#endif
#define DECODE_WARPS 4
#define DECODE_THREADS (DECODE_WARPS * 32)
// The most partial results merged for one (row, KV head, pass) (one weight each in shared memory).
#define DECODE_MAX_SPLITS 1024

struct DecodeArgs {
    u64 q;         // [B, L_q, H, D]
    u64 k_cache;   // cache layout, strides below
    u64 v_cache;
    u64 k_new;     // [B, L_new, H_kv, D] or 0 (plain attention)
    u64 v_new;
    u64 seqlens;   // const int* [B]
    u64 batch_idx; // const int* [B] or 0
    u64 o;         // [B, L_q, H, D], dtype of q
    u64 lse;       // float [B, H, L_q]
    u64 part_o;    // partial outputs (accumulator type), layout of the kernel
    u64 part_lse;  // their lse (log2 units)
    u64 counters;  // unsigned, one per combined unit, zero between launches
    u64 flag;      // unsigned
    i64 batch, lq, h, h_kv, d, s, b_cache, l_new;
    i64 stride_b, stride_h, stride_s;
    i64 chunk, nsplit, causal; // split kernel: keys per split, splits
    i64 npass, min_portion;    // walk kernel: passes of RB rows, least keys per block
    double scale_log2; // softmax_scale * log2(e)
};

// Compile-time geometry of a (dtype, padded head dim DP, elements per load W, rows per pass RB).
template <typename T, int DP, int W, int RB> struct DecodeGeo {
    typedef typename AccOf<T>::type Acc;
    static constexpr int CH = DP / W;                 // W-element pieces of a padded key row
    static constexpr int LK = CH < 32 ? CH : 32;      // lanes per key
    static constexpr int NV = CH / LK;                // pieces per lane
    static constexpr int KPW = 32 / LK;               // keys per warp instruction
    static constexpr int NE = NV * W;                 // features per lane
    static constexpr int U = RB >= 8 ? 2 : DECODE_U; // keys per lane group per step
    static constexpr int TK = DECODE_WARPS * KPW * U; // keys per block step
};

// Running state of one pass: per row, the lane's accumulator, running max and sum.
template <typename Acc, int RB, int NE> struct DecodeState {
    Acc acc[RB][NE], m[RB], l[RB];
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            m[rr] = DECODE_NEG_INF;
            l[rr] = 0.f;
#pragma unroll
            for (int e = 0; e < NE; ++e) acc[rr][e] = 0.f;
        }
    }
};

// Shared memory of the merge across warps.
template <typename Acc, int DP, int RB> struct DecodeSmem {
    Acc acc[DECODE_WARPS][RB][DP];
    Acc m[DECODE_WARPS][RB], l[DECODE_WARPS][RB];
    Acc w[DECODE_MAX_SPLITS];
    Acc red[DECODE_WARPS];
    int last;
};

// Writes o = val, lse = lse_val for every row of (b, hk).
template <typename T>
__device__ void decode_fill(const DecodeArgs& a, i64 b, i64 hk, float val, float lse_val) {
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
    for (i64 e = threadIdx.x; e < rows * a.d; e += blockDim.x) {
        const i64 r = e / a.d, dd = e - r * a.d, g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
        reinterpret_cast<T*>(a.o)[((b * a.lq + i) * a.h + h) * a.d + dd] = Narrow<T>::from(val);
        if (dd == 0) reinterpret_cast<float*>(a.lse)[(b * a.h + h) * a.lq + i] = lse_val;
    }
}

template <typename Acc> __device__ __forceinline__ Acc block_max(Acc v, Acc* red) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = acc_max(v, __shfl_xor_sync(0xffffffffu, v, off));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int w = 1; w < DECODE_WARPS; ++w) v = acc_max(v, red[w]);
    return v;
}

template <typename Acc> __device__ __forceinline__ Acc block_sum(Acc v, Acc* red) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int w = 1; w < DECODE_WARPS; ++w) v += red[w];
    return v;
}

// Merges nsv partials of query rows r0 .. r0 + nrows of (b, hk) into o and lse: partial s of
// local row r at pl[s * stride + r], po[(s * stride + r) * D ..] (written by other blocks of
// this launch: read through L2).
template <typename T>
__device__ void decode_combine(const DecodeArgs& a, i64 b, i64 hk, const typename AccOf<T>::type* pl,
                               const typename AccOf<T>::type* po, i64 nsv, i64 stride, i64 r0, i64 nrows,
                               typename AccOf<T>::type* w, typename AccOf<T>::type* red) {
    typedef typename AccOf<T>::type Acc;
    const i64 g_count = a.h / a.h_kv;
    for (i64 r = 0; r < nrows; ++r) {
        Acc mx = DECODE_NEG_INF;
        for (i64 s = threadIdx.x; s < nsv; s += blockDim.x) mx = acc_max(mx, load_cg(pl + s * stride + r));
        mx = block_max(mx, red);
        Acc sum = 0.f;
        for (i64 s = threadIdx.x; s < nsv; s += blockDim.x) {
            const Acc x = mx == DECODE_NEG_INF ? 0.f : acc_exp2(load_cg(pl + s * stride + r) - mx);
            w[s] = x;
            sum += x;
        }
        sum = block_sum(sum, red); // its barriers publish w
        const i64 rq = r0 + r, g = rq / a.lq, i = rq - g * a.lq, h = hk * g_count + g;
        const Acc inv = sum > 0.f ? 1.f / sum : 0.f;
        for (i64 dd = threadIdx.x; dd < a.d; dd += blockDim.x) {
            Acc acc = 0.f;
#pragma unroll 8
            for (i64 s = 0; s < nsv; ++s) acc += w[s] * load_cg(po + (s * stride + r) * a.d + dd);
            reinterpret_cast<T*>(a.o)[((b * a.lq + i) * a.h + h) * a.d + dd] = Narrow<T>::from(acc * inv);
        }
        if (threadIdx.x == 0) {
            reinterpret_cast<float*>(a.lse)[(b * a.h + h) * a.lq + i] =
                sum > 0.f ? (mx + acc_log2(sum)) * (Acc)DECODE_LN2 : DECODE_NEG_INF;
        }
        __syncthreads(); // w is rewritten for the next row
    }
}

// Loads this lane's features of query rows r0 .. r0 + RB (scaled to log2 units; zeros past the
// last row). Needs no length: issued before the lengths arrive.
template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_load_q(const DecodeArgs& a, i64 b, i64 hk, i64 r0, int sub,
                                              typename AccOf<T>::type qscale,
                                              typename AccOf<T>::type (&qf)[RB][DecodeGeo<T, DP, W, RB>::NE]) {
    typedef DecodeGeo<T, DP, W, RB> G;
    typedef typename G::Acc Acc;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        const i64 r = r0 + rr;
#pragma unroll
        for (int e = 0; e < G::NE; ++e) qf[rr][e] = 0.f;
        if (r < rows) {
            const i64 g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
            const T* qr = reinterpret_cast<const T*>(a.q) + ((b * a.lq + i) * a.h + h) * a.d;
#pragma unroll
            for (int v = 0; v < G::NV; ++v) {
                const int p = v * G::LK + sub;
                if (p * W < a.d) {
                    Acc x[W];
                    widen_vec(*reinterpret_cast<const Vec<T, W>*>(qr + p * W), x);
#pragma unroll
                    for (int e = 0; e < W; ++e) qf[rr][v * W + e] = x[e] * qscale;
                }
            }
        }
    }
}

// The visible end of each row of the pass at r0 (n keys): n, or with `causal` n - L_q + i + 1.
template <int RB> __device__ __forceinline__ void decode_visible(const DecodeArgs& a, i64 r0, i64 rows, i64 n, i64 (&vis)[RB]) {
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        const i64 r = r0 + rr;
        vis[rr] = 0;
        if (r < rows) {
            const i64 i = r % a.lq;
            vis[rr] = a.causal ? max((i64)0, min(n, n - a.lq + i + 1)) : n;
        }
    }
}

// One block step of a lane: keys j0 + u * KPW + grp (u < U), already in kr / vr, against the RB
// rows of qf; keys at or past lim[rr] are invisible to row rr.
template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_keys(const typename AccOf<T>::type (&qf)[RB][DecodeGeo<T, DP, W, RB>::NE],
                                            const Vec<T, W> (&kr)[DecodeGeo<T, DP, W, RB>::U][DecodeGeo<T, DP, W, RB>::NV],
                                            const Vec<T, W> (&vr)[DecodeGeo<T, DP, W, RB>::U][DecodeGeo<T, DP, W, RB>::NV],
                                            i64 j0, int grp, const i64 (&lim)[RB],
                                            DecodeState<typename AccOf<T>::type, RB, DecodeGeo<T, DP, W, RB>::NE>& st) {
    typedef DecodeGeo<T, DP, W, RB> G;
    typedef typename G::Acc Acc;
    constexpr int U = G::U, NV = G::NV, NE = G::NE, LK = G::LK, KPW = G::KPW;
    Acc sc[U][RB];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        Acc kf[NE];
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            Acc x[W];
            widen_vec(kr[u][v], x);
#pragma unroll
            for (int e = 0; e < W; ++e) kf[v * W + e] = x[e];
        }
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            Acc s = 0.f;
#pragma unroll
            for (int e = 0; e < NE; ++e) s = fmaf(qf[rr][e], kf[e], s);
            sc[u][rr] = s;
        }
    }
#pragma unroll
    for (int off = LK / 2; off > 0; off >>= 1) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) sc[u][rr] += __shfl_xor_sync(0xffffffffu, sc[u][rr], off);
        }
    }
    Acc vf[U][NE];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            Acc x[W];
            widen_vec(vr[u][v], x);
#pragma unroll
            for (int e = 0; e < W; ++e) vf[u][v * W + e] = x[e];
        }
    }
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        Acc mx = st.m[rr];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 j = j0 + u * KPW + grp;
            if (j >= lim[rr]) sc[u][rr] = DECODE_NEG_INF;
            mx = acc_max(mx, sc[u][rr]);
        }
        if (mx == DECODE_NEG_INF) continue; // nothing visible yet
        const Acc alpha = acc_exp2(st.m[rr] - mx);
        Acc p[U];
        Acc ps = 0.f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            p[u] = acc_exp2(sc[u][rr] - mx);
            ps += p[u];
        }
        st.l[rr] = st.l[rr] * alpha + ps;
        st.m[rr] = mx;
#pragma unroll
        for (int e = 0; e < NE; ++e) {
            Acc x = st.acc[rr][e] * alpha;
#pragma unroll
            for (int u = 0; u < U; ++u) x = fmaf(p[u], vf[u][e], x);
            st.acc[rr][e] = x;
        }
    }
}

// Ends a pass: merges the lane groups (shuffles) and the warps (shared memory), then writes rows
// r0 .. r0 + nrows of (b, hk): into o and lse when po == 0, else the normalised partial of local
// row rr at po[rr * D ..], its lse (log2 units) at pl[rr]. Every thread of the block calls it.
template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_finish(const DecodeArgs& a, DecodeState<typename AccOf<T>::type, RB, DecodeGeo<T, DP, W, RB>::NE>& st,
                                              DecodeSmem<typename AccOf<T>::type, DP, RB>& sm, i64 b, i64 hk, i64 r0,
                                              i64 nrows, typename AccOf<T>::type* po, typename AccOf<T>::type* pl) {
    typedef DecodeGeo<T, DP, W, RB> G;
    typedef typename G::Acc Acc;
    constexpr int NV = G::NV, NE = G::NE, LK = G::LK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LK, sub = lane % LK;
    // merge the lane groups of the warp (keys interleaved by group)
#pragma unroll
    for (int off = LK; off < 32; off <<= 1) {
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            const Acc m2 = __shfl_xor_sync(0xffffffffu, st.m[rr], off);
            const Acc l2 = __shfl_xor_sync(0xffffffffu, st.l[rr], off);
            const Acc mx = acc_max(st.m[rr], m2);
            const Acc a1 = mx == DECODE_NEG_INF ? 0.f : acc_exp2(st.m[rr] - mx);
            const Acc a2 = mx == DECODE_NEG_INF ? 0.f : acc_exp2(m2 - mx);
#pragma unroll
            for (int e = 0; e < NE; ++e) {
                const Acc o2 = __shfl_xor_sync(0xffffffffu, st.acc[rr][e], off);
                st.acc[rr][e] = st.acc[rr][e] * a1 + o2 * a2;
            }
            st.l[rr] = st.l[rr] * a1 + l2 * a2;
            st.m[rr] = mx;
        }
    }
    if (grp == 0) {
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
#pragma unroll
            for (int v = 0; v < NV; ++v) {
#pragma unroll
                for (int e = 0; e < W; ++e) sm.acc[warp][rr][(v * LK + sub) * W + e] = st.acc[rr][v * W + e];
            }
            if (sub == 0) {
                sm.m[warp][rr] = st.m[rr];
                sm.l[warp][rr] = st.l[rr];
            }
        }
    }
    __syncthreads();
    const i64 g_count = a.h / a.h_kv;
    for (i64 e = threadIdx.x; e < nrows * a.d; e += blockDim.x) {
        const int rr = (int)(e / a.d);
        const i64 dd = e - (i64)rr * a.d, r = r0 + rr;
        Acc mx = sm.m[0][rr];
#pragma unroll
        for (int w = 1; w < DECODE_WARPS; ++w) mx = acc_max(mx, sm.m[w][rr]);
        Acc sum = 0.f, out = 0.f;
        if (mx != DECODE_NEG_INF) {
#pragma unroll
            for (int w = 0; w < DECODE_WARPS; ++w) {
                const Acc f = acc_exp2(sm.m[w][rr] - mx);
                sum += sm.l[w][rr] * f;
                out += sm.acc[w][rr][dd] * f;
            }
            out /= sum;
        }
        const Acc lse2 = mx == DECODE_NEG_INF ? DECODE_NEG_INF : mx + acc_log2(sum);
        if (po == nullptr) {
            const i64 g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
            reinterpret_cast<T*>(a.o)[((b * a.lq + i) * a.h + h) * a.d + dd] = Narrow<T>::from(out);
            if (dd == 0) {
                reinterpret_cast<float*>(a.lse)[(b * a.h + h) * a.lq + i] =
                    lse2 == DECODE_NEG_INF ? DECODE_NEG_INF : lse2 * (Acc)DECODE_LN2;
            }
        } else {
            po[rr * a.d + dd] = out;
            if (dd == 0) pl[rr] = lse2;
        }
    }
    __syncthreads(); // shared memory is reused by the next pass
}

// Counts one finished partial of a unit whose `total` partials are combined by the block that
// finishes last; true in that block (every thread), after a fence that makes the others' partials
// visible. The last block resets the counter (after the combine) for the next launch.
__device__ __forceinline__ bool decode_arrive(unsigned* counter, i64 total, int& sm_last) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sm_last = atomicAdd(counter, 1u) == (unsigned)(total - 1);
    __syncthreads();
    const bool last = sm_last != 0;
    if (last) __threadfence();
    return last;
}
