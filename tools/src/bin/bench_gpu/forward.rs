//! The whole delta-rule forward cases of `bench_gpu` (`fwd_gdn_*`, `fwd_kda_*`): `gdn_fwd` and
//! `kda_fwd` as models call them: bf16, K = V = 128, chunk 64, q/k L2-normalised in the kernel,
//! `initial_state`, final state, varlen `cu_seqlens`. `tools/forward_anchors.py` times FLA 0.6.0
//! (and FlashQLA when installed) on the same rows.
//!
//! Two kinds of rows:
//! - the rows of the issue "The whole delta-rule forward on the GPU" that the split's table
//!   lacks (`fwd_gdn_h32_8x8192`, ...; `conformance/spec/anchors.md`, the frontier table): GDN
//!   with `g ~ U[−1.5, −0.05]` given, KDA with the gate in the kernel (`A_log`, `dt_bias`, lower
//!   bound −5) and `safe_gate`;
//! - the automatic split's rows (issue 24), each in the three gate regimes of
//!   [`attn_tools::gates`], named `fwd_{gdn,kda}_<shape>_{strong,trained,long}`: `g` the
//!   regime's natural-log decays (KDA per key, `use_gate_in_kernel` off, `safe_gate` where the
//!   regime stays in `[−5, 0]`). Each such row also times the same call without the split
//!   (`with_split(gpu, None)`, "serial") and reports the pieces the split chose
//!   ([`DeltaFwdPlan::chosen_warmups`]), for GDN and KDA alike; a plan that does not split
//!   reports "no split" and serial ≈ auto.
//!
//! Bytes = q, k, v (bf16), g (fp32), β (fp32), o (bf16) and the states (fp32), each once. TFLOP/s
//! counts the dense products of the chunked algorithm per chunk and head: `Q Kᵀ`, `K Kᵀ` (2 BT²
//! K each), `w`, `u` (BT² K, BT² V: triangular), `W S`, `Q S`, `Kᵀ D` (2 BT K V each) and
//! `Aqk D` (BT² V).

use super::{cu_seqlens, random_tensor, time_ms};
use attn_gpu::delta::{DeltaFwdPlan, ForwardPath, ForwardTensors};
use attn_gpu::{DeviceTensor, Gpu, GpuResult};
use attn_reference::delta::{GdnFwdParams, KdaFwdParams};
use attn_reference::Dtype;
use attn_tools::gates::GateRegime;
use serde_json::{json, Value};

/// One row: its name (shared with `forward_anchors.py`), key heads, value heads, sequence
/// lengths, op and gate regime (`None`: the original gates of the issue-23 rows).
pub struct FwdCase {
    pub name: String,
    pub h: usize,
    pub hv: usize,
    pub seqs: Vec<usize>,
    pub kda: bool,
    pub regime: Option<GateRegime>,
}

pub fn cases() -> Vec<FwdCase> {
    let plain: [(&str, usize, usize, Vec<usize>); 3] = [
        ("h32_8x8192", 32, 32, vec![8192; 8]),
        ("h16hv64_65536", 16, 64, vec![65536]),
        ("h16hv64_8192", 16, 64, vec![8192]),
    ];
    let long_and_short: Vec<usize> = std::iter::once(131072)
        .chain(std::iter::repeat_n(1024, 10))
        .collect();
    let split: [(&str, usize, usize, Vec<usize>); 7] = [
        ("h4_131072", 4, 4, vec![131072]),
        ("h4_65536", 4, 4, vec![65536]),
        ("h2hv8_65536", 2, 8, vec![65536]),
        ("h4_131072+10x1024", 4, 4, long_and_short),
        ("h4_4x8192", 4, 4, vec![8192; 4]),
        ("h8_131072", 8, 8, vec![131072]),
        ("h32_32768", 32, 32, vec![32768]),
    ];
    let mut v = Vec::new();
    for kda in [false, true] {
        let op = if kda { "kda" } else { "gdn" };
        for (n, h, hv, seqs) in plain.iter().cloned() {
            v.push(FwdCase {
                name: format!("fwd_{op}_{n}"),
                h,
                hv,
                seqs,
                kda,
                regime: None,
            });
        }
        for (n, h, hv, seqs) in split.iter() {
            for r in GateRegime::ALL {
                v.push(FwdCase {
                    name: format!("fwd_{op}_{n}_{}", r.name()),
                    h: *h,
                    hv: *hv,
                    seqs: seqs.clone(),
                    kda,
                    regime: Some(r),
                });
            }
        }
    }
    v
}

const K: usize = 128;
const V: usize = 128;
const BT: usize = 64;

/// One input set of a row (the context-parallel rows draw theirs alike).
pub struct Set {
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    g: DeviceTensor,
    beta: DeviceTensor,
    h0: DeviceTensor,
    /// KDA's in-kernel gate (`A_log`, `dt_bias`), on the rows without a regime.
    gate: Option<(DeviceTensor, DeviceTensor)>,
}

impl Set {
    /// Random inputs of `t` tokens, `h` key and `hv` value heads and `n` state rows (bf16 q, k,
    /// v; fp32 g, β, initial state), seeds `seed + 1 ..= seed + 8`. `g`: the decay of `regime`
    /// (natural log, per token and value head, and key for KDA), the trained regime's
    /// parameters from the regime's seed (its second field; shards of one sequence share it);
    /// without a regime, KDA's gate input with `A_log` and `dt_bias` for the gate in the kernel,
    /// or GDN's `U[−1.5, −0.05]`.
    #[allow(clippy::too_many_arguments)]
    pub fn random(
        gpu: &Gpu,
        kda: bool,
        regime: Option<(GateRegime, u64)>,
        t: usize,
        h: usize,
        hv: usize,
        n: usize,
        seed: u64,
    ) -> GpuResult<Set> {
        let gk = if kda { K } else { 1 };
        let gshape: Vec<usize> = if kda {
            vec![1, t, hv, K]
        } else {
            vec![1, t, hv]
        };
        let g = match regime {
            Some((r, params)) => {
                let mut g = DeviceTensor::alloc(gpu, &gshape, Dtype::F32)?;
                g.copy_from_host(gpu, &r.decays_with(t, hv, gk, params, seed + 4))?;
                g
            }
            // KDA: the gate's input
            None if kda => random_tensor(gpu, &gshape, Dtype::F32, -2.0, 2.0, seed + 4)?,
            None => random_tensor(gpu, &gshape, Dtype::F32, -1.5, -0.05, seed + 4)?,
        };
        let gate = if kda && regime.is_none() {
            Some((
                random_tensor(gpu, &[hv], Dtype::F32, 0.0, 2.7, seed + 7)?,
                random_tensor(gpu, &[hv * K], Dtype::F32, -7.0, -2.3, seed + 8)?,
            ))
        } else {
            None
        };
        Ok(Set {
            q: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -1.0, 1.0, seed + 1)?,
            k: random_tensor(gpu, &[1, t, h, K], Dtype::BF16, -1.0, 1.0, seed + 2)?,
            v: random_tensor(gpu, &[1, t, hv, V], Dtype::BF16, -1.0, 1.0, seed + 3)?,
            g,
            beta: random_tensor(gpu, &[1, t, hv], Dtype::F32, 0.0, 1.0, seed + 5)?,
            h0: random_tensor(gpu, &[n, hv, K, V], Dtype::F32, -0.1, 0.1, seed + 6)?,
            gate,
        })
    }

    pub fn tensors(&self) -> ForwardTensors<'_> {
        ForwardTensors {
            initial_state: Some(&self.h0),
            a_log: self.gate.as_ref().map(|g| &g.0),
            dt_bias: self.gate.as_ref().map(|g| &g.1),
            ..ForwardTensors::new(&self.q, &self.k, &self.v, &self.g, &self.beta)
        }
    }
}

/// The pieces of a split run, from [`DeltaFwdPlan::chosen_warmups`] (`[P · HV]`).
struct SplitSummary {
    /// Pieces × value heads.
    pieces_heads: usize,
    /// The most warm-up chunks of a piece.
    warmup_max: i64,
    /// Pieces that warmed up (`w > 0`).
    warmed: usize,
    /// Pieces run through by the piece before them (`w = −1`).
    run_through: usize,
}

impl SplitSummary {
    fn new(w: &[i64]) -> SplitSummary {
        SplitSummary {
            pieces_heads: w.len(),
            warmup_max: w.iter().copied().max().unwrap_or(0),
            warmed: w.iter().filter(|&&x| x > 0).count(),
            run_through: w.iter().filter(|&&x| x < 0).count(),
        }
    }

    fn json(&self) -> Value {
        json!({"pieces_heads": self.pieces_heads, "warmup_max": self.warmup_max,
               "warmed": self.warmed, "run_through": self.run_through})
    }
}

/// The input sets of `case` (`nsets` rotated copies, seeds `20 i + …`).
fn input_sets(gpu: &Gpu, case: &FwdCase, t: usize, nsets: usize) -> GpuResult<Vec<Set>> {
    let n = case.seqs.len();
    (0..nsets as u64)
        .map(|i| {
            let regime = case.regime.map(|r| (r, 20 * i + 4));
            Set::random(gpu, case.kda, regime, t, case.h, case.hv, n, 20 * i)
        })
        .collect()
}

/// The `Auto` plan of `case` on `set`'s shapes.
fn plan(gpu: &Gpu, case: &FwdCase, set: &Set, cu: &[i64]) -> GpuResult<DeltaFwdPlan> {
    if case.kda {
        let in_kernel = set.gate.is_some();
        let p = KdaFwdParams {
            output_final_state: true,
            use_qk_l2norm_in_kernel: true,
            use_gate_in_kernel: in_kernel,
            lower_bound: in_kernel.then_some(-5.0),
            safe_gate: case.regime.is_none_or(GateRegime::within_safe_gate),
            ..KdaFwdParams::default()
        };
        DeltaFwdPlan::kda(gpu, &set.tensors(), Some(cu), &p, ForwardPath::Auto)
    } else {
        let p = GdnFwdParams {
            output_final_state: true,
            use_qk_l2norm_in_kernel: true,
            ..GdnFwdParams::default()
        };
        DeltaFwdPlan::gdn(gpu, &set.tensors(), Some(cu), &p, ForwardPath::Auto)
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
    let cu = cu_seqlens(&case.seqs);
    let gk = if case.kda { K } else { 1 };
    let in_bytes = t * (2 * h * K * 2 + hv * V * 2 + hv * gk * 4 + hv * 4) + n * hv * K * V * 4;
    let out_bytes = t * hv * V * 2 + n * hv * K * V * 4;
    // intermediates of the fused path: w, u, kg, qg (bf16), Aqk (bf16), exp2(G_l) per chunk
    // (the serial plan's workspace replaces the automatic one's)
    let work = t * hv * (3 * K + V + BT) * 2;
    let mut nsets = (3 * l2).div_ceil(in_bytes).max(2);
    while nsets > 1 && nsets * in_bytes + out_bytes + work > free * 3 / 4 {
        nsets -= 1;
    }
    let data = input_sets(gpu, case, t, nsets)?;
    let plan_auto = plan(gpu, case, &data[0], &cu)?;
    let mut ws = plan_auto.alloc_workspace(gpu)?;
    let mut out = plan_auto.alloc_outputs(gpu)?;
    let ms = time_ms(gpu, iters, |i| {
        plan_auto.run(gpu, &data[i % nsets].tensors(), &mut ws, &mut out)
    })?;
    let intra_ms = time_ms(gpu, iters, |i| {
        plan_auto.run_intra(gpu, &data[i % nsets].tensors(), &mut ws)
    })?;
    // the automatic split: the pieces it chose, and the same call without it
    let split = plan_auto
        .chosen_warmups(gpu, &ws)?
        .map(|w| (SplitSummary::new(&w), w));
    let verdict = plan_auto.chosen_split(gpu, &ws)?;
    let split_bv = plan_auto.split_choice().map(|c| c.bv);
    let fell_back = plan_auto.ran_exact_fallback(&ws);
    drop(ws);
    let serial_ms = if case.regime.is_some() || plan_auto.splits() {
        let serial = plan(gpu, case, &data[0], &cu)?.with_split(gpu, None)?;
        let mut sws = serial.alloc_workspace(gpu)?;
        Some(time_ms(gpu, iters, |i| {
            serial.run(gpu, &data[i % nsets].tensors(), &mut sws, &mut out)
        })?)
    } else {
        None
    };
    let split_note = match (&split, serial_ms) {
        (Some((s, _)), _) => format!(
            ", split at {:?} columns: {} pieces x heads, {} warmed up (max {} chunks), {} run through{}",
            split_bv,
            s.pieces_heads,
            s.warmed,
            s.warmup_max,
            s.run_through,
            verdict.as_ref().map_or(String::new(), |v| format!(
                ", verdict: split for {} of {} (sequence, head)",
                v.iter().filter(|&&x| x).count(),
                v.len()
            )) + match (fell_back, plan_auto.fallback_intra_pipe()) {
                (true, Some(_)) => ", exact fallback (staged, fwd_h split, intra on kda_intra_pipe)",
                (true, None) => ", exact fallback (staged, fwd_h split)",
                (false, _) => "",
            }
        ),
        (None, Some(_)) => ", no split".to_string(),
        (None, None) => String::new(),
    };
    let serial_note = serial_ms
        .map(|sm| format!(", serial {sm:.4} ms (auto {:.2}x)", sm / ms))
        .unwrap_or_default();
    let bytes = in_bytes + out_bytes;
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    let chunks: usize = case.seqs.iter().map(|s| s.div_ceil(BT)).sum();
    let per_chunk = 4.0 * (BT * BT * K) as f64
        + (BT * BT * (K + V)) as f64
        + 6.0 * (BT * K * V) as f64
        + (BT * BT * V) as f64;
    let tflops = (chunks * hv) as f64 * per_chunk / (ms * 1e-3) / 1e12;
    let choice = plan_auto.fused_choice();
    println!(
        "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}  {:?} {:.1} TFLOP/s, intra {:.4} ms{}{}",
        case.name,
        ms,
        gbps,
        100.0 * gbps / ceiling,
        nsets,
        choice,
        tflops,
        intra_ms,
        serial_note,
        split_note
    );
    Ok(json!({
        "name": case.name, "shape": [1, t, h, hv, K, V], "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "seqs": case.seqs, "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling,
        "sets": nsets, "kernel": format!("{choice:?}"), "tflops": tflops, "path": format!("{:?}", plan_auto.path()),
        "intra_ms": intra_ms, "serial_ms": serial_ms, "regime": case.regime.map(GateRegime::name),
        "split": split.as_ref().map(|(s, _)| s.json()), "warmups": split.map(|(_, w)| w),
        "split_bv": split_bv, "split_verdict": verdict, "exact_fallback": fell_back,
    }))
}

/// The rows of the persistent KDA intra kernel: the intra stage alone of `fwd_kda_h32_8x8192`
/// with `safe_gate`, the lower-bound gate in the kernel (`INTRA_PIPE_ROW`) or `g` given in a
/// regime within `[−5, 0]` (`…_strong`, `…_long`: `use_gate_in_kernel` off), or without
/// `safe_gate` in the trained regime (`…_trained`: the pipe kernel's FMA diagonal), on today's
/// `kda_intra_mma_fast_bf16` and on `kda_intra_pipe` at two CTAs per multiprocessor, both plans
/// pinned ([`DeltaFwdPlan::with_intra_pipe`], so `$ATTN_KDA_INTRA` changes neither). GB/s on the
/// stage's own traffic: q, k, v, g, β read, w, u, kg, qg, Aqk, qf and `exp2(G_ℓ)` written, once
/// each.
pub const INTRA_PIPE_ROW: &str = "intra_kda_pipe_h32_8x8192";

/// The regimes of the intra rows (`None`: the gate in the kernel) and their names.
pub fn intra_pipe_rows() -> Vec<(String, Option<GateRegime>)> {
    std::iter::once((INTRA_PIPE_ROW.to_string(), None))
        .chain(
            [GateRegime::Strong, GateRegime::Long, GateRegime::Trained]
                .map(|r| (format!("{INTRA_PIPE_ROW}_{}", r.name()), Some(r))),
        )
        .collect()
}

pub fn run_intra_pipe(
    gpu: &Gpu,
    name: &str,
    regime: Option<GateRegime>,
    iters: usize,
    l2: usize,
    ceiling: f64,
) -> GpuResult<Value> {
    let case = FwdCase {
        name: name.to_string(),
        h: 32,
        hv: 32,
        seqs: vec![8192; 8],
        kda: true,
        regime,
    };
    let (h, hv) = (case.h, case.hv);
    let t: usize = case.seqs.iter().sum();
    let cu = cu_seqlens(&case.seqs);
    let in_bytes = t * (2 * h * K * 2 + hv * V * 2 + hv * K * 4 + hv * 4);
    let chunks: usize = case.seqs.iter().map(|s| s.div_ceil(BT)).sum();
    let out_bytes = t * hv * (4 * K * 2 + BT * 2 + 4) + chunks * hv * K * 4;
    let nsets = (3 * l2).div_ceil(in_bytes).max(2);
    let data = input_sets(gpu, &case, t, nsets)?;
    let grid = 2 * gpu.sm_count();
    let mut ms = [0.0f64; 2];
    for (i, pipe) in [None, Some(grid)].into_iter().enumerate() {
        let p = plan(gpu, &case, &data[0], &cu)?.with_intra_pipe(pipe);
        assert_eq!(
            p.intra_pipe(),
            pipe,
            "{name}: the plan runs the kernel asked for"
        );
        let mut ws = p.alloc_workspace(gpu)?;
        ms[i] = time_ms(gpu, iters, |j| {
            p.run_intra(gpu, &data[j % nsets].tensors(), &mut ws)
        })?;
    }
    let gbps = |m: f64| (in_bytes + out_bytes) as f64 / (m * 1e-3) / 1e9;
    println!(
        "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}  kda_intra_pipe ({grid} CTAs); today's intra {:.4} ms ({:.0} GB/s), {:.2}x",
        name,
        ms[1],
        gbps(ms[1]),
        100.0 * gbps(ms[1]) / ceiling,
        nsets,
        ms[0],
        gbps(ms[0]),
        ms[0] / ms[1]
    );
    Ok(json!({
        "name": name, "shape": [1, t, h, hv, K, V], "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "seqs": case.seqs, "bytes": in_bytes + out_bytes, "median_ms": ms[1], "gbps": gbps(ms[1]),
        "share": gbps(ms[1]) / ceiling, "sets": nsets, "kernel": "kda_intra_pipe", "grid": grid,
        "today_ms": ms[0], "today_gbps": gbps(ms[0]), "speedup": ms[0] / ms[1],
        "regime": regime.map(GateRegime::name),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23's other rows once each, issue 24's rows once per regime, every name distinct and
    /// picked by `fwd_gdn` / `fwd_kda`, a regime's suffix picking its rows alone.
    #[test]
    fn row_names() {
        let c = cases();
        assert_eq!(c.len(), 2 * (3 + 7 * 3));
        let names: std::collections::HashSet<&str> = c.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names.len(), c.len());
        for op in ["fwd_gdn", "fwd_kda"] {
            assert_eq!(c.iter().filter(|x| x.name.contains(op)).count(), 24);
        }
        assert_eq!(c.iter().filter(|x| x.regime.is_none()).count(), 6);
        for r in GateRegime::ALL {
            let suffix = format!("_{}", r.name());
            let picked: Vec<_> = c.iter().filter(|x| x.name.contains(&suffix)).collect();
            assert_eq!(picked.len(), 14);
            assert!(picked.iter().all(|x| x.regime == Some(r)));
        }
        let one: Vec<_> = c
            .iter()
            .filter(|x| x.name.contains("fwd_gdn_h4_131072_strong"))
            .collect();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].seqs, vec![131072]);
    }
}
