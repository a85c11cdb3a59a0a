//! The whole delta-rule forward cases of `bench_gpu` (`fwd_gdn_*`, `fwd_kda_*`): `gdn_fwd` and
//! `kda_fwd` as models call them, on the rows of the issue "The whole delta-rule forward on the
//! GPU" (`conformance/spec/anchors.md`, the frontier table): bf16, K = V = 128, chunk 64, q/k
//! L2-normalised in the kernel, `initial_state`, final state, varlen `cu_seqlens`; GDN with `g`
//! given (`logsigmoid`-like decays), KDA with the gate in the kernel (`A_log`, `dt_bias`, lower
//! bound −5) and `safe_gate`. `tools/forward_anchors.py` times FLA 0.6.0 (and FlashQLA when
//! installed) on the same rows.
//!
//! Bytes = q, k, v (bf16), g (fp32), β (fp32), o (bf16) and the states (fp32), each once. TFLOP/s
//! counts the dense products of the chunked algorithm per chunk and head: `Q Kᵀ`, `K Kᵀ` (2 BT²
//! K each), `w`, `u` (BT² K, BT² V: triangular), `W S`, `Q S`, `Kᵀ D` (2 BT K V each) and
//! `Aqk D` (BT² V).

use super::{random_tensor, time_ms};
use attn_gpu::delta::{DeltaFwdPlan, ForwardPath, ForwardTensors};
use attn_gpu::{DeviceTensor, Gpu, GpuResult};
use attn_reference::delta::{GdnFwdParams, KdaFwdParams};
use attn_reference::Dtype;
use serde_json::{json, Value};

/// One row: its name (shared with `forward_anchors.py`), key heads, value heads, sequence
/// lengths and op.
pub struct FwdCase {
    pub name: String,
    pub h: usize,
    pub hv: usize,
    pub seqs: Vec<usize>,
    pub kda: bool,
}

pub fn cases() -> Vec<FwdCase> {
    let rows: [(&str, usize, usize, Vec<usize>); 7] = [
        ("h4_131072", 4, 4, vec![131072]),
        ("h32_32768", 32, 32, vec![32768]),
        ("h32_8x8192", 32, 32, vec![8192; 8]),
        ("h16hv64_65536", 16, 64, vec![65536]),
        ("h16hv64_8192", 16, 64, vec![8192]),
        ("h2hv8_65536", 2, 8, vec![65536]),
        ("h4_4x8192", 4, 4, vec![8192; 4]),
    ];
    let mut v = Vec::new();
    for kda in [false, true] {
        for (n, h, hv, seqs) in rows.iter().cloned() {
            let op = if kda { "kda" } else { "gdn" };
            v.push(FwdCase {
                name: format!("fwd_{op}_{n}"),
                h,
                hv,
                seqs,
                kda,
            });
        }
    }
    v
}

const K: usize = 128;
const V: usize = 128;
const BT: usize = 64;

/// One input set of a row.
struct Set {
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    g: DeviceTensor,
    beta: DeviceTensor,
    h0: DeviceTensor,
    a_log: DeviceTensor,
    dt_bias: DeviceTensor,
}

impl Set {
    fn tensors(&self, kda: bool) -> ForwardTensors<'_> {
        ForwardTensors {
            initial_state: Some(&self.h0),
            a_log: kda.then_some(&self.a_log),
            dt_bias: kda.then_some(&self.dt_bias),
            ..ForwardTensors::new(&self.q, &self.k, &self.v, &self.g, &self.beta)
        }
    }
}

/// Times `case` and returns its JSON row.
pub fn run(
    gpu: &Gpu,
    case: &FwdCase,
    iters: usize,
    l2: usize,
    free: usize,
    ceiling: f64,
) -> GpuResult<Value> {
    let (h, hv) = (case.h, case.hv);
    let t: usize = case.seqs.iter().sum();
    let n = case.seqs.len();
    let mut cu = vec![0i64];
    for s in &case.seqs {
        cu.push(cu.last().unwrap() + *s as i64);
    }
    let gk = if case.kda { K } else { 1 };
    let in_bytes = t * (2 * h * K * 2 + hv * V * 2 + hv * gk * 4 + hv * 4) + n * hv * K * V * 4;
    let out_bytes = t * hv * V * 2 + n * hv * K * V * 4;
    // intermediates of the fused path: w, u, kg, qg (bf16), Aqk (bf16), exp2(G_l) per chunk
    let work = t * hv * (3 * K + V + BT) * 2;
    let mut nsets = (3 * l2).div_ceil(in_bytes).max(2);
    while nsets > 1 && nsets * in_bytes + out_bytes + work > free * 3 / 4 {
        nsets -= 1;
    }
    let gshape: Vec<usize> = if case.kda {
        vec![1, t, hv, K]
    } else {
        vec![1, t, hv]
    };
    let data = (0..nsets as u64)
        .map(|i| {
            Ok(Set {
                q: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -1.0, 1.0, 20 * i + 1)?,
                k: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -1.0, 1.0, 20 * i + 2)?,
                v: random_tensor(gpu, &[1, t, hv, V], Dtype::BF16, -1.0, 1.0, 20 * i + 3)?,
                // GDN: per-step decays; KDA: the gate's input
                g: if case.kda {
                    random_tensor(gpu, &gshape, Dtype::F32, -2.0, 2.0, 20 * i + 4)?
                } else {
                    random_tensor(gpu, &gshape, Dtype::F32, -1.5, -0.05, 20 * i + 4)?
                },
                beta: random_tensor(gpu, &[1, t, hv], Dtype::F32, 0.0, 1.0, 20 * i + 5)?,
                h0: random_tensor(gpu, &[n, hv, K, V], Dtype::F32, -0.1, 0.1, 20 * i + 6)?,
                a_log: random_tensor(gpu, &[hv], Dtype::F32, 0.0, 2.7, 20 * i + 7)?,
                dt_bias: random_tensor(gpu, &[hv * K], Dtype::F32, -7.0, -2.3, 20 * i + 8)?,
            })
        })
        .collect::<GpuResult<Vec<Set>>>()?;
    let plan = if case.kda {
        let p = KdaFwdParams {
            output_final_state: true,
            use_qk_l2norm_in_kernel: true,
            use_gate_in_kernel: true,
            lower_bound: Some(-5.0),
            safe_gate: true,
            ..KdaFwdParams::default()
        };
        DeltaFwdPlan::kda(
            gpu,
            &data[0].tensors(true),
            Some(&cu),
            &p,
            ForwardPath::Auto,
        )?
    } else {
        let p = GdnFwdParams {
            output_final_state: true,
            use_qk_l2norm_in_kernel: true,
            ..GdnFwdParams::default()
        };
        DeltaFwdPlan::gdn(
            gpu,
            &data[0].tensors(false),
            Some(&cu),
            &p,
            ForwardPath::Auto,
        )?
    };
    let mut ws = plan.alloc_workspace(gpu)?;
    let mut out = plan.alloc_outputs(gpu)?;
    let ms = time_ms(gpu, iters, |i| {
        plan.run(gpu, &data[i % nsets].tensors(case.kda), &mut ws, &mut out)
    })?;
    let intra_ms = time_ms(gpu, iters, |i| {
        plan.run_intra(gpu, &data[i % nsets].tensors(case.kda), &mut ws)
    })?;
    // the automatic split (GDN): its warm-ups, and the same call without it
    let warmups = plan.chosen_warmups(gpu, &ws)?;
    let verdict = plan.chosen_split(gpu, &ws)?;
    let split_bv = plan.split_choice().map(|c| c.bv);
    let serial_ms = if plan.splits() {
        let p = GdnFwdParams {
            output_final_state: true,
            use_qk_l2norm_in_kernel: true,
            ..GdnFwdParams::default()
        };
        let serial = DeltaFwdPlan::gdn(
            gpu,
            &data[0].tensors(false),
            Some(&cu),
            &p,
            ForwardPath::Auto,
        )?
        .with_split(gpu, None)?;
        let mut sws = serial.alloc_workspace(gpu)?;
        Some(time_ms(gpu, iters, |i| {
            serial.run(gpu, &data[i % nsets].tensors(false), &mut sws, &mut out)
        })?)
    } else {
        None
    };
    let split_note = match (&warmups, serial_ms) {
        (Some(w), Some(sm)) => format!(
            ", split at {:?} columns: {} pieces x heads, warm-ups max {} (-1: run through: {}){}, serial {:.4} ms",
            split_bv,
            w.len(),
            w.iter().max().copied().unwrap_or(0),
            w.iter().filter(|&&x| x < 0).count(),
            verdict.as_ref().map_or(String::new(), |v| format!(
                ", verdict: split for {} of {} (sequence, head)",
                v.iter().filter(|&&x| x).count(),
                v.len()
            )),
            sm
        ),
        _ => String::new(),
    };
    let bytes = in_bytes + out_bytes;
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    let chunks: usize = case.seqs.iter().map(|s| s.div_ceil(BT)).sum();
    let per_chunk = 4.0 * (BT * BT * K) as f64
        + (BT * BT * (K + V)) as f64
        + 6.0 * (BT * K * V) as f64
        + (BT * BT * V) as f64;
    let tflops = (chunks * hv) as f64 * per_chunk / (ms * 1e-3) / 1e12;
    let choice = plan.fused_choice();
    println!(
        "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}  {:?} {:.1} TFLOP/s, intra {:.4} ms{}",
        case.name,
        ms,
        gbps,
        100.0 * gbps / ceiling,
        nsets,
        choice,
        tflops,
        intra_ms,
        split_note
    );
    Ok(json!({
        "name": case.name, "shape": [1, t, h, hv, K, V], "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "seqs": case.seqs, "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling,
        "sets": nsets, "kernel": format!("{choice:?}"), "tflops": tflops, "path": format!("{:?}", plan.path()),
        "intra_ms": intra_ms, "serial_ms": serial_ms, "warmups": warmups, "split_bv": split_bv, "split_verdict": verdict,
    }))
}
