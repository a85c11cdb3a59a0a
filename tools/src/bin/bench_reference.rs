//! Benchmark (not a test) of the float64 CPU reference of the delta rule: `kda_fwd` in its
//! recurrent and chunked forms and `chunk_gated_delta_rule_fwd_h`, on `B = 1, T = 8192,
//! H = HV = 4, K = V = 128`, with rayon on all cores and on a 1-thread pool.
//!
//! `cargo run --release -p attn-tools --bin bench_reference [-- T]`

use attn_reference::cumsum::chunk_local_cumsum;
use attn_reference::delta::{
    chunk_gated_delta_rule_fwd_h, kda_fwd, kda_fwd_chunked, kda_intra, FwdHInputs, FwdHParams,
    KdaFwdInputs, KdaFwdParams, KdaIntraInputs, KdaIntraParams,
};
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

fn main() {
    let t: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(8192);
    let (b, h, kd, vd, bt) = (1usize, 4usize, 128usize, 128usize, 64usize);
    let mut rng = StdRng::seed_from_u64(7);
    let mut randn = |shape: (usize, usize, usize, usize)| {
        Array4::from_shape_simple_fn(shape, || rng.sample::<f64, _>(StandardNormal))
    };
    let q = l2norm(randn((b, t, h, kd)));
    let k = l2norm(randn((b, t, h, kd)));
    let v = randn((b, t, h, vd));
    // logsigmoid(randn) / 10, beta = sigmoid(randn) (spec 10.2)
    let g = randn((b, t, h, kd)).mapv(|x| -(-x).exp().ln_1p() / 10.0);
    let beta = Array3::from_shape_simple_fn((b, t, h), || {
        1.0 / (1.0 + (-rng.sample::<f64, _>(StandardNormal)).exp())
    });

    let all = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("rayon pool");
    println!(
        "delta-rule reference, f64, B={b} T={t} H=HV={h} K={kd} V={vd} BT={bt}; {} threads vs 1",
        all.current_num_threads()
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
