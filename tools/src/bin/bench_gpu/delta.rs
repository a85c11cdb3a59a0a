//! The delta-rule cases of `bench_gpu`: `chunk_gated_delta_rule_fwd_h` on the rows of the fwd_h
//! table of `conformance/spec/anchors.md` (bf16, K = V = 128, chunk 64, `gk`, `initial_state`,
//! final state, `v_new`, varlen `cu_seqlens`) and `fwd_h_pre_scan` on H = 4, T = 131072 cut into 32
//! pieces.
//!
//! Inputs are random (`k, w` in ±0.02, `u` in ±1, `gk` in [−0.1, 0], the state in ±1): a
//! kernel's time does not depend on the values. Bytes = `k, w, u, v_new, h` (bf16) + `gk` (fp32)
//! + the states (fp32), each once.

use super::{cu_seqlens, random_tensor, time_ms};
use attn_gpu::delta::{FwdHPlan, FwdHPreScanPlan, FwdHTensors};
use attn_gpu::{DeviceTensor, Gpu, GpuResult};
use attn_reference::delta::{FwdHParams, FwdHPreScanParams};
use attn_reference::Dtype;
use serde_json::{json, Value};

/// One case: its name (shared with `bench_anchors.py`), value heads and sequence lengths.
pub struct DeltaCase {
    pub name: &'static str,
    pub heads: usize,
    pub seqs: Vec<usize>,
    /// `Some(p)`: the pre-scan of the sequence cut into `p` equal pieces.
    pub pieces: Option<usize>,
}

pub fn cases() -> Vec<DeltaCase> {
    let c = |name, heads, seqs: Vec<usize>| DeltaCase {
        name,
        heads,
        seqs,
        pieces: None,
    };
    let mut v = vec![
        c("fwd_h_h4_4096", 4, vec![4096]),
        c("fwd_h_h4_32768", 4, vec![32768]),
        c("fwd_h_h4_65536", 4, vec![65536]),
        c("fwd_h_h4_131072", 4, vec![131072]),
        c("fwd_h_h4_131072+10x1024", 4, {
            let mut s = vec![131072];
            s.extend([1024; 10]);
            s
        }),
        c("fwd_h_h4_4x8192", 4, vec![8192; 4]),
        c("fwd_h_h4_28672+4096", 4, vec![28672, 4096]),
        c("fwd_h_h8_131072", 8, vec![131072]),
        c("fwd_h_h16_131072", 16, vec![131072]),
        c("fwd_h_h32_32768", 32, vec![32768]),
        c("fwd_h_h32_8x8192", 32, vec![8192; 8]),
    ];
    v.push(DeltaCase {
        name: "fwd_h_pre_scan_h4_131072_32pieces",
        heads: 4,
        seqs: vec![131072],
        pieces: Some(32),
    });
    v
}

const K: usize = 128;
const V: usize = 128;
pub const BT: usize = 64;

/// One input set.
pub struct Set {
    k: DeviceTensor,
    w: DeviceTensor,
    u: DeviceTensor,
    gk: DeviceTensor,
    h0: DeviceTensor,
}

impl Set {
    pub fn tensors(&self, with_state: bool) -> FwdHTensors<'_> {
        FwdHTensors {
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: None,
            gk: Some(&self.gk),
            initial_state: with_state.then_some(&self.h0),
        }
    }
}

/// Random input sets for `h` heads over sequences `seqs`: enough to exceed 3x the L2 (at least
/// 2) where memory allows.
pub fn sets(gpu: &Gpu, h: usize, seqs: &[usize], l2: usize, free: usize) -> GpuResult<Vec<Set>> {
    let t: usize = seqs.iter().sum();
    let n = seqs.len();
    let chunks: usize = seqs.iter().map(|s| s.div_ceil(BT)).sum();
    let tok = t * h;
    let in_bytes = tok * (2 * K + V) * 2 + tok * K * 4;
    let state = n * h * K * V * 4;
    let mut sets = (3 * l2).div_ceil(in_bytes).max(2);
    let out_bytes = chunks * h * K * V * 2 + tok * V * 2 + state;
    while sets > 1 && sets * (in_bytes + state) + out_bytes > free * 3 / 4 {
        sets -= 1;
    }
    (0..sets as u64)
        .map(|i| {
            Ok(Set {
                k: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -0.02, 0.02, 10 * i + 1)?,
                w: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -0.02, 0.02, 10 * i + 2)?,
                u: random_tensor(gpu, &[1, t, h, V], Dtype::BF16, -1.0, 1.0, 10 * i + 3)?,
                gk: random_tensor(gpu, &[1, t, h, K], Dtype::F32, -0.1, 0.0, 10 * i + 4)?,
                h0: random_tensor(gpu, &[n, h, K, V], Dtype::F32, -1.0, 1.0, 10 * i + 5)?,
            })
        })
        .collect()
}

/// Times `case` (`iters` launches, inputs rotated over enough sets to exceed 3x the L2) and
/// returns its JSON row (with `tflops` for the pre-scan).
pub fn run(
    gpu: &Gpu,
    case: &DeltaCase,
    iters: usize,
    l2: usize,
    free: usize,
    ceiling: f64,
) -> GpuResult<Value> {
    let t: usize = case.seqs.iter().sum();
    let h = case.heads;
    let cu = cu_seqlens(&case.seqs);
    let chunks: usize = case.seqs.iter().map(|s| s.div_ceil(BT)).sum();
    let n = case.seqs.len();
    let tok = t * h;
    let in_bytes = tok * (2 * K + V) * 2 + tok * K * 4;
    let state = n * h * K * V * 4;
    let out_bytes = chunks * h * K * V * 2 + tok * V * 2 + state;
    let data = sets(gpu, h, &case.seqs, l2, free)?;
    let sets = data.len();
    let (ms, bytes, extra, choice) = match case.pieces {
        None => {
            let p = FwdHParams {
                chunk_size: BT as i64,
                output_final_state: true,
                save_new_value: true,
                state_v_first: false,
            };
            let plan = FwdHPlan::new(gpu, &data[0].tensors(true), Some(&cu), &p)?;
            let mut out = plan.alloc_outputs(gpu)?;
            let ms = time_ms(gpu, iters, |i| {
                plan.run(gpu, &data[i % sets].tensors(true), &mut out)
            })?;
            let kernel = if plan.hopper() {
                "Hopper (wg)".to_string()
            } else {
                format!("{:?}", plan.choice())
            };
            (ms, in_bytes + out_bytes + state, json!({}), kernel)
        }
        Some(p) => {
            let step = (t / p).div_ceil(BT) * BT;
            let cuts: Vec<i64> = (0..p)
                .map(|j| (j * step).min(t) as i64)
                .chain([t as i64])
                .collect();
            let params = FwdHPreScanParams {
                chunk_size: BT as i64,
            };
            let plan = FwdHPreScanPlan::new(gpu, &data[0].tensors(false), Some(&cuts), &params)?;
            let mut hm = DeviceTensor::alloc(gpu, &plan.hm_shape(), Dtype::F32)?;
            let ms = time_ms(gpu, iters, |i| {
                plan.run(gpu, &data[i % sets].tensors(false), &mut hm)
            })?;
            // per chunk and head: W·X and Kᵀ·D, each 2·BT·K·(V + K) flops
            let flops = (chunks * h) as f64 * 4.0 * (BT * K * (V + K)) as f64;
            let tflops = flops / (ms * 1e-3) / 1e12;
            (
                ms,
                in_bytes + p * h * K * (V + K) * 4,
                json!({ "tflops": tflops }),
                format!("{:?}", plan.choice()),
            )
        }
    };
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    let longest = case.seqs.iter().copied().max().unwrap_or(0);
    let step_us = ms * 1e3 / (longest.div_ceil(BT) as f64).max(1.0);
    println!(
        "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}  {}{}",
        case.name,
        ms,
        gbps,
        100.0 * gbps / ceiling,
        sets,
        choice,
        extra
            .get("tflops")
            .map(|v| format!(" {:.1} TFLOP/s", v.as_f64().unwrap_or(0.0)))
            .unwrap_or_default()
    );
    let mut row = json!({
        "name": case.name, "shape": [1, t, h, K], "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling, "sets": sets,
        "kernel": choice, "longest_seq_step_us": step_us,
    });
    if let (Some(r), Some(e)) = (row.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    Ok(row)
}
