//! The persistent KDA intra kernel `kda_intra_pipe` against today's `kda_intra_mma_fast_bf16`
//! on the same calls (the fused KDA path's intra stage, both plans pinned explicitly so that
//! `$ATTN_KDA_INTRA` changes nothing here): bf16, `K = V = 128`, chunk 64, `safe_gate` with the
//! gate in the kernel (two lower bounds) or `g` given as fp32 per-step decays (three regimes:
//! strong `U[−1.5, −0.05]`, trained-like clamped to the promise's `[−5, 0]`, long memory
//! `U[−1e-3, 0]`); without `safe_gate` (the entry point whose diagonal blocks are FMAs on the
//! running product of the steps, against today's FMA path) the gate in the kernel in both forms
//! (softplus: the trained gate; lower bound) or `g` given as the common regimes draw it (trained
//! unclamped, strong `logsigmoid(randn)` per key, long memory, hard forget with 5% of the steps at
//! −1000); the in-kernel L2 norm and β sigmoid, GVA, varlen with empty, one-token and partial
//! chunks, and the per-token `G` that context parallelism's first half asks for (`rows_gate`);
//! grids of one CTA, a few CTAs (several items each) and two per multiprocessor. Outputs are
//! poisoned with NaN before each run, so every element must have been written. Without a GPU
//! each test is reported ignored with the reason.

mod common;

use attn_gpu::delta::{DeltaFwdPlan, DeltaFwdWorkspace, ForwardPath};
use attn_gpu::Gpu;
use attn_reference::delta::KdaFwdParams;
use attn_reference::Dtype;
use common::forward::*;
use common::*;
use ndarray::ArrayD;

/// How a case's gate arrives.
#[derive(Clone, Copy)]
enum GateCase {
    /// The KDA gate in the kernel (`use_gate_in_kernel`) with this lower bound.
    InKernel(f64),
    /// `g` given: `U[−1.5, −0.05]` per token and key (the benchmarks' strong regime).
    Strong,
    /// `g` given: the trained regime (`−exp(A_log) · softplus(x + dt_bias)`) clamped to `−5`.
    Trained,
    /// `g` given: `U[−1e-3, 0]` (long memory).
    Long,
    /// The KDA gate in the kernel without a lower bound (`−exp(A_log) · softplus(x + dt_bias)`;
    /// only without `safe_gate`).
    InKernelSoftplus,
    /// `g` given as the common draw's regime makes it (unclamped).
    Drawn(Regime),
}

/// One call: its draw, `cu_seqlens`, gate, `safe_gate` and whether the intra stage also writes
/// `G` per token.
struct Case {
    name: &'static str,
    draw: Draw,
    cu: Vec<i64>,
    gate: GateCase,
    safe: bool,
    rows_gate: bool,
}

fn cases() -> Vec<Case> {
    let draw = |h, hv, t, gate| Draw {
        b: 1,
        t,
        h,
        hv,
        k: 128,
        v: 128,
        per_key: true,
        regime: match gate {
            GateCase::Trained => Regime::Trained,
            GateCase::Long => Regime::Long,
            GateCase::Drawn(r) => r,
            _ => Regime::Safe,
        },
        raw_qk: true,
        beta_logits: true,
        gate_input: matches!(gate, GateCase::InKernel(_) | GateCase::InKernelSoftplus),
        h0: false,
        v_first: false,
    };
    let case = |name, h, hv, t, cu: &[i64], gate, rows_gate| Case {
        name,
        draw: draw(h, hv, t, gate),
        cu: cu.to_vec(),
        gate,
        safe: true,
        rows_gate,
    };
    let unsafe_case = |name, h, hv, t, cu: &[i64], gate, rows_gate| Case {
        safe: false,
        ..case(name, h, hv, t, cu, gate, rows_gate)
    };
    let varlen = [0, 1, 64, 130, 130, 300, 517];
    let varlen2 = [0, 63, 64, 65, 200, 450];
    vec![
        case(
            "lower-bound gate, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::InKernel(-5.0),
            false,
        ),
        case(
            "lower bound -2, whole chunks",
            3,
            3,
            384,
            &[0, 384],
            GateCase::InKernel(-2.0),
            false,
        ),
        case(
            "given g strong, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::Strong,
            false,
        ),
        case(
            "given g trained-like, varlen",
            2,
            2,
            450,
            &[0, 63, 64, 65, 200, 450],
            GateCase::Trained,
            false,
        ),
        case(
            "given g long memory, whole chunks",
            3,
            3,
            384,
            &[0, 384],
            GateCase::Long,
            false,
        ),
        case(
            "rows gate, lower-bound gate, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::InKernel(-5.0),
            true,
        ),
        case(
            "rows gate, given g strong, varlen",
            2,
            2,
            450,
            &[0, 63, 64, 65, 200, 450],
            GateCase::Strong,
            true,
        ),
        // without safe_gate: the diagonal blocks by FMAs
        unsafe_case(
            "no safe_gate, softplus gate in the kernel, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::InKernelSoftplus,
            false,
        ),
        unsafe_case(
            "no safe_gate, lower-bound gate, partial last chunk",
            3,
            3,
            400,
            &[0, 400],
            GateCase::InKernel(-5.0),
            false,
        ),
        unsafe_case(
            "no safe_gate, given g trained, varlen",
            2,
            2,
            450,
            &varlen2,
            GateCase::Drawn(Regime::Trained),
            false,
        ),
        unsafe_case(
            "no safe_gate, given g strong logsigmoid, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::Drawn(Regime::Strong),
            false,
        ),
        unsafe_case(
            "no safe_gate, given g long memory, partial last chunk",
            3,
            3,
            400,
            &[0, 400],
            GateCase::Drawn(Regime::Long),
            false,
        ),
        unsafe_case(
            "no safe_gate, given g hard forget, varlen",
            2,
            2,
            450,
            &varlen2,
            GateCase::Drawn(Regime::Hard),
            false,
        ),
        unsafe_case(
            "no safe_gate, rows gate, softplus gate in the kernel, varlen",
            2,
            2,
            450,
            &varlen2,
            GateCase::InKernelSoftplus,
            true,
        ),
        unsafe_case(
            "no safe_gate, rows gate, given g trained, GVA, varlen",
            2,
            4,
            517,
            &varlen,
            GateCase::Drawn(Regime::Trained),
            true,
        ),
    ]
}

fn params(c: &Case) -> KdaFwdParams {
    KdaFwdParams {
        scale: None,
        output_final_state: true,
        use_qk_l2norm_in_kernel: true,
        use_gate_in_kernel: matches!(c.gate, GateCase::InKernel(_) | GateCase::InKernelSoftplus),
        lower_bound: match c.gate {
            GateCase::InKernel(lb) => Some(lb),
            _ => None,
        },
        use_beta_sigmoid_in_kernel: true,
        allow_neg_eigval: false,
        safe_gate: c.safe,
        chunk_size: 64,
        state_v_first: false,
    }
}

/// The device tensors of `c`: its draw, with a given `g` replaced by the case's regime where the
/// common draw differs (strong: the benchmarks' uniform; trained: clamped to the `safe_gate`
/// promise `[−5, 0]`; `Drawn`: as drawn).
fn draw_case(gpu: &Gpu, rng: &mut Rng, c: &Case) -> ForwardDev {
    let (host, mut dev) = draw(gpu, rng, &c.draw, Dtype::BF16, Dtype::F32);
    let g = match c.gate {
        GateCase::Strong => Some(rng.array(host.g.shape(), -1.5, -0.05)),
        GateCase::Trained => Some(host.g.mapv(|x| x.max(-5.0))),
        _ => None,
    };
    if let Some(g) = g {
        dev.g = upload(gpu, &g, Dtype::F32).0;
    }
    dev
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
    /// `G` per token, where the case asks for it.
    rows_gate: Option<ArrayD<f64>>,
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
        rows_gate: t.rows_gate.map(|g| download(gpu, g)),
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
    if c.rows_gate {
        // the first run allocates the per-token G, poisoned with the rest before the second
        plan.run_intra_rows_gate(gpu, &dev.tensors(), &mut ws)
            .unwrap();
        ws.poison_intra_tiles(gpu).unwrap();
        plan.run_intra_rows_gate(gpu, &dev.tensors(), &mut ws)
            .unwrap();
    } else {
        ws.poison_intra_tiles(gpu).unwrap();
        plan.run_intra(gpu, &dev.tensors(), &mut ws).unwrap();
    }
    let t = download_tiles(gpu, &ws);
    assert_eq!(
        t.rows_gate.is_some(),
        c.rows_gate,
        "{}: G per token written where asked",
        c.name
    );
    t
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
        let dev = draw_case(gpu, &mut rng, c);
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
            if let Some(g) = &pipe.rows_gate {
                no_nan(&format!("{what}: rows_gate"), g);
            }
            check(&what, &today, &pipe);
        }
    }
}

/// kg, qg, lam and qf (the norms, the gate or the given decays, their cumsum and the elementwise
/// factors) bit-equal to today's kernel, and so is `G` per token where the case writes it.
fn kda_intra_pipe_elementwise_bit_equal(gpu: &Gpu) {
    each_run(gpu, |what, today, pipe| {
        match (&pipe.rows_gate, &today.rows_gate) {
            (Some(p), Some(t)) => assert_bit_identical(&format!("{what}: rows_gate"), p, t),
            (None, None) => {}
            _ => panic!("{what}: rows_gate written by one kernel only"),
        }
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
