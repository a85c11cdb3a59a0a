// `decode_attention` (`conformance/spec/ops-decode.md` §2), split-KV ("flash-decoding"), and the
// fused step (`kv_cache_update` then `decode_attention` in one launch).
//
// For batch row b (cache row r, n valid keys), query i of L_q and head h (KV head hk = h / G,
// G = H / H_kv): the visible keys are j < n, and with `causal` j <= n - L_q + i; with
// s_j = scale * q[b,i,h,:] . k[r,j,hk,:]: o = sum_j softmax(s)_j v[r,j,hk,:],
// lse = log sum_j exp(s_j); no visible key gives o = 0, lse = -inf.
//
// Grid (nsplit, H_kv, B), sized from S, B, H_kv and the device only. Block (split, hk, b)
// handles keys [split * chunk, min((split + 1) * chunk, n)) for all R = G * L_q query rows of
// KV head hk (the G heads of one KV head share every K/V load). A split at or past n exits at
// once, so the work follows the valid lengths; keys at or past n are never read. Scores are
// kept in log2 units (q is scaled by scale * log2(e) once); fp32 accumulation (fp64 for fp64).
//
// Inside a block: DECODE_WARPS warps; a warp covers KPW keys per load instruction, LK lanes per
// key, each lane NV vectors of W elements (16 bytes) of a key row, so a key row is read as whole
// 16-byte pieces. Each warp walks its keys U at a time with its own online softmax per lane
// group (running max m, sum l, accumulator acc); the groups are merged by shuffles, the warps
// through shared memory. The pieces travel by cp.async through a per-thread ring in shared
// memory, STAGES - 1 steps ahead of the step being computed, so a warp keeps its next
// loads in flight while it computes (a read-bound kernel lives on the bytes in flight; loads
// into registers stalled every step on their own latency). Pieces narrower than 16 bytes (a
// head dim that is not a multiple of 16 bytes) load into registers step by step. Rows are taken
// RB at a time (several passes when R > RB).
//
// Combine: a row with one valid split (n <= chunk) is written directly by split 0. Otherwise
// every split writes its normalised partial (o_s, lse_s) to the scratch `part_o`, `part_lse`;
// the last split of (b, hk) to finish (a counter per (b, hk), reset by that block for the next
// launch) merges them in split order: lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s
// (deterministic: the order never depends on timing).
//
// Fused step (k_new != 0): n = cache_seqlens[b] + L_new; keys j >= cache_seqlens[b] are read from
// k_new/v_new [B, L_new, H_kv, D] and written into the caches by the block that owns them.
//
// Bad rows (see decode.cuh) get o = NaN, lse = NaN, a flag bit, and no cache write.

// Keys per lane group per step for up to 4 query rows (8 rows: 2).
#ifndef DECODE_U
#define DECODE_U 4
#endif
// The least rows per pass RB whose kernels use the ring (below: loads into registers; S11: the
// ring lost 5-10% on the 1-row kernels of HBM-bound rows, and won 7-10% at 4 rows).
#ifndef DECODE_RING_ROWS
#define DECODE_RING_ROWS 4
#endif
// Ring slots: 3 (2 steps queued while one computes), 2 when a slot exceeds 16 KB (D 256, fp64).
#define DECODE_RING_SLOT_MAX 16384
#define DECODE_WARPS 4
#define DECODE_THREADS (DECODE_WARPS * 32)
// Resident blocks per multiprocessor the register allocator must allow: the one-row kernels
// (RB = 1) and the others (tuning knobs through ATTN_NVRTC_OPTS, e.g.
// -DDECODE_MIN_BLOCKS_R1=5; 0: the compiler's choice, no .minnctapersm).
#ifndef DECODE_MIN_BLOCKS_R1
#define DECODE_MIN_BLOCKS_R1 0
#endif
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 0
#endif
// The most splits per row (the host keeps nsplit at or below it; the combine keeps one weight
// per split in shared memory).
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
    u64 part_o;    // float [B * H_kv, nsplit, R, D]
    u64 part_lse;  // float [B * H_kv, nsplit, R] (log2 units)
    u64 counters;  // unsigned [B * H_kv], zero between launches
    u64 flag;      // unsigned
    i64 lq, h, h_kv, d, s, b_cache, l_new;
    i64 stride_b, stride_h, stride_s;
    i64 chunk, nsplit, causal;
    double scale_log2; // softmax_scale * log2(e)
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

// Merges the partials of the nsv valid splits of (b, hk) into o and lse (the last block).
template <typename T>
__device__ void decode_combine(const DecodeArgs& a, i64 b, i64 hk, i64 nsv, typename AccOf<T>::type* w,
                               typename AccOf<T>::type* red) {
    typedef typename AccOf<T>::type Acc;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq, bh = b * a.h_kv + hk;
    const Acc* pl = reinterpret_cast<const Acc*>(a.part_lse) + bh * a.nsplit * rows;
    const Acc* po = reinterpret_cast<const Acc*>(a.part_o) + bh * a.nsplit * rows * a.d;
    for (i64 r = 0; r < rows; ++r) {
        Acc mx = DECODE_NEG_INF;
        for (i64 s = threadIdx.x; s < nsv; s += blockDim.x) mx = acc_max(mx, load_cg(pl + s * rows + r));
        mx = block_max(mx, red);
        Acc sum = 0.f;
        for (i64 s = threadIdx.x; s < nsv; s += blockDim.x) {
            const Acc x = mx == DECODE_NEG_INF ? 0.f : acc_exp2(load_cg(pl + s * rows + r) - mx);
            w[s] = x;
            sum += x;
        }
        sum = block_sum(sum, red); // its barriers publish w
        const i64 g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
        const Acc inv = sum > 0.f ? 1.f / sum : 0.f;
        for (i64 dd = threadIdx.x; dd < a.d; dd += blockDim.x) {
            Acc acc = 0.f;
#pragma unroll 8
            for (i64 s = 0; s < nsv; ++s) acc += w[s] * load_cg(po + (s * rows + r) * a.d + dd);
            reinterpret_cast<T*>(a.o)[((b * a.lq + i) * a.h + h) * a.d + dd] = Narrow<T>::from(acc * inv);
        }
        if (threadIdx.x == 0) {
            reinterpret_cast<float*>(a.lse)[(b * a.h + h) * a.lq + i] =
                sum > 0.f ? (mx + acc_log2(sum)) * (Acc)DECODE_LN2 : DECODE_NEG_INF;
        }
        __syncthreads(); // w is rewritten for the next row
    }
}

// The row of key j in `cache` (cache_off: the cache row and KV head), or in this step's new
// tokens `fresh_src` (new_off: the batch row and KV head, new_stride = H_kv D) when `fresh`
// (j >= n_old, fused step).
template <typename T>
__device__ __forceinline__ const T* decode_source(const DecodeArgs& a, u64 cache, u64 fresh_src, bool fresh, i64 j,
                                                  i64 n_old, i64 cache_off, i64 new_off, i64 new_stride) {
    return fresh ? reinterpret_cast<const T*>(fresh_src) + new_off + (j - n_old) * new_stride
                 : reinterpret_cast<const T*>(cache) + cache_off + j * a.stride_s;
}

// Writes piece p of this step's key j (fused step) into the caches.
template <typename T, int W>
__device__ __forceinline__ void decode_store_fresh(const DecodeArgs& a, i64 cache_off, i64 j, int p, const Vec<T, W>& k,
                                                   const Vec<T, W>& v) {
    T* kw = reinterpret_cast<T*>(a.k_cache) + cache_off + j * a.stride_s + p * W;
    T* vw = reinterpret_cast<T*>(a.v_cache) + cache_off + j * a.stride_s + p * W;
    *reinterpret_cast<Vec<T, W>*>(kw) = k;
    *reinterpret_cast<Vec<T, W>*>(vw) = v;
}

// Loads the K and V pieces of keys j0 + u * KPW + grp (u < U) of this lane into kr, vr (zeros
// past `end`). Keys of this step (j >= n_old, fused step only) come from k_new / v_new and are
// written into the caches here, by the one lane group that owns them.
template <typename T, int W, int U, int NV, int LK, int KPW>
__device__ __forceinline__ void decode_load(const DecodeArgs& a, i64 j0, i64 end, i64 n_old, i64 cache_off,
                                            i64 new_off, int grp, int sub, Vec<T, W> (&kr)[U][NV],
                                            Vec<T, W> (&vr)[U][NV]) {
    const i64 new_stride = a.h_kv * a.d;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const i64 j = j0 + u * KPW + grp;
        const bool fresh = j >= n_old;
        const T* ks = decode_source<T>(a, a.k_cache, a.k_new, fresh, j, n_old, cache_off, new_off, new_stride);
        const T* vs = decode_source<T>(a, a.v_cache, a.v_new, fresh, j, n_old, cache_off, new_off, new_stride);
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const int p = v * LK + sub;
#pragma unroll
            for (int e = 0; e < W; ++e) kr[u][v].v[e] = vr[u][v].v[e] = Narrow<T>::from(0.f);
            if (j < end && p * W < a.d) {
                kr[u][v] = load_stream<T, W>(ks + p * W);
                vr[u][v] = load_stream<T, W>(vs + p * W);
                if (fresh) decode_store_fresh<T, W>(a, cache_off, j, p, kr[u][v], vr[u][v]);
            }
        }
    }
}

// The asynchronous form of decode_load for 16-byte pieces: queues the same pieces of keys
// j0 + u * KPW + grp into this thread's slot of the ring (zero-filled past `end` and past D),
// piece c of the slot at ring + (c * DECODE_THREADS + tid) * 16 bytes (K pieces c = u * NV + v,
// V pieces U * NV + u * NV + v: a warp's 16-byte accesses are consecutive, free of bank
// conflicts). Each thread later reads back only what it queued itself, so the ring needs no
// barrier, only cp.async.wait_group. Fresh keys (fused step) are also copied into the caches.
template <typename T, int W, int U, int NV, int LK, int KPW>
__device__ __forceinline__ void decode_issue(const DecodeArgs& a, i64 j0, i64 end, i64 n_old, i64 cache_off,
                                             i64 new_off, int grp, int sub, unsigned slot) {
    const i64 new_stride = a.h_kv * a.d;
    const unsigned tid16 = threadIdx.x * 16u;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const i64 j = j0 + u * KPW + grp;
        const bool fresh = j >= n_old;
        const T* ks = decode_source<T>(a, a.k_cache, a.k_new, fresh, j, n_old, cache_off, new_off, new_stride);
        const T* vs = decode_source<T>(a, a.v_cache, a.v_new, fresh, j, n_old, cache_off, new_off, new_stride);
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            const int p = v * LK + sub;
            const bool in = j < end && p * W < a.d;
            const unsigned kd = slot + (unsigned)((u * NV + v) * DECODE_THREADS) * 16u + tid16;
            const unsigned vd = kd + (unsigned)(U * NV * DECODE_THREADS) * 16u;
            // past the end: nothing read (a valid address, 0 source bytes), 16 zero bytes written
            cp_async16(kd, in ? ks + p * W : reinterpret_cast<const T*>(a.k_cache), in ? 16 : 0);
            cp_async16(vd, in ? vs + p * W : reinterpret_cast<const T*>(a.v_cache), in ? 16 : 0);
            if (in && fresh)
                decode_store_fresh<T, W>(a, cache_off, j, p, *reinterpret_cast<const Vec<T, W>*>(ks + p * W),
                                         *reinterpret_cast<const Vec<T, W>*>(vs + p * W));
        }
    }
}

// Reads back this thread's pieces of a ring slot (see decode_issue).
template <typename T, int W, int U, int NV>
__device__ __forceinline__ void decode_take(const unsigned char* slot, Vec<T, W> (&kr)[U][NV], Vec<T, W> (&vr)[U][NV]) {
    const unsigned char* base = slot + threadIdx.x * 16u;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
            kr[u][v] = *reinterpret_cast<const Vec<T, W>*>(base + (u * NV + v) * DECODE_THREADS * 16);
            vr[u][v] = *reinterpret_cast<const Vec<T, W>*>(base + ((U + u) * NV + v) * DECODE_THREADS * 16);
        }
    }
}

// Loads this lane's features of query rows r0 .. r0 + RB (scaled to log2 units; zeros past the
// last row). Needs no length: issued before the lengths arrive.
template <typename T, int W, int RB, int NV, int LK, int NE>
__device__ __forceinline__ void decode_load_q(const DecodeArgs& a, i64 b, i64 hk, i64 r0, int sub,
                                              typename AccOf<T>::type qscale,
                                              typename AccOf<T>::type (&qf)[RB][NE]) {
    typedef typename AccOf<T>::type Acc;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        const i64 r = r0 + rr;
#pragma unroll
        for (int e = 0; e < NE; ++e) qf[rr][e] = 0.f;
        if (r < rows) {
            const i64 g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
            const T* qr = reinterpret_cast<const T*>(a.q) + ((b * a.lq + i) * a.h + h) * a.d;
#pragma unroll
            for (int v = 0; v < NV; ++v) {
                const int p = v * LK + sub;
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

template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_block(const DecodeArgs& a) {
    typedef typename AccOf<T>::type Acc;
    constexpr int CH = DP / W;                 // W-element pieces of a padded key row
    constexpr int LK = CH < 32 ? CH : 32;      // lanes per key
    constexpr int NV = CH / LK;                // pieces per lane
    constexpr int KPW = 32 / LK;               // keys per warp instruction
    constexpr int NE = NV * W;                 // features per lane
    constexpr int U = RB >= 8 ? 2 : DECODE_U; // keys per lane group per step
    __shared__ Acc sm_acc[DECODE_WARPS][RB][DP];
    __shared__ Acc sm_m[DECODE_WARPS][RB], sm_l[DECODE_WARPS][RB];
    __shared__ Acc sm_w[DECODE_MAX_SPLITS];
    __shared__ Acc sm_red[DECODE_WARPS];
    __shared__ int sm_last;
    // the ring of 16-byte pieces (dynamic shared memory: STAGES slots of 2 U NV pieces per
    // thread; `attention_kernel` on the host); narrower pieces (W = 1) load into registers
    constexpr bool RING = sizeof(Vec<T, W>) == 16 && RB >= DECODE_RING_ROWS;
    constexpr unsigned slot_bytes = 2u * U * NV * DECODE_THREADS * 16u;
    constexpr int STAGES = slot_bytes <= DECODE_RING_SLOT_MAX ? 3 : 2;
    extern __shared__ __align__(16) unsigned char decode_ring[];
    const unsigned char* ring_ptr = decode_ring;
    const unsigned ring = smem_u32(decode_ring);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LK, sub = lane % LK;
    const i64 split = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
    const Acc qscale = (Acc)a.scale_log2;
    Acc qf[RB][NE];
    decode_load_q<T, W, RB, NV, LK, NE>(a, b, hk, 0, sub, qscale, qf);
    i64 n_old, crow;
    const unsigned bad = decode_row(reinterpret_cast<const int*>(a.seqlens), reinterpret_cast<const int*>(a.batch_idx),
                                    b, a.l_new, a.s, a.b_cache, n_old, crow);
    if (bad) {
        if (split == 0) {
            if (threadIdx.x == 0) atomicOr(reinterpret_cast<unsigned*>(a.flag), bad);
            decode_fill<T>(a, b, hk, DECODE_NAN, DECODE_NAN);
        }
        return;
    }
    const i64 n = n_old + a.l_new;
    const i64 begin = split * a.chunk;
    if (begin >= n) {
        if (split == 0) decode_fill<T>(a, b, hk, 0.f, DECODE_NEG_INF);
        return;
    }
    const i64 end = min(begin + a.chunk, n);
    const i64 nsv = (n + a.chunk - 1) / a.chunk;
    const bool single = nsv == 1;
    const i64 bh = b * a.h_kv + hk;
    const i64 cache_off = crow * a.stride_b + hk * a.stride_h;
    const i64 new_off = b * a.l_new * a.h_kv * a.d + hk * a.d;

    for (i64 r0 = 0; r0 < rows; r0 += RB) {
        if (r0 > 0) decode_load_q<T, W, RB, NV, LK, NE>(a, b, hk, r0, sub, qscale, qf);
        Acc acc[RB][NE], m[RB], l[RB];
        i64 lim[RB];
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            const i64 r = r0 + rr;
            m[rr] = DECODE_NEG_INF;
            l[rr] = 0.f;
            lim[rr] = begin;
#pragma unroll
            for (int e = 0; e < NE; ++e) acc[rr][e] = 0.f;
            if (r < rows) {
                const i64 i = r % a.lq;
                const i64 vis = a.causal ? max((i64)0, min(n, n - a.lq + i + 1)) : n;
                lim[rr] = min(end, vis);
            }
        }
        const i64 step = DECODE_WARPS * KPW * U, first = begin + warp * (KPW * U);
        // ring: STAGES - 1 steps queued ahead of the one computed
        i64 jq = first;
        if constexpr (RING) {
#pragma unroll
            for (int st = 0; st + 1 < STAGES; ++st, jq += step) {
                if (jq < end) decode_issue<T, W, U, NV, LK, KPW>(a, jq, end, n_old, cache_off, new_off, grp, sub, ring + st * slot_bytes);
                cp_async_commit();
            }
        }
        int slot = 0;
        for (i64 j0 = first; j0 < end; j0 += step) {
            Vec<T, W> kr[U][NV], vr[U][NV];
            if constexpr (RING) {
                // the slot computed last step takes the step STAGES - 1 ahead of this one; the
                // warp barrier orders this thread's reads of that slot (decode_take) before the
                // copies that overwrite it (cp.async is not ordered with earlier loads otherwise)
                const int back = slot == 0 ? STAGES - 1 : slot - 1;
                __syncwarp();
                if (jq < end) decode_issue<T, W, U, NV, LK, KPW>(a, jq, end, n_old, cache_off, new_off, grp, sub, ring + back * slot_bytes);
                cp_async_commit();
                jq += step;
                cp_async_wait<STAGES - 1>();
                decode_take<T, W, U, NV>(ring_ptr + slot * slot_bytes, kr, vr);
                slot = slot + 1 == STAGES ? 0 : slot + 1;
            } else {
                decode_load<T, W, U, NV, LK, KPW>(a, j0, end, n_old, cache_off, new_off, grp, sub, kr, vr);
            }
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
                Acc mx = m[rr];
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 j = j0 + u * KPW + grp;
                    if (j >= lim[rr]) sc[u][rr] = DECODE_NEG_INF;
                    mx = acc_max(mx, sc[u][rr]);
                }
                if (mx == DECODE_NEG_INF) continue; // nothing visible yet
                const Acc alpha = acc_exp2(m[rr] - mx);
                Acc p[U];
                Acc ps = 0.f;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    p[u] = acc_exp2(sc[u][rr] - mx);
                    ps += p[u];
                }
                l[rr] = l[rr] * alpha + ps;
                m[rr] = mx;
#pragma unroll
                for (int e = 0; e < NE; ++e) {
                    Acc x = acc[rr][e] * alpha;
#pragma unroll
                    for (int u = 0; u < U; ++u) x = fmaf(p[u], vf[u][e], x);
                    acc[rr][e] = x;
                }
            }
        }
        if constexpr (RING) cp_async_wait_all(); // the queued steps past the end are empty groups
        // merge the lane groups of the warp (keys interleaved by group)
#pragma unroll
        for (int off = LK; off < 32; off <<= 1) {
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) {
                const Acc m2 = __shfl_xor_sync(0xffffffffu, m[rr], off);
                const Acc l2 = __shfl_xor_sync(0xffffffffu, l[rr], off);
                const Acc mx = acc_max(m[rr], m2);
                const Acc a1 = mx == DECODE_NEG_INF ? 0.f : acc_exp2(m[rr] - mx);
                const Acc a2 = mx == DECODE_NEG_INF ? 0.f : acc_exp2(m2 - mx);
#pragma unroll
                for (int e = 0; e < NE; ++e) {
                    const Acc o2 = __shfl_xor_sync(0xffffffffu, acc[rr][e], off);
                    acc[rr][e] = acc[rr][e] * a1 + o2 * a2;
                }
                l[rr] = l[rr] * a1 + l2 * a2;
                m[rr] = mx;
            }
        }
        if (grp == 0) {
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) {
#pragma unroll
                for (int v = 0; v < NV; ++v) {
#pragma unroll
                    for (int e = 0; e < W; ++e) sm_acc[warp][rr][(v * LK + sub) * W + e] = acc[rr][v * W + e];
                }
                if (sub == 0) {
                    sm_m[warp][rr] = m[rr];
                    sm_l[warp][rr] = l[rr];
                }
            }
        }
        __syncthreads();
        // merge the warps; write the row (one split) or the split's partial
        const i64 nrows = min((i64)RB, rows - r0);
        for (i64 e = threadIdx.x; e < nrows * a.d; e += blockDim.x) {
            const int rr = (int)(e / a.d);
            const i64 dd = e - (i64)rr * a.d, r = r0 + rr;
            Acc mx = sm_m[0][rr];
#pragma unroll
            for (int w = 1; w < DECODE_WARPS; ++w) mx = acc_max(mx, sm_m[w][rr]);
            Acc sum = 0.f, out = 0.f;
            if (mx != DECODE_NEG_INF) {
#pragma unroll
                for (int w = 0; w < DECODE_WARPS; ++w) {
                    const Acc f = acc_exp2(sm_m[w][rr] - mx);
                    sum += sm_l[w][rr] * f;
                    out += sm_acc[w][rr][dd] * f;
                }
                out /= sum;
            }
            const Acc lse2 = mx == DECODE_NEG_INF ? DECODE_NEG_INF : mx + acc_log2(sum);
            if (single) {
                const i64 g = r / a.lq, i = r - g * a.lq, h = hk * g_count + g;
                reinterpret_cast<T*>(a.o)[((b * a.lq + i) * a.h + h) * a.d + dd] = Narrow<T>::from(out);
                if (dd == 0) {
                    reinterpret_cast<float*>(a.lse)[(b * a.h + h) * a.lq + i] =
                        lse2 == DECODE_NEG_INF ? DECODE_NEG_INF : lse2 * (Acc)DECODE_LN2;
                }
            } else {
                const i64 pr = (bh * a.nsplit + split) * rows + r;
                reinterpret_cast<Acc*>(a.part_o)[pr * a.d + dd] = out;
                if (dd == 0) reinterpret_cast<Acc*>(a.part_lse)[pr] = lse2;
            }
        }
        __syncthreads(); // shared memory is reused by the next rows
    }
    if (single) return;
    // the last split of (b, hk) to finish merges the partials
    __threadfence();
    __syncthreads();
    unsigned* counter = reinterpret_cast<unsigned*>(a.counters) + bh;
    if (threadIdx.x == 0) sm_last = atomicAdd(counter, 1u) == (unsigned)(nsv - 1);
    __syncthreads();
    if (!sm_last) return;
    __threadfence();
    decode_combine<T>(a, b, hk, nsv, sm_w, sm_red);
    if (threadIdx.x == 0) *counter = 0u;
}

// A diagnostic, off by default (the kernels are unchanged without it): with -DDECODE_TIMELINE
// (through ATTN_NVRTC_OPTS) thread 0 of every block records, at linear block id i < the table
// size, its start and end on %globaltimer (ns) and its multiprocessor: decode_timeline[3 i ..
// 3 i + 2] = (start, end, smid). The host reads it with attn_gpu::decode::timeline (bench_gpu
// --decode-timeline): how the blocks of one launch fill the multiprocessors over time (ramp,
// waves, tail).
#ifdef DECODE_TIMELINE
#define DECODE_TIMELINE_BLOCKS (1 << 18)
__device__ unsigned long long decode_timeline[3 * DECODE_TIMELINE_BLOCKS];
__device__ __forceinline__ unsigned long long decode_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define DECODE_TL_BEGIN const unsigned long long tl_start = decode_now();
#define DECODE_TL_END                                                                          \
    if (threadIdx.x == 0) {                                                                   \
        const unsigned long long i =                                                          \
            blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z); \
        unsigned sm;                                                                          \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                      \
        if (i < DECODE_TIMELINE_BLOCKS) {                                                     \
            decode_timeline[3 * i] = tl_start;                                                \
            decode_timeline[3 * i + 1] = decode_now();                                        \
            decode_timeline[3 * i + 2] = sm;                                                  \
        }                                                                                     \
    }
#else
#define DECODE_TL_BEGIN
#define DECODE_TL_END
#endif

// decode_attention_{dtype}_d{DP}_w{W}_r{RB}: DP the padded head dim (64, 128, 256), W the
// elements per load (16 bytes, or 1 for a head dim that is not a multiple of 16 bytes), RB the
// query rows held per pass.
#define DECODE_KERNEL(T, TAG, DP, W, RB)                                                      \
    extern "C" __global__ void                                                                \
    __launch_bounds__(DECODE_THREADS, RB == 1 ? DECODE_MIN_BLOCKS_R1 : DECODE_MIN_BLOCKS)     \
        decode_attention_##TAG##_d##DP##_w##W##_r##RB(const DecodeArgs a) {                  \
        DECODE_TL_BEGIN                                                                       \
        decode_block<T, DP, W, RB>(a);                                                        \
        DECODE_TL_END                                                                         \
    }
#define DECODE_ROWS(T, TAG, DP, W)   \
    DECODE_KERNEL(T, TAG, DP, W, 1) \
    DECODE_KERNEL(T, TAG, DP, W, 2) \
    DECODE_KERNEL(T, TAG, DP, W, 4) \
    DECODE_KERNEL(T, TAG, DP, W, 8)
#define DECODE_DTYPE(T, TAG, W)       \
    DECODE_ROWS(T, TAG, 64, W)        \
    DECODE_ROWS(T, TAG, 128, W)       \
    DECODE_ROWS(T, TAG, 256, W)       \
    DECODE_ROWS(T, TAG, 256, 1)

// fp64 (fp64 accumulation): at most 4 rows per pass (shared memory)
#define DECODE_ROWS_F64(DP, W)             \
    DECODE_KERNEL(double, f64, DP, W, 1) \
    DECODE_KERNEL(double, f64, DP, W, 2) \
    DECODE_KERNEL(double, f64, DP, W, 4)

DECODE_ROWS_F64(64, 2)
DECODE_ROWS_F64(128, 2)
DECODE_ROWS_F64(256, 2)
DECODE_ROWS_F64(256, 1)
DECODE_DTYPE(bf16, bf16, 8)
DECODE_DTYPE(f16, f16, 8)
DECODE_DTYPE(float, f32, 4)
