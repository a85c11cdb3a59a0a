// `nsa_fwd` (`conformance/spec/ops-nsa.md` §7): the sliding-window branch (nsa_attend.cuh, KIND 2)
// and the gated sum of the branches.
//
// nsa_fwd_combine: o = A_slc + A_cmp + A_swa per element of [rows, V] (rows = B * T * HQ) in
// Acc, cast once; A_slc = g_slc * o_slc (o_slc without g_slc), A_cmp = g_cmp * o_cmp when g_cmp
// is given, A_swa = g_swa * o_swa when the window ran (pointer 0: the term is absent).

ATT_KERNELS(nsa_window_attention, 2)
ATT_SHARED_SHAPES(nsa_window_attention, 2, bf16, bf16)
ATT_SHARED_SHAPES(nsa_window_attention, 2, f16, f16)

struct FwdCombineArgs {
    u64 o_slc, o_cmp, o_swa;  // const T* [rows, V] (o_cmp, o_swa: 0 when absent)
    u64 g_slc, g_cmp, g_swa;  // const T* [rows] (0 when absent)
    u64 o;                    // T* [rows, V]
    i64 rows;
    i64 v;
};

template <typename T, typename Acc> __device__ __forceinline__ void fwd_combine(const FwdCombineArgs& a) {
    const i64 n = a.rows * a.v;
    const T* os = reinterpret_cast<const T*>(a.o_slc);
    const T* oc = reinterpret_cast<const T*>(a.o_cmp);
    const T* ow = reinterpret_cast<const T*>(a.o_swa);
    const T* gs = reinterpret_cast<const T*>(a.g_slc);
    const T* gc = reinterpret_cast<const T*>(a.g_cmp);
    const T* gw = reinterpret_cast<const T*>(a.g_swa);
    T* out = reinterpret_cast<T*>(a.o);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = div_fast(i, a.v);
        Acc y = (Acc)widen(os[i]);
        if (gs) y *= (Acc)widen(gs[r]);
        if (oc) y += (Acc)widen(gc[r]) * (Acc)widen(oc[i]);
        if (ow) y += (Acc)widen(gw[r]) * (Acc)widen(ow[i]);
        out[i] = Narrow<T>::from(y);
    }
}

#define FWD_COMBINE(TIN, ACC, IN) \
    extern "C" __global__ void __launch_bounds__(256) nsa_fwd_combine_##IN(const FwdCombineArgs a) { fwd_combine<TIN, ACC>(a); }
FWD_COMBINE(float, float, f32)
FWD_COMBINE(double, double, f64)
FWD_COMBINE(bf16, float, bf16)
FWD_COMBINE(f16, float, f16)
