//! Properties of `kv_cache_update` and `decode_attention` (`conformance/spec/ops-decode.md`).

mod common;

use attn_reference::decode::{decode_attention, kv_cache_update, CacheLayout, DecodeOut};
use common::{check_close, narrow, widen, Rng};
use half::bf16;
use ndarray::{s, Array3, Array4, ArrayView4, Ix4};
use proptest::prelude::*;

/// One random decode problem, caches in `bshd`.
#[derive(Debug, Clone)]
struct Problem {
    q: Array4<f64>,
    k: Array4<f64>,
    v: Array4<f64>,
    seqlens: Vec<i64>,
    /// `Some` when the call passes `cache_batch_idx`.
    idx: Option<Vec<i64>>,
    causal: bool,
}

impl Problem {
    fn rows(&self) -> Vec<usize> {
        match &self.idx {
            Some(idx) => idx.iter().map(|&r| r as usize).collect(),
            None => (0..self.seqlens.len()).collect(),
        }
    }
}

/// Geometry of a case: `(B, extra cache rows, L_q, H_kv, GQA ratio, D, S)`.
type Geometry = (usize, usize, usize, usize, usize, usize, usize);

fn geometry() -> impl Strategy<Value = Geometry> {
    (
        1usize..4,
        0usize..3,
        prop::sample::select(vec![1usize, 2, 7]),
        1usize..3,
        prop::sample::select(vec![1usize, 4, 8]),
        prop::sample::select(vec![64usize, 128, 80]),
        prop::sample::select(vec![65usize, 72]),
    )
}

/// Random caches whose positions `j >= n` of every used row (and all unused rows) hold `fill`
/// (`None`: random values), lengths from the spec's list (0, 1, 63, 64, 65, S).
fn problem(
    rng: &mut Rng,
    geo: Geometry,
    use_idx: bool,
    causal: bool,
    fill: Option<f64>,
) -> Problem {
    let (b, extra, l_q, h_kv, group, d, s_len) = geo;
    let b_cache = b + extra;
    let q = rng.array(&[b, l_q, h_kv * group, d], -1.0, 1.0);
    let mut k = rng
        .array(&[b_cache, s_len, h_kv, d], -1.0, 1.0)
        .into_dimensionality::<Ix4>()
        .unwrap();
    let mut v = rng
        .array(&[b_cache, s_len, h_kv, d], -1.0, 1.0)
        .into_dimensionality::<Ix4>()
        .unwrap();
    let lens = [0, 1, 63, 64, 65, s_len];
    let seqlens: Vec<i64> = (0..b).map(|_| lens[rng.below(lens.len())] as i64).collect();
    let rows = if use_idx {
        rng.distinct(b_cache, b)
    } else {
        (0..b).collect()
    };
    if let Some(x) = fill {
        let mut used = vec![None; b_cache];
        for (bb, &r) in rows.iter().enumerate() {
            used[r] = Some(seqlens[bb] as usize);
        }
        for (r, n) in used.into_iter().enumerate() {
            let n = n.unwrap_or(0);
            k.slice_mut(s![r, n.., .., ..]).fill(x);
            v.slice_mut(s![r, n.., .., ..]).fill(x);
        }
    }
    Problem {
        q: q.into_dimensionality().unwrap(),
        k,
        v,
        seqlens,
        idx: use_idx.then(|| rows.iter().map(|&r| r as i64).collect()),
        causal,
    }
}

/// `[B, S, H, D]` -> `[B, H, S, D]`, contiguous.
fn to_bhsd<E: Clone>(a: &Array4<E>) -> Array4<E> {
    a.view()
        .permuted_axes([0, 2, 1, 3])
        .as_standard_layout()
        .into_owned()
}

fn run<T: attn_reference::Real>(
    p: &Problem,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    layout: CacheLayout,
) -> DecodeOut<T> {
    decode_attention(
        q,
        k,
        v,
        &p.seqlens,
        p.idx.as_deref(),
        None,
        p.causal,
        layout,
    )
    .unwrap()
}

/// `o` and `lse` of the reference within `1e-10` of [`oracle`], with the caches in `bshd` and in
/// `bhsd` (the transposed `bshd` ones).
fn matches_oracle_in_both_layouts(p: &Problem) -> Result<(), String> {
    let (o, lse) = oracle(p);
    for layout in [CacheLayout::Bshd, CacheLayout::Bhsd] {
        let (k, v) = match layout {
            CacheLayout::Bshd => (p.k.clone(), p.v.clone()),
            CacheLayout::Bhsd => (to_bhsd(&p.k), to_bhsd(&p.v)),
        };
        let out = run(p, p.q.view(), k.view(), v.view(), layout);
        check_close("o", &o.clone().into_dyn(), &out.o.into_dyn(), 1e-10)
            .and_then(|()| check_close("lse", &lse.clone().into_dyn(), &out.lse.into_dyn(), 1e-10))
            .map_err(|e| format!("{layout:?}: {e}"))?;
    }
    Ok(())
}

/// The float64 oracle written out: full score rows over all `S` keys with `-inf` where the
/// boolean mask is false (masked keys are never multiplied), softmax over the row.
fn oracle(p: &Problem) -> (Array4<f64>, Array3<f64>) {
    let (b, l_q, h, d) = p.q.dim();
    let (s_len, h_kv) = (p.k.shape()[1], p.k.shape()[2]);
    let scale = 1.0 / (d as f64).sqrt();
    let rows = p.rows();
    let mut o = Array4::zeros((b, l_q, h, d));
    let mut lse = Array3::zeros((b, h, l_q));
    for bb in 0..b {
        let (r, n) = (rows[bb], p.seqlens[bb] as usize);
        for i in 0..l_q {
            for hh in 0..h {
                let hk = hh / (h / h_kv);
                let visible = |j: usize| j < n && (!p.causal || j + l_q <= n + i);
                let scores: Vec<f64> = (0..s_len)
                    .map(|j| {
                        if visible(j) {
                            scale
                                * (0..d)
                                    .map(|x| p.q[[bb, i, hh, x]] * p.k[[r, j, hk, x]])
                                    .sum::<f64>()
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    lse[[bb, hh, i]] = f64::NEG_INFINITY;
                    continue;
                }
                let p_j: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = p_j.iter().sum();
                for x in 0..d {
                    o[[bb, i, hh, x]] = (0..s_len)
                        .filter(|&j| visible(j))
                        .map(|j| p_j[j] * p.v[[r, j, hk, x]])
                        .sum::<f64>()
                        / sum;
                }
                lse[[bb, hh, i]] = max + sum.ln();
            }
        }
    }
    (o, lse)
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(24)
}

proptest! {
    #![proptest_config(config())]

    /// Against the masked-softmax oracle (1e-10), caches NaN beyond every valid prefix, both
    /// layouts (the `bhsd` caches are the transposed `bshd` ones).
    #[test]
    fn matches_masked_softmax_oracle(geo in geometry(), use_idx: bool, causal: bool, seed: u64) {
        let p = problem(&mut Rng::new(seed), geo, use_idx, causal, Some(f64::NAN));
        if let Err(e) = matches_oracle_in_both_layouts(&p) {
            prop_assert!(false, "{}", e);
        }
    }

    /// Whatever the caches hold past the valid prefix (NaN or numbers), the result is the same
    /// bit for bit; rows without a visible key give `o = 0`, `lse = -inf`.
    #[test]
    fn ignores_everything_past_valid_length(geo in geometry(), causal: bool, seed: u64) {
        let with_nan = problem(&mut Rng::new(seed), geo, true, causal, Some(f64::NAN));
        let with_numbers = problem(&mut Rng::new(seed), geo, true, causal, None);
        let a = run(&with_nan, with_nan.q.view(), with_nan.k.view(), with_nan.v.view(), CacheLayout::Bshd);
        let b = run(&with_numbers, with_numbers.q.view(), with_numbers.k.view(), with_numbers.v.view(), CacheLayout::Bshd);
        prop_assert!(common::same_bits(&a.o, &b.o));
        prop_assert!(common::same_bits(&a.lse, &b.lse));
        let l_q = geo.2;
        for (bb, &n) in with_nan.seqlens.iter().enumerate() {
            for i in 0..l_q {
                let empty = n == 0 || (causal && (n as usize) + i < l_q);
                let lse_row = a.lse.slice(s![bb, .., i]);
                prop_assert_eq!(empty, lse_row.iter().all(|&x| x == f64::NEG_INFINITY));
                if empty {
                    prop_assert!(a.o.slice(s![bb, i, .., ..]).iter().all(|&x| x == 0.0));
                }
            }
        }
    }

    /// `cache_batch_idx` is the same as permuting the cache rows beforehand.
    #[test]
    fn batch_idx_equals_permuted_rows(geo in geometry(), causal: bool, seed: u64) {
        let p = problem(&mut Rng::new(seed), geo, true, causal, Some(f64::NAN));
        let rows = p.rows();
        let pick = |c: &Array4<f64>| {
            let mut out = Array4::zeros((rows.len(), c.shape()[1], c.shape()[2], c.shape()[3]));
            for (bb, &r) in rows.iter().enumerate() {
                out.slice_mut(s![bb, .., .., ..]).assign(&c.slice(s![r, .., .., ..]));
            }
            out
        };
        let permuted = Problem { k: pick(&p.k), v: pick(&p.v), idx: None, ..p.clone() };
        let a = run(&p, p.q.view(), p.k.view(), p.v.view(), CacheLayout::Bshd);
        let b = run(&permuted, permuted.q.view(), permuted.k.view(), permuted.v.view(), CacheLayout::Bshd);
        prop_assert!(common::same_bits(&a.o, &b.o));
        prop_assert!(common::same_bits(&a.lse, &b.lse));
    }

    /// f32 meets the spec threshold (`o` 1e-5; `lse` 1e-5) against f64 on the same inputs.
    #[test]
    fn f32_close_to_f64(geo in geometry(), use_idx: bool, causal: bool, seed: u64) {
        let p = problem(&mut Rng::new(seed), geo, use_idx, causal, Some(f64::NAN));
        let (q32, k32, v32) = (narrow(&p.q), narrow(&p.k), narrow(&p.v));
        let p64 = Problem { q: q32.mapv(f64::from), k: k32.mapv(f64::from), v: v32.mapv(f64::from), ..p.clone() };
        let r = run(&p64, p64.q.view(), p64.k.view(), p64.v.view(), CacheLayout::Bshd);
        let c = run(&p, q32.view(), k32.view(), v32.view(), CacheLayout::Bshd);
        if let Err(e) = check_close("o", &r.o.into_dyn(), &widen(&c.o), 1e-5) { prop_assert!(false, "{}", e); }
        if let Err(e) = check_close("lse", &r.lse.into_dyn(), &widen(&c.lse), 1e-5) { prop_assert!(false, "{}", e); }
    }

    /// The update writes exactly `k`/`v` at `cache_seqlens[b] ..+ L_new` of row
    /// `cache_batch_idx[b]` and leaves every other element bit-identical (f32 caches of random
    /// bit patterns, NaN payloads included, and bf16 caches), in both layouts.
    #[test]
    fn update_is_bit_exact(
        b in 1usize..4, extra in 0usize..3, l_new in 0usize..5, h_kv in 1usize..3, d in 1usize..9,
        s_len in 1usize..20, use_idx: bool, bhsd: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let b_cache = b + extra;
        prop_assume!(l_new <= s_len);
        let seqlens: Vec<i64> = (0..b).map(|_| rng.below(s_len - l_new + 1) as i64).collect();
        let rows = if use_idx { rng.distinct(b_cache, b) } else { (0..b).collect() };
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let idx = use_idx.then_some(&idx[..]);
        let mut bits = |shape: (usize, usize, usize, usize)| {
            Array4::from_shape_simple_fn(shape, || f32::from_bits(rng.next_u64() as u32))
        };
        let (kc, vc) = (bits((b_cache, s_len, h_kv, d)), bits((b_cache, s_len, h_kv, d)));
        let (k, v) = (bits((b, l_new, h_kv, d)), bits((b, l_new, h_kv, d)));
        let layout = if bhsd { CacheLayout::Bhsd } else { CacheLayout::Bshd };
        let lay = |c: &Array4<f32>| if bhsd { to_bhsd(c) } else { c.clone() };
        let (nk, nv) = kv_cache_update(lay(&kc).view(), lay(&vc).view(), k.view(), v.view(), &seqlens, idx, layout).unwrap();
        let to_bshd = |c: Array4<f32>| if bhsd { to_bhsd(&c) } else { c };
        let (nk, nv) = (to_bshd(nk), to_bshd(nv));
        for (old, new, src) in [(&kc, &nk, &k), (&vc, &nv, &v)] {
            for ((r, j, h, x), &val) in new.indexed_iter() {
                let writer = rows.iter().position(|&rr| rr == r)
                    .filter(|&bb| (j as i64) >= seqlens[bb] && (j as i64) < seqlens[bb] + l_new as i64);
                let want = match writer {
                    Some(bb) => src[[bb, j - seqlens[bb] as usize, h, x]],
                    None => old[[r, j, h, x]],
                };
                prop_assert_eq!(val.to_bits(), want.to_bits(), "at {:?}", (r, j, h, x));
            }
        }
        // the same write on bf16 caches (any `Copy` element) is exact too
        let half = |a: &Array4<f32>| a.mapv(|x| bf16::from_bits(x.to_bits() as u16));
        let (hk, _) = kv_cache_update(half(&lay(&kc)).view(), half(&lay(&vc)).view(), half(&k).view(),
                                      half(&v).view(), &seqlens, idx, layout).unwrap();
        let want = nk.mapv(|x| bf16::from_bits(x.to_bits() as u16));
        let hk = if bhsd { to_bhsd(&hk) } else { hk };
        prop_assert!(hk.iter().zip(want.iter()).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

}

proptest! {
    // Long rows: a few cases suffice (each one is 3 rows of 4096 keys).
    #![proptest_config(ProptestConfig::with_cases(4))]

    /// A long row (`n = 4000` of `S = 4096`) next to an empty and a full one, both layouts,
    /// against the oracle.
    #[test]
    fn long_rows(l_q in prop::sample::select(vec![1usize, 2, 7]), causal: bool, seed: u64) {
        let geo = (3, 0, l_q, 1, 4, 64, 4096);
        let mut p = problem(&mut Rng::new(seed), geo, false, causal, None);
        p.seqlens = vec![4000, 0, 4096];
        for (r, &n) in p.seqlens.iter().enumerate() {
            p.k.slice_mut(s![r, n as usize.., .., ..]).fill(f64::NAN);
            p.v.slice_mut(s![r, n as usize.., .., ..]).fill(f64::NAN);
        }
        if let Err(e) = matches_oracle_in_both_layouts(&p) {
            prop_assert!(false, "{}", e);
        }
    }
}
