//! The fwd_h / pre-scan kernel choice (no GPU needed): the FMA kernel for float32/float64, and
//! for half inputs the key padding and the column-block width of the cost rule on the spec's
//! anchor shapes (132 multiprocessors), measured best in run 6 of NOTES.md.

mod common;

use attn_gpu::delta::{kernel_choice, KernelChoice, Workload};
use attn_reference::Dtype;

fn choose(dtype: Dtype, k: usize, cols: &[usize], seqs: &[usize], hv: usize) -> KernelChoice {
    let chunks: Vec<usize> = seqs.iter().map(|t| t.div_ceil(64)).collect();
    let w = Workload {
        dtype,
        k,
        col_groups: cols,
        seq_chunks: &chunks,
        hv,
    };
    kernel_choice(&w, 132)
}

fn float_inputs_take_the_fma_kernel() {
    for d in [Dtype::F32, Dtype::F64] {
        assert_eq!(choose(d, 128, &[128], &[4096], 4), KernelChoice::Fma);
    }
}

fn half_inputs_pad_keys_and_pick_the_measured_block_width() {
    let bv = |hv, seqs: &[usize]| match choose(Dtype::BF16, 128, &[128], seqs, hv) {
        KernelChoice::Mma { kp: 128, bv } => bv,
        other => panic!("{other:?}"),
    };
    // a few long sequences: the serial chain, narrow blocks (run 6: 16 beat 32 and 64)
    assert_eq!(bv(4, &[131072]), 16);
    assert_eq!(
        bv(
            4,
            &[131072, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024]
        ),
        16
    );
    assert_eq!(bv(16, &[131072]), 16);
    // 32 heads of one 32768-token sequence: 32 columns (1.24 ms against 1.77 and 1.87)
    assert_eq!(bv(32, &[32768]), 32);
    // 32 heads of 8 sequences: throughput, 64 columns (1.88 ms against 2.87 with 32 columns)
    assert_eq!(bv(32, &[8192; 8]), 64);
    // key padding, and no 64-column block with 256 keys (shared memory)
    for (k, kp) in [
        (16, 64),
        (60, 64),
        (64, 64),
        (100, 128),
        (200, 256),
        (256, 256),
    ] {
        match choose(Dtype::F16, k, &[128], &[8192; 8], 32) {
            KernelChoice::Mma { kp: p, bv } => {
                assert_eq!(p, kp, "K = {k}");
                assert!(kp <= 128 || bv <= 32, "K = {k}: {bv} columns");
            }
            other => panic!("{other:?}"),
        }
    }
    // narrow states never take blocks wider than twice their columns
    match choose(Dtype::BF16, 64, &[16], &[8192; 8], 32) {
        KernelChoice::Mma { bv, .. } => assert_eq!(bv, 16),
        other => panic!("{other:?}"),
    }
    // the pre-scan blocks b and M columns separately
    assert!(matches!(
        choose(Dtype::BF16, 128, &[128, 128], &[4096; 32], 4),
        KernelChoice::Mma { kp: 128, .. }
    ));
}

gpu_tests!(
    float_inputs_take_the_fma_kernel,
    half_inputs_pad_keys_and_pick_the_measured_block_width
);
