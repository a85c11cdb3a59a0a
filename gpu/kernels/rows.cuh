// Scans along the innermost (stride-1) axis: rows of `len` contiguous elements.
//
// A warp scans U chunks of 32 * VEC elements at a time: each lane loads VEC consecutive elements
// (one 16-byte access when VEC > 1), scans them in registers, the lane totals are scanned with
// shuffles, and a running carry links the chunks. `reverse` is handled by addressing: logical
// element e of a row is physical element len - 1 - e, so the scan itself always runs forward.
//
// Two kernels use it:
// - rows_warp: one warp per row (short rows, many of them);
// - rows_lookback: rows cut into tiles of LB_WARPS warps; a tile's exclusive prefix comes from a
//   single-pass look-back over the tiles before it in its row. The look-back is deterministic:
//   tiles form groups of 32, super-groups of 32 groups and hyper-groups of 32 super-groups; a
//   tile adds (inclusive prefix at the end of the previous hyper-group) + (aggregates of the
//   earlier super-groups of its hyper-group) + (of the earlier groups of its super-group) + (of
//   the earlier tiles of its group), always in the same order, so repeated launches give
//   bit-identical results whatever the scheduling. Aggregates are published as soon as a tile
//   has loaded its data, so the only serial chain is one hop per 32768 tiles.

#define LB_WARPS 8

struct RowArgs {
    u64 x;              // const Tin*
    u64 y;              // Tout*
    i64 rows;
    i64 len;
    i64 reverse;
    u64 status;         // Status<Acc>[4 * rows * tiles_per_row] (look-back only)
    i64 epoch;          // look-back: flags equal to this value are valid in this launch
    i64 tiles_per_row;  // look-back only
};

template <int VEC> struct RowU { static constexpr int U = VEC >= 8 ? 4 : 8; };
// Chunks per warp in a look-back tile (the host passes -DATTN_LB_U=N when $ATTN_LB_U is set,
// a tuning knob; it sizes the tiles with the same value).
#ifndef ATTN_LB_U
#define ATTN_LB_U 0
#endif
// Default: twice the row kernel's chunks for fp32 accumulation, the same for fp64 (registers).
template <int VEC, typename Acc> struct LbU {
    static constexpr int U = ATTN_LB_U > 0 ? ATTN_LB_U : (sizeof(Acc) == 8 ? 1 : 2) * RowU<VEC>::U;
};
// Resident look-back blocks per multiprocessor asked of the register allocator: bigger tiles
// (16 KB of fp32 per warp-chunk set) at 2 blocks beat smaller ones at 3-5 (NOTES.md, run 4).
#ifndef ATTN_LB_MIN_BLOCKS
#define ATTN_LB_MIN_BLOCKS 2
#endif

template <typename Tin, typename Acc, int VEC, int U> struct WarpTile {
    static constexpr int ELEMS = U * 32 * VEC;
    Acc v[U][VEC];

    // Loads logical elements [start, start + ELEMS) of a row (zeros past its end).
    __device__ __forceinline__ void load(const Tin* __restrict__ row, i64 len, i64 start, bool rev,
                                         int lane) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 e0 = start + (i64)(u * 32 + lane) * VEC;
            if (e0 < len) {
                Acc t[VEC];
                load_vec<Tin, Acc, VEC>(row + (rev ? len - e0 - VEC : e0), t);
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[u][k] = t[rev ? VEC - 1 - k : k];
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) v[u][k] = Acc(0);
            }
        }
    }

    // In-place inclusive scan of the ELEMS logical elements; returns their total in every lane.
    __device__ __forceinline__ Acc scan(int lane) {
        Acc carry = Acc(0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int k = 1; k < VEC; ++k) v[u][k] += v[u][k - 1];
            const Acc incl = warp_incl_scan(v[u][VEC - 1], lane);
            Acc ex = __shfl_up_sync(0xffffffffu, incl, 1);
            if (lane == 0) ex = Acc(0);
            const Acc off = carry + ex;
#pragma unroll
            for (int k = 0; k < VEC; ++k) v[u][k] = off + v[u][k];
            carry = carry + __shfl_sync(0xffffffffu, incl, 31);
        }
        return carry;
    }

    // Stores base + element for the valid logical elements of [start, start + ELEMS); STREAMING:
    // with the streaming hint (st.global.cs).
    template <bool STREAMING, typename Tout>
    __device__ __forceinline__ void store(Tout* __restrict__ row, i64 len, i64 start, bool rev,
                                          int lane, Acc base) const {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 e0 = start + (i64)(u * 32 + lane) * VEC;
            if (e0 < len) {
                Acc t[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) t[rev ? VEC - 1 - k : k] = base + v[u][k];
                store_vec<Tout, Acc, VEC, STREAMING>(row + (rev ? len - e0 - VEC : e0), t);
            }
        }
    }
};

// One warp per row, grid-stride over rows.
template <typename Tin, typename Tout, typename Acc, int VEC>
__device__ __forceinline__ void rows_warp(const RowArgs& a) {
    constexpr int U = RowU<VEC>::U;
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const bool rev = a.reverse != 0;
    for (i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        const Tin* x = reinterpret_cast<const Tin*>(a.x) + r * a.len;
        Tout* y = reinterpret_cast<Tout*>(a.y) + r * a.len;
        Acc carry = Acc(0);
        for (i64 s = 0; s < a.len; s += WarpTile<Tin, Acc, VEC, U>::ELEMS) {
            WarpTile<Tin, Acc, VEC, U> w;
            w.load(x, a.len, s, rev, lane);
            const Acc tot = w.scan(lane);
            w.template store<false>(y, a.len, s, rev, lane, carry);
            carry = carry + tot;
        }
    }
}

// A look-back status word: `epoch` tags the value as published in this launch. fp32 packs
// both into one 64-bit word (a single access, no fence); fp64 stores the value, then the flag
// with release semantics, and reads the flag with acquire semantics.
template <typename Acc> struct Status;
template <> struct alignas(8) Status<float> { u64 w; };
template <> struct alignas(16) Status<double> { unsigned flag; unsigned pad; double val; };

__device__ __forceinline__ void publish(Status<float>* s, float v, unsigned epoch) {
    const u64 w = ((u64)epoch << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(&s->w), "l"(w) : "memory");
}
__device__ __forceinline__ void publish(Status<double>* s, double v, unsigned epoch) {
    *reinterpret_cast<volatile double*>(&s->val) = v;
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&s->flag), "r"(epoch) : "memory");
}

__device__ __forceinline__ u64 load_word(const Status<float>* s) {
    u64 w;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(&s->w));
    return w;
}

// The four look-back levels of one tile. level(i) = sum over the warp of the value published
// at at[i] by the lanes where need[i] holds, waiting until each is published. fp32: the
// constructor issues every lane's (up to) four loads before any wait, so the levels cost one
// round trip; fp64 reads each level in turn.
template <typename Acc> struct Gather;
template <> struct Gather<float> {
    const Status<float>* const (&at)[4];
    unsigned epoch;
    u64 w[4];
    __device__ __forceinline__ Gather(const Status<float>* const (&at_)[4], const bool (&need)[4],
                                      unsigned epoch_)
        : at(at_), epoch(epoch_) {
        const u64 ready = (u64)epoch << 32;  // value 0.0f
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = need[i] ? load_word(at[i]) : ready;
    }
    __device__ __forceinline__ float level(int i) {
        while ((unsigned)(w[i] >> 32) != epoch) w[i] = load_word(at[i]);
        return warp_sum(__uint_as_float((unsigned)w[i]));
    }
};
template <> struct Gather<double> {
    const Status<double>* const (&at)[4];
    const bool (&need)[4];
    unsigned epoch;
    __device__ __forceinline__ Gather(const Status<double>* const (&at_)[4], const bool (&need_)[4],
                                      unsigned epoch_)
        : at(at_), need(need_), epoch(epoch_) {}
    __device__ __forceinline__ double level(int i) {
        double v = 0.0;
        if (need[i]) {
            unsigned f;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(&at[i]->flag) : "memory");
            } while (f != epoch);
            v = *reinterpret_cast<const volatile double*>(&at[i]->val);
        }
        return warp_sum(v);
    }
};

// One block (LB_WARPS warps) per tile; blockIdx.x = row * tiles_per_row + tile. A tile waits
// only on tiles of lower index, which are dispatched before it.
template <typename Tin, typename Tout, typename Acc, int VEC>
__device__ __forceinline__ void rows_lookback(const RowArgs& a) {
    constexpr int U = LbU<VEC, Acc>::U;
    typedef WarpTile<Tin, Acc, VEC, U> W;
    constexpr i64 TILE = (i64)LB_WARPS * W::ELEMS;
    __shared__ Acc wsum[LB_WARPS];
    __shared__ Acc tile_excl;

    const i64 tile = blockIdx.x;
    const i64 row = tile / a.tiles_per_row;
    const i64 t = tile - row * a.tiles_per_row;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool rev = a.reverse != 0;
    const Tin* x = reinterpret_cast<const Tin*>(a.x) + row * a.len;
    Tout* y = reinterpret_cast<Tout*>(a.y) + row * a.len;
    const i64 start = t * TILE + (i64)warp * W::ELEMS;

    W w;
    w.load(x, a.len, start, rev, lane);
    const Acc wtot = w.scan(lane);
    if (lane == 0) wsum[warp] = wtot;
    __syncthreads();

    if (warp == 0) {
        const unsigned epoch = (unsigned)a.epoch;
        const i64 nt = a.rows * a.tiles_per_row;
        Status<Acc>* base = reinterpret_cast<Status<Acc>*>(a.status);
        // four regions of nt entries, each indexed by (row, index within the row)
        Status<Acc>* A = base + row * a.tiles_per_row;           // tile aggregates
        Status<Acc>* G = base + nt + row * a.tiles_per_row;      // group (32 tiles) aggregates
        Status<Acc>* S = base + 2 * nt + row * a.tiles_per_row;  // super (32 groups) aggregates
        Status<Acc>* P = base + 3 * nt + row * a.tiles_per_row;  // inclusive prefix per 32 supers

        const Acc wv = lane < LB_WARPS ? wsum[lane] : Acc(0);
        const Acc wincl = warp_incl_scan(wv, lane);
        Acc wex = __shfl_up_sync(0xffffffffu, wincl, 1);
        if (lane == 0) wex = Acc(0);
        const Acc agg = __shfl_sync(0xffffffffu, wincl, LB_WARPS - 1);
        if (lane == 0) publish(&A[t], agg, epoch);

        const i64 g = t >> 5, s = t >> 10, h = t >> 15;
        const int p = (int)(t & 31), gs = (int)(g & 31), sh = (int)(s & 31);
        // Lane l takes entry l of: the earlier tiles of this group, the earlier groups of this
        // super-group, the earlier super-groups of this hyper-group; lane 0 also the inclusive
        // prefix of the previous hyper-group. A group / super / hyper aggregate is published
        // by its last tile, from sums of the same values in the same order.
        const Status<Acc>* const at[4] = {&A[t - p + lane], &G[g - gs + lane], &S[s - sh + lane], &P[h - 1]};
        const bool need[4] = {lane < p, lane < gs, lane < sh, h > 0 && lane == 0};
        // aggregates are published as soon as their own inputs are in: no chain inside a hyper-group
        Gather<Acc> gather(at, need, epoch);
        const Acc in_group = gather.level(0);
        if (p == 31 && lane == 0) publish(&G[g], in_group + agg, epoch);
        const Acc in_super = gather.level(1);
        if (p == 31 && gs == 31 && lane == 0) publish(&S[s], (in_super + in_group) + agg, epoch);
        const Acc in_hyper = gather.level(2);
        const Acc before = gather.level(3);
        const Acc excl = ((before + in_hyper) + in_super) + in_group;
        if (p == 31 && gs == 31 && sh == 31 && lane == 0) publish(&P[h], excl + agg, epoch);
        if (lane < LB_WARPS) wsum[lane] = wex;
        if (lane == 0) tile_excl = excl;
    }
    __syncthreads();
    // streaming stores: +2 points of the copy ceiling on the H200 (NOTES.md, run 28)
    w.template store<true>(y, a.len, start, rev, lane, tile_excl + wsum[warp]);
}
