//! The persistent KDA intra kernel `kda_intra_pipe` against today's `kda_intra_mma_fast_bf16`
//! on the same calls (the fused KDA path's intra stage, both plans pinned explicitly so that
//! `$ATTN_KDA_INTRA` changes nothing here): bf16, `K = V = 128`, chunk 64, the in-kernel gate
//! (two lower bounds) with `safe_gate`, the in-kernel L2 norm and β sigmoid, GVA,
//! varlen with partial and one-token chunks, grids of one CTA, a few CTAs (several items each)
//! and two per multiprocessor. Outputs are poisoned with NaN before each run, so every element
//! must have been written. Without a GPU each test is reported ignored with the reason.

mod common;

use attn_gpu::delta::{DeltaFwdPlan, DeltaFwdWorkspace, ForwardPath};
use attn_gpu::Gpu;
use attn_reference::delta::KdaFwdParams;
use attn_reference::Dtype;
use common::forward::*;
use common::*;
use ndarray::ArrayD;

/// One call: its draw, `cu_seqlens` and gate form.
struct Case {
    name: &'static str,
    draw: Draw,
    cu: Vec<i64>,
    lower_bound: Option<f64>,
}

fn cases() -> Vec<Case> {
    let draw = |h, hv, t| Draw {
        b: 1,
        t,
        h,
        hv,
        k: 128,
        v: 128,
        per_key: true,
        regime: Regime::Safe,
        raw_qk: true,
        beta_logits: true,
        gate_input: true,
        h0: false,
        v_first: false,
    };
    vec![
        Case {
            name: "lower-bound gate, GVA, varlen",
            draw: draw(2, 4, 517),
            cu: vec![0, 1, 64, 130, 130, 300, 517],
            lower_bound: Some(-5.0),
        },
        Case {
            name: "lower bound -2, whole chunks",
            draw: draw(3, 3, 384),
            cu: vec![0, 384],
            lower_bound: Some(-2.0),
        },
    ]
}

fn params(c: &Case) -> KdaFwdParams {
    KdaFwdParams {
        scale: None,
        output_final_state: true,
        use_qk_l2norm_in_kernel: true,
        use_gate_in_kernel: true,
        lower_bound: c.lower_bound,
        use_beta_sigmoid_in_kernel: true,
        allow_neg_eigval: false,
        safe_gate: true,
        chunk_size: 64,
        state_v_first: false,
    }
}

/// The intra stage's outputs of one run, downloaded.
struct Tiles {
    w: ArrayD<f64>,
    u: ArrayD<f64>,
    kg: ArrayD<f64>,
    qg: ArrayD<f64>,
    qf: ArrayD<f64>,
    lam: ArrayD<f64>,
    aqk: ArrayD<f64>,
}

fn download_tiles(gpu: &Gpu, ws: &DeltaFwdWorkspace) -> Tiles {
    let t = ws.intra_tiles().expect("a fused KDA workspace");
    Tiles {
        w: download(gpu, t.w),
        u: download(gpu, t.u),
        kg: download(gpu, t.kg),
        qg: download(gpu, t.qg),
        qf: download(gpu, t.qf),
        lam: download(gpu, t.lam),
        aqk: download(gpu, t.aqk),
    }
}

/// The intra stage of `c` on today's kernel (`grid` None) or the pipe kernel with `grid` CTAs,
/// into poisoned tiles.
fn intra(gpu: &Gpu, c: &Case, dev: &ForwardDev, grid: Option<usize>) -> Tiles {
    let plan = DeltaFwdPlan::kda(
        gpu,
        &dev.tensors(),
        Some(&c.cu),
        &params(c),
        ForwardPath::Fused,
    )
    .unwrap()
    .with_intra_pipe(grid);
    assert_eq!(
        plan.intra_pipe(),
        grid,
        "{}: the plan runs the kernel asked for",
        c.name
    );
    let mut ws = plan.alloc_workspace(gpu).unwrap();
    ws.poison_intra_tiles(gpu).unwrap();
    plan.run_intra(gpu, &dev.tensors(), &mut ws).unwrap();
    download_tiles(gpu, &ws)
}

fn no_nan(what: &str, x: &ArrayD<f64>) {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        panic!(
            "{what}: element {i} is {} (not written?)",
            x.iter().nth(i).unwrap()
        );
    }
}

/// Each case on today's kernel and on the pipe kernel at three grids, compared output by output
/// with `check(case name, grid, today's, pipe's)`.
fn each_run(gpu: &Gpu, check: impl Fn(&str, &Tiles, &Tiles)) {
    for (i, c) in cases().iter().enumerate() {
        let mut rng = Rng::new(0x5eed_0000 + i as u64);
        let (_, dev) = draw(gpu, &mut rng, &c.draw, Dtype::BF16, Dtype::F32);
        let today = intra(gpu, c, &dev, None);
        for grid in [1, 7, 2 * gpu.sm_count()] {
            let pipe = intra(gpu, c, &dev, Some(grid));
            let what = format!("{}, {grid} CTAs", c.name);
            for (name, x) in [
                ("w", &pipe.w),
                ("u", &pipe.u),
                ("kg", &pipe.kg),
                ("qg", &pipe.qg),
                ("qf", &pipe.qf),
                ("lam", &pipe.lam),
                ("aqk", &pipe.aqk),
            ] {
                no_nan(&format!("{what}: {name}"), x);
            }
            check(&what, &today, &pipe);
        }
    }
}

/// kg, qg, lam and qf (the norms, the gate, its cumsum and the elementwise factors) bit-equal to
/// today's kernel.
fn kda_intra_pipe_elementwise_bit_equal(gpu: &Gpu) {
    each_run(gpu, |what, today, pipe| {
        assert_bit_identical(&format!("{what}: kg"), &pipe.kg, &today.kg);
        assert_bit_identical(&format!("{what}: qg"), &pipe.qg, &today.qg);
        assert_bit_identical(&format!("{what}: lam"), &pipe.lam, &today.lam);
        assert_bit_identical(&format!("{what}: qf"), &pipe.qf, &today.qf);
    });
}

/// `RMS(a - b) / RMS(b)` of `what` at most `thr`.
fn assert_ratio(what: &str, a: &ArrayD<f64>, b: &ArrayD<f64>, thr: f64) {
    if let Some((max_abs, ratio)) = close_ratio(what, a, b) {
        assert!(
            ratio <= thr,
            "{what}: relative RMS {ratio:e} > {thr:e} (max_abs {max_abs:e})"
        );
    }
}

/// Aqk (the same bf16 hi + lo products as today's, another fp32 summation order: the two key
/// halves summed apart) within relative RMS 1e-4 of today's kernel.
fn kda_intra_pipe_aqk_matches(gpu: &Gpu) {
    each_run(gpu, |what, today, pipe| {
        assert_ratio(&format!("{what}: aqk"), &pipe.aqk, &today.aqk, 1e-4);
    });
}

/// w and u (today's solve on L, whose products sum the key halves apart, then Akk as hi + lo
/// times the bf16 operands) within relative RMS 1e-3 of today's kernel; they depend on every
/// element of L, which no output shows directly.
fn kda_intra_pipe_w_u_match(gpu: &Gpu) {
    each_run(gpu, |what, today, pipe| {
        assert_ratio(&format!("{what}: w"), &pipe.w, &today.w, 1e-3);
        assert_ratio(&format!("{what}: u"), &pipe.u, &today.u, 1e-3);
    });
}

gpu_tests!(
    kda_intra_pipe_elementwise_bit_equal,
    kda_intra_pipe_aqk_matches,
    kda_intra_pipe_w_u_match
);
