// Chunk scans by tiles (`chunk_local_cumsum`, `kda_gate_chunk_cumsum`): one block scans one tile,
// the rows of one job (a chunk of at most parts * TILE_RP rows) over G = blockDim.x / parts lane
// groups of VEC adjacent lanes. The jobs and the lanes are those of the strided scan
// (StridedArgs, strided.cuh); `parts` (a power of two up to 16) is the number of row parts a
// tile is cut into, and G is a power of two of at least 16, so each half-warp reads 16 lane
// groups of one row: whole 32-byte sectors.
//
// Thread (p, g) owns the lanes of group g in the rows of part p: the scan-order positions
// i = p * TILE_RP .. (p + 1) * TILE_RP - 1 of the job (row i from the job's start, or from its
// end when reverse). It loads all its rows at once (TILE_RP loads in flight), applies the gate
// (a GATE form) and sums them; the part totals meet in shared memory; after one barrier the
// thread rescans its rows (the gated values kept in shared memory) starting from the sum of the
// totals of the parts before it, in part order, and stores with the streaming hint (the output
// is not read again):
//   o[i] = scale * ((T_0 + T_1 + ... + T_{p-1}) + x[p * TILE_RP] + ... + x[i]),
// a fixed order of additions, so the result is deterministic.
//
// Blocks live for one tile (a few memory latencies), so the GPU drains evenly at the end of the
// grid; a long-lived thread walking a whole chunk leaves a tail of partly idle multiprocessors.

// Rows per part (overridable with -DATTN_TILE_RP=N; the host reads the same knob).
#ifndef ATTN_TILE_RP
#define ATTN_TILE_RP 8
#endif

// Resident blocks per multiprocessor the register allocator must allow (tile kernels).
#ifndef ATTN_TILE_MIN_BLOCKS
#define ATTN_TILE_MIN_BLOCKS 4
#endif

// Dynamic shared memory (sized by the host, tile.rs): the part totals [part][k][group]
// (blockDim.x * VEC accumulators), then with a gate the gated values [u][thread][k]
// (TILE_RP * 256 * VEC accumulators: a fixed thread stride, so the offsets of rows are
// immediates, and one vector access per row). A warp's accesses hit distinct banks (two ways
// for the totals when G = 16: the half-warps are in different parts).
extern __shared__ __align__(16) unsigned char tile_smem[];

// Where thread (p, g) of a tile works: its first row (in scan order) at element `first`, the
// next ones `step` elements apart, `m` rows (0 for lanes past the last group), lanes c0 ...
struct TileAt {
    i64 first;
    i64 c0;
    int step;
    int m;
};

__device__ __forceinline__ TileAt tile_at(const StridedArgs& a, i64 tile, i64 slabs, int G, int g, int p, int vec) {
    constexpr int RP = ATTN_TILE_RP;
    const i64 job = div_fast(tile, slabs);
    const i64 cv = (tile - job * slabs) * G + g;
    TileAt t;
    t.c0 = cv * vec;
    i64 row0, n;
    if (a.job_row0) {
        row0 = reinterpret_cast<const i64*>(a.job_row0)[job];
        n = reinterpret_cast<const i64*>(a.job_len)[job];
    } else {
        const i64 b = div_fast(job, a.jobs_per_batch), k = job - b * a.jobs_per_batch;
        row0 = b * a.rows_per_batch + k * a.seg;
        n = min(a.seg, a.rows_per_batch - k * a.seg);
    }
    const i64 i0 = (i64)p * RP;
    t.m = cv < a.ncv ? (int)max((i64)0, min((i64)RP, n - i0)) : 0;
    // offsets within a part fit 32 bits (the host keeps cols * TILE_RP < 2^31)
    t.step = (int)a.cols;
    t.first = (row0 + i0) * a.cols + t.c0;
    if (a.reverse) {
        t.first = (row0 + n - 1 - i0) * a.cols + t.c0;
        t.step = -t.step;
    }
    return t;
}

// The first half of a tile for one thread: loads its rows (all at once), applies the gate (its
// constants loaded meanwhile) and sums them into `total`. For the rescan the gated values go to
// `kept` (holding them in registers would take twice the registers, recomputing them twice the
// gate arithmetic); without a gate the raw rows stay in `raw`. FULL: all TILE_RP rows are there
// (the usual case), so no row needs a guard.
template <bool FULL, typename Tin, typename Acc, int VEC, int GATE>
__device__ __forceinline__ void tile_gather(const StridedArgs& a, const TileAt& t, Vec<Tin, VEC> (&raw)[ATTN_TILE_RP],
                                            Vec<Acc, VEC>* kept, Acc (&total)[VEC]) {
    constexpr int RP = ATTN_TILE_RP;
    const Tin* __restrict__ x = reinterpret_cast<const Tin*>(a.x) + t.first;
#pragma unroll
    for (int u = 0; u < RP; ++u)
        if (FULL || u < t.m) raw[u] = *reinterpret_cast<const Vec<Tin, VEC>*>(x + u * t.step);
    Gate<Acc, VEC, GATE> gate;
    if (GATE && (FULL || t.m > 0)) gate.init(a.gate, t.c0);
#pragma unroll
    for (int k = 0; k < VEC; ++k) total[k] = Acc(0);
#pragma unroll
    for (int u = 0; u < RP; ++u) {
        if (FULL || u < t.m) {
            Acc in[VEC];
            widen_vec(raw[u], in);
            if constexpr (GATE != GATE_NONE) {
                gate.apply(in);
                Vec<Acc, VEC> q;
#pragma unroll
                for (int k = 0; k < VEC; ++k) q.v[k] = in[k];
                kept[u * 256] = q;
            }
#pragma unroll
            for (int k = 0; k < VEC; ++k) total[k] += in[k];
        }
    }
}

// The second half: rescans the thread's rows from `acc` (the carry of the parts before it) and
// stores scale * the running sums with the streaming hint.
template <bool FULL, typename Tin, typename Tout, typename Acc, int VEC, int GATE>
__device__ __forceinline__ void tile_rescan(const StridedArgs& a, const TileAt& t, const Vec<Tin, VEC> (&raw)[ATTN_TILE_RP],
                                            const Vec<Acc, VEC>* kept, Acc (&acc)[VEC]) {
    constexpr int RP = ATTN_TILE_RP;
    Tout* __restrict__ y = reinterpret_cast<Tout*>(a.y) + t.first;
    const Acc scale = (Acc)a.scale;
#pragma unroll
    for (int u = 0; u < RP; ++u) {
        if (FULL || u < t.m) {
            Acc in[VEC];
            if constexpr (GATE != GATE_NONE) {
                const Vec<Acc, VEC> q = kept[u * 256];
#pragma unroll
                for (int k = 0; k < VEC; ++k) in[k] = q.v[k];
            } else {
                widen_vec(raw[u], in);
            }
            Acc o[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                acc[k] += in[k];
                o[k] = acc[k] * scale;
            }
            store_vec<Tout, Acc, VEC, true>(y + u * t.step, o);
        }
    }
}

template <typename Tin, typename Tout, typename Acc, int VEC, int GATE>
__device__ __forceinline__ void tile_scan(const StridedArgs& a) {
    constexpr int RP = ATTN_TILE_RP;
    Acc* part_total = reinterpret_cast<Acc*>(tile_smem);
    // this thread's gated values: row u at kept[u * 256]
    Vec<Acc, VEC>* kept = reinterpret_cast<Vec<Acc, VEC>*>(part_total + blockDim.x * VEC) + threadIdx.x;
    const int parts = (int)a.parts;
    const int G = blockDim.x / parts;  // blockDim.x <= 256; G a power of two
    const int g = threadIdx.x & (G - 1);
    const int p = threadIdx.x >> (__ffs(G) - 1);
    const i64 slabs = (a.ncv + G - 1) / G;
    const i64 ntiles = a.njobs * slabs;
    for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const TileAt t = tile_at(a, tile, slabs, G, g, p, VEC);
        // Full tiles of a plain scan take the unguarded copy of the code. The gated kernel keeps
        // the guards: its unguarded copy needs more than its 64 registers (spills), which cost
        // more than the guards (NOTES.md, runs 23-25).
        const bool full = GATE == GATE_NONE && t.m == RP;
        Vec<Tin, VEC> raw[RP];
        Acc total[VEC];
        if (full) {
            tile_gather<true, Tin, Acc, VEC, GATE>(a, t, raw, kept, total);
        } else {
            tile_gather<false, Tin, Acc, VEC, GATE>(a, t, raw, kept, total);
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) part_total[(p * VEC + k) * G + g] = total[k];
        __syncthreads();

        Acc acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = Acc(0);
#pragma unroll 1
        for (int q = 0; q < p; ++q) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[k] += part_total[(q * VEC + k) * G + g];
        }
        if (full) {
            tile_rescan<true, Tin, Tout, Acc, VEC, GATE>(a, t, raw, kept, acc);
        } else {
            tile_rescan<false, Tin, Tout, Acc, VEC, GATE>(a, t, raw, kept, acc);
        }
        __syncthreads();  // part_total is rewritten by the block's next tile
    }
}
