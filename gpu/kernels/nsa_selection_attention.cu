// `nsa_selection_attention` (`conformance/spec/ops-nsa.md` §5): each query attends to the tokens of
// its selected blocks, a multiset with token-level causality (nsa_attend.cuh, KIND 1).

ATT_KERNELS(nsa_selection_attention, 1)
