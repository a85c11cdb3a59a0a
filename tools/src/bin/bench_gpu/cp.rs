//! The context-parallel rows of `bench_gpu` (`cp_gdn_*`, `cp_kda_*`): the whole forward
//! (`attn_gpu::cp::CpFwdPlan::run`, GDN or KDA) over `R` = 1, 2, 4 GPUs of the host (one
//! process, NCCL), on the rows of issue 25: bf16, K = V = 128, H = HV = 4 and 16, one sequence
//! of 1,048,576 tokens or 524,288 + 64 × 4096, chunk 64, q/k L2-normalised in the kernel,
//! `initial_state`, final state; the decay `g` given per token (GDN `[T, HV]`, KDA `[T, HV, K]`,
//! natural log) in the regimes `strong` and `trained` (trained-like: Mamba's initialisation) of
//! [`GateRegime`] (`tools/src/gates.rs`), every shard and the single GPU's input drawn with the
//! same gate parameters (one model), each rank's tokens from its own seed. Each row also prints
//! every rank's local split (`local splits`: the longest warm-up, the pieces run through, the
//! (sequence, value head) pairs the split ran).
//! `tools/cp_anchors.py` times FLA's and FlashQLA's context parallelism on the same rows.
//!
//! Method: the inputs are already sharded on the devices ([`Partition::balanced`], the ops'
//! default minimum piece): the scatter is not timed, nor is the plan (`CpFwdPlan`: plans,
//! tables, workspaces, summary and all-gather buffers, made once per row, outputs allocated
//! once). One sample is the host wall time of one `CpFwdPlan::run` and `CpGroup::synchronize`,
//! from its first launch until every rank has synchronised (all ranks are idle before it);
//! median of `min(--iters, 10)` samples after 2 warm-up calls. `single_ms` is our best single-GPU time of the same row: the plain
//! `DeltaFwdPlan` forward on GPU 0 on the whole input (its automatic split included), timed the
//! same way (run + synchronise). Each row reports `speedup_r1` (the `R = 1` row's time over
//! this one's), `vs_single` (`single_ms` over this one's) and `mem_gib` (per GPU: device
//! memory in use after the row's calls: inputs, and the plan's buffers and outputs kept by the
//! allocator's pool after the plan is dropped). A row
//! for more GPUs than the host has, or without NCCL, is skipped with a printed reason.
//!
//! `cp_gdn_h32_4194304_strong`: H = 32, 4,194,304 tokens, whose q, k, v alone exceed one GPU
//! (the row for "does not fit one GPU"): only `R = 4` runs (the others are skipped with the
//! sizes), and after its timing GPU 0 runs rank 0's shard alone, whose `o` must equal rank 0's
//! (`first_vs_one`, largest |difference| over largest |o|; rank 0 merges nothing, so the same
//! kernels see the same inputs). The other ranks' outputs at that size have no check here.

use super::cu_seqlens;
use super::forward::Set;
use attn_gpu::cp::{
    CpFwdPlan, CpGroup, CpPhaseTimes, LocalChoice, Partition, SentSummary, DEFAULT_MIN_PIECE_CHUNKS,
};
use attn_gpu::delta::{DeltaFwdPlan, ForwardPath, ForwardTensors};
use attn_gpu::{Gpu, GpuResult};
use attn_reference::delta::{GdnFwdParams, KdaFwdParams};
use attn_tools::gates::GateRegime;
use half::bf16;
use serde_json::{json, Value};
use std::time::Instant;

/// The GPU counts of the rows.
pub const RANKS: [usize; 3] = [1, 2, 4];

const K: usize = 128;
const V: usize = 128;
const BT: usize = 64;
/// Timed calls per sample set (at most), after [`WARMUP`] calls.
const MAX_ITERS: usize = 10;
const WARMUP: usize = 2;

/// One row family: its name without the `_r{R}` suffix, heads (H = HV), sequences, op, decay,
/// and the fewest GPUs it fits (1, or 4 for the row whose inputs exceed one GPU).
pub struct CpCase {
    pub name: String,
    pub h: usize,
    pub seqs: Vec<usize>,
    pub kda: bool,
    pub decay: GateRegime,
    pub min_ranks: usize,
}

impl CpCase {
    /// The name of the row on `ranks` GPUs.
    pub fn row(&self, ranks: usize) -> String {
        format!("{}_r{ranks}", self.name)
    }
}

/// Every row family: GDN and KDA × H 4, 16 × the two layouts × the two decays; and GDN H 32 ×
/// 4,194,304 tokens, strong decay, whose q, k, v alone (103 GB) exceed one GPU: 4 GPUs only.
pub fn cases() -> Vec<CpCase> {
    let layouts: [(&str, Vec<usize>); 2] = [
        ("1048576", vec![1 << 20]),
        ("524288p64x4096", {
            let mut s = vec![1 << 19];
            s.extend([4096; 64]);
            s
        }),
    ];
    let mut v = Vec::new();
    for kda in [false, true] {
        for h in [4, 16] {
            for (lname, seqs) in &layouts {
                for decay in [GateRegime::Strong, GateRegime::Trained] {
                    let op = if kda { "kda" } else { "gdn" };
                    v.push(CpCase {
                        name: format!("cp_{op}_h{h}_{lname}_{}", decay.name()),
                        h,
                        seqs: seqs.clone(),
                        kda,
                        decay,
                        min_ranks: 1,
                    });
                }
            }
        }
    }
    v.push(CpCase {
        name: "cp_gdn_h32_4194304_strong".into(),
        h: 32,
        seqs: vec![1 << 22],
        kda: false,
        decay: GateRegime::Strong,
        min_ranks: 4,
    });
    v
}

/// The seed of the trained regime's gate parameters: one model's `A_log` and `dt_bias` for the
/// single-GPU input and every rank's shard (S11-6: drawn per shard, the ranks of a trained row
/// had other heads than the single GPU's input, one of them too slow to split).
const GATE_PARAMS_SEED: u64 = 11;

/// Random inputs of `t` tokens and `n` state rows of `case` on `gpu` (one rank's, or the
/// whole call's on one GPU): tokens from `seed`, the gate parameters shared.
fn inputs(gpu: &Gpu, case: &CpCase, t: usize, n: usize, seed: u64) -> GpuResult<Set> {
    let regime = Some((case.decay, GATE_PARAMS_SEED));
    Set::random(gpu, case.kda, regime, t, case.h, case.h, n, seed)
}

fn gdn_params() -> GdnFwdParams {
    GdnFwdParams {
        output_final_state: true,
        use_qk_l2norm_in_kernel: true,
        ..GdnFwdParams::default()
    }
}

fn kda_params() -> KdaFwdParams {
    KdaFwdParams {
        output_final_state: true,
        use_qk_l2norm_in_kernel: true,
        ..KdaFwdParams::default()
    }
}

/// Median host wall time (ms) of `call` (which ends synchronised), after the warm-up calls.
fn wall_ms(iters: usize, mut call: impl FnMut() -> GpuResult<()>) -> GpuResult<f64> {
    for _ in 0..WARMUP {
        call()?;
    }
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        call()?;
        t.push(start.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Device memory in use on `gpu`, GiB.
fn used_gib(gpu: &Gpu) -> GpuResult<f64> {
    let (free, total) = gpu
        .context()
        .mem_get_info()
        .map_err(attn_gpu::GpuError::driver_ctx("memory info"))?;
    Ok((total - free) as f64 / (1u64 << 30) as f64)
}

/// Bytes of a row: q, k, v (bf16), g, β (fp32), o (bf16), initial and final states (fp32).
fn bytes(case: &CpCase) -> usize {
    let (t, h, n) = (case.seqs.iter().sum::<usize>(), case.h, case.seqs.len());
    let gk = if case.kda { K } else { 1 };
    t * (3 * h * K * 2 + h * gk * 4 + h * 4 + h * V * 2) + 2 * n * h * K * V * 4
}

/// What a CP row measured: the median ms, the phases of a run (each the median over the
/// iterations of [`CpFwdPlan::run_phases`], the group synchronised between phases), per rank
/// whether the last run sent its tail's summary, and for a row too large for one GPU, rank 0's
/// `o` against one GPU (largest |difference| / largest |o|).
struct CpTiming {
    ms: f64,
    phases: CpPhaseTimes,
    tails: Vec<Option<SentSummary>>,
    /// Per rank, its local forward's split in the last run.
    local: Vec<Option<LocalChoice>>,
    first_vs_one: Option<f64>,
}

/// A rank's local split in a few words: the longest warm-up, the pieces run through by the
/// one before them, the (sequence, value head) pairs the split ran, and whether the exact
/// fallback ran instead.
fn describe(c: &Option<LocalChoice>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let through = c.warmups.iter().filter(|&&w| w < 0).count();
    let longest = c.warmups.iter().copied().max().unwrap_or(0);
    let split = c.split.as_ref().map_or("-".into(), |s| {
        format!("{}/{}", s.iter().filter(|&&x| x).count(), s.len())
    });
    format!(
        "warm-up <= {longest}, run through {through}/{}, split {split}{}",
        c.warmups.len(),
        if c.exact_fallback {
            ", exact fallback"
        } else {
            ""
        }
    )
}

/// The CP forward of `case` over `group` on its shards (its plan made outside the timing).
/// With `check_first`, after the timing, GPU 0 runs rank 0's shard alone (the same inputs, its
/// `cu_seqlens`, the same initial state: rank 0 merges nothing) for [`CpTiming::first_vs_one`].
fn time_cp(
    group: &CpGroup,
    part: &Partition,
    case: &CpCase,
    iters: usize,
    check_first: bool,
) -> GpuResult<CpTiming> {
    let shards = group
        .ranks()
        .map(|(r, gpu)| {
            let s = part.shard(r);
            inputs(
                gpu,
                case,
                s.tokens(),
                part.piece_sequences(r).len(),
                100 * r as u64,
            )
        })
        .collect::<GpuResult<Vec<_>>>()?;
    group.synchronize()?;
    let tensors: Vec<ForwardTensors<'_>> = shards.iter().map(Set::tensors).collect();
    let mut plan = if case.kda {
        CpFwdPlan::kda(group, part, &tensors, &kda_params(), ForwardPath::Auto)?
    } else {
        CpFwdPlan::gdn(group, part, &tensors, &gdn_params(), ForwardPath::Auto)?
    };
    let mut outs = plan.alloc_outputs()?;
    group.synchronize()?;
    let ms = wall_ms(iters, || {
        plan.run(&tensors, &mut outs)?;
        group.synchronize()
    })?;
    let phased = (0..iters.max(1))
        .map(|_| plan.run_phases(&tensors, &mut outs))
        .collect::<GpuResult<Vec<_>>>()?;
    let median = |f: fn(&CpPhaseTimes) -> f64| {
        let mut v: Vec<f64> = phased.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let phases = CpPhaseTimes {
        tail_checks_ms: median(|p| p.tail_checks_ms),
        summaries_ms: median(|p| p.summaries_ms),
        exchange_ms: median(|p| p.exchange_ms),
        local_ms: median(|p| p.local_ms),
    };
    let tails = plan.tail_summaries();
    let local = plan.local_choices()?;
    drop(plan);
    let first_vs_one = match (check_first, tensors.first(), outs.first()) {
        (true, Some(t), Some(cp)) => {
            let gpu = group.gpu(0);
            let cu = part.shard(0).cu_seqlens();
            let plan = if case.kda {
                DeltaFwdPlan::kda(gpu, t, Some(&cu), &kda_params(), ForwardPath::Auto)?
            } else {
                DeltaFwdPlan::gdn(gpu, t, Some(&cu), &gdn_params(), ForwardPath::Auto)?
            };
            let mut ws = plan.alloc_workspace(gpu)?;
            let mut one = plan.alloc_outputs(gpu)?;
            plan.run(gpu, t, &mut ws, &mut one)?;
            let (a, b) = (cp.o.to_array::<bf16>(gpu)?, one.o.to_array::<bf16>(gpu)?);
            let (mut diff, mut top) = (0f64, 0f64);
            for (x, y) in a.iter().zip(b.iter()) {
                let (x, y) = (f64::from(*x), f64::from(*y));
                diff = diff.max((x - y).abs());
                top = top.max(y.abs());
            }
            Some(if diff.is_nan() || top.is_nan() {
                f64::NAN
            } else {
                diff / top.max(f64::MIN_POSITIVE)
            })
        }
        _ => None,
    };
    Ok(CpTiming {
        ms,
        phases,
        tails,
        local,
        first_vs_one,
    })
}

/// The plain single-GPU forward of `case` on `gpu` (the whole input, its automatic split):
/// the median ms.
fn time_single(gpu: &Gpu, case: &CpCase, iters: usize) -> GpuResult<f64> {
    let cu = cu_seqlens(&case.seqs);
    let t = case.seqs.iter().sum();
    let x = inputs(gpu, case, t, case.seqs.len(), 7)?;
    let plan = if case.kda {
        DeltaFwdPlan::kda(
            gpu,
            &x.tensors(),
            Some(&cu),
            &kda_params(),
            ForwardPath::Auto,
        )?
    } else {
        DeltaFwdPlan::gdn(
            gpu,
            &x.tensors(),
            Some(&cu),
            &gdn_params(),
            ForwardPath::Auto,
        )?
    };
    let mut ws = plan.alloc_workspace(gpu)?;
    let mut out = plan.alloc_outputs(gpu)?;
    gpu.synchronize()?;
    wall_ms(iters, || {
        plan.run(gpu, &x.tensors(), &mut ws, &mut out)?;
        gpu.synchronize()
    })
}

/// Every wanted row family (one of its rows wanted): the single-GPU baseline (`<name>_single`,
/// on GPU 0 of the `R = 1` group), then `R` = 1, 2, 4 (all of them: the speedups need
/// `R = 1`); each printed, returned as JSON rows. A group that cannot be opened skips its rows
/// with the reason.
pub fn run_all(iters: usize, ceiling: f64, wanted: impl Fn(&str) -> bool) -> GpuResult<Vec<Value>> {
    let cases: Vec<CpCase> = cases()
        .into_iter()
        .filter(|c| RANKS.iter().any(|&r| wanted(&c.row(r))))
        .collect();
    if cases.is_empty() {
        return Ok(Vec::new());
    }
    let iters = iters.min(MAX_ITERS);
    let groups: Vec<(usize, Result<CpGroup, String>)> = RANKS
        .iter()
        .map(|&r| (r, CpGroup::open(r).map_err(|e| e.to_string())))
        .collect();
    let mut rows = Vec::new();
    for case in &cases {
        let t: usize = case.seqs.iter().sum();
        let b = bytes(case);
        let shape = json!([1, t, case.h, case.h, K, V]);
        let mut single_ms = None;
        let mut r1_ms = None;
        for (ranks, group) in &groups {
            let name = case.row(*ranks);
            let group = match group {
                Ok(g) => g,
                Err(why) => {
                    println!("{name:<40} skipped: {ranks} GPU(s) and NCCL needed: {why}");
                    continue;
                }
            };
            if *ranks < case.min_ranks {
                let (_, total) = group
                    .gpu(0)
                    .context()
                    .mem_get_info()
                    .map_err(attn_gpu::GpuError::driver_ctx("memory info"))?;
                let gib = |x: usize| x as f64 / (1u64 << 30) as f64;
                let what = if *ranks == 1 {
                    format!("{}_single and {name}", case.name)
                } else {
                    name.clone()
                };
                println!(
                    "{what} skipped: {:.0} GiB of inputs and outputs, {:.0} GiB a GPU: {} GPUs at least",
                    gib(b),
                    gib(total),
                    case.min_ranks
                );
                continue;
            }
            if *ranks == 1 {
                let ms = time_single(group.gpu(0), case, iters)?;
                let mem = used_gib(group.gpu(0))?;
                println!(
                    "{:<40} {ms:>10.3} ms  single GPU (DeltaFwdPlan, automatic split), {mem:.1} GiB",
                    format!("{}_single", case.name)
                );
                rows.push(json!({
                    "name": format!("{}_single", case.name), "shape": shape, "in_dtype": "bfloat16",
                    "out_dtype": "bfloat16", "seqs": case.seqs, "bytes": b, "median_ms": ms,
                    "gbps": b as f64 / (ms * 1e-3) / 1e9, "share": b as f64 / (ms * 1e-3) / 1e9 / ceiling,
                    "ranks": 1, "path": "single", "decay": case.decay.name(), "mem_gib": [mem],
                }));
                single_ms = Some(ms);
            }
            let part = Partition::balanced(
                &cu_seqlens(&case.seqs),
                BT,
                *ranks,
                DEFAULT_MIN_PIECE_CHUNKS,
            )?;
            let CpTiming {
                ms,
                phases,
                tails,
                local,
                first_vs_one,
            } = time_cp(group, &part, case, iters, case.min_ranks > 1)?;
            let local: Vec<String> = local.iter().map(describe).collect();
            let tails: Vec<String> = tails
                .iter()
                .map(|t| match t {
                    Some(SentSummary::Tail(n)) => format!("tail {n}"),
                    Some(SentSummary::Whole) => "whole".into(),
                    Some(SentSummary::PreScanned) => "whole (pre-scan)".into(),
                    None => "-".into(),
                })
                .collect();
            let mem = group
                .ranks()
                .map(|(_, gpu)| used_gib(gpu))
                .collect::<GpuResult<Vec<_>>>()?;
            if *ranks == 1 {
                r1_ms = Some(ms);
            }
            let speedup = r1_ms.map(|r1| r1 / ms);
            let vs_single = single_ms.map(|s| s / ms);
            let gbps = b as f64 / (ms * 1e-3) / 1e9;
            println!(
                "{name:<40} {ms:>10.3} ms  {} vs R=1, {} vs single GPU, GiB per GPU {:?}, summaries {tails:?}, phases (synchronised) tail checks {:.3} / local heads + summaries {:.3} / exchange {:.3} / local finish {:.3} ms{}, local splits {local:?}",
                ratio(speedup),
                ratio(vs_single),
                mem.iter()
                    .map(|m| (m * 10.0).round() / 10.0)
                    .collect::<Vec<_>>(),
                phases.tail_checks_ms,
                phases.summaries_ms,
                phases.exchange_ms,
                phases.local_ms,
                first_vs_one
                    .map(|d| format!(", rank 0's o vs GPU 0 alone: {d:.2e} of max |o|"))
                    .unwrap_or_default()
            );
            rows.push(json!({
                "name": name, "shape": shape, "in_dtype": "bfloat16", "out_dtype": "bfloat16",
                "seqs": case.seqs, "bytes": b, "median_ms": ms, "gbps": gbps,
                "share": gbps / (ceiling * *ranks as f64), "ranks": ranks, "path": "cp",
                "decay": case.decay.name(), "cuts": part.cuts(), "speedup_r1": speedup,
                "single_ms": single_ms, "vs_single": vs_single, "mem_gib": mem, "summaries": tails,
                "first_vs_one": first_vs_one, "local_splits": local,
                "phases_ms": {
                    "tail_checks": phases.tail_checks_ms, "summaries": phases.summaries_ms,
                    "exchange": phases.exchange_ms, "local": phases.local_ms,
                },
            }));
        }
    }
    Ok(rows)
}

/// A speedup as `x1.23`, or `-` where its baseline did not run (it did not fit).
fn ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("x{r:.2}"))
}
