// The KDA gate (spec ops-cumsum.md section 4), per element of g [B, T, HV, K] at column
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

// fp32: the multi-function unit's exp2/log2 (as FLA's Triton kernels use), with log1p(e) taken
// as e - e^2/2 where 1 + e would lose e's digits; the softplus error stays below 3e-7 absolute.
// fp64: the precise library functions.
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
__device__ __forceinline__ float gexp(float v) { return ex2_approx(v * 1.4426950408889634f); }
__device__ __forceinline__ double gexp(double v) { return exp(v); }
// Branch-free (selects), so the elements of a thread interleave their multi-function latencies.
__device__ __forceinline__ float gsoftplus(float a) {
    const float e = gexp(a);
    const float tiny = e - 0.5f * e * e;
    const float mid = lg2_approx(1.0f + e) * 0.6931471805599453f;
    return a > 20.0f ? a : (a < -8.0f ? tiny : mid);
}
__device__ __forceinline__ double gsoftplus(double a) { return a > 20.0 ? a : log1p(exp(a)); }
__device__ __forceinline__ float gsigmoid(float z) { return __fdividef(1.0f, 1.0f + gexp(-z)); }
__device__ __forceinline__ double gsigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

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

template <typename Acc, int VEC, int FORM> struct Gate {
    Acc bias[VEC];
    Acc coef[VEC];  // exp(A_log[hv]), or 1 without A_log
    Acc lb;

    // The constants of columns c0 .. c0 + VEC - 1.
    __device__ __forceinline__ void init(const GateArgs& g, i64 c0) {
        lb = (Acc)g.lower_bound;
#pragma unroll
        for (int k = 0; k < VEC; ++k) bias[k] = Acc(0);
        if (g.dt_bias_dtype >= 0) load_side(reinterpret_cast<const void*>(g.dt_bias), (int)g.dt_bias_dtype, c0, bias);
#pragma unroll
        for (int k = 0; k < VEC; ++k) coef[k] = Acc(1);
        if (g.a_log_dtype >= 0) {
            const void* alog = reinterpret_cast<const void*>(g.a_log);
            const int dt = (int)g.a_log_dtype;
            i64 hv = div_fast(c0, g.head_dim);
            i64 r = c0 - hv * g.head_dim;
            if (r + VEC <= g.head_dim) {  // one head for all VEC columns (K >= VEC: the usual case)
                Acc l[1];
                load_side(alog, dt, hv, l);
                const Acc c = gexp(l[0]);
#pragma unroll
                for (int k = 0; k < VEC; ++k) coef[k] = c;
            } else {
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    Acc l[1];
                    load_side(alog, dt, hv, l);
                    coef[k] = gexp(l[0]);
                    if (++r == g.head_dim) {
                        r = 0;
                        ++hv;
                    }
                }
            }
        }
    }

    __device__ __forceinline__ void apply(Acc (&v)[VEC]) const {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const Acc a = v[k] + bias[k];
            if constexpr (FORM == GATE_BOUNDED) {
                v[k] = lb * gsigmoid(coef[k] * a);
            } else {
                v[k] = -coef[k] * gsoftplus(a);
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
