//! Warm-up pieces of `chunk_gated_delta_rule_fwd_h_split` (`warmup_chunks`,
//! `conformance/spec/ops-delta-rule.md` §5.9) and the truncation bound `Λ` (§5.10), on fresh
//! random inputs (f64).

mod delta_util;

use attn_reference::delta::{
    chunk_gated_delta_rule_fwd_h, chunk_gated_delta_rule_fwd_h_split, truncation_log_bound,
    FwdHOutputs, FwdHSplitInputs, LogGates,
};
use attn_reference::ErrorKind;
use delta_util::{
    assert_same_outputs, bt, fwd_h_case, gates, l2norm, mode, params, random_split, seqs, sigmoid,
    transpose_state, Case, FwdHCase, GateMode, Rng,
};
use ndarray::{s, Array1, Array2, Array3, Array4, ArrayView2, Axis};
use proptest::prelude::*;

/// One piece of a split: its sequence `n`, batch row, sequence start `bos` (local), and its local
/// token range `[lo, hi)`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    n: usize,
    b: usize,
    bos: usize,
    lo: usize,
    hi: usize,
    first: bool,
}

/// The pieces of a valid split, in order.
fn pieces(c: &Case, split: &[i64]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut i = 0usize;
    for (n, (b, bos, eos)) in seqs(c.b, c.t, c.cu()).into_iter().enumerate() {
        let base = if c.cu().is_some() { 0 } else { b * c.t };
        let mut first = true;
        loop {
            let (lo, hi) = (split[i] as usize - base, split[i + 1] as usize - base);
            out.push(Piece {
                n,
                b,
                bos,
                lo,
                hi,
                first,
            });
            first = false;
            i += 1;
            if hi == eos {
                break;
            }
        }
    }
    out
}

/// Random warm-ups: 0 on first pieces; elsewhere 0 with probability `1 − p`, else `1 ..= c0 + 2`
/// (so some reach the sequence start, some reach past it).
fn random_warmups(ps: &[Piece], bt: usize, p: f64, rng: &mut Rng) -> Vec<i64> {
    ps.iter()
        .map(|pc| {
            if pc.first || rng.uniform(0.0, 1.0) >= p {
                0
            } else {
                let c0 = (pc.lo - pc.bos) / bt;
                1 + rng.below(c0 + 2) as i64
            }
        })
        .collect()
}

/// The oracle of §5.9: the untruncated section 2 result, with every warm piece replaced by
/// section 2 run directly on the sliced tokens `[bos + max(0, c0 − w)·bt, hi)` of its sequence
/// from zero (from `initial_state[n]` when the warm-up reaches the sequence start).
#[allow(clippy::too_many_arguments)]
fn oracle(
    c: &Case,
    fc: &FwdHCase,
    h0: Option<&Array4<f64>>,
    ps: &[Piece],
    warm: &[i64],
    bt: usize,
    v_first: bool,
) -> FwdHOutputs<f64> {
    let prm = params(bt, v_first);
    let mut out = chunk_gated_delta_rule_fwd_h(&fc.inputs(c, h0), &prm).unwrap();
    let varlen = c.cu().is_some();
    // global chunk index of each sequence's first chunk (varlen) or 0 (per batch row)
    let mut chunk0 = Vec::new();
    let mut acc = 0usize;
    for (_, bos, eos) in seqs(c.b, c.t, c.cu()) {
        chunk0.push(if varlen { acc } else { 0 });
        acc += (eos - bos).div_ceil(bt);
    }
    for (pc, &w) in ps.iter().zip(warm) {
        if w == 0 {
            continue;
        }
        let c0 = (pc.lo - pc.bos) / bt;
        let from_chunk = c0.saturating_sub(w as usize);
        let from = pc.bos + from_chunk * bt;
        let bsl = s![pc.b..pc.b + 1, from..pc.hi, .., ..];
        let mut inp = attn_reference::delta::FwdHInputs::new(
            fc.k.slice(bsl),
            fc.w.slice(bsl),
            fc.u.slice(bsl),
        );
        inp.g =
            fc.g.as_ref()
                .map(|g| g.slice(s![pc.b..pc.b + 1, from..pc.hi, ..]));
        inp.gk = fc.gk.as_ref().map(|g| g.slice(bsl));
        if from_chunk == 0 {
            inp.initial_state = h0.map(|a| a.slice(s![pc.n..pc.n + 1, .., .., ..]));
        }
        let run = chunk_gated_delta_rule_fwd_h(&inp, &prm).unwrap();
        let skip = c0 - from_chunk;
        let nch = (pc.hi - pc.lo).div_ceil(bt);
        let hb = if varlen { 0 } else { pc.b };
        let g0 = chunk0[pc.n] + c0;
        out.h
            .slice_mut(s![hb, g0..g0 + nch, .., .., ..])
            .assign(&run.h.slice(s![0, skip..skip + nch, .., .., ..]));
        out.v_new
            .as_mut()
            .unwrap()
            .slice_mut(s![pc.b, pc.lo..pc.hi, .., ..])
            .assign(
                &run.v_new
                    .as_ref()
                    .unwrap()
                    .slice(s![0, pc.lo - from.., .., ..]),
            );
        let last = ps
            .iter()
            .filter(|q| q.n == pc.n)
            .map(|q| q.hi)
            .max()
            .unwrap();
        if pc.hi == last {
            out.final_state
                .as_mut()
                .unwrap()
                .slice_mut(s![pc.n, .., .., ..])
                .assign(&run.final_state.as_ref().unwrap().index_axis(Axis(0), 0));
        }
    }
    out
}

fn run_split(
    c: &Case,
    fc: &FwdHCase,
    h0: Option<&Array4<f64>>,
    split: &[i64],
    warm: Option<&[i64]>,
    bt: usize,
    v_first: bool,
) -> FwdHOutputs<f64> {
    chunk_gated_delta_rule_fwd_h_split(
        &FwdHSplitInputs {
            fwd_h: fc.inputs(c, h0),
            subseq_cu_seqlens: Some(split),
            warmup_chunks: warm,
        },
        &params(bt, v_first),
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// §5.9: with random pieces and random warm-ups (mixed with exact pieces, some reaching the
    /// sequence start or past it), `h`, `v_new` and `final_state` equal section 2 run directly on
    /// each warm piece's sliced chunks from zero (or `initial_state[n]`), and section 2's
    /// untruncated result on the exact pieces (f64, 1e-10).
    #[test]
    fn warmups_equal_the_direct_recurrence(
        c in delta_util::cases(200, 16), m in mode(), bt in bt(), p_cut in 0.0f64..1.0,
        p_warm in 0.0f64..1.0, v_first: bool, with_h0: bool, seed: u64,
    ) {
        let fc = fwd_h_case(&c, m, bt);
        let h0t = with_h0.then(|| if v_first { transpose_state(c.h0.view()) } else { c.h0.clone() });
        let mut rng = Rng::new(seed);
        let split = random_split(&c, bt, p_cut, &mut rng);
        let ps = pieces(&c, &split);
        let warm = random_warmups(&ps, bt, p_warm, &mut rng);
        let got = run_split(&c, &fc, h0t.as_ref(), &split, Some(&warm), bt, v_first);
        let want = oracle(&c, &fc, h0t.as_ref(), &ps, &warm, bt, v_first);
        assert_same_outputs(&got, &want, 1e-10);
        // all-zero warm-ups are the exact split, bit for bit the same as no warm-ups
        let zeros = vec![0i64; ps.len()];
        prop_assert_eq!(
            run_split(&c, &fc, h0t.as_ref(), &split, Some(&zeros), bt, v_first),
            run_split(&c, &fc, h0t.as_ref(), &split, None, bt, v_first)
        );
    }
}

/// §5.9 on fixed layouts: several split sequences in one batch (with an empty and a one-token
/// sequence), pieces of one chunk, mixed warm-up and exact pieces; warm-ups that reach the
/// sequence start give the untruncated result; shorter ones give the direct recurrence and
/// (with states that do not vanish) differ from the untruncated result.
#[test]
fn warmups_on_fixed_layouts() {
    let bt = 32usize;
    // sequences: 200 tokens (7 chunks), empty, 1 token, 319 tokens (10 chunks), 380 (12 chunks)
    let cu = vec![0i64, 200, 200, 201, 520, 900];
    let mut c = Case::build(77, Some(cu), 1, 0, 2, 2, 12, 10);
    // long memory so the truncation is visible in the outputs
    let mut rng = Rng::new(78);
    c.g = Array4::from_shape_simple_fn(c.g.dim(), || rng.uniform(-1e-3, 0.0));
    c.gs = Array3::from_shape_simple_fn(c.gs.dim(), || rng.uniform(-1e-3, 0.0));
    // seq 0: every chunk its own piece; seq 3: pieces of 3 chunks; seq 4: 4 pieces
    let mut split = vec![0i64];
    split.extend((1..7).map(|i| 32 * i));
    split.extend([200, 200, 201]);
    split.extend([201 + 96, 201 + 192, 201 + 288, 520]);
    split.extend([520 + 96, 520 + 192, 520 + 288, 900]);
    for m in [GateMode::Kda, GateMode::Gdn, GateMode::Both] {
        let fc = fwd_h_case(&c, m, bt);
        let ps = pieces(&c, &split);
        assert_eq!(ps.len(), split.len() - 1);
        let whole =
            chunk_gated_delta_rule_fwd_h(&fc.inputs(&c, Some(&c.h0)), &params(bt, false)).unwrap();
        // every warm-up reaches the sequence start: the exact result
        let reach: Vec<i64> = ps
            .iter()
            .map(|pc| {
                if pc.first {
                    0
                } else {
                    ((pc.lo - pc.bos) / bt) as i64 + (pc.lo % 3) as i64
                }
            })
            .collect();
        let got = run_split(&c, &fc, Some(&c.h0), &split, Some(&reach), bt, false);
        assert_same_outputs(&got, &whole, 1e-10);
        // mixed: one-chunk warm-ups on one-chunk pieces, exact pieces, and a warm-up of 2
        let mixed: Vec<i64> = ps
            .iter()
            .enumerate()
            .map(|(i, pc)| if pc.first { 0 } else { [1, 0, 2][i % 3] })
            .collect();
        let got = run_split(&c, &fc, Some(&c.h0), &split, Some(&mixed), bt, false);
        let want = oracle(&c, &fc, Some(&c.h0), &ps, &mixed, bt, false);
        assert_same_outputs(&got, &want, 1e-10);
        // the truncation is real: with long memory the result is not the untruncated one
        let d = (got.final_state.as_ref().unwrap() - whole.final_state.as_ref().unwrap())
            .iter()
            .fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(
            d > 1e-3,
            "{m:?}: warm-ups left the final state unchanged ({d:e})"
        );
        for v_first in [false, true] {
            let h0t = if v_first {
                transpose_state(c.h0.view())
            } else {
                c.h0.clone()
            };
            let got = run_split(&c, &fc, Some(&h0t), &split, Some(&mixed), bt, v_first);
            let want = oracle(&c, &fc, Some(&h0t), &ps, &mixed, bt, v_first);
            assert_same_outputs(&got, &want, 1e-10);
        }
    }
}

/// Non-varlen `B = 2` with warm-ups: the split indexes the flattened `B·T` tokens.
#[test]
fn warmups_without_cu_seqlens() {
    let bt = 16usize;
    let c = Case::build(91, None, 2, 100, 1, 2, 8, 6);
    let fc = fwd_h_case(&c, GateMode::Kda, bt);
    let split = vec![0i64, 32, 48, 96, 100, 116, 164, 200];
    let ps = pieces(&c, &split);
    let warm = vec![0i64, 1, 5, 0, 0, 2, 1];
    let got = run_split(&c, &fc, Some(&c.h0), &split, Some(&warm), bt, false);
    let want = oracle(&c, &fc, Some(&c.h0), &ps, &warm, bt, false);
    assert_same_outputs(&got, &want, 1e-10);
}

/// The spectral norm `‖S‖₂` of a matrix: the square root of the largest eigenvalue of the smaller
/// Gram matrix (`SᵀS` or `SSᵀ`), by 200 power iterations with a Rayleigh quotient.
fn spectral(sm: ArrayView2<'_, f64>) -> f64 {
    let m: Array2<f64> = if sm.nrows() >= sm.ncols() {
        sm.t().dot(&sm)
    } else {
        sm.dot(&sm.t())
    };
    let n = m.nrows();
    let mut x = Array1::from_shape_fn(n, |i| 1.0 + 0.1 * (i as f64 + 1.0).sin());
    let mut lam = 0.0;
    for _ in 0..200 {
        let y = m.dot(&x);
        let ny = y.dot(&y).sqrt();
        if ny == 0.0 {
            return 0.0;
        }
        lam = x.dot(&y) / x.dot(&x);
        x = y / ny;
    }
    lam = lam.max(x.dot(&m.dot(&x)) / x.dot(&x));
    lam.max(0.0).sqrt()
}

/// Gate regimes of the bound's property test.
#[derive(Debug, Clone, Copy)]
enum Regime {
    /// `a = logsigmoid(randn)` (strong decay), L2-normalised keys.
    Strong,
    /// `a = logsigmoid(randn) / 16` (trained-like), L2-normalised keys.
    Trained,
    /// `a ∈ [−1e-3, 0]` (long memory), L2-normalised keys.
    LongMemory,
    /// `a = logsigmoid(randn) / 10` with keys of squared norm in `[0, 3)` and `β ∈ (0, 1)`, so
    /// `|1 − β‖k‖²|` can exceed 1.
    Unnormalised,
}

fn regime() -> impl Strategy<Value = Regime> {
    prop_oneof![
        Just(Regime::Strong),
        Just(Regime::Trained),
        Just(Regime::LongMemory),
        Just(Regime::Unnormalised)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// §5.10: for every warm piece (warm-up not reaching the sequence start) of a random split of
    /// a KDA case (fwd_h on `kda_intra`'s factors is the per-token recurrence), the difference
    /// between the untruncated and the truncated state at the piece start never exceeds
    /// `exp(Λ(t0, t1)) · ‖S_{t0}‖₂` (spectral norms), with `t0` the warm-up start, `t1` the piece
    /// start and `S_{t0}` the untruncated state there; plus an f64 rounding allowance relative
    /// to the states.
    #[test]
    fn truncation_error_within_the_bound(
        seed: u64, varlen: bool, n in 1usize..=3, h in 1usize..=2, group in 1usize..=2,
        kd in 1usize..=12, vd in 1usize..=12, r in regime(), big_bt: bool,
    ) {
        let bt = if big_bt { 64 } else { 32 };
        let mut rng = Rng::new(seed ^ 0xB0);
        // sequences of 64 ..= 360 tokens, so most pieces after the first can warm up
        let mut c = if varlen {
            let mut cu = vec![0i64];
            for _ in 0..n {
                cu.push(cu.last().unwrap() + 64 + rng.below(297) as i64);
            }
            Case::build(seed, Some(cu), 1, 0, h, group, kd, vd)
        } else {
            Case::build(seed, None, n, 64 + rng.below(297), h, group, kd, vd)
        };
        let (b, t, hv, kd) = (c.b, c.t, c.hv, c.kd);
        match r {
            Regime::Strong => c.g = gates(&mut rng, (b, t, hv, kd), 1.0, 0.0),
            Regime::Trained => c.g = gates(&mut rng, (b, t, hv, kd), 16.0, 0.0),
            Regime::LongMemory => {
                c.g = Array4::from_shape_simple_fn((b, t, hv, kd), || rng.uniform(-1e-3, 0.0))
            }
            Regime::Unnormalised => {
                c.g = gates(&mut rng, (b, t, hv, kd), 10.0, 0.0);
                let mut k = l2norm(rng.randn((b, t, c.h, kd)));
                for mut row in k.lanes_mut(Axis(3)) {
                    row *= rng.uniform(0.0, 3.0).sqrt();
                }
                c.k = k;
                c.beta = Array3::from_shape_simple_fn((b, t, hv), || sigmoid(rng.normal()));
            }
        }
        let fc = fwd_h_case(&c, GateMode::Kda, bt);
        let split = random_split(&c, bt, 0.5, &mut rng);
        let ps = pieces(&c, &split);
        let warm = random_warmups(&ps, bt, 0.8, &mut rng);
        let whole = chunk_gated_delta_rule_fwd_h(&fc.inputs(&c, Some(&c.h0)), &params(bt, false))
            .unwrap();
        let got = run_split(&c, &fc, Some(&c.h0), &split, Some(&warm), bt, false);
        let varlen = c.cu().is_some();
        for (pc, &w) in ps.iter().zip(&warm) {
            let c0 = (pc.lo - pc.bos) / bt;
            if w == 0 || w as usize >= c0 {
                continue;
            }
            let from_chunk = c0 - w as usize;
            let (t0, t1) = (from_chunk * bt, c0 * bt);
            // global chunk index of the sequence's first chunk
            let chunk0: usize = if varlen {
                seqs(c.b, c.t, c.cu())[..pc.n].iter().map(|&(_, lo, hi)| (hi - lo).div_ceil(bt)).sum()
            } else {
                0
            };
            let hb = if varlen { 0 } else { pc.b };
            for h in 0..c.hv {
                let kh = c.kh(h);
                let a = c.g.slice(s![pc.b, pc.bos.., h, ..]);
                let beta = c.beta.slice(s![pc.b, pc.bos.., h]);
                let k = c.k.slice(s![pc.b, pc.bos.., kh, ..]);
                let lam = truncation_log_bound(LogGates::PerKey(a), beta, k, t0, t1).unwrap();
                let s_t0 = whole.h.slice(s![hb, chunk0 + from_chunk, h, .., ..]);
                let exact = whole.h.slice(s![hb, chunk0 + c0, h, .., ..]);
                let trunc = got.h.slice(s![hb, chunk0 + c0, h, .., ..]);
                let diff = spectral((&exact - &trunc).view());
                let bound = lam.exp() * spectral(s_t0);
                let scale = exact.iter().chain(trunc.iter()).chain(s_t0.iter())
                    .fold(1.0f64, |m, x| m.max(x.abs()));
                prop_assert!(
                    diff <= bound * (1.0 + 1e-9) + 1e-11 * scale,
                    "{:?} piece {:?} w {} head {}: diff {:e} > exp(Λ = {}) ‖S_t0‖ = {:e}",
                    r, pc, w, h, diff, lam, bound
                );
            }
        }
    }
}

/// `Λ` on hand-computed values (§5.10), and its refusals.
#[test]
fn bound_hand_values_and_refusals() {
    // scalar gates, unit keys, beta 0.5: ln max(1, 0.5) = 0, Λ = Σ a
    let a = Array1::from(vec![-0.5, -1.0, -0.25, -2.0]);
    let beta = Array1::from(vec![0.5, 0.5, 0.5, 0.5]);
    let k = Array2::from_shape_vec((4, 2), vec![1.0, 0.0, 0.0, 1.0, 0.6, 0.8, 1.0, 0.0]).unwrap();
    let lam =
        truncation_log_bound(LogGates::Scalar(a.view()), beta.view(), k.view(), 1, 3).unwrap();
    assert!((lam - (-1.25)).abs() < 1e-15, "{lam}");
    assert_eq!(
        truncation_log_bound(LogGates::Scalar(a.view()), beta.view(), k.view(), 2, 2).unwrap(),
        0.0
    );
    // per-key gates take the largest; ‖k‖² = 4, β = 1: ln |1 − 4| = ln 3
    let ak = Array2::from_shape_vec((1, 2), vec![-3.0, -0.1]).unwrap();
    let k2 = Array2::from_shape_vec((1, 2), vec![2.0, 0.0]).unwrap();
    let b1 = Array1::from(vec![1.0]);
    let lam =
        truncation_log_bound(LogGates::PerKey(ak.view()), b1.view(), k2.view(), 0, 1).unwrap();
    assert!((lam - (-0.1 + 3f64.ln())).abs() < 1e-15, "{lam}");
    // refusals name the argument
    let e =
        truncation_log_bound(LogGates::Scalar(a.view()), beta.view(), k.view(), 3, 2).unwrap_err();
    assert_eq!(e.arg, "t0");
    let e =
        truncation_log_bound(LogGates::Scalar(a.view()), beta.view(), k.view(), 0, 5).unwrap_err();
    assert_eq!(e.arg, "t1");
    let e =
        truncation_log_bound(LogGates::Scalar(a.view()), b1.view(), k.view(), 0, 1).unwrap_err();
    assert_eq!(e.arg, "beta");
    let e =
        truncation_log_bound(LogGates::PerKey(ak.view()), beta.view(), k.view(), 0, 1).unwrap_err();
    assert_eq!((e.arg.as_str(), e.kind), ("a", ErrorKind::Shape));
}

/// §5.9 bad input: every bad `warmup_chunks` is a typed error naming `warmup_chunks`: without
/// `subseq_cu_seqlens`, a wrong length, a negative count, a non-zero count on the first piece of
/// a sequence (the first sequence, a later one, an empty one).
#[test]
fn bad_warmup_chunks_are_typed_errors() {
    let bt = 16usize;
    let cu = vec![0i64, 64, 64, 128];
    let c = Case::build(5, Some(cu), 1, 0, 1, 1, 4, 3);
    let fc = fwd_h_case(&c, GateMode::Gdn, bt);
    // pieces: [0,32) [32,64) | [64,64) | [64,80) [80,128)
    let split = vec![0i64, 32, 64, 64, 80, 128];
    let call = |subseq: Option<&[i64]>, warm: &[i64]| {
        chunk_gated_delta_rule_fwd_h_split(
            &FwdHSplitInputs {
                fwd_h: fc.inputs(&c, None),
                subseq_cu_seqlens: subseq,
                warmup_chunks: Some(warm),
            },
            &params(bt, false),
        )
        .map(|_| ())
    };
    assert!(call(Some(&split), &[0, 1, 0, 0, 9]).is_ok());
    let cases = [
        (None::<&[i64]>, vec![0i64, 0, 0], ErrorKind::Missing),
        (None, vec![0, 1, 0, 0, 1], ErrorKind::Missing),
        (Some(&split), vec![0, 1, 0, 0], ErrorKind::Shape),
        (Some(&split), vec![0, 1, 0, 0, 1, 0], ErrorKind::Shape),
        (Some(&split), vec![], ErrorKind::Shape),
        (Some(&split), vec![0, -1, 0, 0, 0], ErrorKind::Index),
        (Some(&split), vec![0, 0, 0, 0, i64::MIN], ErrorKind::Index),
        (Some(&split), vec![1, 0, 0, 0, 0], ErrorKind::Index),
        (Some(&split), vec![0, 0, 2, 0, 0], ErrorKind::Index),
        (Some(&split), vec![0, 0, 0, 1, 0], ErrorKind::Index),
    ];
    for (subseq, warm, kind) in cases {
        let e = call(subseq, &warm).unwrap_err();
        assert_eq!(e.arg, "warmup_chunks", "{warm:?}: {e}");
        assert_eq!(e.kind, kind, "{warm:?}: {e}");
    }
}
