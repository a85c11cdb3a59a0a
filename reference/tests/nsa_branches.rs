//! `nsa_compress_kv`, `nsa_compression_attention` and `nsa_selection_attention` against
//! brute-force oracles of `conformance/spec/ops-nsa.md` §2, §3, §5, and each op's "Suite must
//! cover" list.
// rstest cases list every dimension of a case; brute-force oracles index plainly
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

mod nsa_util;

use attn_reference::nsa::{
    nsa_compress_kv, nsa_compression_attention, nsa_selection_attention, window_attention,
    BlockCounts, EmptyLse, PartialBlock, Visibility,
};
use ndarray::{s, Array3, Array4};
use nsa_util::Rng;
use nsa_util::*;
use proptest::prelude::*;
use rstest::rstest;

const TIGHT: f64 = 1e-12;

/// `cu_seqlens` (or none) for a total of `t` tokens; varlen cases hold a zero-length sequence,
/// one shorter than the block and one with a partial block.
fn cu_for(t: usize, varlen: bool) -> Option<Vec<i64>> {
    varlen.then(|| vec![0, 0, 7, (t as i64 - 9).max(7), t as i64])
}

// ---------------------------------------------------------------- nsa_compress_kv (§2)

/// `(B, T, H, K, V, BS, drop, w_k, w_v, varlen)`: both variants with a partial block, `L < BS`,
/// `L % BS == 0`, varlen with zero-length and short sequences, `BS = 1`, each weight alone and
/// both, `K != V`.
#[rstest]
#[case(2, 100, 2, 32, 32, 32, false, false, false, false)] // partial tail of 4
#[case(2, 100, 2, 32, 32, 32, true, false, false, false)] // tail dropped
#[case(1, 20, 2, 16, 8, 32, false, false, false, false)] // L < BS: one block of 20
#[case(1, 20, 2, 16, 8, 32, true, false, false, false)] // L < BS: no block
#[case(2, 64, 3, 24, 16, 16, false, false, false, false)] // L % BS == 0
#[case(1, 60, 2, 8, 8, 16, false, false, false, true)] // varlen mean_of_valid
#[case(1, 60, 2, 8, 8, 16, true, false, false, true)] // varlen drop
#[case(2, 9, 2, 8, 4, 1, false, false, false, false)] // BS = 1
#[case(1, 64, 2, 8, 12, 16, true, true, false, false)] // w_k only
#[case(1, 64, 2, 8, 12, 16, false, false, true, false)] // w_v only
#[case(1, 70, 2, 8, 12, 16, true, true, true, true)] // both, varlen
fn compress_kv_matches_brute_pool(
    #[case] b: usize,
    #[case] t: usize,
    #[case] h: usize,
    #[case] kd: usize,
    #[case] vd: usize,
    #[case] bs: usize,
    #[case] drop: bool,
    #[case] with_wk: bool,
    #[case] with_wv: bool,
    #[case] varlen: bool,
) {
    let mut rng = Rng::new((t * 31 + bs * 7 + kd) as u64);
    let k = n4(&mut rng, [b, t, h, kd]);
    let v = n4(&mut rng, [b, t, h, vd]);
    let w_k: Option<Array3<f64>> = with_wk.then(|| rng.randn((h, kd, kd)) / (kd as f64).sqrt());
    let w_v: Option<Array3<f64>> = with_wv.then(|| rng.randn((h, vd, vd)) / (vd as f64).sqrt());
    let cu = cu_for(t, varlen);
    let partial = if drop {
        PartialBlock::Drop
    } else {
        PartialBlock::MeanOfValid
    };
    let out = nsa_compress_kv(
        k.view(),
        Some(v.view()),
        w_k.as_ref().map(|w| w.view()),
        w_v.as_ref().map(|w| w.view()),
        cu.as_deref(),
        bs as i64,
        partial,
    )
    .unwrap();
    let want_k = brute_pool(&k, bs, drop, cu.as_deref(), w_k.as_ref());
    let want_v = brute_pool(&v, bs, drop, cu.as_deref(), w_v.as_ref());
    assert_eq!(out.k_cmp.shape(), want_k.shape());
    check_close("k_cmp", &dynf(&want_k), &dynf(&out.k_cmp), TIGHT).unwrap();
    check_close("v_cmp", &dynf(&want_v), &dynf(&out.v_cmp.unwrap()), TIGHT).unwrap();
    if bs == 1 && !with_wk {
        assert_eq!(out.k_cmp, k, "BS = 1 is the identity");
    }
}

#[test]
fn compress_kv_without_v_returns_no_v_cmp() {
    let k = n4(&mut Rng::new(5), [2, 64, 2, 24]);
    let out = nsa_compress_kv(
        k.view(),
        None,
        None,
        None,
        None,
        16,
        PartialBlock::default(),
    )
    .unwrap();
    assert!(out.v_cmp.is_none());
    assert_eq!(out.k_cmp.shape(), [2, 4, 2, 24]);
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let k = Array4::<f64>::zeros((1, 0, 2, 8));
    let out = nsa_compress_kv(
        k.view(),
        Some(k.view()),
        None,
        None,
        None,
        16,
        PartialBlock::default(),
    )
    .unwrap();
    assert_eq!(out.k_cmp.shape(), [1, 0, 2, 8]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// `"drop"` and `"mean_of_valid"` agree when every length is a multiple of `BS`, and f32
    /// stays within 1e-5 of f64.
    #[test]
    fn variants_agree_on_whole_blocks(seed: u64, nb in 1usize..5, bs_log in 0u32..5, h in 1usize..3) {
        let bs = 1usize << bs_log;
        let t = nb * bs * 2;
        let mut rng = Rng::new(seed);
        let k = n4(&mut rng, [1, t, h, 8]);
        let cu = vec![0, (nb * bs) as i64, t as i64];
        let run = |p| nsa_compress_kv(k.view(), None, None, None, Some(&cu), bs as i64, p).unwrap().k_cmp;
        prop_assert_eq!(run(PartialBlock::Drop), run(PartialBlock::MeanOfValid));
        let k32 = narrow(&k);
        let f32_out = nsa_compress_kv(k32.view(), None, None, None, Some(&cu), bs as i64, PartialBlock::Drop).unwrap().k_cmp;
        let f64_out = nsa_compress_kv(k32.mapv(f64::from).view(), None, None, None, Some(&cu), bs as i64, PartialBlock::Drop).unwrap().k_cmp;
        prop_assert!(check_close("k_cmp f32", &dynf(&f64_out), &widen(&f32_out), 1e-5).is_ok());
    }
}

// ------------------------------------------------------- nsa_compression_attention (§3)

/// Visible compressed blocks of position `p` (`conformance/spec/ops-nsa.md` §3 step 1, written
/// out).
fn visible(vis: Visibility, p: usize, bs: usize, tc: usize) -> Vec<usize> {
    (0..tc)
        .filter(|&c| match vis {
            Visibility::Complete => (c + 1) * bs - 1 <= p,
            Visibility::Started => c * bs <= p,
            Visibility::All => true,
        })
        .collect()
}

/// `(B, T, HQ, H, K, V, BS, visibility, drop, varlen)`: each visibility, `G` in {1, 2, 16},
/// `K != V`, `T < BS`, varlen with zero-length, short and partial sequences.
#[rstest]
#[case(2, 100, 2, 2, 32, 32, 16, Visibility::Complete, false, false)]
#[case(1, 200, 4, 1, 32, 48, 16, Visibility::Complete, false, true)]
#[case(1, 128, 16, 1, 16, 16, 16, Visibility::Complete, false, false)]
#[case(1, 20, 4, 2, 8, 8, 32, Visibility::Complete, false, false)] // T < BS: all empty
#[case(1, 128, 4, 2, 32, 16, 32, Visibility::Started, true, false)]
#[case(1, 100, 4, 2, 32, 16, 32, Visibility::Started, false, true)] // partial visible to itself
#[case(1, 20, 2, 1, 8, 8, 32, Visibility::Started, true, false)] // drop, L < BS: all empty
#[case(1, 128, 4, 2, 32, 16, 32, Visibility::All, true, false)]
#[case(2, 90, 16, 1, 8, 8, 16, Visibility::All, false, false)]
fn compression_attention_matches_brute(
    #[case] b: usize,
    #[case] t: usize,
    #[case] hq: usize,
    #[case] h: usize,
    #[case] kd: usize,
    #[case] vd: usize,
    #[case] bs: usize,
    #[case] vis: Visibility,
    #[case] drop: bool,
    #[case] varlen: bool,
    #[values(EmptyLse::NegInf, EmptyLse::Zero)] empty: EmptyLse,
) {
    let mut rng = Rng::new((t + hq * 3 + bs) as u64);
    let q = n4(&mut rng, [b, t, hq, kd]);
    let (k, v) = (n4(&mut rng, [b, t, h, kd]), n4(&mut rng, [b, t, h, vd]));
    let cu = cu_for(t, varlen);
    let partial = if drop {
        PartialBlock::Drop
    } else {
        PartialBlock::MeanOfValid
    };
    let kc = brute_pool(&k, bs, drop, cu.as_deref(), None);
    let vc = brute_pool(&v, bs, drop, cu.as_deref(), None);
    let scale = 0.3;
    let out = nsa_compression_attention(
        q.view(),
        kc.view(),
        vc.view(),
        cu.as_deref(),
        bs as i64,
        Some(scale),
        vis,
        partial,
        empty,
    )
    .unwrap();
    // compressed row base and TC of every sequence
    let ss = seqs(b, t, cu.as_deref());
    let rows = |l: usize| if drop { l / bs } else { l.div_ceil(bs) };
    let mut bases = Vec::new();
    let mut acc = 0;
    for &(_, bos, eos) in &ss {
        bases.push(acc);
        if cu.is_some() {
            acc += rows(eos - bos);
        }
    }
    let (o, mut lse) = brute_attention(&q, &kc, &vc, scale, |bb, tt, _| {
        let n = ss
            .iter()
            .position(|&(sb, bos, eos)| sb == bb && bos <= tt && tt < eos)
            .unwrap();
        let (_, bos, eos) = ss[n];
        visible(vis, tt - bos, bs, rows(eos - bos))
            .into_iter()
            .map(|c| bases[n] + c)
            .collect()
    });
    if empty == EmptyLse::Zero {
        lse.mapv_inplace(|l| if l == f64::NEG_INFINITY { 0.0 } else { l });
    }
    check_close("o", &dynf(&o), &dynf(&out.o), TIGHT).unwrap();
    check_close("lse", &lse.into_dyn(), &out.lse.clone().into_dyn(), TIGHT).unwrap();
    if vis == Visibility::Complete && empty == EmptyLse::NegInf {
        // the first BS - 1 tokens of every sequence have empty rows
        for &(bb, bos, eos) in &ss {
            for tt in bos..eos.min(bos + bs - 1) {
                assert!(out
                    .lse
                    .slice(s![bb, tt, ..])
                    .iter()
                    .all(|&l| l == f64::NEG_INFINITY));
                assert!(out.o.slice(s![bb, tt, .., ..]).iter().all(|&x| x == 0.0));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// With `BS = 1` and `"all"`, the compressed branch is plain (non-causal) attention over
    /// `k`, `v` themselves.
    #[test]
    fn bs1_all_is_plain_attention(seed: u64, t in 1usize..40, h in 1usize..3, g in 1usize..4) {
        let mut rng = Rng::new(seed);
        let q = n4(&mut rng, [1, t, h * g, 8]);
        let (k, v) = (n4(&mut rng, [1, t, h, 8]), n4(&mut rng, [1, t, h, 6]));
        let out = nsa_compression_attention(
            q.view(), k.view(), v.view(), None, 1, None, Visibility::All, PartialBlock::Drop,
            EmptyLse::NegInf,
        ).unwrap();
        let (o, lse) = brute_attention(&q, &k, &v, 1.0 / 8f64.sqrt(), |_, _, _| (0..t).collect());
        prop_assert!(check_close("o", &dynf(&o), &dynf(&out.o), TIGHT).is_ok());
        prop_assert!(check_close("lse", &lse.into_dyn(), &out.lse.into_dyn(), TIGHT).is_ok());
    }
}

// -------------------------------------------------------- nsa_selection_attention (§5)

/// Random slot rows as in `fla-org/native-sparse-attention`'s tests: a random permutation of
/// past blocks, padded with `-1` and out-of-range ids (future blocks, past the end, huge values),
/// with some duplicated entries.
fn random_indices(
    rng: &mut Rng,
    ss: &[(usize, usize, usize)],
    b: usize,
    t: usize,
    h: usize,
    slots: usize,
    bs: usize,
) -> Array4<i64> {
    let mut idx = Array4::<i64>::from_elem((b, t, h, slots), -1);
    for &(bb, bos, eos) in ss {
        for tt in bos..eos {
            let p = tt - bos;
            for hh in 0..h {
                let past = p / bs + 1;
                let mut row: Vec<i64> = rng
                    .distinct(past, past.min(slots))
                    .into_iter()
                    .map(|x| x as i64)
                    .collect();
                for x in row.iter_mut().skip(1) {
                    match rng.below(8) {
                        0 => *x = -1,
                        1 => *x = (p / bs + 1 + rng.below(4)) as i64, // future
                        2 => *x = ((eos - bos) / bs + 5) as i64,      // past the end
                        3 => *x = i64::MAX,
                        4 => *x = i64::MIN,
                        5 => *x = row_first(&idx, bb, tt, hh).unwrap_or(0), // duplicate
                        _ => {}
                    }
                }
                for (i, x) in row.into_iter().enumerate() {
                    idx[[bb, tt, hh, i]] = x;
                }
            }
        }
    }
    idx
}

fn row_first(idx: &Array4<i64>, b: usize, t: usize, h: usize) -> Option<i64> {
    let x = idx[[b, t, h, 0]];
    (x >= 0).then_some(x)
}

/// Brute keys of a row (`conformance/spec/ops-nsa.md` §5 steps 1-3): tokens of every valid slot
/// among the first `n_sel`.
fn sel_keys(
    idx: &Array4<i64>,
    b: usize,
    t: usize,
    h: usize,
    n_sel: usize,
    bos: usize,
    bs: usize,
) -> Vec<usize> {
    let p = t - bos;
    let mut keys = Vec::new();
    for sl in 0..n_sel {
        let x = idx[[b, t, h, sl]];
        if x >= 0 && (x as u128) * (bs as u128) <= p as u128 {
            let start = x as usize * bs;
            keys.extend((start..(start + bs).min(p + 1)).map(|j| bos + j));
        }
    }
    keys
}

/// `(B, T, HQ, H, K, V, BS, S, tensor counts, varlen)`: random indices with invalid entries and
/// duplicates, counts with zeros (empty rows), partial blocks, varlen, `G` in {1, 2, 16}, `K != V`.
#[rstest]
#[case(2, 128, 2, 2, 32, 32, 16, 4, false, false)]
#[case(1, 200, 4, 1, 32, 48, 16, 5, false, true)]
#[case(1, 96, 2, 1, 16, 16, 16, 3, true, false)]
#[case(1, 128, 16, 1, 16, 16, 16, 4, true, false)]
#[case(1, 150, 16, 1, 16, 8, 32, 4, true, true)]
#[case(1, 50, 4, 2, 8, 8, 8, 0, false, false)] // S = 0: every row empty
fn selection_attention_matches_brute(
    #[case] b: usize,
    #[case] t: usize,
    #[case] hq: usize,
    #[case] h: usize,
    #[case] kd: usize,
    #[case] vd: usize,
    #[case] bs: usize,
    #[case] slots: usize,
    #[case] tensor_counts: bool,
    #[case] varlen: bool,
) {
    let mut rng = Rng::new((t * 5 + hq + slots) as u64);
    let q = n4(&mut rng, [b, t, hq, kd]);
    let (k, v) = (n4(&mut rng, [b, t, h, kd]), n4(&mut rng, [b, t, h, vd]));
    let cu = cu_for(t, varlen);
    let ss = seqs(b, t, cu.as_deref());
    let idx = random_indices(&mut rng, &ss, b, t, h, slots, bs);
    let counts: Array3<i64> =
        Array3::from_shape_simple_fn((b, t, h), || rng.below(slots + 1) as i64);
    let bc = tensor_counts.then(|| BlockCounts::Tensor(counts.view()));
    let out = nsa_selection_attention(
        q.view(),
        k.view(),
        v.view(),
        idx.view(),
        bc,
        cu.as_deref(),
        bs as i64,
        Some(0.2),
    )
    .unwrap();
    let g = hq / h;
    let (o, lse) = brute_attention(&q, &k, &v, 0.2, |bb, tt, hh| {
        let (_, bos, _) = seq_of(&ss, bb, tt);
        let n_sel = if tensor_counts {
            counts[[bb, tt, hh / g]] as usize
        } else {
            slots
        };
        sel_keys(&idx, bb, tt, hh / g, n_sel, bos, bs)
    });
    check_close("o", &dynf(&o), &dynf(&out.o), TIGHT).unwrap();
    check_close(
        "lse",
        &lse.clone().into_dyn(),
        &out.lse.clone().into_dyn(),
        TIGHT,
    )
    .unwrap();
    if tensor_counts {
        let zeros = counts.iter().filter(|&&c| c == 0).count();
        assert!(zeros > 0, "the case must hold empty rows");
        for ((bb, tt, hh), &c) in counts.indexed_iter() {
            if c == 0 {
                for gg in 0..g {
                    assert_eq!(out.lse[[bb, tt, hh * g + gg]], f64::NEG_INFINITY);
                    assert!(out
                        .o
                        .slice(s![bb, tt, hh * g + gg, ..])
                        .iter()
                        .all(|&x| x == 0.0));
                }
            }
        }
    }
}

#[test]
fn duplicates_count_twice_and_invalid_slots_are_ignored() {
    let mut rng = Rng::new(33);
    let (t, bs) = (48, 16);
    let q = n4(&mut rng, [1, t, 2, 8]);
    let (k, v) = (n4(&mut rng, [1, t, 1, 8]), n4(&mut rng, [1, t, 1, 8]));
    let run = |rows: [i64; 3]| {
        let idx = Array4::from_shape_fn((1, t, 1, 3), |(_, _, _, s)| rows[s]);
        nsa_selection_attention(
            q.view(),
            k.view(),
            v.view(),
            idx.view(),
            None,
            None,
            bs,
            None,
        )
        .unwrap()
    };
    let single = run([0, -1, -1]);
    let double = run([0, 0, -1]);
    let junk = run([0, i64::MAX, 7]);
    assert_eq!(single.o, junk.o, "out-of-range slots change nothing");
    let (o2, _) = brute_attention(&q, &k, &v, 1.0 / 8f64.sqrt(), |_, tt, _| {
        let keys: Vec<usize> = (0..16.min(tt + 1)).collect();
        [keys.clone(), keys].concat()
    });
    check_close("o", &dynf(&o2), &dynf(&double.o), TIGHT).unwrap();
    // block 0 twice: same softmax weights within it, so o agrees, but lse grows by ln 2
    let d = &double.lse - &single.lse;
    assert!(d.iter().all(|&x| (x - 2f64.ln()).abs() < 1e-12), "{d:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Every past block selected is full causal attention; so is a window `w >= L`.
    #[test]
    fn all_past_blocks_and_wide_window_are_causal_attention(seed: u64, t in 1usize..70, bs_log in 0u32..5, g in 1usize..3) {
        let bs = 1usize << bs_log;
        let mut rng = Rng::new(seed);
        let q = n4(&mut rng, [1, t, 2 * g, 8]);
        let (k, v) = (n4(&mut rng, [1, t, 2, 8]), n4(&mut rng, [1, t, 2, 5]));
        let slots = t.div_ceil(bs);
        let idx = Array4::from_shape_fn((1, t, 2, slots), |(_, _, _, s)| s as i64);
        let sel = nsa_selection_attention(q.view(), k.view(), v.view(), idx.view(), None, None, bs as i64, None).unwrap();
        let win = window_attention(q.view(), k.view(), v.view(), None, t as i64 + rng.below(3) as i64, None).unwrap();
        let (o, lse) = brute_attention(&q, &k, &v, 1.0 / 8f64.sqrt(), |_, tt, _| (0..=tt).collect());
        prop_assert!(check_close("sel o", &dynf(&o), &dynf(&sel.o), TIGHT).is_ok());
        prop_assert!(check_close("sel lse", &lse.clone().into_dyn(), &sel.lse.into_dyn(), TIGHT).is_ok());
        prop_assert!(check_close("win o", &dynf(&o), &dynf(&win.o), TIGHT).is_ok());
    }

    /// f32 on rounded inputs stays within 1e-5 of f64 on the same inputs.
    #[test]
    fn selection_f32_within_threshold(seed: u64) {
        let mut rng = Rng::new(seed);
        let (t, bs) = (64, 16);
        let q = narrow(&n4(&mut rng, [1, t, 4, 16]));
        let k = narrow(&n4(&mut rng, [1, t, 1, 16]));
        let v = narrow(&n4(&mut rng, [1, t, 1, 16]));
        let ss = seqs(1, t, None);
        let idx = random_indices(&mut rng, &ss, 1, t, 1, 3, bs);
        let lo = nsa_selection_attention(q.view(), k.view(), v.view(), idx.view(), None, None, 16, None).unwrap();
        let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
        let hi = nsa_selection_attention(q.view(), k.view(), v.view(), idx.view(), None, None, 16, None).unwrap();
        prop_assert!(check_close("o", &dynf(&hi.o), &widen(&lo.o), 1e-5).is_ok());
    }
}

#[test]
fn window_of_one_is_the_own_value() {
    let mut rng = Rng::new(7);
    let q = n4(&mut rng, [1, 30, 2, 8]);
    let (k, v) = (n4(&mut rng, [1, 30, 1, 8]), n4(&mut rng, [1, 30, 1, 4]));
    let cu = [0i64, 11, 30];
    let out = window_attention(q.view(), k.view(), v.view(), Some(&cu), 1, None).unwrap();
    for tt in 0..30 {
        for hh in 0..2 {
            for d in 0..4 {
                assert!((out.o[[0, tt, hh, d]] - v[[0, tt, 0, d]]).abs() < 1e-14);
            }
        }
    }
}
