// `fwd_h_pre_scan` (`conformance/spec/ops-delta-rule.md` §3): the recurrence of fwd_h.cuh on the
// augmented state [b | M] from [0 | I], values [U | 0]; writes only hm = the exit state (fp32).

FWDH_KERNELS(fwd_h_pre_scan, true)
