// `decode_attention` (`conformance/spec/ops-decode.md` §2), split-KV ("flash-decoding"), and the
// fused step (`kv_cache_update` then `decode_attention` in one launch); the math and the layout of
// a block are in decode_attend.cuh.
//
// Grid (nsplit, H_kv, B), sized from S, B, H_kv and the device only. Block (split, hk, b)
// handles keys [split * chunk, min((split + 1) * chunk, n)) for all R = G * L_q query rows of
// KV head hk, RB at a time. A split at or past n exits at once, so the work follows the valid
// lengths; keys at or past n are never read. Keys are loaded straight into registers.
//
// Combine: a row with one valid split (n <= chunk) is written directly by split 0. Otherwise
// every split writes its normalised partial (o_s, lse_s) to the scratch `part_o`
// [B * H_kv, nsplit, R, D], `part_lse` [B * H_kv, nsplit, R]; the last split of (b, hk) to
// finish (a counter per (b, hk), reset by that block for the next launch) merges them in split
// order.
//
// Bad rows (see decode.cuh) get o = NaN, lse = NaN, a flag bit, and no cache write.

// Loads the K and V pieces of keys j0 + u * KPW + grp (u < U) of this lane into kr, vr (zeros
// past `end`). Keys of this step (j >= n_old, fused step only) come from k_new / v_new and are
// written into the caches here, by the one lane group that owns them.
template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_load(const DecodeArgs& a, i64 j0, i64 end, i64 n_old, i64 cache_off,
                                            i64 new_off, int grp, int sub,
                                            Vec<T, W> (&kr)[DecodeGeo<T, DP, W, RB>::U][DecodeGeo<T, DP, W, RB>::NV],
                                            Vec<T, W> (&vr)[DecodeGeo<T, DP, W, RB>::U][DecodeGeo<T, DP, W, RB>::NV]) {
    typedef DecodeGeo<T, DP, W, RB> G;
    const i64 new_stride = a.h_kv * a.d;
#pragma unroll
    for (int u = 0; u < G::U; ++u) {
        const i64 j = j0 + u * G::KPW + grp;
        const bool fresh = j >= n_old;
        const T* ks = fresh ? reinterpret_cast<const T*>(a.k_new) + new_off + (j - n_old) * new_stride
                            : reinterpret_cast<const T*>(a.k_cache) + cache_off + j * a.stride_s;
        const T* vs = fresh ? reinterpret_cast<const T*>(a.v_new) + new_off + (j - n_old) * new_stride
                            : reinterpret_cast<const T*>(a.v_cache) + cache_off + j * a.stride_s;
#pragma unroll
        for (int v = 0; v < G::NV; ++v) {
            const int p = v * G::LK + sub;
#pragma unroll
            for (int e = 0; e < W; ++e) kr[u][v].v[e] = vr[u][v].v[e] = Narrow<T>::from(0.f);
            if (j < end && p * W < a.d) {
                kr[u][v] = load_stream<T, W>(ks + p * W);
                vr[u][v] = load_stream<T, W>(vs + p * W);
                if (fresh) {
                    T* kw = reinterpret_cast<T*>(a.k_cache) + cache_off + j * a.stride_s + p * W;
                    T* vw = reinterpret_cast<T*>(a.v_cache) + cache_off + j * a.stride_s + p * W;
                    *reinterpret_cast<Vec<T, W>*>(kw) = kr[u][v];
                    *reinterpret_cast<Vec<T, W>*>(vw) = vr[u][v];
                }
            }
        }
    }
}

template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_block(const DecodeArgs& a) {
    typedef DecodeGeo<T, DP, W, RB> G;
    typedef typename G::Acc Acc;
    __shared__ DecodeSmem<Acc, DP, RB> sm;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / G::LK, sub = lane % G::LK;
    const i64 split = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
    const Acc qscale = (Acc)a.scale_log2;
    Acc qf[RB][G::NE];
    decode_load_q<T, DP, W, RB>(a, b, hk, 0, sub, qscale, qf);
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
    Acc* part_o = reinterpret_cast<Acc*>(a.part_o);
    Acc* part_lse = reinterpret_cast<Acc*>(a.part_lse);

    for (i64 r0 = 0; r0 < rows; r0 += RB) {
        if (r0 > 0) decode_load_q<T, DP, W, RB>(a, b, hk, r0, sub, qscale, qf);
        DecodeState<Acc, RB, G::NE> st;
        st.init();
        i64 lim[RB];
        decode_visible<RB>(a, r0, rows, n, lim);
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) lim[rr] = min(end, lim[rr]);
        for (i64 j0 = begin + warp * (G::KPW * G::U); j0 < end; j0 += G::TK) {
            Vec<T, W> kr[G::U][G::NV], vr[G::U][G::NV];
            decode_load<T, DP, W, RB>(a, j0, end, n_old, cache_off, new_off, grp, sub, kr, vr);
            decode_keys<T, DP, W, RB>(qf, kr, vr, j0, grp, lim, st);
        }
        const i64 nrows = min((i64)RB, rows - r0), pr = (bh * a.nsplit + split) * rows + r0;
        decode_finish<T, DP, W, RB>(a, st, sm, b, hk, r0, nrows, single ? nullptr : part_o + pr * a.d,
                                    single ? nullptr : part_lse + pr);
    }
    if (single) return;
    // the last split of (b, hk) to finish merges the partials
    unsigned* counter = reinterpret_cast<unsigned*>(a.counters) + bh;
    if (!decode_arrive(counter, nsv, sm.last)) return;
    const i64 base = bh * a.nsplit * rows;
    decode_combine<T>(a, b, hk, part_lse + base, part_o + base * a.d, nsv, rows, 0, rows, sm.w, sm.red);
    if (threadIdx.x == 0) *counter = 0u;
}

// decode_attention_{dtype}_d{DP}_w{W}_r{RB}: DP the padded head dim (64, 128, 256), W the
// elements per load (16 bytes, or 1 for a head dim that is not a multiple of 16 bytes), RB the
// query rows held per pass.
#define DECODE_KERNEL(T, TAG, DP, W, RB)                                                      \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                             \
        decode_attention_##TAG##_d##DP##_w##W##_r##RB(const DecodeArgs a) {                  \
        decode_block<T, DP, W, RB>(a);                                                        \
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
