// The KDA gate (`conformance/spec/ops-cumsum.md` §4), per element of g [B, T, HV, K] at column
// c = hv * K + k of the flattened [HV * K] row:
//   a = g + dt_bias[c]                      (a = g without dt_bias)
//   no lower_bound:  y = -exp(A_log[hv]) * softplus(a),  softplus(a) = a for a > 20, else log1p(exp(a))
//   lower_bound lb:  y = lb * sigmoid(exp(A_log[hv]) * a)   (lb * sigmoid(a) without A_log)
// computed in the accumulator type (fp32, or fp64 for fp64 data).

struct GateArgs {
    u64 a_log;            // const void*, dtype a_log_dtype
    u64 dt_bias;          // const void*, dtype dt_bias_dtype
    i64 a_log_dtype;      // -1: absent
    i64 dt_bias_dtype;    // -1: absent
    i64 has_lower_bound;
    double lower_bound;
    i64 head_dim;         // K
};

// fp32: the multi-function unit's exp2/log2 (as FLA's Triton kernels use). fp64: the precise
// library functions.
__device__ __forceinline__ float ex2_approx(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float lg2_approx(float v) {
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
#define GATE_LOG2E 1.4426950408889634
#define GATE_LN2 0.6931471805599453
__device__ __forceinline__ float gexp(float v) { return ex2_approx(v * (float)GATE_LOG2E); }
__device__ __forceinline__ double gexp(double v) { return exp(v); }

// fp32 softplus in base 2: for t = a * log2(e), softplus(a) / ln 2 =
//   t                          for a > 20,
//   log2(1 + 2^t)              in between,
//   (e - e^2/2) * log2(e)      for a < -8, e = 2^t (where 1 + e would lose e's digits),
// branch-free (selects), so the elements of a thread interleave their multi-function latencies.
// The GPU tests and fixtures hold the result to the spec's 1e-5 of the float64 reference.
__device__ __forceinline__ float gsoftplus2(float t) {
    const float e = ex2_approx(t);
    const float tiny = e * fmaf(e, (float)(-0.5 * GATE_LOG2E), (float)GATE_LOG2E);
    const float mid = lg2_approx(1.0f + e);
    return t > (float)(20.0 * GATE_LOG2E) ? t : (t < (float)(-8.0 * GATE_LOG2E) ? tiny : mid);
}
__device__ __forceinline__ double gsoftplus(double a) { return a > 20.0 ? a : log1p(exp(a)); }

// Which gate a kernel applies: none (a plain scan), the softplus form, or the lower-bound form.
// Kernels choose between the two forms once per launch (GATE_DISPATCH), so no element branches.
#define GATE_NONE 0
#define GATE_SOFTPLUS 1
#define GATE_BOUNDED 2

// Loads N consecutive elements of a side input (A_log, dt_bias) whose dtype is only known at
// run time, as Acc. Codes match the host's `dtype_code`: 0 fp64, 1 fp32, 2 bf16, 3 fp16.
template <typename Acc, int N>
__device__ __forceinline__ void load_side(const void* p, int dtype, i64 i, Acc (&out)[N]) {
    switch (dtype) {
    case 0:
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = (Acc)reinterpret_cast<const double*>(p)[i + k];
        break;
    case 1:
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = (Acc)reinterpret_cast<const float*>(p)[i + k];
        break;
    case 2:
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = (Acc)widen(reinterpret_cast<const bf16*>(p)[i + k]);
        break;
    default:
#pragma unroll
        for (int k = 0; k < N; ++k) out[k] = (Acc)widen(reinterpret_cast<const f16*>(p)[i + k]);
    }
}

// The gate of VEC adjacent columns of one head (the host keeps VEC a divisor of K), its
// constants folded at init so that each element costs one multiply-add before the exponential:
//   fp32 softplus form:  t = x * log2(e) + bias * log2(e),  y = (-exp(A_log) * ln 2) * gsoftplus2(t)
//   fp32 bounded form:   u = -exp(A_log) * log2(e) * (x + bias),  y = lb / (1 + 2^u)
//   fp64:                a = x + bias, then the formulas of the header with the library functions.
template <typename Acc, int VEC, int FORM> struct Gate {
    static constexpr bool FP32 = sizeof(Acc) == 4;
    Acc bias[VEC];  // the folded dt_bias of each column (see above)
    Acc coef;       // the folded factor of the head (see above)
    Acc lb;

    // The constants of columns c0 .. c0 + VEC - 1.
    __device__ __forceinline__ void init(const GateArgs& g, i64 c0) {
        lb = (Acc)g.lower_bound;
        Acc b[VEC];  // dt_bias (0 when absent)
#pragma unroll
        for (int k = 0; k < VEC; ++k) b[k] = Acc(0);
        if (g.dt_bias_dtype >= 0) load_side(reinterpret_cast<const void*>(g.dt_bias), (int)g.dt_bias_dtype, c0, b);
        Acc c = Acc(1);  // exp(A_log[hv]) (1 when absent)
        if (g.a_log_dtype >= 0) {
            Acc l[1];
            load_side(reinterpret_cast<const void*>(g.a_log), (int)g.a_log_dtype, div_fast(c0, g.head_dim), l);
            c = gexp(l[0]);
        }
        if constexpr (!FP32) {
            coef = FORM == GATE_BOUNDED ? c : -c;
        } else if constexpr (FORM == GATE_BOUNDED) {
            coef = -c * (float)GATE_LOG2E;
        } else {
            coef = -c * (float)GATE_LN2;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            if constexpr (!FP32) {
                bias[k] = b[k];
            } else if constexpr (FORM == GATE_BOUNDED) {
                bias[k] = coef * b[k];
            } else {
                bias[k] = b[k] * (float)GATE_LOG2E;
            }
        }
    }

    __device__ __forceinline__ void apply(Acc (&v)[VEC]) const {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            if constexpr (!FP32) {
                const Acc a = v[k] + bias[k];
                v[k] = FORM == GATE_BOUNDED ? lb / (1.0 + exp(-coef * a)) : coef * gsoftplus(a);
            } else if constexpr (FORM == GATE_BOUNDED) {
                v[k] = __fdividef(lb, 1.0f + ex2_approx(fmaf(v[k], coef, bias[k])));
            } else {
                v[k] = coef * gsoftplus2(fmaf(v[k], (float)GATE_LOG2E, bias[k]));
            }
        }
    }
};

// Runs CALL (which names FORM) with the launch's gate form as the constant FORM.
#define GATE_DISPATCH(args, CALL)                   \
    if ((args).gate.has_lower_bound) {              \
        constexpr int FORM = GATE_BOUNDED;          \
        CALL;                                       \
    } else {                                        \
        constexpr int FORM = GATE_SOFTPLUS;         \
        CALL;                                       \
    }
