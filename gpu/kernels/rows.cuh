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
//   tiles form groups of 32 and super-groups of 32 groups; a tile adds (inclusive prefix at the
//   end of the previous super-group) + (aggregates of the earlier groups of its super-group) +
//   (aggregates of the earlier tiles of its group), always in the same order, so repeated
//   launches give bit-identical results whatever the scheduling.

#define LB_WARPS 8

struct RowArgs {
    u64 x;              // const Tin*
    u64 y;              // Tout*
    i64 rows;
    i64 len;
    i64 reverse;
    u64 status;         // Status<Acc>[3 * rows * tiles_per_row] (look-back only)
    i64 epoch;          // look-back: flags equal to this value are valid in this launch
    i64 tiles_per_row;  // look-back only
};

template <int VEC> struct RowU { static constexpr int U = VEC >= 8 ? 4 : 8; };

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

    // Stores base + element for the valid logical elements of [start, start + ELEMS).
    template <typename Tout>
    __device__ __forceinline__ void store(Tout* __restrict__ row, i64 len, i64 start, bool rev,
                                          int lane, Acc base) const {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 e0 = start + (i64)(u * 32 + lane) * VEC;
            if (e0 < len) {
                Acc t[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) t[rev ? VEC - 1 - k : k] = base + v[u][k];
                store_vec<Tout, Acc, VEC>(row + (rev ? len - e0 - VEC : e0), t);
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
            w.store(y, a.len, s, rev, lane, carry);
            carry = carry + tot;
        }
    }
}

template <typename Acc> struct alignas(16) Status {
    unsigned flag;
    unsigned pad;
    Acc val;
};

template <typename Acc> __device__ __forceinline__ void publish(Status<Acc>* s, Acc v, unsigned epoch) {
    *reinterpret_cast<volatile Acc*>(&s->val) = v;
    __threadfence();
    *reinterpret_cast<volatile unsigned*>(&s->flag) = epoch;
}

template <typename Acc> __device__ __forceinline__ Acc wait_read(const Status<Acc>* s, unsigned epoch) {
    while (*reinterpret_cast<const volatile unsigned*>(&s->flag) != epoch) {
    }
    __threadfence();
    return *reinterpret_cast<const volatile Acc*>(&s->val);
}

// One block (LB_WARPS warps) per tile; blockIdx.x = row * tiles_per_row + tile. A tile waits
// only on tiles of lower index, which are dispatched before it.
template <typename Tin, typename Tout, typename Acc, int VEC>
__device__ __forceinline__ void rows_lookback(const RowArgs& a) {
    constexpr int U = RowU<VEC>::U;
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
        const i64 gpr = (a.tiles_per_row + 31) / 32;       // groups per row
        const i64 spr = (gpr + 31) / 32;                   // super-groups per row
        Status<Acc>* A = reinterpret_cast<Status<Acc>*>(a.status) + row * a.tiles_per_row;
        Status<Acc>* G = reinterpret_cast<Status<Acc>*>(a.status) + nt + row * gpr;
        Status<Acc>* S = reinterpret_cast<Status<Acc>*>(a.status) + 2 * nt + row * spr;

        const Acc wv = lane < LB_WARPS ? wsum[lane] : Acc(0);
        const Acc wincl = warp_incl_scan(wv, lane);
        Acc wex = __shfl_up_sync(0xffffffffu, wincl, 1);
        if (lane == 0) wex = Acc(0);
        const Acc agg = __shfl_sync(0xffffffffu, wincl, LB_WARPS - 1);
        if (lane == 0) publish(&A[t], agg, epoch);

        const i64 g = t >> 5, s = t >> 10;
        const int p = (int)(t & 31), gs = (int)(g & 31);
        // earlier tiles of this group
        Acc in_group = lane < p ? wait_read(&A[t - p + lane], epoch) : Acc(0);
        in_group = warp_sum(in_group);
        if (p == 31 && lane == 0) publish(&G[g], in_group + agg, epoch);
        // earlier groups of this super-group
        Acc in_super = lane < gs ? wait_read(&G[g - gs + lane], epoch) : Acc(0);
        in_super = warp_sum(in_super);
        // inclusive prefix at the end of the previous super-group
        const Acc before = s > 0 ? wait_read(&S[s - 1], epoch) : Acc(0);
        const Acc excl = (before + in_super) + in_group;
        if (p == 31 && gs == 31 && lane == 0) publish(&S[s], excl + agg, epoch);
        if (lane < LB_WARPS) wsum[lane] = wex;
        if (lane == 0) tile_excl = excl;
    }
    __syncthreads();
    w.store(y, a.len, start, rev, lane, tile_excl + wsum[warp]);
}
