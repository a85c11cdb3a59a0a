// The truncation policy of a split (`conformance/spec/ops-delta-rule.md` §5.10), on the device:
// the log bound Lambda of every chunk and value head, then per piece the shortest warm-up whose
// window has exp(Lambda) <= eps for every value head, then which pre-scan summaries are still read.
// Three launches, queued with the split's stages (no host synchronisation); gpu/src/delta/
// truncation.rs builds the tables.
//
// 1. fwd_h_chunk_log_bound: for chunk row r (the h rows of fwd_h: one per chunk) and value head hv,
//      lam[r, hv] = sum_t (s * max_k a[t, hv, k] + ln max(1, |1 - beta[t, hv] ||k[t, kh]||^2|))
//                   + 1e-9 * sum_t |that term|
//    over the chunk's tokens t, in fp64 (s: gate_scale, natural-log units per gate unit). The
//    second line makes the value an upper bound of the exact (real-number) sum: fp64 rounding of
//    the terms, the log and the sums is below 2^-50 relative per operation, and no window sums
//    more than 2^20 terms, so their error is under 1e-9 of the absolute sum. Without beta / k
//    the norm term is 0 (the caller's promise: ||I - beta k k^T||_2 <= 1). NaN stays NaN.
// 2. fwd_h_warmup_decide: for every re-run row (piece) with first chunk row hb and chunk c0 in its
//    sequence, the smallest w in 1 .. min(max_w, c0) with
//      sum_{j = 1 .. w} lam[hb - j, hv] <= log_eps for every hv,   or w = c0 (<= max_w: the
//    warm-up reaches the sequence start and is exact), else 0 (the exact summaries). First pieces
//    (c0 = 0) get 0. A NaN bound never passes the test.
// 3. fwd_h_warmup_summaries: per sequence, L = the last piece with w = 0 (0 if none); summary rows
//    of pieces i >= L are marked -1 (skipped by the pre-scan: nobody reads them).

#define TRUNC_BOUND_THREADS 128
#define TRUNC_DECIDE_THREADS 256
#define TRUNC_MAX_WARMUP 256  // chunks a warm-up may span (the decide block's window)

struct ChunkBoundArgs {
    u64 gates;   // [rows, HV] (scalar) or [rows, HV, K] (per key), natural log x gate_scale
    u64 beta;    // [rows, HV] or 0
    u64 k;       // [rows, H, K] or 0
    u64 chunks;  // const i64* [C][2]: first token row, tokens (0: an unused h row)
    u64 lam;     // double* [C, HV]
    i64 H, HV, K;
    i64 per_key;
    i64 gate_dtype, beta_dtype, k_dtype;
    double gate_scale;
};

// One warp per token (strided), lanes over K; per-warp partial sums in a fixed order, then warp 0
// adds the four partials in order: deterministic.
extern "C" __global__ void __launch_bounds__(TRUNC_BOUND_THREADS) fwd_h_chunk_log_bound(const ChunkBoundArgs a) {
    __shared__ double part[TRUNC_BOUND_THREADS / 32][2];
    const i64 r = blockIdx.x, hv = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64* ch = reinterpret_cast<const i64*>(a.chunks) + r * 2;
    const i64 row0 = ch[0], rows = ch[1];
    const i64 kh = hv / (a.HV / a.H);
    const void* gp = reinterpret_cast<const void*>(a.gates);
    double sum = 0.0, mag = 0.0;
    for (i64 t = warp; t < rows; t += TRUNC_BOUND_THREADS / 32) {
        const i64 tok = row0 + t;
        double gmax = -__longlong_as_double(0x7ff0000000000000ll), kk = 0.0;
        bool nan = false;
        if (a.per_key) {
            for (i64 i = lane; i < a.K; i += 32) {
                const double x = load_f<double>(gp, a.gate_dtype, (tok * a.HV + hv) * a.K + i);
                nan |= x != x;
                gmax = fmax(gmax, x);
            }
        } else if (lane == 0) {
            gmax = load_f<double>(gp, a.gate_dtype, tok * a.HV + hv);
            nan = gmax != gmax;
        }
        if (a.k != 0) {
            for (i64 i = lane; i < a.K; i += 32) {
                const double x = load_f<double>(reinterpret_cast<const void*>(a.k), a.k_dtype, (tok * a.H + kh) * a.K + i);
                kk = fma(x, x, kk);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            gmax = fmax(gmax, __shfl_xor_sync(0xffffffffu, gmax, o));
            kk += __shfl_xor_sync(0xffffffffu, kk, o);
            nan |= __shfl_xor_sync(0xffffffffu, (int)nan, o) != 0;
        }
        double term = nan ? __longlong_as_double(0x7ff8000000000000ll) : gmax * a.gate_scale;
        if (a.beta != 0) {
            const double b = load_f<double>(reinterpret_cast<const void*>(a.beta), a.beta_dtype, tok * a.HV + hv);
            const double shrink = fabs(1.0 - b * kk);
            // a NaN shrink keeps the term NaN (fmax would drop it)
            term += shrink != shrink ? shrink : log(fmax(shrink, 1.0));
        }
        sum += term;
        mag += fabs(term);
    }
    if (lane == 0) {
        part[warp][0] = sum;
        part[warp][1] = mag;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0, m = 0.0;
#pragma unroll
        for (int w = 0; w < TRUNC_BOUND_THREADS / 32; ++w) {
            s += part[w][0];
            m += part[w][1];
        }
        reinterpret_cast<double*>(a.lam)[r * a.HV + hv] = s + 1e-9 * m;
    }
}

struct WarmupDecideArgs {
    u64 lam;     // const double* [C, HV]
    u64 pieces;  // const i64* [S][2]: first h row, first chunk in the sequence (c0)
    u64 warm;    // i64* [S]
    i64 HV;
    i64 max_warmup;  // <= TRUNC_MAX_WARMUP
    double log_eps;
};

// One block per piece. Every warp takes value heads in turn; for its head, lanes hold windows of
// 32 consecutive lengths, an inclusive warp scan gives each window's sum, and a ballot clears the
// windows the head refuses in the shared mask `ok` (one bit per window length).
extern "C" __global__ void __launch_bounds__(TRUNC_DECIDE_THREADS) fwd_h_warmup_decide(const WarmupDecideArgs a) {
    __shared__ unsigned ok[TRUNC_MAX_WARMUP / 32];
    const i64 p = blockIdx.x;
    const i64* pc = reinterpret_cast<const i64*>(a.pieces) + p * 2;
    const i64 hb = pc[0], c0 = pc[1];
    const i64 wmax = min(min(a.max_warmup, (i64)TRUNC_MAX_WARMUP), c0);  // windows 1 .. wmax
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tiles = (int)((wmax + 31) / 32);
    const double* lam = reinterpret_cast<const double*>(a.lam);
    for (int i = threadIdx.x; i < TRUNC_MAX_WARMUP / 32; i += TRUNC_DECIDE_THREADS) ok[i] = 0xffffffffu;
    __syncthreads();
    for (i64 hv = warp; hv < a.HV; hv += TRUNC_DECIDE_THREADS / 32) {
        double carry = 0.0;
        for (int tile = 0; tile < tiles; ++tile) {
            const i64 w = (i64)tile * 32 + lane + 1;  // this lane's window: chunks hb - w .. hb - 1
            double x = w <= wmax ? lam[(hb - w) * a.HV + hv] : 0.0;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const double y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            const double s = carry + x;
            const unsigned pass = __ballot_sync(0xffffffffu, w <= wmax && s <= a.log_eps);
            if (lane == 0) atomicAnd(&ok[tile], pass);
            carry = __shfl_sync(0xffffffffu, s, 31);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        i64 w = 0;
        for (int tile = 0; tile < tiles && w == 0; ++tile) {
            if (ok[tile] != 0) w = (i64)tile * 32 + __ffs(ok[tile]);
        }
        // no window passes: a warm-up that reaches the sequence start is exact
        if (w == 0 && c0 > 0 && c0 <= wmax) w = c0;
        reinterpret_cast<i64*>(a.warm)[p] = w;
    }
}

struct WarmupSummaryArgs {
    u64 merge;  // const i64* [N][2]: pieces m_n, first summary row q0_n (split.rs's numbering)
    u64 warm;   // const i64* [S]: re-run rows (last pieces 0 .. N, then N + q0_n + i)
    u64 skip;   // i64* [Q]: 0 (summary read by the merge) or -1 (skipped)
    i64 N;
};

extern "C" __global__ void fwd_h_warmup_summaries(const WarmupSummaryArgs a) {
    const i64 n = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= a.N) return;
    const i64* mt = reinterpret_cast<const i64*>(a.merge) + n * 2;
    const i64 m = mt[0], q0 = mt[1];
    const i64* warm = reinterpret_cast<const i64*>(a.warm);
    i64 last = 0;
    for (i64 i = 1; i < m; ++i) {
        const i64 row = i == m - 1 ? n : a.N + q0 + i;
        if (warm[row] == 0) last = i;
    }
    for (i64 i = 0; i + 1 < m; ++i) reinterpret_cast<i64*>(a.skip)[q0 + i] = i < last ? 0 : -1;
}
