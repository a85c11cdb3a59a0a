// Scans along a strided axis: `cols` independent lanes that are contiguous in memory, scanned
// over rows of stride `cols`. The rows are cut into jobs (a job is one lane segment that is
// scanned from zero: a whole lane for `cumsum` and `chunk_global_cumsum`, one chunk for
// `chunk_local_cumsum`). Each thread owns VEC adjacent lanes of one job and walks its rows in
// order, UNR rows loaded ahead, so a warp reads and writes 32 * VEC contiguous elements per row.
//
// Job j covers rows row0 .. row0 + n of the flattened [rows, cols] tensor. Either a table gives
// (row0, n) per job (varlen), or jobs are uniform: batch b = j / jobs_per_batch has
// rows_per_batch rows cut into segments of `seg` rows, the last one partial.
//
// With a GATE form the KDA gate (gate.cuh) is applied to every element before it is summed, so
// the gate values never reach memory.
//
// Few lanes over long sequences (too few threads for the GPU) use three passes over jobs cut
// into chunks of SPLIT_ROWS rows (MODE): SUMS writes each chunk's total to `sums`
// [chunk job, cols]; a plain scan (MODE SCAN, over the sums, same direction) turns them into
// running totals; CARRY rescans each chunk starting from the running total of the chunk before
// it in its sequence (`job_carry`, or the previous/next chunk of a uniform layout).

struct StridedArgs {
    u64 x;               // const Tin*
    u64 y;               // Tout*
    i64 cols;
    i64 ncv;             // cols / VEC
    i64 njobs;
    i64 rows_per_batch;
    i64 seg;
    i64 jobs_per_batch;
    u64 job_row0;        // const i64* or 0
    u64 job_len;         // const i64* or 0
    i64 reverse;
    double scale;
    GateArgs gate;
    u64 sums;       // Acc*: chunk totals (MODE_SUMS writes, MODE_CARRY reads running totals)
    u64 job_carry;  // const i64* or 0: MODE_CARRY, the job whose running total starts this one (-1: none)
    i64 parts;      // tile kernels (tile.cuh) only: row parts per tile
};

#define MODE_SCAN 0
#define MODE_SUMS 1
#define MODE_CARRY 2

// Rows loaded ahead per thread (overridable with -DATTN_UNR=N for tuning).
#ifndef ATTN_UNR
#define ATTN_UNR 8
#endif

template <typename Tin, typename Tout, typename Acc, int VEC, int GATE, int MODE = MODE_SCAN>
__device__ __forceinline__ void strided_scan(const StridedArgs& a) {
    constexpr int UNR = ATTN_UNR;
    const i64 total = a.njobs * a.ncv;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const Acc scale = (Acc)a.scale;
    for (i64 gid = (i64)blockIdx.x * blockDim.x + threadIdx.x; gid < total; gid += stride) {
        const i64 job = gid / a.ncv;
        const i64 c0 = (gid - job * a.ncv) * VEC;
        i64 row0, n;
        if (a.job_row0) {
            row0 = reinterpret_cast<const i64*>(a.job_row0)[job];
            n = reinterpret_cast<const i64*>(a.job_len)[job];
        } else {
            const i64 b = job / a.jobs_per_batch, k = job - b * a.jobs_per_batch;
            row0 = b * a.rows_per_batch + k * a.seg;
            n = min(a.seg, a.rows_per_batch - k * a.seg);
        }
        i64 step = a.cols;
        i64 first = row0 * a.cols + c0;
        if (a.reverse) {
            first += (n - 1) * a.cols;
            step = -step;
        }
        const Tin* __restrict__ x = reinterpret_cast<const Tin*>(a.x) + first;
        Tout* __restrict__ y = reinterpret_cast<Tout*>(a.y) + first;

        Gate<Acc, VEC, GATE> gate;
        if (GATE) gate.init(a.gate, c0);

        Acc acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = Acc(0);
        if (MODE == MODE_CARRY) {
            i64 cj;
            if (a.job_carry) {
                cj = reinterpret_cast<const i64*>(a.job_carry)[job];
            } else {
                const i64 k = job % a.jobs_per_batch;
                cj = a.reverse ? (k + 1 < a.jobs_per_batch ? job + 1 : -1) : (k > 0 ? job - 1 : -1);
            }
            if (cj >= 0) {
#pragma unroll
                for (int k = 0; k < VEC; ++k) acc[k] = reinterpret_cast<const Acc*>(a.sums)[cj * a.cols + c0 + k];
            }
        }
        for (i64 r = 0; r < n; r += UNR) {
            // raw (unwidened) rows in flight: UNR * 16 bytes per thread
            Vec<Tin, VEC> raw[UNR];
#pragma unroll
            for (int u = 0; u < UNR; ++u)
                if (r + u < n) raw[u] = *reinterpret_cast<const Vec<Tin, VEC>*>(x + (r + u) * step);
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                if (r + u < n) {
                    Acc in[VEC];
#pragma unroll
                    for (int k = 0; k < VEC; ++k) in[k] = (Acc)widen(raw[u].v[k]);
                    if (GATE) gate.apply(in);
                    Acc o[VEC];
#pragma unroll
                    for (int k = 0; k < VEC; ++k) {
                        acc[k] += in[k];
                        o[k] = acc[k] * scale;
                    }
                    if (MODE != MODE_SUMS) store_vec<Tout, Acc, VEC>(y + (r + u) * step, o);
                }
            }
        }
        if (MODE == MODE_SUMS) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) reinterpret_cast<Acc*>(a.sums)[job * a.cols + c0 + k] = acc[k];
        }
    }
}
