// `fwd_h_merge` (`conformance/spec/ops-delta-rule.md` §4): for every sequence n, value head hv and
// block of MERGE_BV state columns, X <- initial_state[n, hv], then for each of its sub-sequences j:
// initial_states[j, hv] = X, X <- M_j X + b_j (hm[j, hv] = [b_j | M_j]); final = X. FMAs in
// hm's precision (IEEE fp32, or fp64 for an fp64 hm), in a fixed order (deterministic); the
// outputs have hm's dtype. States in memory are X^T with v_first.

#define MERGE_BV 32
#define MERGE_THREADS 256
#define MERGE_RSTEP (MERGE_THREADS / MERGE_BV)

struct MergeArgs {
    u64 hm;        // const Acc* [S, HV, K, V + K]
    u64 offsets;   // const i64* [N + 1]
    u64 h0;        // initial_state (dtype h0_dtype) or 0
    u64 out;       // Acc* initial_states [S, HV, K, V] (or [.., V, K])
    u64 ht;        // Acc* final_state [N, HV, K, V] or 0
    i64 HV, K, V;
    i64 h0_dtype;
    i64 v_first;
};

// Element (i, c) of a K x V state at `base` in the layout of v_first.
__device__ __forceinline__ i64 state_index(const MergeArgs& a, i64 base, i64 i, i64 c) {
    return base + (a.v_first ? c * a.K + i : i * a.V + c);
}

// Dynamic shared memory: X, 256 x (MERGE_BV + 1) values of Acc.
template <typename Acc>
__device__ __forceinline__ void fwd_h_merge(const MergeArgs& a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Acc (*x)[MERGE_BV + 1] = reinterpret_cast<Acc (*)[MERGE_BV + 1]>(smem_raw);
    const int tid = threadIdx.x;
    const int j = tid % MERGE_BV, q0 = tid / MERGE_BV;
    const i64 n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV;
    const i64 c = (i64)blockIdx.y * MERGE_BV + j;
    const bool col_ok = c < a.V;
    const int K = (int)a.K;
    const i64* offs = reinterpret_cast<const i64*>(a.offsets);
    const Acc* hm = reinterpret_cast<const Acc*>(a.hm);
    Acc* out = reinterpret_cast<Acc*>(a.out);
    const i64 pitch = a.V + a.K;
    for (int r = q0; r < K; r += MERGE_RSTEP) {
        Acc v = Acc(0);
        if (a.h0 != 0 && col_ok) v = load_f<Acc>(reinterpret_cast<const void*>(a.h0), a.h0_dtype, state_index(a, (n * a.HV + hv) * a.K * a.V, r, c));
        x[r][j] = v;
    }
    __syncthreads();
    for (i64 s = offs[n]; s < offs[n + 1]; ++s) {
        const i64 sb = (s * a.HV + hv) * a.K * a.V;
        const Acc* m = hm + (s * a.HV + hv) * a.K * pitch;
        Acc next[256 / MERGE_RSTEP];
#pragma unroll
        for (int q = 0; q < 256 / MERGE_RSTEP; ++q) {
            const int r = q0 + q * MERGE_RSTEP;
            if (r < K) {
                if (col_ok) out[state_index(a, sb, r, c)] = x[r][j];
                Acc acc = col_ok ? m[r * pitch + c] : Acc(0);
                for (int l = 0; l < K; ++l) acc = fma(m[r * pitch + a.V + l], x[l][j], acc);
                next[q] = acc;
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 256 / MERGE_RSTEP; ++q) {
            const int r = q0 + q * MERGE_RSTEP;
            if (r < K) x[r][j] = next[q];
        }
        __syncthreads();
    }
    if (a.ht != 0 && col_ok) {
        Acc* ht = reinterpret_cast<Acc*>(a.ht);
        for (int r = q0; r < K; r += MERGE_RSTEP) ht[state_index(a, (n * a.HV + hv) * a.K * a.V, r, c)] = x[r][j];
    }
}

extern "C" __global__ void __launch_bounds__(MERGE_THREADS) fwd_h_merge_f32(const MergeArgs a) { fwd_h_merge<float>(a); }
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) fwd_h_merge_f64(const MergeArgs a) { fwd_h_merge<double>(a); }
