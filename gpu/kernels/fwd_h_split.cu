// `chunk_gated_delta_rule_fwd_h_split` (`conformance/spec/ops-delta-rule.md` §5): the merge stage
// between the pre-scan of the split pieces and the fwd_h re-run of every piece. The recurrence
// kernels themselves are those of fwd_h.cuh, launched by the host on piece tables.
//
// Piece numbering (built by the host, gpu/src/delta/split.rs): the re-run table holds first the
// LAST piece of every sequence n (row n, so that its exit state is final_state[n]), then the
// other pieces of the split sequences in order: piece i < m_n - 1 of sequence n is row
// N + q0_n + i, and its summary [b | M] is hm row q0_n + i (the pre-scan ran on exactly those
// pieces, in that order).
//
// For every sequence n, value head hv and block of SPLIT_MERGE_BV state columns, with w_i the
// warm-up of piece i (warm[row(i)], all 0 without a table) and L the last piece with w_i = 0:
//   X <- initial_state[n, hv] (0 when absent)
//   for i with w_i > 0:  init[row(i), hv] = (w_i >= c0_i ? X : 0)    (c0_i: the piece's first
//                        chunk in its sequence; the warm-up reaches the start, or starts at zero)
//   for i = 0 .. L:  if w_i = 0: init[row(i), hv] = X;  if i < L: X <- M_q X + b_q (q = q0_n + i)
// so a warm-up piece has no merge step of its own, and the summaries of pieces >= L are never
// read (the pre-scan skips them: fwd_h.cuh's row_warmup < 0).
// FMAs in hm's precision (IEEE fp32, or fp64), in a fixed order (b, then l = 0 .. K-1: the order
// of fwd_h_merge.cu; deterministic). init is written in the state layout of v_first (the re-run
// reads it as its initial_state).
//
// Speed: a step is a K x K by K x BV product whose M comes from L2. M goes through shared memory
// in tiles of SPLIT_MERGE_LT columns (coalesced rows), the next tile's loads issued into
// registers before the current tile is used (so the chain of steps never waits on a load),
// and every thread keeps K / 32 independent accumulators (rows rg, rg + 32, ...) fed by
// vector reads of the tile (one address per quarter-warp: a broadcast). Narrow column blocks
// (8) spread a sequence over more multiprocessors.

#define SPLIT_MERGE_BV 8
#define SPLIT_MERGE_THREADS 256
#define SPLIT_MERGE_RG (SPLIT_MERGE_THREADS / SPLIT_MERGE_BV)  // row groups (32)
#define SPLIT_MERGE_LT 32                                        // M columns per tile
#define SPLIT_MERGE_RPT (256 / SPLIT_MERGE_RG)                   // rows per thread at K = 256 (8)
#define SPLIT_MERGE_PF (256 * SPLIT_MERGE_LT / SPLIT_MERGE_THREADS)  // tile elements per thread (32)

struct SplitMergeArgs {
    u64 hm;        // const Acc* [Q, HV, K, V + K]
    u64 table;     // const i64* [N][2]: pieces m_n, first summary row q0_n
    u64 h0;        // initial_state (dtype h0_dtype) or 0
    u64 init;      // Acc* [S, HV, K, V] (or [.., V, K] with v_first)
    i64 N, HV, K, V;
    i64 h0_dtype;
    i64 v_first;
    u64 run;       // const i64* [S][3]: the re-run rows (first token row, length, first h row)
    u64 warm;      // const i64* [S]: warm-up chunks of every re-run row, or 0 (all exact)
};

// Element (i, c) of a K x V state at `base` in the layout of v_first.
__device__ __forceinline__ i64 split_state_index(const SplitMergeArgs& a, i64 base, i64 i, i64 c) {
    return base + (a.v_first ? c * a.K + i : i * a.V + c);
}

// Dynamic shared memory: X (256 x BV) and one M tile (256 x LT), in Acc.
template <typename Acc>
struct SplitMergeSmem {
    Acc x[256][SPLIT_MERGE_BV];
    Acc mt[256][SPLIT_MERGE_LT];
};

template <typename Acc>
__device__ __forceinline__ void fwd_h_split_merge(const SplitMergeArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    SplitMergeSmem<Acc>& sm = *reinterpret_cast<SplitMergeSmem<Acc>*>(smem_raw);
    const int tid = threadIdx.x;
    const int j = tid % SPLIT_MERGE_BV, rg = tid / SPLIT_MERGE_BV;
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
    // X from the initial state; rows K .. 255 stay zero (they meet zero-filled tile columns)
    for (int r = rg; r < 256; r += SPLIT_MERGE_RG) {
        Acc v = Acc(0);
        if (r < K && a.h0 != 0 && col_ok) v = load_f<Acc>(reinterpret_cast<const void*>(a.h0), a.h0_dtype, split_state_index(a, (n * a.HV + hv) * state, r, c));
        sm.x[r][j] = v;
    }
    auto row_of = [&](i64 i) { return i == m - 1 ? n : a.N + s0 + i; };
    auto out_base = [&](i64 i) { return (row_of(i) * a.HV + hv) * state; };
    const i64* warm = reinterpret_cast<const i64*>(a.warm);
    const i64* run = reinterpret_cast<const i64*>(a.run);
    auto warm_of = [&](i64 i) { return warm != nullptr ? warm[row_of(i)] : (i64)0; };
    // the chain's length L (every thread finds the same) and the warm-up pieces' initial states
    // (the first piece is exact: validated on the host, never chosen by the policy)
    i64 steps = 0;
    const i64 h_first = run[row_of(0) * 3 + 2];
    for (i64 i = 1; i < m; ++i) {
        const i64 w = warm_of(i);
        if (w == 0) {
            steps = i;
        } else if (col_ok) {
            const bool reach = w >= run[row_of(i) * 3 + 2] - h_first;
            const i64 ob = out_base(i);
            for (int r = rg; r < K; r += SPLIT_MERGE_RG) init[split_state_index(a, ob, r, c)] = reach ? sm.x[r][j] : Acc(0);
        }
    }
    {
        const i64 ob = out_base(0);
        for (int r = rg; r < K; r += SPLIT_MERGE_RG)
            if (col_ok) init[split_state_index(a, ob, r, c)] = sm.x[r][j];
    }
    const int nt = (K + SPLIT_MERGE_LT - 1) / SPLIT_MERGE_LT;
    const i64 total = steps * nt;
    // the prefetch of tile t (step t / nt, columns l0 = (t % nt) * LT) into registers
    Acc pf[SPLIT_MERGE_PF];
    auto fetch = [&](i64 t) {
        const i64 q = s0 + t / nt;
        const int l0 = (int)(t % nt) * SPLIT_MERGE_LT;
        const Acc* mq = hm + (q * a.HV + hv) * a.K * pitch + a.V + l0;
#pragma unroll
        for (int e = 0; e < SPLIT_MERGE_PF; ++e) {
            const int idx = tid + e * SPLIT_MERGE_THREADS;
            const int r = idx / SPLIT_MERGE_LT, l = idx % SPLIT_MERGE_LT;
            pf[e] = (r < K && l0 + l < K) ? mq[r * pitch + l] : Acc(0);
        }
    };
    if (total > 0) fetch(0);
    Acc acc[SPLIT_MERGE_RPT];
    for (i64 t = 0; t < total; ++t) {
        const i64 step = t / nt;
        const int tl = (int)(t % nt);
        if (tl == 0) {
            const Acc* bq = hm + ((s0 + step) * a.HV + hv) * a.K * pitch;
#pragma unroll
            for (int i = 0; i < SPLIT_MERGE_RPT; ++i) {
                const int r = rg + i * SPLIT_MERGE_RG;
                acc[i] = (r < K && col_ok) ? bq[r * pitch + c] : Acc(0);
            }
        }
        __syncthreads();  // the previous tile (and X's last update) is no longer being read / is visible
#pragma unroll
        for (int e = 0; e < SPLIT_MERGE_PF; ++e) {
            const int idx = tid + e * SPLIT_MERGE_THREADS;
            sm.mt[idx / SPLIT_MERGE_LT][idx % SPLIT_MERGE_LT] = pf[e];
        }
        __syncthreads();
        if (t + 1 < total) fetch(t + 1);
        const int l0 = tl * SPLIT_MERGE_LT;
#pragma unroll
        for (int l4 = 0; l4 < SPLIT_MERGE_LT; l4 += 4) {
            Acc xv[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) xv[e] = sm.x[l0 + l4 + e][j];
#pragma unroll
            for (int i = 0; i < SPLIT_MERGE_RPT; ++i) {
                const int r = rg + i * SPLIT_MERGE_RG;
                if (r < K) {
                    Acc m4[4];
                    if constexpr (sizeof(Acc) == 4) {
                        const Vec<Acc, 4> v = *reinterpret_cast<const Vec<Acc, 4>*>(&sm.mt[r][l4]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) m4[e] = v.v[e];
                    } else {  // 16-byte pieces (the dynamic shared base is 16-byte aligned)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const Vec<Acc, 2> v = *reinterpret_cast<const Vec<Acc, 2>*>(&sm.mt[r][l4 + 2 * h]);
                            m4[2 * h] = v.v[0];
                            m4[2 * h + 1] = v.v[1];
                        }
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i] = fma(m4[e], xv[e], acc[i]);
                }
            }
        }
        if (tl == nt - 1) {
            __syncthreads();  // every thread is done reading X
            const i64 ob = out_base(step + 1);
            const bool exact = warm_of(step + 1) == 0;
#pragma unroll
            for (int i = 0; i < SPLIT_MERGE_RPT; ++i) {
                const int r = rg + i * SPLIT_MERGE_RG;
                if (r < K) {
                    sm.x[r][j] = acc[i];
                    if (col_ok && exact) init[split_state_index(a, ob, r, c)] = acc[i];
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(SPLIT_MERGE_THREADS) fwd_h_split_merge_f32(const SplitMergeArgs a) { fwd_h_split_merge<float>(a); }
extern "C" __global__ void __launch_bounds__(SPLIT_MERGE_THREADS) fwd_h_split_merge_f64(const SplitMergeArgs a) { fwd_h_split_merge<double>(a); }
