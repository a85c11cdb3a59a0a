//! Properties of `cumsum`, `chunk_local_cumsum`, `chunk_global_cumsum`
//! (`conformance/spec/ops-cumsum.md` §1-§3).

mod common;

use attn_reference::cumsum::{chunk_global_cumsum, chunk_local_cumsum, cumsum};
use attn_reference::RCP_LN2;
use common::{check_close, narrow, same_bits, widen, Rng};
use ndarray::{ArrayD, Axis, IxDyn, Slice};
use proptest::prelude::*;

/// Sizes the spec asks for (and 0 for length-0 dimensions).
const SIZES: [usize; 6] = [0, 1, 2, 31, 32, 33];

/// Shapes of rank 1..=5 drawn from [`SIZES`], at most `max_numel` elements.
fn shapes(max_numel: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop::sample::select(SIZES.to_vec()), 1..=5)
        .prop_filter("small enough", move |s| {
            s.iter().product::<usize>() <= max_numel
        })
}

/// Scan written independently of the crate: explicit row-major offsets, one lane at a time.
fn naive_cumsum(x: &ArrayD<f64>, axis: usize, reverse: bool) -> ArrayD<f64> {
    let shape = x.shape().to_vec();
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let flat: Vec<f64> = x.iter().copied().collect();
    let mut out = vec![0.0; flat.len()];
    for o in 0..outer {
        for c in 0..inner {
            let mut acc = 0.0;
            let order: Vec<usize> = if reverse {
                (0..len).rev().collect()
            } else {
                (0..len).collect()
            };
            for i in order {
                let at = (o * len + i) * inner + c;
                acc += flat[at];
                out[at] = acc;
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).unwrap()
}

fn flip(x: &ArrayD<f64>, axis: usize) -> ArrayD<f64> {
    x.slice_axis(Axis(axis), Slice::new(0, None, -1)).to_owned()
}

/// Random `cu_seqlens` over `t` tokens with `n` sequences, zero-length ones likely.
fn random_cu(rng: &mut Rng, t: usize, n: usize) -> Vec<i64> {
    let mut cuts: Vec<i64> = (0..n - 1)
        .map(|_| {
            if rng.below(4) == 0 {
                0
            } else {
                rng.below(t + 1) as i64
            }
        })
        .collect();
    cuts.push(0);
    cuts.push(t as i64);
    cuts.sort_unstable();
    cuts
}

/// Independent chunked scan: for each token, sum its chunk's tokens up to it (down to it when
/// `reverse`) in the sequential order, then scale.
fn naive_chunk_scan(
    g: &ArrayD<f64>,
    cu: &[i64],
    bt: usize,
    reverse: bool,
    scale: Option<f64>,
) -> ArrayD<f64> {
    let mut o = ArrayD::zeros(g.raw_dim());
    let lanes: usize = g.shape()[2..].iter().product();
    let g3 = g
        .view()
        .into_shape_with_order((g.shape()[0], g.shape()[1], lanes))
        .unwrap();
    let mut o3 = o
        .view_mut()
        .into_shape_with_order((g.shape()[0], g.shape()[1], lanes))
        .unwrap();
    for b in 0..g3.shape()[0] {
        for w in cu.windows(2) {
            let (bos, eos) = (w[0] as usize, w[1] as usize);
            for t in bos..eos {
                let start = bos + (t - bos) / bt * bt;
                let end = (start + bt).min(eos);
                for c in 0..lanes {
                    let mut acc = 0.0;
                    if reverse {
                        for u in (t..end).rev() {
                            acc += g3[[b, u, c]];
                        }
                    } else {
                        for u in start..=t {
                            acc += g3[[b, u, c]];
                        }
                    }
                    o3[[b, t, c]] = scale.map_or(acc, |s| acc * s);
                }
            }
        }
    }
    o
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(32)
}

proptest! {
    #![proptest_config(config())]

    /// `cumsum` over every dim (given positive or negative) equals the naive loop, bit for bit.
    #[test]
    fn cumsum_matches_naive_loop(shape in shapes(120_000), seed: u64, reverse: bool, neg: bool) {
        let mut rng = Rng::new(seed);
        let x = rng.array(&shape, -1.0, 1.0);
        let rank = shape.len();
        for axis in 0..rank {
            let dim = if neg { axis as i64 - rank as i64 } else { axis as i64 };
            let y = cumsum(x.view(), dim, reverse).unwrap();
            prop_assert!(same_bits(&y, &naive_cumsum(&x, axis, reverse)), "axis {axis} shape {shape:?}");
        }
    }

    /// `reverse` is flip ∘ scan ∘ flip, and a non-contiguous (reversed-axes) view scans as its copy.
    #[test]
    fn reverse_is_flip_scan_flip(shape in shapes(40_000), seed: u64) {
        let mut rng = Rng::new(seed);
        let x = rng.array(&shape, -1.0, 1.0);
        for axis in 0..shape.len() {
            let rev = cumsum(x.view(), axis as i64, true).unwrap();
            let via_flip = flip(&cumsum(flip(&x, axis).view(), axis as i64, false).unwrap(), axis);
            prop_assert!(same_bits(&rev, &via_flip));
            let xt = x.t();
            let owned = xt.to_owned();
            let d = (shape.len() - 1 - axis) as i64;
            prop_assert!(same_bits(&cumsum(xt, d, false).unwrap(), &cumsum(owned.view(), d, false).unwrap()));
        }
    }

    /// An f32 scan meets the spec threshold (1e-5) against the f64 oracle on the same inputs.
    #[test]
    fn cumsum_f32_close_to_f64(rows in 1usize..8, len in 1usize..2000, seed: u64, reverse: bool) {
        let mut rng = Rng::new(seed);
        let x32 = narrow(&rng.array(&[rows, len], -1.0, 1.0));
        let x64 = x32.mapv(f64::from);
        for dim in [0i64, 1] {
            let r = cumsum(x64.view(), dim, reverse).unwrap();
            let c = widen(&cumsum(x32.view(), dim, reverse).unwrap());
            if let Err(e) = check_close("y", &r, &c, 1e-5) { prop_assert!(false, "{}", e); }
        }
    }

    /// A NaN or Inf poisons its lane from its position on (up to it when `reverse`), and nothing else.
    #[test]
    fn nan_inf_propagate_within_lane_only(
        outer in 1usize..4, len in 1usize..40, inner in 1usize..5, seed: u64, reverse: bool, use_inf: bool,
    ) {
        let mut rng = Rng::new(seed);
        let clean = rng.array(&[outer, len, inner], -1.0, 1.0);
        let (o, p, c) = (rng.below(outer), rng.below(len), rng.below(inner));
        let bad = if use_inf { f64::INFINITY } else { f64::NAN };
        let mut x = clean.clone();
        x[[o, p, c]] = bad;
        let y = cumsum(x.view(), 1, reverse).unwrap();
        let y0 = cumsum(clean.view(), 1, reverse).unwrap();
        for ((idx, &v), &v0) in y.indexed_iter().zip(y0.iter()) {
            let poisoned = idx[0] == o && idx[2] == c && if reverse { idx[1] <= p } else { idx[1] >= p };
            if poisoned {
                prop_assert!(if use_inf { v == f64::INFINITY } else { v.is_nan() }, "{idx:?}: {v}");
            } else {
                prop_assert_eq!(v.to_bits(), v0.to_bits(), "{:?}", idx);
            }
        }
    }

    /// The seed identity: `cumsum(x.reshape(B*H, T, D*D), dim=1)` of `[B, H, T, D, D]` equals
    /// `chunk_global_cumsum` on the view `[B*H, T, 1, D*D]`.
    #[test]
    fn seed_identity(b in 1usize..3, h in 1usize..3, t in 0usize..70, d in 1usize..6, seed: u64) {
        let x = Rng::new(seed).array(&[b, h, t, d, d], -1.0, 1.0);
        let flat = x.view().into_shape_with_order(IxDyn(&[b * h, t, d * d])).unwrap();
        let view4 = x.view().into_shape_with_order(IxDyn(&[b * h, t, 1, d * d])).unwrap();
        let y = cumsum(flat, 1, false).unwrap().into_shape_with_order(IxDyn(&[b * h, t, 1, d * d])).unwrap();
        prop_assert!(same_bits(&y, &chunk_global_cumsum(view4, None, false, None).unwrap()));
    }

    /// `chunk_local_cumsum` equals the independent chunked loop, scalar and vector forms, with and
    /// without `cu_seqlens`, scale applied after the sum.
    #[test]
    fn chunk_local_matches_naive(
        t in 0usize..140, h in 1usize..3, s in prop::option::of(1usize..5), n in 1usize..5, b in 1usize..3,
        log_bt in 0u32..7, varlen: bool, reverse: bool, scaled: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let (b, cu) = if varlen { (1, random_cu(&mut rng, t, n)) } else { (b, vec![0, t as i64]) };
        let mut shape = vec![b, t, h];
        shape.extend(s);
        let g = rng.array(&shape, -3.0, 1.0);
        let bt = 1usize << log_bt;
        let scale = scaled.then_some(RCP_LN2);
        let o = chunk_local_cumsum(g.view(), varlen.then_some(&cu[..]), bt as i64, reverse, scale).unwrap();
        prop_assert!(same_bits(&o, &naive_chunk_scan(&g, &cu, bt, reverse, scale)));
        // the scale multiplies the finished sum, exactly
        if let Some(sc) = scale {
            let unscaled = chunk_local_cumsum(g.view(), varlen.then_some(&cu[..]), bt as i64, reverse, None).unwrap();
            prop_assert!(same_bits(&o, &unscaled.mapv(|v| v * sc)));
        }
    }

    /// A chunk at least as long as every sequence makes the local scan the global one.
    #[test]
    fn local_with_long_chunk_is_global(
        t in 0usize..100, h in 1usize..4, vector: bool, n in 1usize..5, varlen: bool, reverse: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let (b, cu) = if varlen { (1, random_cu(&mut rng, t, n)) } else { (2, vec![0, t as i64]) };
        let shape: Vec<usize> = if vector { vec![b, t, h, 3] } else { vec![b, t, h] };
        let g = rng.array(&shape, -2.0, 2.0);
        let bt = t.max(1).next_power_of_two() as i64;
        let cu = varlen.then_some(&cu[..]);
        let local = chunk_local_cumsum(g.view(), cu, bt, reverse, Some(0.5)).unwrap();
        let global = chunk_global_cumsum(g.view(), cu, reverse, Some(0.5)).unwrap();
        prop_assert!(same_bits(&local, &global));
    }

    /// Varlen equals one `B = 1` call per sequence; nothing flows across sequence boundaries.
    #[test]
    fn varlen_equals_per_sequence_calls(
        t in 0usize..150, h in 1usize..3, vector: bool, n in 1usize..6, log_bt in 2u32..6, reverse: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let cu = random_cu(&mut rng, t, n);
        let shape: Vec<usize> = if vector { vec![1, t, h, 2] } else { vec![1, t, h] };
        let g = rng.array(&shape, -2.0, 1.0);
        let bt = 1i64 << log_bt;
        let local = chunk_local_cumsum(g.view(), Some(&cu), bt, reverse, None).unwrap();
        let global = chunk_global_cumsum(g.view(), Some(&cu), reverse, None).unwrap();
        for w in cu.windows(2) {
            let range = Slice::from(w[0] as usize..w[1] as usize);
            let part = g.slice_axis(Axis(1), range);
            let l1 = chunk_local_cumsum(part.clone(), None, bt, reverse, None).unwrap();
            let g1 = chunk_global_cumsum(part, None, reverse, None).unwrap();
            prop_assert!(same_bits(&local.slice_axis(Axis(1), range).to_owned(), &l1));
            prop_assert!(same_bits(&global.slice_axis(Axis(1), range).to_owned(), &g1));
        }
    }

    /// f32 chunked scans meet the spec thresholds against f64: local 1e-6, global 1e-5.
    #[test]
    fn chunk_scans_f32_close_to_f64(
        t in 1usize..300, h in 1usize..4, log_bt in 4u32..8, reverse: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let g32 = narrow(&rng.array(&[2, t, h, 4], -4.0, 0.0));
        let g64 = g32.mapv(f64::from);
        let bt = 1i64 << log_bt;
        let r = chunk_local_cumsum(g64.view(), None, bt, reverse, Some(RCP_LN2)).unwrap();
        let c = widen(&chunk_local_cumsum(g32.view(), None, bt, reverse, Some(RCP_LN2)).unwrap());
        if let Err(e) = check_close("o", &r, &c, 1e-6) { prop_assert!(false, "{}", e); }
        let r = chunk_global_cumsum(g64.view(), None, reverse, None).unwrap();
        let c = widen(&chunk_global_cumsum(g32.view(), None, reverse, None).unwrap());
        if let Err(e) = check_close("o", &r, &c, 1e-5) { prop_assert!(false, "{}", e); }
    }

    /// The seed layout reduced in batch (`[2, 2, 64, 8, 8]`, scanned over `dim = 2`, stride 64)
    /// and the scan lengths of 1000 the spec lists, against the naive loop.
    #[test]
    fn seed_layout_and_long_lanes(seed: u64, reverse: bool) {
        let mut rng = Rng::new(seed);
        let x = rng.array(&[2, 2, 64, 8, 8], -1.0, 1.0);
        prop_assert!(same_bits(&cumsum(x.view(), 2, reverse).unwrap(), &naive_cumsum(&x, 2, reverse)));
        prop_assert!(same_bits(&cumsum(x.view(), -3, reverse).unwrap(), &naive_cumsum(&x, 2, reverse)));
        let x = rng.array(&[3, 1000, 2], -1.0, 1.0);
        for axis in 0..3 {
            prop_assert!(same_bits(&cumsum(x.view(), axis as i64, reverse).unwrap(), &naive_cumsum(&x, axis, reverse)));
        }
    }

    /// Varlen with the spec's lengths (1, 15, 63, 64, 65, 1000 and 0) in random order, against
    /// the independent chunked loop (local) and one chunk per sequence (global).
    #[test]
    fn spec_varlen_lengths(seed: u64, log_bt in 4u32..8, vector: bool, reverse: bool) {
        let mut rng = Rng::new(seed);
        let lens = [1usize, 15, 63, 64, 65, 1000, 0];
        let order = rng.distinct(lens.len(), lens.len());
        let mut cu = vec![0i64];
        for i in order {
            cu.push(cu[cu.len() - 1] + lens[i] as i64);
        }
        let t = *cu.last().unwrap() as usize;
        let shape: Vec<usize> = if vector { vec![1, t, 2, 3] } else { vec![1, t, 2] };
        let g = rng.array(&shape, -5.0, 0.0);
        let bt = 1usize << log_bt;
        let o = chunk_local_cumsum(g.view(), Some(&cu), bt as i64, reverse, Some(RCP_LN2)).unwrap();
        prop_assert!(same_bits(&o, &naive_chunk_scan(&g, &cu, bt, reverse, Some(RCP_LN2))));
        let o = chunk_global_cumsum(g.view(), Some(&cu), reverse, None).unwrap();
        prop_assert!(same_bits(&o, &naive_chunk_scan(&g, &cu, t.next_power_of_two(), reverse, None)));
    }
}
