// The pieces of the fused delta-rule forwards (conformance/spec/ops-delta-rule.md 5.9-5.10),
// shared by delta_fwd.cu and delta_fwd_wg.cu: the fused kernels' arguments (FusedArgs: KDA on the
// intra stage's w, u, kg, qg; GdnFusedArgs: the lean GDN kernels) and the run of a CTA over the
// pieces table.

struct FusedArgs {
    u64 kg, w, qg, qf, u, aqk, lam, h0;  // inputs (h0: 0 when absent)
    u64 pieces;                      // i64 [P][5]: first row, length, the sequence's first and end rows, sequence
    u64 warm;                        // i64 [P][HV] warm-up chunks (warm_walk), or 0: none
    u64 gate;                        // i64 [N][HV] 1: split, 0: serial (warm_walk), or 0: none
    u64 seqs;                        // i64 [N][3] (seq_table): first packed row, length, lam row of the first chunk
    u64 o, ht;                       // outputs (o: 0 for the final state alone; ht: 0 when absent)
    i64 HV, K, V, bt;
    i64 h0_dtype, v_first, npieces, gate_mode;
};

struct GdnFusedArgs {
    u64 q, k, v, tbh, tbl, aqk, g, h0;  // q, k [rows][QH][K]; v [rows][HV][V]; tb*, aqk [rows][HV][bt]; g = G [rows][HV] f32
    u64 pieces;                         // i64 [P][5]: first row, length, the sequence's first and end rows, sequence
    u64 warm;                           // i64 [P][HV] warm-up chunks (warm_walk), or 0: none
    u64 gate;                           // i64 [N][HV] 1: split, 0: serial (warm_walk), or 0: none
    u64 o, ht;                          // outputs (o: 0 for the final state alone; ht: 0 when absent)
    u64 rqk;                            // Hopper kernel: f32 [rows][QH][2] (1 / ‖q‖, 1 / ‖k‖) of raw q, k, or 0
    i64 QH, HV, K, V, bt;
    i64 h0_dtype, v_first, npieces, gate_mode;
    double scale;
};

// A CTA of the fused kernels over the pieces table (conformance/spec/ops-delta-rule.md 5.9-5.10):
// piece p and value head hv from the task index (blockIdx.x in delta_fwd.cu). False where there is nothing to run: the verdict
// (gate_mode 1: the split's launch, 2: the serial one) leaves the (sequence, head) to the other
// launch, or an earlier piece runs through this one (warm-up -1). Else the rows [row0, end): w
// warm-up chunks before the piece (state only), the piece, and the later pieces of the sequence
// marked -1; and the sequence's bounds and index.
struct PieceRun {
    i64 hv, seq0, seqend, n, w, row0, end;
};

template <typename A>
__device__ __forceinline__ bool piece_run_at(const A& a, i64 task, PieceRun& r) {
    const i64 p = task / a.HV;
    r.hv = task % a.HV;
    const i64* pieces = reinterpret_cast<const i64*>(a.pieces);
    const i64* warm = reinterpret_cast<const i64*>(a.warm);
    r.seq0 = pieces[p * 5 + 2];
    r.seqend = pieces[p * 5 + 3];
    r.n = pieces[p * 5 + 4];
    if (a.gate_mode != 0 && (reinterpret_cast<const i64*>(a.gate)[r.n * a.HV + r.hv] != 0) != (a.gate_mode == 1)) return false;
    r.w = warm != nullptr ? warm[p * a.HV + r.hv] : 0;
    if (r.w < 0) return false;
    r.end = pieces[p * 5] + pieces[p * 5 + 1];
    for (i64 q = p + 1; warm != nullptr && q < a.npieces && pieces[q * 5 + 2] == r.seq0 && warm[q * a.HV + r.hv] < 0; ++q)
        r.end = pieces[q * 5] + pieces[q * 5 + 1];
    r.row0 = pieces[p * 5] - r.w * a.bt;
    return true;
}

template <typename A>
__device__ __forceinline__ bool piece_run(const A& a, PieceRun& r) { return piece_run_at(a, blockIdx.x, r); }
