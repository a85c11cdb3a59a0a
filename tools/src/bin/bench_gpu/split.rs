//! The intra-card split cases of `bench_gpu` (`fwd_h_split_*`): the fwd_h rows of spec
//! `conformance/spec/anchors.md` plus the cuLA report's shapes (H = 4 and 8: 64K, 128K, 64K + 512 +
//! 256 + 128, 128K + 1K, 128K + 2×1K, 128K + 5×1K; the bypass shapes 8×4K, 4×8K, 2×16K, 24K + 8K,
//! 32K + 256 + 256, 40K + 1K + 8K), same inputs as [`super::delta`] (bf16, K = V = 128, chunk
//! 64, `gk`, `initial_state`, final state, `v_new`, varlen). Each row times our serial kernel,
//! our auto path (the policy's choice: the row's `median_ms`) and the policy's best split forced
//! (`split_ms`, and its three stages alone: `forced_stage_ms`), and records whether auto split,
//! its pieces and the policy's estimates. Warm-up pieces (`conformance/spec/ops-delta-rule.md`
//! §5.9, §5.10) on the forced split's pieces: every piece but the first of a sequence warmed up by
//! [`FORCED_WARMUP`] chunks (`warm_forced_ms`: no summary, no merge step), and the device
//! truncation policy deciding per piece from per-token gates (`trunc_strong_ms`: `a` in
//! [−1.5, −0.5], every piece warms up by one chunk; `trunc_long_ms`: `a` in [−1e-3, 0], every
//! piece falls back to the exact summaries), bound and decision kernels included, with the
//! chosen warm-ups summarised (`trunc_*_warm`: pieces warmed up, longest warm-up).

use super::delta::{sets, BT};
use super::{cu_seqlens, random_tensor, time_ms};
use attn_gpu::delta::{
    BoundGates, FwdHPlan, FwdHSplitPlan, SplitMode, SplitStage, TruncationInputs, TruncationParams,
};
use attn_gpu::{Gpu, GpuResult};
use attn_reference::delta::FwdHParams;
use attn_reference::Dtype;
use serde_json::{json, Value};

/// One case: its name (shared with `bench_anchors.py`), value heads and sequence lengths.
pub struct SplitCase {
    pub name: String,
    pub heads: usize,
    pub seqs: Vec<usize>,
}

const K1: usize = 1024;

/// Warm-up chunks of every non-first piece in the forced warm-up rows.
pub const FORCED_WARMUP: i64 = 4;

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
    let cu = cu_seqlens(&case.seqs);
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
    // warm-up pieces on the forced split's pieces: explicit, then chosen by the device policy
    let (mut warm_forced_ms, mut trunc) = (None, Vec::new());
    if let Some(sub) = forced.pieces() {
        let sub = sub.to_vec();
        let starts: Vec<i64> = cu[..cu.len() - 1].to_vec();
        let warm: Vec<i64> = sub[..sub.len() - 1]
            .iter()
            .map(|a| if starts.contains(a) { 0 } else { FORCED_WARMUP })
            .collect();
        let mode = SplitMode::Warmup {
            subseq_cu_seqlens: &sub,
            warmup_chunks: &warm,
        };
        let plan = FwdHSplitPlan::new(gpu, &inputs(0), Some(&cu), mode, &p)?;
        let mut ws = plan.alloc_workspace(gpu)?;
        warm_forced_ms = Some(time_ms(gpu, iters, |i| {
            plan.run(gpu, &inputs(i), &mut ws, &mut out)
        })?);
        let t: usize = case.seqs.iter().sum();
        let policy = forced
            .truncation_policy(gpu, &TruncationParams::default())?
            .expect("a split plan");
        let mut ws = forced.alloc_workspace(gpu)?;
        for (lo, hi, seed) in [(-1.5, -0.5, 71), (-1e-3, 0.0, 72)] {
            let a = random_tensor(gpu, &[1, t, case.heads, 128], Dtype::F32, lo, hi, seed)?;
            let bound = TruncationInputs {
                gates: BoundGates::PerKey(&a),
                gate_scale: 1.0,
                contraction: None,
            };
            let ms = time_ms(gpu, iters, |i| {
                forced.run_truncated(gpu, &inputs(i), &bound, &policy, &mut ws, &mut out)
            })?;
            let chosen = forced.chosen_warmups(gpu, &ws)?.unwrap_or_default();
            let warmed = chosen.iter().filter(|&&w| w > 0).count();
            let longest = chosen.iter().copied().max().unwrap_or(0);
            trunc.push((ms, warmed, longest));
        }
    }
    println!(
        "{:<40} warm-up forced {:?} truncated strong / long (ms, pieces warmed, longest) {:?}",
        case.name, warm_forced_ms, trunc
    );
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
        "warm_forced_ms": warm_forced_ms, "warm_forced_chunks": FORCED_WARMUP,
        "trunc_strong_ms": trunc.first().map(|t| t.0),
        "trunc_strong_warm": trunc.first().map(|t| [t.1 as i64, t.2]),
        "trunc_long_ms": trunc.get(1).map(|t| t.0),
        "trunc_long_warm": trunc.get(1).map(|t| [t.1 as i64, t.2]),
    }))
}
