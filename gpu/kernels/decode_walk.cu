// `decode_attention` and the fused step as a persistent walk (issue 26): a fixed grid of G blocks
// (a few per multiprocessor, from the device only) shares the valid keys evenly, and each block
// streams its share through a ring of shared-memory stages filled by `cp.async`.
//
// Units and the global order. A unit is (b, hk, pass): KV head hk of batch row b, query rows
// pass * RB .. + RB; it has n_b keys (0 for a refused row). Units are laid end to end in the
// order (b, hk, pass), unit u = (b * H_kv + hk) * npass + pass starting at key position P_u; the
// total is T = sum_b n_b * H_kv * npass. Every block computes T and its range from the lengths
// in device memory (a block scan over B), so the grid and the arguments never depend on them
// (one captured graph serves every step):
//   p = roundup(max(ceil(T / G), min_portion), TK),  block i: positions [i p, min((i + 1) p, T)).
// Block i walks its range tile by tile (TK keys, never across units): the part of a unit inside
// one block is a segment. Empty rows are skipped without a read; keys past n_b are never read.
//
// Pipeline. 2 .. 7 tiles (as many as the launch's dynamic shared memory holds) of K and V ([TK][DP] each) live in dynamic shared memory; the block
// keeps stages - 1 tiles in flight (`cp.async.cg`, 16 bytes a thread, zero-filled past the
// segment) while it computes on the oldest; the loads run ahead across segment ends, so the
// epilogue of one segment overlaps the loads of the next. Head dims that are not a multiple of
// 16 bytes (W = 1) are staged with plain loads.
//
// Combine. A unit inside one block is written directly. Otherwise the segment of block i in
// unit u writes its partial to slot i + u (distinct: along the walk, i and u never decrease and
// one of them grows at each new segment), `part_o` [G + units, RB, D], `part_lse` [G + units, RB];
// the unit's segments are the blocks P_u / p .. (P_u + n_b - 1) / p, so its slots are contiguous,
// and the last block to finish it (a counter per unit, reset by that block) merges them in
// order, while the other blocks keep streaming.
//
// Rows with nothing to attend (n_b = 0) or refused (decode.cuh: flag bit, o = lse = NaN, no
// cache write) are written by block b mod G before the walk; a refused row's segments write
// nothing.

// cp.async of 16 bytes into shared memory, zero-filled when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `pending` (0 .. 6) groups of this thread are still in flight.
__device__ __forceinline__ void cp_async_wait(int pending) {
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    }
}

// Valid length of row b for the schedule: n_old + L_new, or 0 when a value is out of range (the
// repeated-index check is left to the row's segments and the fill pass).
__device__ __forceinline__ i64 walk_len(const DecodeArgs& a, i64 b) {
    const i64 n_old = __ldg(reinterpret_cast<const int*>(a.seqlens) + b);
    const i64 row = a.batch_idx ? (i64)__ldg(reinterpret_cast<const int*>(a.batch_idx) + b) : b;
    const bool ok = n_old >= 0 && n_old + a.l_new <= a.s && row >= 0 && row < a.b_cache;
    return ok ? n_old + a.l_new : 0;
}

// Inclusive block scan of v (thread order); `total` gets the block's sum. sm: DECODE_WARPS slots.
__device__ __forceinline__ i64 walk_scan(i64 v, i64* sm, i64& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_incl_scan(v, lane);
    __syncthreads();
    if (lane == 31) sm[warp] = v;
    __syncthreads();
    i64 pre = 0, tot = 0;
#pragma unroll
    for (int w = 0; w < DECODE_WARPS; ++w) {
        if (w < warp) pre += sm[w];
        tot += sm[w];
    }
    total = tot;
    return v + pre;
}

// A place in the walk: row b (length n), unit k of the row (hk * npass + pass), key j of the
// unit, global position pos, keys of the block's range left.
struct WalkCursor {
    i64 b, n, k, j, pos, left;
    // Keys of the current tile.
    __device__ __forceinline__ i64 tile(i64 tk) const { return min(tk, min(n - j, left)); }
    // Moves past `c` keys (the current tile): to the next unit, and past empty rows.
    __device__ __forceinline__ void advance(const DecodeArgs& a, i64 c) {
        j += c;
        pos += c;
        left -= c;
        if (left > 0 && j == n) {
            j = 0;
            if (++k == a.h_kv * a.npass) {
                k = 0;
                do {
                    n = walk_len(a, ++b);
                } while (n == 0); // left > 0: a non-empty row follows
            }
        }
    }
};

// Issues the cp.async of tile `c` (keys cur.j .. + c of the cursor's unit) into stage st_k / st_v.
template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void walk_issue(const DecodeArgs& a, const WalkCursor& cur, i64 c, T* st_k, T* st_v) {
    typedef DecodeGeo<T, DP, W, RB> G;
    constexpr int CH = G::CH;
    const i64 hk = cur.k / a.npass;
    const i64 n_old = cur.n - a.l_new;
    const i64 crow = a.batch_idx ? (i64)__ldg(reinterpret_cast<const int*>(a.batch_idx) + cur.b) : cur.b;
    const i64 cache_off = crow * a.stride_b + hk * a.stride_h;
    const i64 new_off = cur.b * a.l_new * a.h_kv * a.d + hk * a.d;
    const T* kc = reinterpret_cast<const T*>(a.k_cache);
    const T* vc = reinterpret_cast<const T*>(a.v_cache);
    for (int e = threadIdx.x; e < G::TK * CH; e += DECODE_THREADS) {
        const int key = e / CH, p = e - key * CH;
        const i64 j = cur.j + key;
        const bool valid = key < c && p * W < a.d;
        const bool fresh = j >= n_old;
        const T* ks = fresh ? reinterpret_cast<const T*>(a.k_new) + new_off + (j - n_old) * a.h_kv * a.d
                            : kc + cache_off + j * a.stride_s;
        const T* vs = fresh ? reinterpret_cast<const T*>(a.v_new) + new_off + (j - n_old) * a.h_kv * a.d
                            : vc + cache_off + j * a.stride_s;
        T* dk = st_k + key * DP + p * W;
        T* dv = st_v + key * DP + p * W;
        if constexpr (sizeof(Vec<T, W>) == 16) {
            cp_async16(dk, valid ? (const void*)(ks + p * W) : (const void*)kc, valid);
            cp_async16(dv, valid ? (const void*)(vs + p * W) : (const void*)vc, valid);
        } else {
            T zk = Narrow<T>::from(0.f), zv = zk;
            if (valid) {
                zk = ks[p * W];
                zv = vs[p * W];
            }
            *dk = zk;
            *dv = zv;
        }
    }
}

template <typename T, int DP, int W, int RB>
__device__ __forceinline__ void decode_walk(const DecodeArgs& a) {
    typedef DecodeGeo<T, DP, W, RB> G;
    typedef typename G::Acc Acc;
    constexpr int TK = G::TK, NV = G::NV, LK = G::LK, KPW = G::KPW, U = G::U;
    __shared__ DecodeSmem<Acc, DP, RB> sm;
    __shared__ i64 sm_scan[DECODE_WARPS];
    __shared__ i64 sm_loc[3];
    extern __shared__ __align__(16) unsigned char walk_stages[];
    T* stages = reinterpret_cast<T*>(walk_stages); // [stages][2][TK][DP]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LK, sub = lane % LK;
    const i64 nblk = gridDim.x, blk = blockIdx.x;
    const i64 g_count = a.h / a.h_kv, rows = g_count * a.lq;
    const i64 upr = a.h_kv * a.npass; // units per batch row
    const int* seqlens = reinterpret_cast<const int*>(a.seqlens);
    const int* batch_idx = reinterpret_cast<const int*>(a.batch_idx);

    // 1. rows with nothing to attend, and refused rows (block-uniform loop: decode_row votes)
    for (i64 b = blk; b < a.batch; b += nblk) {
        i64 n_old, crow;
        const unsigned bad = decode_row(seqlens, batch_idx, b, a.l_new, a.s, a.b_cache, n_old, crow);
        if (bad && threadIdx.x == 0) atomicOr(reinterpret_cast<unsigned*>(a.flag), bad);
        for (i64 hk = 0; hk < a.h_kv; ++hk) {
            if (bad) {
                decode_fill<T>(a, b, hk, DECODE_NAN, DECODE_NAN);
            } else if (n_old + a.l_new == 0) {
                decode_fill<T>(a, b, hk, 0.f, DECODE_NEG_INF);
            }
        }
    }

    // 2. the total T, this block's range, and where it starts
    i64 total = 0;
    for (i64 t0 = 0; t0 < a.batch; t0 += DECODE_THREADS) {
        const i64 b = t0 + threadIdx.x;
        i64 tot;
        walk_scan(b < a.batch ? walk_len(a, b) : 0, sm_scan, tot);
        total += tot;
    }
    total *= upr;
    i64 portion = max((total + nblk - 1) / nblk, a.min_portion);
    portion = (portion + TK - 1) / TK * TK;
    const i64 start = blk * portion;
    if (start >= total) return;
    if (threadIdx.x == 0) sm_loc[0] = -1;
    i64 base = 0;
    for (i64 t0 = 0; t0 < a.batch; t0 += DECODE_THREADS) {
        const i64 b = t0 + threadIdx.x;
        const i64 len = b < a.batch ? walk_len(a, b) : 0;
        i64 tot;
        const i64 inc = walk_scan(len * upr, sm_scan, tot);
        const i64 lo = base + inc - len * upr;
        if (len > 0 && lo <= start && start < base + inc) {
            sm_loc[0] = b;
            sm_loc[1] = len;
            sm_loc[2] = start - lo;
        }
        base += tot;
        __syncthreads();
        if (sm_loc[0] >= 0) break;
    }
    WalkCursor cur;
    cur.b = sm_loc[0];
    cur.n = sm_loc[1];
    cur.k = sm_loc[2] / cur.n;
    cur.j = sm_loc[2] - cur.k * cur.n;
    cur.pos = start;
    cur.left = min(portion, total - start);

    // 3. the walk: a ring of `stages` tiles, stages - 1 in flight
    // stages: as many as the dynamic shared memory holds (the host sizes it), at most 7
    const i64 stage_elems = 2 * TK * DP;
    unsigned dyn_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
    const int nst = (int)min((i64)7, (i64)dyn_bytes / (stage_elems * (i64)sizeof(T)));
    if (nst < 2) asm volatile("trap;"); // the host always gives two stages or more
    WalkCursor ld = cur;
    for (int s = 0; s < nst - 1; ++s) {
        if (ld.left > 0) {
            const i64 c = ld.tile(TK);
            walk_issue<T, DP, W, RB>(a, ld, c, stages + s * stage_elems, stages + s * stage_elems + TK * DP);
            ld.advance(a, c);
        }
        cp_async_commit();
    }

    const Acc qscale = (Acc)a.scale_log2;
    Acc qf[RB][G::NE];
    DecodeState<Acc, RB, G::NE> st;
    i64 vis[RB];
    i64 seg_j0 = 0, crow = 0, n_old = 0, hk = 0, r0 = 0, pass = 0;
    bool bad = false;
    Acc* part_o = reinterpret_cast<Acc*>(a.part_o);
    Acc* part_lse = reinterpret_cast<Acc*>(a.part_lse);
    bool seg_open = false;
    for (int t = 0; cur.left > 0; ++t) {
        cp_async_wait(nst - 2);
        __syncthreads(); // tile t is in, and every thread is done with tile t - 1
        {
            const int s = (t + nst - 1) % nst;
            if (ld.left > 0) {
                const i64 c = ld.tile(TK);
                walk_issue<T, DP, W, RB>(a, ld, c, stages + s * stage_elems, stages + s * stage_elems + TK * DP);
                ld.advance(a, c);
            }
            cp_async_commit();
        }
        if (!seg_open) { // a new segment: its unit's rows, q and visibility
            seg_open = true;
            seg_j0 = cur.j;
            hk = cur.k / a.npass;
            pass = cur.k - hk * a.npass;
            r0 = pass * RB;
            bad = decode_row(seqlens, batch_idx, cur.b, a.l_new, a.s, a.b_cache, n_old, crow) != 0;
            decode_load_q<T, DP, W, RB>(a, cur.b, hk, r0, sub, qscale, qf);
            decode_visible<RB>(a, r0, rows, n_old + a.l_new, vis);
            st.init();
        }
        const i64 c = cur.tile(TK);
        const T* tk = stages + (t % nst) * stage_elems;
        const T* tv = tk + TK * DP;
        if (!bad) {
            const i64 j0 = cur.j + warp * (KPW * U);
            Vec<T, W> kr[U][NV], vr[U][NV];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int key = warp * (KPW * U) + u * KPW + grp;
#pragma unroll
                for (int v = 0; v < NV; ++v) {
                    const int p = v * LK + sub;
                    kr[u][v] = *reinterpret_cast<const Vec<T, W>*>(tk + key * DP + p * W);
                    vr[u][v] = *reinterpret_cast<const Vec<T, W>*>(tv + key * DP + p * W);
                    const i64 j = cur.j + key;
                    if (a.k_new && pass == 0 && key < c && j >= n_old && p * W < a.d) { // fused step
                        const i64 off = crow * a.stride_b + hk * a.stride_h + j * a.stride_s + p * W;
                        *reinterpret_cast<Vec<T, W>*>(reinterpret_cast<T*>(a.k_cache) + off) = kr[u][v];
                        *reinterpret_cast<Vec<T, W>*>(reinterpret_cast<T*>(a.v_cache) + off) = vr[u][v];
                    }
                }
            }
            i64 lim[RB];
#pragma unroll
            for (int rr = 0; rr < RB; ++rr) lim[rr] = min(cur.j + c, vis[rr]);
            decode_keys<T, DP, W, RB>(qf, kr, vr, j0, grp, lim, st);
        }
        const i64 unit_start = cur.pos - cur.j, b = cur.b, n = cur.n, k = cur.k;
        const i64 seg_end = cur.j + c;
        cur.advance(a, c);
        if (seg_end < n && cur.left > 0) continue; // the segment goes on
        // the segment ends: write it
        seg_open = false;
        if (bad) continue;
        const i64 nrows = min((i64)RB, rows - r0);
        if (seg_j0 == 0 && seg_end == n) {
            decode_finish<T, DP, W, RB>(a, st, sm, b, hk, r0, nrows, nullptr, nullptr);
            continue;
        }
        const i64 u = b * upr + k;
        const i64 first = unit_start / portion, last = (unit_start + n - 1) / portion;
        decode_finish<T, DP, W, RB>(a, st, sm, b, hk, r0, nrows, part_o + (blk + u) * RB * a.d,
                                    part_lse + (blk + u) * RB);
        unsigned* counter = reinterpret_cast<unsigned*>(a.counters) + u;
        if (!decode_arrive(counter, last - first + 1, sm.last)) continue;
        decode_combine<T>(a, b, hk, part_lse + (first + u) * RB, part_o + (first + u) * RB * a.d, last - first + 1,
                          RB, r0, nrows, sm.w, sm.red);
        if (threadIdx.x == 0) *counter = 0u;
    }
    cp_async_wait(0);
}

// decode_walk_{dtype}_d{DP}_w{W}_r{RB}: as decode_attention_* (decode_attention.cu).
#define WALK_KERNEL(T, TAG, DP, W, RB)                                             \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                   \
        decode_walk_##TAG##_d##DP##_w##W##_r##RB(const DecodeArgs a) {             \
        decode_walk<T, DP, W, RB>(a);                                              \
    }
#define WALK_ROWS(T, TAG, DP, W)   \
    WALK_KERNEL(T, TAG, DP, W, 1) \
    WALK_KERNEL(T, TAG, DP, W, 2) \
    WALK_KERNEL(T, TAG, DP, W, 4) \
    WALK_KERNEL(T, TAG, DP, W, 8)
#define WALK_DTYPE(T, TAG, W)   \
    WALK_ROWS(T, TAG, 64, W)    \
    WALK_ROWS(T, TAG, 128, W)   \
    WALK_ROWS(T, TAG, 256, W)   \
    WALK_ROWS(T, TAG, 256, 1)

// fp64 (fp64 accumulation): at most 4 rows per pass (shared memory)
#define WALK_ROWS_F64(DP, W)             \
    WALK_KERNEL(double, f64, DP, W, 1) \
    WALK_KERNEL(double, f64, DP, W, 2) \
    WALK_KERNEL(double, f64, DP, W, 4)

WALK_ROWS_F64(64, 2)
WALK_ROWS_F64(128, 2)
WALK_ROWS_F64(256, 2)
WALK_ROWS_F64(256, 1)
WALK_DTYPE(bf16, bf16, 8)
WALK_DTYPE(f16, f16, 8)
WALK_DTYPE(float, f32, 4)
