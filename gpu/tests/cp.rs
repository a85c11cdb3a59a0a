//! Context parallelism over `R` GPUs (`attn_gpu::cp`): `kda_fwd`, `gdn_fwd` and
//! `chunk_gated_delta_rule_fwd_h` with R = 1, 2, 3, 4 against the float64 reference (the spec's
//! thresholds) and against the single-GPU result on GPU 0 (same dtype, 5e-3): one long
//! sequence, a long one with short ones on either side, many sequences, a sequence shorter than
//! `R` chunks, zero-length sequences; with and without `initial_state`, final state on; strong,
//! trained-like and long-memory gates; KDA at `K = V = 128` with and without `safe_gate`, whose
//! ranks' local intra stages run on `kda_intra_pipe` (asserted on Hopper); repeated runs
//! bit-identical; bad input refused; the
//! persistent plans (`CpFwdPlan`, `CpFwdHPlan`) run twice bit-identical to the one-call ops,
//! and a shard of the wrong shape at `run` refused before any launch; a rank whose peer (a second
//! process: this binary run again) never enters a collective gets the timeout's error and the
//! group is aborted (no rank waits forever).
//!
//! A test for `R` GPUs is reported ignored where fewer GPUs (or no NCCL) are present, and fails
//! instead when `ATTN_REQUIRE_GPUS` is at least `R` (`ATTN_REQUIRE_GPU=1` counts as
//! `ATTN_REQUIRE_GPUS=1`: the R = 1 tests then need a GPU and NCCL).

mod common;

use attn_gpu::cp::{
    cp_chunk_gated_delta_rule_fwd_h, cp_gdn_fwd, cp_kda_fwd, gather_final_states, gather_tokens,
    scatter_states, scatter_tokens, tail_levels, CpFwdHPlan, CpFwdPlan, CpGroup, CpId, Partition,
    SentSummary, SHORT_TAIL_CHUNKS,
};
use attn_gpu::delta::{
    DeltaFwdDeviceOutputs, DeltaFwdPlan, ForwardPath, FwdHPlan, EXACT_FALLBACK_CHUNKS,
};
use attn_gpu::{DeviceTensor, ForwardTensors, FwdHTensors, GpuError};
use attn_reference::delta::{self as d, FwdHParams, GdnFwdParams, KdaFwdParams};
use attn_reference::Dtype;
use common::delta::{random_state, realistic, Gates, Layout, Uploaded};
use common::forward::*;
use common::*;
use half::bf16;
use libtest_mimic::{Completion, Failed};
use ndarray::ArrayD;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

type TestResult = Result<Completion, Failed>;

/// GPUs the run must have: `$ATTN_REQUIRE_GPUS`, else 1 under `ATTN_REQUIRE_GPU=1`, else 0.
fn required_gpus() -> usize {
    std::env::var("ATTN_REQUIRE_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if std::env::var("ATTN_REQUIRE_GPU").as_deref() == Ok("1") {
            1
        } else {
            0
        })
}

/// The group of `ranks` GPUs, or the outcome of a test that cannot run.
fn open(ranks: usize) -> Result<CpGroup, TestResult> {
    CpGroup::open(ranks).map_err(|e| {
        if required_gpus() >= ranks {
            Err(format!("{ranks} GPU(s) required (ATTN_REQUIRE_GPUS) but: {e}").into())
        } else {
            Ok(Completion::ignored_with(format!(
                "needs {ranks} GPU(s) and NCCL: {e}"
            )))
        }
    })
}

/// The test layouts (chunk 64) and whether R > 1 must cut a sequence.
fn layouts() -> Vec<(&'static str, Vec<i64>, bool)> {
    let mut many = vec![0i64];
    let mut rng = Rng::new(25);
    for _ in 0..24 {
        let l = [0, 1, 63, 64, 65, 130, 300][rng.below(7)];
        many.push(many.last().unwrap() + l);
    }
    let cum = |lens: &[i64]| {
        let mut cu = vec![0i64];
        for l in lens {
            cu.push(cu.last().unwrap() + l);
        }
        cu
    };
    vec![
        ("one long sequence", cum(&[64 * 40 + 17]), true),
        (
            "long with short ones on either side",
            cum(&[30, 1, 64 * 32 + 5, 50, 0, 7]),
            true,
        ),
        ("many sequences", many, false),
        ("a sequence shorter than R chunks", cum(&[100]), false),
        (
            "zero-length sequences",
            cum(&[0, 64 * 24, 0, 0, 70, 0]),
            true,
        ),
    ]
}

/// One sequence whose pieces hold `EXACT_FALLBACK_CHUNKS` chunks or more on up to 4 ranks
/// (the local forwards' exact fallback; a cut is expected).
fn long_shards() -> (&'static str, Vec<i64>, bool) {
    (
        "long shards",
        vec![0, (4 * EXACT_FALLBACK_CHUNKS * 64 + 9) as i64],
        true,
    )
}

/// Minimum piece of the tests' partitions: small enough to cut the short test sequences.
const MIN_PIECE: usize = 2;

fn to_bf16(a: &ArrayD<f64>) -> ArrayD<bf16> {
    a.mapv(bf16::from_f64)
}

fn to_f32(a: &ArrayD<f64>) -> ArrayD<f32> {
    a.mapv(|x| x as f32)
}

/// A bf16 forward case on GPU 0 over the layout `cu` (1 key head, 2 value heads, K = V = `dk`,
/// fp32 gates and states), with one `initial_state` row per sequence when `h0`.
fn draw_forward(
    gpu0: &Gpu,
    cu: &[i64],
    (per_key, dk): (bool, usize),
    regime: Regime,
    h0: bool,
    seed: u64,
) -> (ForwardHost, ForwardDev) {
    let spec = Draw {
        b: 1,
        t: *cu.last().unwrap() as usize,
        h: 1,
        hv: 2,
        k: dk,
        v: dk,
        per_key,
        regime,
        raw_qk: false,
        beta_logits: false,
        gate_input: false,
        h0,
        v_first: false,
    };
    let mut rng = Rng::new(seed);
    let (mut host, mut dev) = draw(gpu0, &mut rng, &spec, Dtype::BF16, Dtype::F32);
    set_state_rows(
        gpu0,
        &mut rng,
        &mut host,
        &mut dev,
        cu.len() - 1,
        false,
        Dtype::F32,
    );
    (host, dev)
}

/// The token rows of `a` over the ranks of `part`, in bf16.
fn scatter_bf16(
    group: &CpGroup,
    part: &Partition,
    arg: &str,
    a: &ArrayD<f64>,
) -> Vec<DeviceTensor> {
    scatter_tokens(group, part, arg, to_bf16(a).view()).unwrap()
}

/// The token rows of `a` over the ranks of `part`, in fp32.
fn scatter_f32(group: &CpGroup, part: &Partition, arg: &str, a: &ArrayD<f64>) -> Vec<DeviceTensor> {
    scatter_tokens(group, part, arg, to_f32(a).view()).unwrap()
}

/// The initial states `a` (one row per sequence) over the ranks of `part`, in fp32.
fn scatter_h0(group: &CpGroup, part: &Partition, a: &ArrayD<f64>) -> Vec<DeviceTensor> {
    scatter_states(group, part, "initial_state", to_f32(a).view()).unwrap()
}

/// A forward case's inputs scattered over the ranks of a partition (bf16 q, k, v; fp32 g, β
/// and initial states).
struct Scattered {
    q: Vec<DeviceTensor>,
    k: Vec<DeviceTensor>,
    v: Vec<DeviceTensor>,
    g: Vec<DeviceTensor>,
    beta: Vec<DeviceTensor>,
    h0: Option<Vec<DeviceTensor>>,
}

impl Scattered {
    fn new(group: &CpGroup, part: &Partition, host: &ForwardHost) -> Scattered {
        let sc = |arg, a: &ArrayD<f64>| scatter_bf16(group, part, arg, a);
        let sf = |arg, a: &ArrayD<f64>| scatter_f32(group, part, arg, a);
        Scattered {
            q: sc("q", &host.q.clone().into_dyn()),
            k: sc("k", &host.k.clone().into_dyn()),
            v: sc("v", &host.v.clone().into_dyn()),
            g: sf("g", &host.g),
            beta: sf("beta", &host.beta.clone().into_dyn()),
            h0: host
                .h0
                .as_ref()
                .map(|a| scatter_h0(group, part, &a.clone().into_dyn())),
        }
    }

    /// Per rank, its shard's inputs.
    fn shards(&self) -> Vec<ForwardTensors<'_>> {
        (0..self.q.len())
            .map(|i| ForwardTensors {
                initial_state: self.h0.as_ref().map(|h| &h[i]),
                ..ForwardTensors::new(
                    &self.q[i],
                    &self.k[i],
                    &self.v[i],
                    &self.g[i],
                    &self.beta[i],
                )
            })
            .collect()
    }
}

/// A `fwd_h` case's inputs (the exact values of an [`Uploaded`]) scattered over the ranks of a
/// partition (bf16 k, w, u; fp32 gates and initial states).
struct ScatteredFwdH {
    k: Vec<DeviceTensor>,
    w: Vec<DeviceTensor>,
    u: Vec<DeviceTensor>,
    g: Option<Vec<DeviceTensor>>,
    gk: Option<Vec<DeviceTensor>>,
    h0: Option<Vec<DeviceTensor>>,
}

impl ScatteredFwdH {
    fn new(group: &CpGroup, part: &Partition, up: &Uploaded) -> ScatteredFwdH {
        let x = &up.exact;
        let sc = |arg, a: ArrayD<f64>| scatter_bf16(group, part, arg, &a);
        let sf = |arg, a: ArrayD<f64>| scatter_f32(group, part, arg, &a);
        ScatteredFwdH {
            k: sc("k", x.k.clone().into_dyn()),
            w: sc("w", x.w.clone().into_dyn()),
            u: sc("u", x.u.clone().into_dyn()),
            g: x.g.clone().map(|a| sf("g", a.into_dyn())),
            gk: x.gk.clone().map(|a| sf("gk", a.into_dyn())),
            h0: up
                .exact_h0
                .as_ref()
                .map(|a| scatter_h0(group, part, &a.clone().into_dyn())),
        }
    }

    /// Per rank, its shard's inputs.
    fn shards(&self) -> Vec<FwdHTensors<'_>> {
        (0..self.k.len())
            .map(|r| FwdHTensors {
                g: self.g.as_ref().map(|x| &x[r]),
                gk: self.gk.as_ref().map(|x| &x[r]),
                initial_state: self.h0.as_ref().map(|x| &x[r]),
                ..FwdHTensors::new(&self.k[r], &self.w[r], &self.u[r])
            })
            .collect()
    }
}

/// One forward case over `ranks` GPUs: CP vs reference, CP vs GPU 0 alone, CP twice. With
/// `tail = Some(c)`, through a plan whose summaries may cover the last `c` chunks only
/// (`with_tail_chunks`): every rank whose continuing piece is longer sends its tail's summary
/// under strong decay and the whole piece's under long memory; and a rank whose local forward
/// splits a piece of `EXACT_FALLBACK_CHUNKS` chunks or more takes the exact fallback under
/// long memory and not under strong decay.
/// The key and value width of a case, and for `K = V = 128` (KDA: the width whose ranks' local
/// intra stages, their rows-gate first half included, run on `kda_intra_pipe`) whether it runs
/// under `safe_gate`.
#[derive(Clone, Copy)]
enum Width {
    K64,
    K128 { safe_gate: bool },
}

/// One forward over `group` against the float64 reference and GPU 0 alone.
fn forward_case(
    group: &CpGroup,
    per_key: bool,
    lay: usize,
    regime: Regime,
    h0: bool,
    tail: Option<usize>,
    width: Width,
) {
    let ranks = group.world();
    let (name, cu, splits) = layouts()
        .into_iter()
        .chain([long_shards()])
        .nth(lay)
        .unwrap();
    let what = format!(
        "{} R={ranks} {name} {regime:?} h0={h0} tail={tail:?}",
        match (per_key, width) {
            (true, Width::K128 { safe_gate: true }) => "kda safe_gate K=128",
            (true, Width::K128 { safe_gate: false }) => "kda K=128",
            (true, Width::K64) => "kda",
            (false, _) => "gdn",
        }
    );
    let gpu0 = group.gpu(0);
    let (host, dev) = draw_forward(
        gpu0,
        &cu,
        (per_key, if matches!(width, Width::K64) { 64 } else { 128 }),
        regime,
        h0,
        0xC0 + lay as u64 + 16 * ranks as u64,
    );
    let kp = KdaFwdParams {
        output_final_state: true,
        safe_gate: matches!(width, Width::K128 { safe_gate: true }),
        ..KdaFwdParams::default()
    };
    let gp = GdnFwdParams {
        output_final_state: true,
        ..GdnFwdParams::default()
    };
    // the float64 reference
    let op = if per_key {
        RefOp::Kda(&kp)
    } else {
        RefOp::Gdn(&gp)
    };
    let (want_o, want_f) = forward_reference(&host, Some(&cu), op);
    let want_f = want_f.unwrap();
    // GPU 0 alone
    let plan = if per_key {
        DeltaFwdPlan::kda(gpu0, &dev.tensors(), Some(&cu), &kp, ForwardPath::Auto)
    } else {
        DeltaFwdPlan::gdn(gpu0, &dev.tensors(), Some(&cu), &gp, ForwardPath::Auto)
    }
    .unwrap();
    // the fused path with full tiles (KDA): its intra stage's tiles serve the whole summary
    let full_tiles = plan.fused_choice().is_some_and(|f| !f.lean);
    let mut ws = plan.alloc_workspace(gpu0).unwrap();
    let mut single = plan.alloc_outputs(gpu0).unwrap();
    plan.run(gpu0, &dev.tensors(), &mut ws, &mut single)
        .unwrap();
    let single_o = download(gpu0, &single.o);
    let single_f = download(gpu0, single.final_state.as_ref().unwrap());
    // R ranks
    let part = Partition::balanced(&cu, 64, ranks, MIN_PIECE).unwrap();
    if ranks > 1 && splits {
        assert!(
            part.shards().iter().any(|s| s.continued().is_some()),
            "{what}: the partition cuts no sequence: {:?}",
            part.cuts()
        );
    }
    let inputs = Scattered::new(group, &part, &host);
    let shards = inputs.shards();
    let mut plan = tail.map(|c| {
        if per_key {
            CpFwdPlan::kda(group, &part, &shards, &kp, ForwardPath::Auto)
        } else {
            CpFwdPlan::gdn(group, &part, &shards, &gp, ForwardPath::Auto)
        }
        .and_then(|p| p.with_tail_chunks(&shards, Some(c)))
        .unwrap()
    });
    let mut run = || {
        let outs = match plan.as_mut() {
            Some(p) => {
                let mut outs = p.alloc_outputs().unwrap();
                p.run(&shards, &mut outs).unwrap();
                group.synchronize().unwrap();
                outs
            }
            None => if per_key {
                cp_kda_fwd(group, &part, &shards, &kp, ForwardPath::Auto)
            } else {
                cp_gdn_fwd(group, &part, &shards, &gp, ForwardPath::Auto)
            }
            .unwrap(),
        };
        let o: ArrayD<bf16> =
            gather_tokens(group, "o", &outs.iter().map(|o| &o.o).collect::<Vec<_>>()).unwrap();
        let fins: Vec<&DeviceTensor> = outs
            .iter()
            .map(|o| o.final_state.as_ref().unwrap())
            .collect();
        let f: ArrayD<f32> = gather_final_states(group, &part, &fins).unwrap();
        (o.mapv(f64::from), f.mapv(f64::from))
    };
    let (o, f) = run();
    let longest = cu
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .max()
        .unwrap_or(0);
    let thr = half_threshold(regime, longest);
    assert_close(&format!("{what}: o vs reference"), &o, &want_o, thr);
    assert_close(
        &format!("{what}: final_state vs reference"),
        &f,
        &want_f,
        thr,
    );
    assert_close(&format!("{what}: o vs one GPU"), &o, &single_o, 5e-3);
    assert_close(
        &format!("{what}: final_state vs one GPU"),
        &f,
        &single_f,
        5e-3,
    );
    let (o2, f2) = run();
    assert_bit_identical(&format!("{what}: o repeated"), &o, &o2);
    assert_bit_identical(&format!("{what}: final_state repeated"), &f, &f2);
    let wide = per_key && !matches!(width, Width::K64);
    if wide && gpu0.arch().0 == 9 && std::env::var("ATTN_KDA_INTRA").as_deref() != Ok("mma") {
        if let Some(p) = &plan {
            for (r, grid) in p.local_intra_pipes().into_iter().enumerate() {
                let pieces = !part.shard(r).pieces.is_empty();
                assert_eq!(
                    grid.is_some(),
                    pieces,
                    "{what}: rank {r}'s local intra stage on kda_intra_pipe"
                );
            }
            // a rank whose local forward took the exact fallback ran the staged twin's intra
            // stage on the pipe kernel too
            let twins = p.local_fallback_intra_pipes();
            for (r, choice) in p.local_choices().unwrap().into_iter().enumerate() {
                if choice.is_some_and(|c| c.exact_fallback) {
                    assert_eq!(
                        twins[r],
                        Some(2 * group.gpu(r).sm_count()),
                        "{what}: rank {r}'s exact fallback's intra stage on kda_intra_pipe"
                    );
                }
            }
        }
    }
    if let (Some(p), Regime::Strong | Regime::Long) = (&plan, regime) {
        for (r, choice) in p.local_choices().unwrap().into_iter().enumerate() {
            let long = part
                .shard(r)
                .pieces
                .iter()
                .any(|q| q.len >= EXACT_FALLBACK_CHUNKS * 64);
            if let (Some(choice), true) = (choice, long) {
                assert_eq!(
                    choice.exact_fallback,
                    regime == Regime::Long,
                    "{what}: rank {r}'s exact fallback"
                );
            }
        }
    }
    if let (Some(c), Some(p)) = (tail, &plan) {
        // strong decay: a tail (GDN's scalar gates, ~-50 nats a chunk, the short one; KDA's
        // least-decaying key may need a longer one); long memory: the whole piece
        let levels = tail_levels(c);
        let want = |sent: SentSummary| match regime {
            Regime::Strong if !per_key => Some(sent == SentSummary::Tail(SHORT_TAIL_CHUNKS)),
            Regime::Strong => Some(matches!(sent, SentSummary::Tail(n) if levels.contains(&n))),
            Regime::Long => Some(matches!(sent, SentSummary::Whole | SentSummary::PreScanned)),
            _ => None,
        };
        let mut checked = 0;
        for (r, sent) in p.tail_summaries().into_iter().enumerate() {
            let continuing = part.shard(r).continuing();
            assert_eq!(sent.is_some(), continuing.is_some(), "{what}: rank {r}");
            let long = continuing.is_some_and(|q| q.len > c * 64);
            if let (Some(sent), true) = (sent, long) {
                if let Some(ok) = want(sent) {
                    assert!(ok, "{what}: rank {r} sent {sent:?}");
                    checked += 1;
                }
            }
        }
        // a rank whose local forward took the exact fallback, or runs fused with full tiles,
        // sends the whole piece's summary from its tiles
        let choices = p.local_choices().unwrap();
        for (r, (sent, choice)) in p.tail_summaries().into_iter().zip(choices).enumerate() {
            if let (Some(SentSummary::Whole | SentSummary::PreScanned), Some(c)) = (sent, choice) {
                let want = if c.exact_fallback || full_tiles {
                    SentSummary::PreScanned
                } else {
                    SentSummary::Whole
                };
                assert_eq!(sent, Some(want), "{what}: rank {r}'s whole summary");
            }
        }
        if ranks > 1 && splits && matches!(regime, Regime::Strong | Regime::Long) {
            assert!(
                checked > 0,
                "{what}: no rank's continuing piece is longer than the tail"
            );
        }
    }
}

/// Every layout, the three gate regimes in turn, with and without `initial_state`.
fn forward_all(group: &CpGroup, per_key: bool) {
    let regimes = [Regime::Strong, Regime::Trained, Regime::Long];
    for lay in 0..layouts().len() {
        for (j, h0) in [true, false].into_iter().enumerate() {
            forward_case(
                group,
                per_key,
                lay,
                regimes[(lay + j) % 3],
                h0,
                None,
                Width::K64,
            );
        }
    }
    // summaries over 8-chunk tails where the decay allows (the one long sequence, 40 chunks)
    for regime in [Regime::Strong, Regime::Long] {
        forward_case(group, per_key, 0, regime, true, Some(8), Width::K64);
    }
    // shards long enough for the local forwards' exact fallback
    for regime in [Regime::Strong, Regime::Long] {
        forward_case(
            group,
            per_key,
            layouts().len(),
            regime,
            true,
            Some(64),
            Width::K64,
        );
    }
}

/// KDA at `K = V = 128` (the ranks' local intra stages on `kda_intra_pipe`, the first half with
/// `G` per token): under `safe_gate` (per-step decays `U[-5, 0]`) the long sequence with an
/// 8-chunk tail and through the one-call path, and the long sequence among short ones; without
/// it (the kernel's FMA diagonal) trained-like and long-memory gates, and long-memory gates on
/// shards long enough for the local forwards' exact fallback (its staged twin's intra stage on
/// the pipe kernel as well).
fn pipe_all(group: &CpGroup) {
    let safe = Width::K128 { safe_gate: true };
    let unsafe_gate = Width::K128 { safe_gate: false };
    forward_case(group, true, 0, Regime::Safe, true, Some(8), safe);
    forward_case(group, true, 0, Regime::Safe, false, None, safe);
    forward_case(group, true, 1, Regime::Safe, true, Some(2), safe);
    forward_case(group, true, 0, Regime::Trained, true, Some(8), unsafe_gate);
    forward_case(group, true, 1, Regime::Long, true, None, unsafe_gate);
    forward_case(
        group,
        true,
        layouts().len(),
        Regime::Long,
        true,
        Some(64),
        unsafe_gate,
    );
}

/// `fwd_h` over `ranks` GPUs: `h`, `v_new` (gathered) and the final states against the float64
/// reference (§2.7, long thresholds) and GPU 0 alone (5e-3), on realistic KDA-like (`gk`) and
/// GDN-like (`g`) inputs; repeated run bit-identical.
fn fwd_h_all(group: &CpGroup) {
    let ranks = group.world();
    let gpu0 = group.gpu(0);
    for (i, (name, cu, _)) in layouts().into_iter().enumerate() {
        let gates = [Gates::Gk, Gates::G][i % 2];
        let what = format!("fwd_h R={ranks} {name} {gates:?}");
        let lay = Layout {
            b: 1,
            t: *cu.last().unwrap() as usize,
            h: 2,
            hv: 2,
            k: 64,
            v: 64,
            bt: 64,
            cu: Some(cu.clone()),
        };
        let mut rng = Rng::new(0xF0 + i as u64 + 16 * ranks as u64);
        let inp = realistic(&mut rng, &lay, gates, false);
        let h0 = (i % 3 != 2).then(|| random_state(&mut rng, &lay, false));
        let up = Uploaded::new(gpu0, &inp, h0.as_ref(), Dtype::BF16, Dtype::F32, Dtype::F32);
        let p = FwdHParams {
            output_final_state: true,
            ..FwdHParams::default()
        };
        let want = d::chunk_gated_delta_rule_fwd_h(&up.reference(Some(&cu)), &p).unwrap();
        let plan = FwdHPlan::new(gpu0, &up.tensors(), Some(&cu), &p).unwrap();
        let mut single = plan.alloc_outputs(gpu0).unwrap();
        plan.run(gpu0, &up.tensors(), &mut single).unwrap();
        let part = Partition::balanced(&cu, 64, ranks, MIN_PIECE).unwrap();
        let inputs = ScatteredFwdH::new(group, &part, &up);
        let shards = inputs.shards();
        let run = || {
            let outs = cp_chunk_gated_delta_rule_fwd_h(group, &part, &shards, &p).unwrap();
            let h: ArrayD<bf16> =
                gather_tokens(group, "h", &outs.iter().map(|o| &o.h).collect::<Vec<_>>()).unwrap();
            let vn: ArrayD<bf16> = gather_tokens(
                group,
                "v_new",
                &outs
                    .iter()
                    .map(|o| o.v_new.as_ref().unwrap())
                    .collect::<Vec<_>>(),
            )
            .unwrap();
            let fins: Vec<&DeviceTensor> = outs
                .iter()
                .map(|o| o.final_state.as_ref().unwrap())
                .collect();
            let f: ArrayD<f32> = gather_final_states(group, &part, &fins).unwrap();
            (h.mapv(f64::from), vn.mapv(f64::from), f.mapv(f64::from))
        };
        let (h, vn, f) = run();
        assert_close(
            &format!("{what}: h vs reference"),
            &h,
            &want.h.into_dyn(),
            1e-2,
        );
        assert_close(
            &format!("{what}: v_new vs reference"),
            &vn,
            &want.v_new.unwrap().into_dyn(),
            1e-2,
        );
        assert_close(
            &format!("{what}: final_state vs reference"),
            &f,
            &want.final_state.unwrap().into_dyn(),
            1e-2,
        );
        assert_close(
            &format!("{what}: h vs one GPU"),
            &h,
            &download(gpu0, &single.h),
            5e-3,
        );
        assert_close(
            &format!("{what}: v_new vs one GPU"),
            &vn,
            &download(gpu0, single.v_new.as_ref().unwrap()),
            5e-3,
        );
        assert_close(
            &format!("{what}: final_state vs one GPU"),
            &f,
            &download(gpu0, single.final_state.as_ref().unwrap()),
            5e-3,
        );
        let (h2, vn2, f2) = run();
        assert_bit_identical(&format!("{what}: h repeated"), &h, &h2);
        assert_bit_identical(&format!("{what}: v_new repeated"), &vn, &vn2);
        assert_bit_identical(&format!("{what}: final_state repeated"), &f, &f2);
    }
}

/// The gathered `o` and final states of per-rank forward outputs.
fn gather_forward(
    group: &CpGroup,
    part: &Partition,
    outs: &[DeltaFwdDeviceOutputs],
) -> (ArrayD<f64>, ArrayD<f64>) {
    let o: ArrayD<bf16> =
        gather_tokens(group, "o", &outs.iter().map(|o| &o.o).collect::<Vec<_>>()).unwrap();
    let fins: Vec<&DeviceTensor> = outs
        .iter()
        .map(|o| o.final_state.as_ref().unwrap())
        .collect();
    let f: ArrayD<f32> = gather_final_states(group, part, &fins).unwrap();
    (o.mapv(f64::from), f.mapv(f64::from))
}

/// The persistent forward plan over the group: two runs into the same outputs (poisoned before
/// each) bit-identical to the one-call op; then the last rank's `v` one token too long at `run`:
/// a typed error naming `v (rank R-1)`, and every rank's outputs still poisoned (nothing ran).
fn plan_case(group: &CpGroup, per_key: bool) {
    let ranks = group.world();
    let (name, cu, _) = layouts().swap_remove(1);
    let what = format!(
        "{} plan R={ranks} {name}",
        if per_key { "kda" } else { "gdn" }
    );
    let gpu0 = group.gpu(0);
    let (host, _) = draw_forward(
        gpu0,
        &cu,
        (per_key, 64),
        Regime::Strong,
        true,
        0x9A + ranks as u64,
    );
    let part = Partition::balanced(&cu, 64, ranks, MIN_PIECE).unwrap();
    let inputs = Scattered::new(group, &part, &host);
    let shards = inputs.shards();
    let kp = KdaFwdParams {
        output_final_state: true,
        ..KdaFwdParams::default()
    };
    let gp = GdnFwdParams {
        output_final_state: true,
        ..GdnFwdParams::default()
    };
    let one_call = if per_key {
        cp_kda_fwd(group, &part, &shards, &kp, ForwardPath::Auto)
    } else {
        cp_gdn_fwd(group, &part, &shards, &gp, ForwardPath::Auto)
    }
    .unwrap();
    let (want_o, want_f) = gather_forward(group, &part, &one_call);
    let mut plan = if per_key {
        CpFwdPlan::kda(group, &part, &shards, &kp, ForwardPath::Auto)
    } else {
        CpFwdPlan::gdn(group, &part, &shards, &gp, ForwardPath::Auto)
    }
    .unwrap();
    let mut outs = plan.alloc_outputs().unwrap();
    let poison = |outs: &mut [DeltaFwdDeviceOutputs]| {
        for ((_, gpu), o) in group.ranks().zip(outs.iter_mut()) {
            o.o.poison(gpu).unwrap();
            o.final_state.as_mut().unwrap().poison(gpu).unwrap();
        }
    };
    for run in 1..=2 {
        poison(&mut outs);
        plan.run(&shards, &mut outs).unwrap();
        group.synchronize().unwrap();
        let (o, f) = gather_forward(group, &part, &outs);
        assert_bit_identical(&format!("{what}: o, run {run} vs one call"), &o, &want_o);
        assert_bit_identical(
            &format!("{what}: final_state, run {run} vs one call"),
            &f,
            &want_f,
        );
    }
    // the phase-timed run: the same outputs, a finite non-negative time per phase
    poison(&mut outs);
    let phases = plan.run_phases(&shards, &mut outs).unwrap();
    let (o, f) = gather_forward(group, &part, &outs);
    assert_bit_identical(&format!("{what}: o, phased run vs one call"), &o, &want_o);
    assert_bit_identical(&format!("{what}: final_state, phased run"), &f, &want_f);
    for ms in [
        phases.tail_checks_ms,
        phases.summaries_ms,
        phases.exchange_ms,
        phases.local_ms,
    ] {
        assert!(ms.is_finite() && ms >= 0.0, "{what}: phases {phases:?}");
    }
    assert!(phases.local_ms > 0.0, "{what}: phases {phases:?}");
    let last = ranks - 1;
    let mut long = inputs.v[last].shape().to_vec();
    long[1] += 1;
    let wrong = DeviceTensor::alloc(group.gpu(last), &long, Dtype::BF16).unwrap();
    let mut bad = shards.clone();
    bad[last].v = &wrong;
    poison(&mut outs);
    let e = plan.run(&bad, &mut outs).unwrap_err();
    assert!(matches!(e, GpuError::Input(_)), "{what}: {e}");
    assert!(
        e.to_string().contains(&format!("v (rank {last})")),
        "{what}: {e}"
    );
    group.synchronize().unwrap();
    let (o, f) = gather_forward(group, &part, &outs);
    assert!(
        o.iter().chain(f.iter()).all(|x| x.is_nan()),
        "{what}: a refused run wrote outputs"
    );
}

/// The persistent `fwd_h` plan over the group: two runs bit-identical to the one-call op.
fn fwd_h_plan_case(group: &CpGroup) {
    let ranks = group.world();
    let gpu0 = group.gpu(0);
    let (name, cu, _) = layouts().swap_remove(1);
    let what = format!("fwd_h plan R={ranks} {name}");
    let lay = Layout {
        b: 1,
        t: *cu.last().unwrap() as usize,
        h: 2,
        hv: 2,
        k: 64,
        v: 64,
        bt: 64,
        cu: Some(cu.clone()),
    };
    let mut rng = Rng::new(0x5A + ranks as u64);
    let inp = realistic(&mut rng, &lay, Gates::Gk, false);
    let h0 = random_state(&mut rng, &lay, false);
    let up = Uploaded::new(gpu0, &inp, Some(&h0), Dtype::BF16, Dtype::F32, Dtype::F32);
    let p = FwdHParams {
        output_final_state: true,
        ..FwdHParams::default()
    };
    let part = Partition::balanced(&cu, 64, ranks, MIN_PIECE).unwrap();
    let inputs = ScatteredFwdH::new(group, &part, &up);
    let shards = inputs.shards();
    let gather = |outs: &[attn_gpu::delta::FwdHDeviceOutputs]| {
        let h: ArrayD<bf16> =
            gather_tokens(group, "h", &outs.iter().map(|o| &o.h).collect::<Vec<_>>()).unwrap();
        let fins: Vec<&DeviceTensor> = outs
            .iter()
            .map(|o| o.final_state.as_ref().unwrap())
            .collect();
        let f: ArrayD<f32> = gather_final_states(group, &part, &fins).unwrap();
        (h.mapv(f64::from), f.mapv(f64::from))
    };
    let (want_h, want_f) =
        gather(&cp_chunk_gated_delta_rule_fwd_h(group, &part, &shards, &p).unwrap());
    let mut plan = CpFwdHPlan::new(group, &part, &shards, &p).unwrap();
    let mut outs = plan.alloc_outputs().unwrap();
    for run in 1..=2 {
        for ((_, gpu), o) in group.ranks().zip(outs.iter_mut()) {
            o.h.poison(gpu).unwrap();
        }
        plan.run(&shards, &mut outs).unwrap();
        group.synchronize().unwrap();
        let (h, f) = gather(&outs);
        assert_bit_identical(&format!("{what}: h, run {run} vs one call"), &h, &want_h);
        assert_bit_identical(
            &format!("{what}: final_state, run {run} vs one call"),
            &f,
            &want_f,
        );
    }
}

/// Bad input is a typed error naming the argument, before any launch: a partition of another
/// rank count, a shard whose tokens are not the partition's, a chunk size other than the
/// partition's; and more ranks than GPUs.
fn refuses_bad_input() -> TestResult {
    let group = match open(1) {
        Ok(g) => g,
        Err(outcome) => return outcome,
    };
    let too_many = CpGroup::open(1024).unwrap_err();
    assert!(matches!(too_many, GpuError::Input(_)), "{too_many}");
    assert!(too_many.to_string().contains("gpus"), "{too_many}");
    let gpu = group.gpu(0);
    let cu = [0i64, 200];
    let mut rng = Rng::new(7);
    let spec = Draw {
        b: 1,
        t: 200,
        h: 1,
        hv: 1,
        k: 64,
        v: 64,
        per_key: false,
        regime: Regime::Strong,
        raw_qk: false,
        beta_logits: false,
        gate_input: false,
        h0: false,
        v_first: false,
    };
    let (_, dev) = draw(gpu, &mut rng, &spec, Dtype::BF16, Dtype::F32);
    let p = GdnFwdParams::default();
    let shards = [dev.tensors()];
    let two = Partition::balanced(&cu, 64, 2, 1).unwrap();
    let e = cp_gdn_fwd(&group, &two, &shards, &p, ForwardPath::Auto).unwrap_err();
    assert!(e.to_string().contains("partition"), "{e}");
    let short = Partition::balanced(&[0, 199], 64, 1, 1).unwrap();
    let e = cp_gdn_fwd(&group, &short, &shards, &p, ForwardPath::Auto).unwrap_err();
    assert!(e.to_string().contains("q (rank 0)"), "{e}");
    let one = Partition::balanced(&cu, 32, 1, 1).unwrap();
    let e = cp_gdn_fwd(&group, &one, &shards, &p, ForwardPath::Auto).unwrap_err();
    assert!(e.to_string().contains("chunk_size"), "{e}");
    Ok(Completion::Completed)
}

/// `kda_fwd`, `gdn_fwd` and `fwd_h`, in one call and as plans, on one group of `ranks` GPUs
/// (one group per test: every GPU of a group compiles its kernels once), each op's failure
/// reported apart.
fn all_ops(ranks: usize) -> TestResult {
    let group = match open(ranks) {
        Ok(g) => g,
        Err(outcome) => return outcome,
    };
    type Op<'a> = &'a dyn Fn(&CpGroup);
    let ops: [(&str, Op); 7] = [
        ("kda_fwd", &|g| forward_all(g, true)),
        ("kda_fwd K=128 (kda_intra_pipe)", &pipe_all),
        ("gdn_fwd", &|g| forward_all(g, false)),
        ("fwd_h", &fwd_h_all),
        ("kda_fwd plan", &|g| plan_case(g, true)),
        ("gdn_fwd plan", &|g| plan_case(g, false)),
        ("fwd_h plan", &fwd_h_plan_case),
    ];
    let mut failed = Vec::new();
    for (name, op) in ops {
        eprintln!("{ranks} ranks: {name} ...");
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(&group)));
        // progress on stderr: a collective that never returns shows which op it was in
        eprintln!(
            "{ranks} ranks: {name} ended in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        if let Err(p) = outcome {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{name}: {msg}"));
        }
    }
    if failed.is_empty() {
        Ok(Completion::Completed)
    } else {
        Err(failed.join("\n").into())
    }
}

fn r1() -> TestResult {
    all_ops(1)
}
fn r2() -> TestResult {
    all_ops(2)
}
fn r3() -> TestResult {
    all_ops(3)
}
fn r4() -> TestResult {
    all_ops(4)
}

/// The environment variable that makes [`a_missing_peer_times_out`] the peer process: the
/// group's [`CpId`], its 128 bytes as 256 hex digits.
const PEER_ID_VAR: &str = "ATTN_CP_PEER_ID";

/// How long rank 0 of [`a_missing_peer_times_out`] may take in all (its collective times out
/// after 2 s) before the test reports a hang.
const RANK0_DEADLINE: Duration = Duration::from_secs(90);

/// How long the peer process may take to exit once its stdin is closed.
const PEER_EXIT_DEADLINE: Duration = Duration::from_secs(30);

/// The stages rank 0 of [`a_missing_peer_times_out`] reaches, in order: a hang is reported with
/// the last one reached.
const STAGES: [&str; 5] = [
    "spawned the peer process, joining as rank 0",
    "joined as rank 0",
    "queued the all-gather, synchronizing",
    "synchronize returned",
    "checked, dropping the group",
];

/// `bytes` as lowercase hex digits.
fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The [`CpId`] whose bytes [`to_hex`] wrote as `hex`.
fn id_from_hex(hex: &str) -> Result<CpId, String> {
    let bad = || format!("{PEER_ID_VAR} is not 256 hex digits: {hex:?}");
    if hex.len() != 256 {
        return Err(bad());
    }
    let mut bytes = [0u8; 128];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = hex
            .get(2 * i..2 * i + 2)
            .and_then(|digits| u8::from_str_radix(digits, 16).ok())
            .ok_or_else(bad)?;
    }
    Ok(CpId::from_bytes(bytes))
}

/// Rank 1 of [`a_missing_peer_times_out`], in its own process (GPU 1): joins the group, enters
/// no collective, and leaves once its stdin is closed (rank 0 is done).
fn missing_peer(hex: &str) -> TestResult {
    let id = id_from_hex(hex)?;
    let group = CpGroup::join(1, 1, 2, &id).map_err(|e| format!("the peer's join: {e}"))?;
    eprintln!("missing peer: rank 1 joined, waiting for its stdin to close");
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())
        .map_err(|e| format!("the peer's stdin: {e}"))?;
    drop(group);
    Ok(Completion::Completed)
}

/// Rank 0 of [`a_missing_peer_times_out`] (GPU 0), its peer never entering the all-gather:
/// `synchronize` must return `GpuError::Collective` naming rank 0 once the timeout has passed
/// (not before, nor much later), and the aborted group must refuse the next collective. Each
/// of [`STAGES`] reached is stored in `stage` and printed on stderr.
fn rank0(id: CpId, stage: &AtomicUsize) -> Result<(), String> {
    let reached = |s: usize| {
        stage.store(s, Ordering::SeqCst);
        eprintln!("missing peer: {}", STAGES[s]);
    };
    let timeout = Duration::from_secs(2);
    let mut group = CpGroup::join(0, 0, 2, &id).map_err(|e| e.to_string())?;
    reached(1);
    group.set_timeout(timeout);
    let gpu = group.gpu(0);
    let send = DeviceTensor::from_slice(gpu, &[1.5f32; 64]).map_err(|e| e.to_string())?;
    let mut recv = [DeviceTensor::alloc(gpu, &[128], Dtype::F32).map_err(|e| e.to_string())?];
    group
        .all_gather(&[&send], &mut recv)
        .map_err(|e| format!("queueing the all-gather: {e}"))?;
    reached(2);
    let start = Instant::now();
    let waited = group.synchronize();
    let took = start.elapsed();
    reached(3);
    let e = waited
        .err()
        .ok_or("the all-gather without its peer completed")?;
    let text = e.to_string();
    if !matches!(e, GpuError::Collective { .. }) || !text.contains("rank(s) [0]") {
        return Err(format!("not the timeout naming rank 0: {text}"));
    }
    if took < timeout || took > timeout * 10 {
        return Err(format!(
            "returned after {took:?} with a timeout of {timeout:?}"
        ));
    }
    let again = group
        .all_gather(&[&send], &mut recv)
        .err()
        .ok_or("an aborted group queued a collective")?;
    if !again.to_string().contains("aborted") {
        return Err(format!("not the aborted group's error: {again}"));
    }
    reached(4);
    Ok(())
}

/// The exit status of `child`, waiting at most `limit` (then it is killed: an error).
fn exit_within(child: &mut Child, limit: Duration) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            return Err(format!(
                "the peer process did not exit within {limit:?} (killed)"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// No rank waits forever: two ranks joined one per process (`CpGroup::join`), rank 1 being
/// this test binary run again ([`missing_peer`], under [`PEER_ID_VAR`]) and never entering the
/// all-gather that rank 0 queues ([`rank0`]'s checks). Rank 0 runs in a worker thread that the
/// test waits for at most [`RANK0_DEADLINE`]: a hang (in NCCL's join or abort, say) fails the
/// test naming the last stage reached, as does the peer process exiting before rank 0 is done.
/// The peer must then exit, successfully, within [`PEER_EXIT_DEADLINE`] of its stdin closing.
/// Last in the list: a hang leaves its worker thread, in NCCL, behind.
fn a_missing_peer_times_out() -> TestResult {
    if let Ok(hex) = std::env::var(PEER_ID_VAR) {
        return missing_peer(&hex);
    }
    // the two GPUs and NCCL, probed by opening (and dropping) a two-rank group
    drop(match open(2) {
        Ok(g) => g,
        Err(outcome) => return outcome,
    });
    let id = CpId::new().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut peer = Command::new(exe)
        .args(["a_missing_peer_times_out", "--exact", "--nocapture"])
        .env(PEER_ID_VAR, to_hex(&id.to_bytes()))
        .stdin(Stdio::piped())
        // the peer's test report on stderr, apart from this harness's report on stdout
        .stdout(std::io::stderr())
        .spawn()
        .map_err(|e| format!("spawning the peer process: {e}"))?;
    let stage = Arc::new(AtomicUsize::new(0));
    eprintln!("missing peer: {}", STAGES[0]);
    let (tx, rx) = mpsc::channel();
    let worker_stage = Arc::clone(&stage);
    // not joined: a worker that hangs (in NCCL, which no one can interrupt) is leaked
    std::thread::spawn(move || tx.send(rank0(id, &worker_stage)).ok());
    let deadline = Instant::now() + RANK0_DEADLINE;
    let checked = loop {
        let at = || STAGES[stage.load(Ordering::SeqCst)];
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(outcome) => break outcome,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err(format!("rank 0 panicked after: {}", at()))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let early = peer.try_wait().ok().flatten();
        if early.is_some() || Instant::now() >= deadline {
            peer.kill().ok();
            peer.wait().ok();
            let why = early.map_or(format!("hung for {RANK0_DEADLINE:?}"), |s| {
                format!("was left waiting: the peer process exited ({s})")
            });
            return Err(format!("rank 0 {why} after: {}", at()).into());
        }
    };
    // rank 0 is done: the peer leaves when its stdin closes
    drop(peer.stdin.take());
    let exited = exit_within(&mut peer, PEER_EXIT_DEADLINE).and_then(|s| {
        s.success()
            .then_some(())
            .ok_or(format!("the peer process failed ({s})"))
    });
    let failed: Vec<String> = [checked, exited]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if failed.is_empty() {
        Ok(Completion::Completed)
    } else {
        Err(failed.join("\n").into())
    }
}

gpu_tests!(refuses_bad_input, r1, r2, r3, r4, a_missing_peer_times_out);
