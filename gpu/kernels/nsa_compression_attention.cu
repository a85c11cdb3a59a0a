// `nsa_compression_attention` (`conformance/spec/ops-nsa.md` §3): each query attends to its visible
// compressed blocks (nsa_attend.cuh, KIND 0).

ATT_KERNELS(nsa_compression_attention, 0)
ATT_SHARED_SHAPES(nsa_compression_attention, 0, bf16, bf16)
ATT_SHARED_SHAPES(nsa_compression_attention, 0, f16, f16)
