// `chunk_gated_delta_rule_fwd_h` (`conformance/spec/ops-delta-rule.md` §2): the recurrence of
// fwd_h.cuh writing h (the state before every chunk, rounded to k's dtype), v_new and the
// final state (fp32).

FWDH_KERNELS(chunk_gated_delta_rule_fwd_h, false)
