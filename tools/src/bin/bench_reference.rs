//! Benchmark (not a test) of the float64 CPU reference, with rayon on all cores and on a
//! 1-thread pool:
//! - the delta rule: `kda_fwd` in its recurrent and chunked forms and
//!   `chunk_gated_delta_rule_fwd_h`, on `B = 1, T = 8192, H = HV = 4, K = V = 128`;
//! - native sparse attention: `nsa_fwd` on `B = 1, T = 8192, HQ = 16, H = 1, K = V = 64`,
//!   `block_size` 64, 16 selected blocks (computed), window 512, all three gates (issue 13: it
//!   must stay under 5 s to serve as an oracle).
//!
//! `cargo run --release -p attn-tools --bin bench_reference [-- [all|delta|nsa] [T]]`

use attn_reference::cumsum::chunk_local_cumsum;
use attn_reference::delta::{
    chunk_gated_delta_rule_fwd_h, kda_fwd, kda_fwd_chunked, kda_intra, FwdHInputs, FwdHParams,
    KdaFwdInputs, KdaFwdParams, KdaIntraInputs, KdaIntraParams,
};
use attn_reference::nsa::nsa_fwd::FwdGates;
use attn_reference::nsa::{nsa_fwd, BlockCounts};
use attn_reference::Error;
use ndarray::{Array3, Array4, Axis, Ix4};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::time::Instant;

fn l2norm(mut x: Array4<f64>) -> Array4<f64> {
    for mut row in x.lanes_mut(Axis(3)) {
        let n = (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row /= n;
    }
    x
}

/// One timed call; returns one element so the work cannot be optimised away.
type Job<'a> = Box<dyn Fn() -> f64 + Sync + 'a>;

/// Wall time of `f` (best of `reps`) in the given pool.
fn time<R: Send>(pool: &rayon::ThreadPool, reps: usize, f: impl Fn() -> R + Sync) -> f64 {
    (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(pool.install(&f));
            t0.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn pools() -> (rayon::ThreadPool, rayon::ThreadPool) {
    let all = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    (all, one)
}

/// Times every row on all cores and on one thread (best of `reps`) and prints the speedup.
fn report(rows: &[(&str, Job<'_>)], reps: usize) {
    let (all, one) = pools();
    println!(
        "{:<30} {:>12} {:>12} {:>8}",
        "op", "all cores s", "1 thread s", "speedup"
    );
    for (name, f) in rows.iter() {
        let ta = time(&all, reps, f);
        let t1 = time(&one, reps, f);
        println!("{name:<30} {ta:>12.3} {t1:>12.3} {:>7.2}x", t1 / ta);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let part = args
        .iter()
        .find(|a| a.parse::<usize>().is_err())
        .map_or("all", String::as_str);
    let t: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(8192);
    if matches!(part, "all" | "delta") {
        delta(t);
    }
    if matches!(part, "all" | "nsa") {
        nsa(t);
    }
}

/// `nsa_fwd` in float64: B = 1, HQ = 16, H = 1, K = V = 64, BS 64, 16 blocks, window 512.
fn nsa(t: usize) {
    let (hq, kd, bs, s, w) = (16usize, 64usize, 64i64, 16i64, 512i64);
    let mut rng = StdRng::seed_from_u64(13);
    let mut uni = |shape: (usize, usize, usize, usize), lo: f64, hi: f64| {
        Array4::from_shape_simple_fn(shape, || rng.random_range(lo..hi))
    };
    let q = uni((1, t, hq, kd), -1.0, 1.0);
    let k = uni((1, t, 1, kd), -1.0, 1.0);
    let v = uni((1, t, 1, kd), -1.0, 1.0);
    let g = uni((3, t, hq, 1), 0.0, 1.0);
    let gate = |c: usize| g.slice(ndarray::s![c..c + 1, .., .., 0]);
    let gates = FwdGates {
        g_cmp: Some(gate(0)),
        g_slc: Some(gate(1)),
        g_swa: Some(gate(2)),
    };
    println!(
        "nsa_fwd reference, f64, B=1 T={t} HQ={hq} H=1 K=V={kd} block_size={bs} block_counts={s} \
         window={w}; {} threads vs 1",
        pools().0.current_num_threads()
    );
    let run = || {
        nsa_fwd(
            q.view(),
            k.view(),
            v.view(),
            gates,
            None,
            Some(BlockCounts::Int(s)),
            None,
            bs,
            w,
            None,
        )
        .map(|o| o.o[[0, t - 1, 0, 0]])
        .unwrap_or(f64::NAN)
    };
    let rows: [(&str, Job<'_>); 1] = [("nsa_fwd", Box::new(run))];
    report(&rows, 2);
}

/// The delta-rule reference on B = 1, H = HV = 4, K = V = 128, BT = 64.
fn delta(t: usize) {
    let (b, h, kd, vd, bt) = (1usize, 4usize, 128usize, 128usize, 64usize);
    let mut rng = StdRng::seed_from_u64(7);
    let mut randn = |shape: (usize, usize, usize, usize)| {
        Array4::from_shape_simple_fn(shape, || rng.sample::<f64, _>(StandardNormal))
    };
    let q = l2norm(randn((b, t, h, kd)));
    let k = l2norm(randn((b, t, h, kd)));
    let v = randn((b, t, h, vd));
    // logsigmoid(randn) / 10, beta = sigmoid(randn) (`conformance/spec/ops-delta-rule.md` §10.2)
    let g = randn((b, t, h, kd)).mapv(|x| -(-x).exp().ln_1p() / 10.0);
    let beta = Array3::from_shape_simple_fn((b, t, h), || {
        1.0 / (1.0 + (-rng.sample::<f64, _>(StandardNormal)).exp())
    });

    println!(
        "delta-rule reference, f64, B={b} T={t} H=HV={h} K={kd} V={vd} BT={bt}; {} threads vs 1",
        pools().0.current_num_threads()
    );

    let kin = KdaFwdInputs::new(q.view(), k.view(), v.view(), g.view(), beta.view());
    let kp = KdaFwdParams {
        chunk_size: bt as i64,
        output_final_state: true,
        ..KdaFwdParams::default()
    };
    // realistic fwd_h inputs: the KDA intra stage on the chunk-local log2 gate
    let gcum = chunk_local_cumsum(
        g.view().into_dyn(),
        None,
        bt as i64,
        false,
        Some(std::f64::consts::LOG2_E),
    )
    .and_then(|a| {
        a.into_dimensionality::<Ix4>()
            .map_err(|e| Error::shape("g", "[B, T, H, K]", e.to_string()))
    })
    .expect("valid chunk_local_cumsum inputs");
    let iin = KdaIntraInputs {
        q: q.view(),
        k: k.view(),
        v: v.view(),
        gk: gcum.view(),
        beta: beta.view(),
        cu_seqlens: None,
    };
    let ip = KdaIntraParams::default();
    let intra = kda_intra(&iin, &ip).expect("valid kda_intra inputs");
    let mut fin = FwdHInputs::new(intra.kg.view(), intra.w.view(), intra.u.view());
    fin.gk = Some(gcum.view());
    let fp = FwdHParams {
        chunk_size: bt as i64,
        output_final_state: true,
        ..FwdHParams::default()
    };

    // check once that both KDA forms agree before timing them
    let rec = kda_fwd(&kin, &kp).expect("valid kda_fwd inputs");
    let chk = kda_fwd_chunked(&kin, &kp).expect("valid kda_fwd inputs");
    let max_abs = rec
        .o
        .iter()
        .zip(&chk.o)
        .fold(0.0f64, |m, (a, c)| m.max((a - c).abs()));
    println!("kda_fwd recurrent vs chunked: max |o| difference {max_abs:.2e}");

    let reps = 3;
    let rows: [(&str, Job<'_>); 4] = [
        (
            "kda_fwd (recurrent)",
            Box::new(|| {
                kda_fwd(&kin, &kp)
                    .map(|o| o.o[[0, 0, 0, 0]])
                    .unwrap_or(f64::NAN)
            }),
        ),
        (
            "kda_fwd (chunked)",
            Box::new(|| {
                kda_fwd_chunked(&kin, &kp)
                    .map(|o| o.o[[0, 0, 0, 0]])
                    .unwrap_or(f64::NAN)
            }),
        ),
        (
            "kda_intra",
            Box::new(|| {
                kda_intra(&iin, &ip)
                    .map(|o| o.w[[0, 0, 0, 0]])
                    .unwrap_or(f64::NAN)
            }),
        ),
        (
            "chunk_gated_delta_rule_fwd_h",
            Box::new(|| {
                chunk_gated_delta_rule_fwd_h(&fin, &fp)
                    .map(|o| o.h[[0, 0, 0, 0, 0]])
                    .unwrap_or(f64::NAN)
            }),
        ),
    ];
    report(&rows, reps);
}
