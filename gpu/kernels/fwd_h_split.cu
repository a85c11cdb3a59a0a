// `chunk_gated_delta_rule_fwd_h_split` (spec ops-delta-rule.md section 5): the merge stage between
// the pre-scan of the split pieces and the fwd_h re-run of every piece. The recurrence kernels
// themselves are those of fwd_h.cuh, launched by the host on piece tables.
//
// Piece numbering (built by the host, gpu/src/delta/split.rs): the re-run table holds first the
// LAST piece of every sequence n (row n, so that its exit state is final_state[n]), then the
// other pieces of the split sequences in order: piece i < m_n - 1 of sequence n is row
// N + q0_n + i, and its summary [b | M] is hm row q0_n + i (the pre-scan ran on exactly those
// pieces, in that order).
//
// For every sequence n, value head hv and block of SPLIT_MERGE_BV state columns:
//   X <- initial_state[n, hv] (0 when absent)
//   for i = 0 .. m_n - 1:  init[row(i), hv] = X;  if i < m_n - 1: X <- M_q X + b_q (q = q0_n + i)
// FMAs in hm's precision (IEEE fp32, or fp64), in a fixed order (deterministic). init is written
// in the state layout of v_first (the re-run reads it as its initial_state).

#define SPLIT_MERGE_BV 32
#define SPLIT_MERGE_THREADS 256
#define SPLIT_MERGE_RSTEP (SPLIT_MERGE_THREADS / SPLIT_MERGE_BV)

struct SplitMergeArgs {
    u64 hm;        // const Acc* [Q, HV, K, V + K]
    u64 table;     // const i64* [N][2]: pieces m_n, first summary row q0_n
    u64 h0;        // initial_state (dtype h0_dtype) or 0
    u64 init;      // Acc* [S, HV, K, V] (or [.., V, K] with v_first)
    i64 N, HV, K, V;
    i64 h0_dtype;
    i64 v_first;
};

// Element (i, c) of a K x V state at `base` in the layout of v_first.
__device__ __forceinline__ i64 split_state_index(const SplitMergeArgs& a, i64 base, i64 i, i64 c) {
    return base + (a.v_first ? c * a.K + i : i * a.V + c);
}

// Dynamic shared memory: X, 256 x (SPLIT_MERGE_BV + 1) values of Acc.
template <typename Acc>
__device__ __forceinline__ void fwd_h_split_merge(const SplitMergeArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc (*x)[SPLIT_MERGE_BV + 1] = reinterpret_cast<Acc (*)[SPLIT_MERGE_BV + 1]>(smem_raw);
    const int tid = threadIdx.x;
    const int j = tid % SPLIT_MERGE_BV, q0 = tid / SPLIT_MERGE_BV;
    const i64 n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV;
    const i64 c = (i64)blockIdx.y * SPLIT_MERGE_BV + j;
    const bool col_ok = c < a.V;
    const int K = (int)a.K;
    const i64* row = reinterpret_cast<const i64*>(a.table) + n * 2;
    const i64 m = row[0], s0 = row[1];
    const Acc* hm = reinterpret_cast<const Acc*>(a.hm);
    Acc* init = reinterpret_cast<Acc*>(a.init);
    const i64 pitch = a.V + a.K;
    const i64 state = a.K * a.V;
    for (int r = q0; r < K; r += SPLIT_MERGE_RSTEP) {
        Acc v = Acc(0);
        if (a.h0 != 0 && col_ok) v = load_f<Acc>(reinterpret_cast<const void*>(a.h0), a.h0_dtype, split_state_index(a, (n * a.HV + hv) * state, r, c));
        x[r][j] = v;
    }
    __syncthreads();
    for (i64 i = 0; i < m; ++i) {
        const i64 out_row = i == m - 1 ? n : a.N + s0 + i;
        const i64 ob = (out_row * a.HV + hv) * state;
        if (i == m - 1) {
            if (col_ok) {
                for (int r = q0; r < K; r += SPLIT_MERGE_RSTEP) init[split_state_index(a, ob, r, c)] = x[r][j];
            }
            break;
        }
        const Acc* mq = hm + ((s0 + i) * a.HV + hv) * a.K * pitch;
        Acc next[256 / SPLIT_MERGE_RSTEP];
#pragma unroll
        for (int q = 0; q < 256 / SPLIT_MERGE_RSTEP; ++q) {
            const int r = q0 + q * SPLIT_MERGE_RSTEP;
            if (r < K) {
                if (col_ok) init[split_state_index(a, ob, r, c)] = x[r][j];
                const Acc* mr = mq + r * pitch + a.V;
                Acc acc = col_ok ? mq[r * pitch + c] : Acc(0);
#pragma unroll 4
                for (int l = 0; l < K; ++l) acc = fma(mr[l], x[l][j], acc);
                next[q] = acc;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 256 / SPLIT_MERGE_RSTEP; ++q) {
            const int r = q0 + q * SPLIT_MERGE_RSTEP;
            if (r < K) x[r][j] = next[q];
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(SPLIT_MERGE_THREADS) fwd_h_split_merge_f32(const SplitMergeArgs a) { fwd_h_split_merge<float>(a); }
extern "C" __global__ void __launch_bounds__(SPLIT_MERGE_THREADS) fwd_h_split_merge_f64(const SplitMergeArgs a) { fwd_h_split_merge<double>(a); }
