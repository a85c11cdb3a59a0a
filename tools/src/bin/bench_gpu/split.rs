//! The intra-card split cases of `bench_gpu` (`fwd_h_split_*`): the fwd_h rows of spec
//! `conformance/spec/anchors.md` plus the cuLA report's shapes (H = 4 and 8: 64K, 128K, 64K + 512 +
//! 256 + 128, 128K + 1K, 128K + 2×1K, 128K + 5×1K; the bypass shapes 8×4K, 4×8K, 2×16K, 24K + 8K,
//! 32K + 256 + 256, 40K + 1K + 8K), same inputs as [`super::delta`] (bf16, K = V = 128, chunk
//! 64, `gk`, `initial_state`, final state, `v_new`, varlen). Each row times our serial kernel,
//! our auto path (the policy's choice: the row's `median_ms`) and the policy's best split forced
//! (`split_ms`, and its three stages alone: `forced_stage_ms`), and records whether auto split,
//! its pieces and the policy's estimates.

use super::delta::{sets, BT};
use super::time_ms;
use attn_gpu::delta::{FwdHPlan, FwdHSplitPlan, SplitMode, SplitStage};
use attn_gpu::{Gpu, GpuResult};
use attn_reference::delta::FwdHParams;
use serde_json::{json, Value};

/// One case: its name (shared with `bench_anchors.py`), value heads and sequence lengths.
pub struct SplitCase {
    pub name: String,
    pub heads: usize,
    pub seqs: Vec<usize>,
}

const K1: usize = 1024;

pub fn cases() -> Vec<SplitCase> {
    let shapes: Vec<(&str, Vec<usize>)> = vec![
        ("4096", vec![4096]),
        ("32768", vec![32 * K1]),
        ("65536", vec![64 * K1]),
        ("131072", vec![128 * K1]),
        ("131072+10x1024", [vec![128 * K1], vec![K1; 10]].concat()),
        ("131072+1024", vec![128 * K1, K1]),
        ("131072+2x1024", [vec![128 * K1], vec![K1; 2]].concat()),
        ("131072+5x1024", [vec![128 * K1], vec![K1; 5]].concat()),
        ("65536+512+256+128", vec![64 * K1, 512, 256, 128]),
        ("28672+4096", vec![28 * K1, 4 * K1]),
        ("8x4096", vec![4 * K1; 8]),
        ("4x8192", vec![8 * K1; 4]),
        ("2x16384", vec![16 * K1; 2]),
        ("24576+8192", vec![24 * K1, 8 * K1]),
        ("32768+256+256", vec![32 * K1, 256, 256]),
        ("40960+1024+8192", vec![40 * K1, K1, 8 * K1]),
    ];
    let mut v = Vec::new();
    for h in [4, 8] {
        for (name, seqs) in &shapes {
            v.push(SplitCase {
                name: format!("fwd_h_split_h{h}_{name}"),
                heads: h,
                seqs: seqs.clone(),
            });
        }
    }
    for (h, name, seqs) in [
        (16, "131072", vec![128 * K1]),
        (32, "32768", vec![32 * K1]),
        (32, "8x8192", vec![8 * K1; 8]),
    ] {
        v.push(SplitCase {
            name: format!("fwd_h_split_h{h}_{name}"),
            heads: h,
            seqs,
        });
    }
    v
}

/// Times `case` three ways and returns its JSON row.
pub fn run(gpu: &Gpu, case: &SplitCase, iters: usize, l2: usize, free: usize) -> GpuResult<Value> {
    let mut cu = vec![0i64];
    for s in &case.seqs {
        cu.push(cu.last().unwrap() + *s as i64);
    }
    let data = sets(gpu, case.heads, &case.seqs, l2, free)?;
    let n = data.len();
    let p = FwdHParams {
        chunk_size: BT as i64,
        output_final_state: true,
        save_new_value: true,
        state_v_first: false,
    };
    let inputs = |i: usize| data[i % n].tensors(true);
    let serial = FwdHPlan::new(gpu, &inputs(0), Some(&cu), &p)?;
    let mut out = serial.alloc_outputs(gpu)?;
    let serial_ms = time_ms(gpu, iters, |i| serial.run(gpu, &inputs(i), &mut out))?;
    let mut timed = Vec::new();
    for mode in [SplitMode::Auto, SplitMode::Split] {
        let plan = FwdHSplitPlan::new(gpu, &inputs(0), Some(&cu), mode, &p)?;
        let mut ws = plan.alloc_workspace(gpu)?;
        let ms = time_ms(gpu, iters, |i| plan.run(gpu, &inputs(i), &mut ws, &mut out))?;
        timed.push((ms, plan));
    }
    let (auto_ms, auto) = &timed[0];
    let (split_ms, forced) = &timed[1];
    // the forced split's stages one by one (for the policy's constants)
    let mut stage_ms = Vec::new();
    if forced.pieces().is_some() {
        let mut ws = forced.alloc_workspace(gpu)?;
        for st in SplitStage::ALL {
            stage_ms.push(time_ms(gpu, iters, |i| {
                forced.run_stages(gpu, &inputs(i), &mut ws, &mut out, &[st])
            })?);
        }
    }
    let pieces = |pl: &FwdHSplitPlan| pl.pieces().map_or(0, |p| p.len() - 1);
    let d = auto.decision().cloned();
    println!(
        "{:<40} serial {:>8.4} auto {:>8.4} ({:.2}x, {}) split {:>8.4} ({} pieces, {:?}) est {:.0}/{:.0} us, stages {:?} ms",
        case.name,
        serial_ms,
        auto_ms,
        serial_ms / auto_ms,
        if auto.pieces().is_some() { "split" } else { "serial" },
        split_ms,
        pieces(forced),
        forced.choices(),
        d.as_ref().map_or(0.0, |d| d.serial_us),
        d.as_ref().and_then(|d| d.split_us).unwrap_or(0.0),
        stage_ms,
    );
    Ok(json!({
        "name": case.name, "heads": case.heads, "seqs": case.seqs, "median_ms": auto_ms,
        "serial_ms": serial_ms, "split_ms": split_ms, "auto_split": auto.pieces().is_some(),
        "auto_pieces": pieces(auto), "forced_pieces": pieces(forced),
        "forced_kernels": format!("{:?}", forced.choices()),
        "est_serial_us": d.as_ref().map(|d| d.serial_us),
        "est_split_us": d.as_ref().and_then(|d| d.split_us),
        "piece_chunks": d.as_ref().map(|d| d.piece_chunks), "sets": n,
        "forced_stage_ms": stage_ms,
    }))
}
