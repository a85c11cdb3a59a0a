//! `nsa_gate_combine` and `nsa_fwd` (`conformance/spec/ops-nsa.md` §6, §7), and MSLK's reference
//! forward as a composition of the six ops (§8) against a per-token brute-force forward.
// rstest cases list every dimension of a case; brute-force oracles index plainly
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

mod nsa_util;

use attn_reference::nsa::nsa_fwd::FwdGates;
use attn_reference::nsa::{
    nsa_compress_kv, nsa_compression_attention, nsa_fwd, nsa_gate_combine, nsa_select_blocks,
    nsa_selection_attention, window_attention, BlockCounts, EmptyLse, Gates, PartialBlock,
    SelectMode, Visibility,
};
use half::bf16;
use ndarray::{s, Array3, Array4, Axis};
use nsa_util::Rng;
use nsa_util::*;
use proptest::prelude::*;
use rstest::rstest;

const TIGHT: f64 = 1e-12;

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ------------------------------------------------------------------ nsa_gate_combine (§6)

/// Each form, `K != V`, saturated logits (`|logit| > 100`), `B = 1` packed.
#[rstest]
#[case("w", 2, 16, 8, 1.0)]
#[case("w", 1, 8, 16, 400.0)] // saturated
#[case("g", 1, 16, 8, 1.0)]
#[case("u", 2, 8, 8, 1.0)]
fn gate_combine_forms(
    #[case] form: &str,
    #[case] b: usize,
    #[case] kd: usize,
    #[case] vd: usize,
    #[case] wscale: f64,
) {
    let mut rng = Rng::new(41 + kd as u64);
    let (t, hq) = (24, 4);
    let o3: Vec<Array4<f64>> = (0..3).map(|_| n4(&mut rng, [b, t, hq, vd])).collect();
    let q = n4(&mut rng, [b, t, hq, kd]);
    let w: Array3<f64> = rng.randn((hq, 3, kd)) * (wscale / (kd as f64).sqrt());
    let g: Vec<Array3<f64>> = (0..3)
        .map(|_| {
            rng.array(&[b, t, hq], 0.0, 1.0)
                .into_dimensionality()
                .unwrap()
        })
        .collect();
    let gates = match form {
        "w" => Gates::W {
            q: q.view(),
            weight: w.view(),
        },
        "g" => Gates::G([g[0].view(), g[1].view(), g[2].view()]),
        _ => Gates::U,
    };
    let out = nsa_gate_combine(o3[0].view(), o3[1].view(), o3[2].view(), gates).unwrap();
    let mut saturated = 0;
    for ((bb, tt, hh, c), &gv) in out.gates.indexed_iter() {
        let want = match form {
            "w" => {
                let logit: f64 = (0..kd).map(|d| q[[bb, tt, hh, d]] * w[[hh, c, d]]).sum();
                saturated += usize::from(logit.abs() > 100.0);
                sig(logit)
            }
            "g" => g[c][[bb, tt, hh]],
            _ => 1.0 / 3.0,
        };
        assert!(
            gv.is_finite() && (gv - want).abs() < 1e-12,
            "gate {c}: {gv} vs {want}"
        );
    }
    if wscale > 100.0 {
        assert!(saturated > 0, "the case must saturate some logits");
    }
    for ((bb, tt, hh, d), &x) in out.o.indexed_iter() {
        let want: f64 = (0..3)
            .map(|c| out.gates[[bb, tt, hh, c]] * o3[c][[bb, tt, hh, d]])
            .sum();
        assert!((x - want).abs() < 1e-14);
    }
    // f32 computes the same gates within 1e-5, without NaN even when saturated
    if form == "w" {
        let (q32, w32) = (narrow(&q), narrow(&w));
        let o32: Vec<_> = o3.iter().map(narrow).collect();
        let lo = nsa_gate_combine(
            o32[0].view(),
            o32[1].view(),
            o32[2].view(),
            Gates::W {
                q: q32.view(),
                weight: w32.view(),
            },
        )
        .unwrap();
        let hi = nsa_gate_combine(
            o3[0].view(),
            o3[1].view(),
            o3[2].view(),
            Gates::W {
                q: q32.mapv(f64::from).view(),
                weight: w32.mapv(f64::from).view(),
            },
        )
        .unwrap();
        check_close("gates f32", &dynf(&hi.gates), &widen(&lo.gates), 1e-5).unwrap();
    }
}

/// MSLK's fast ungated path `(o_cmp + o_slc + o_swa) * (1/3)` rounded three times in bf16 stays
/// within the bf16 threshold of the reference's single-rounding definition.
#[test]
fn bf16_ungated_three_roundings_within_threshold() {
    let mut rng = Rng::new(44);
    let shape = [2, 64, 4, 64];
    let r = |x: f64| bf16::from_f64(x).to_f64();
    let o3: Vec<Array4<f64>> = (0..3).map(|_| n4(&mut rng, shape).mapv(r)).collect();
    let out = nsa_gate_combine(o3[0].view(), o3[1].view(), o3[2].view(), Gates::U).unwrap();
    let fast = ndarray::Zip::from(&o3[0])
        .and(&o3[1])
        .and(&o3[2])
        .map_collect(|&a, &b, &c| r(r(r(a + b) + c) * r(1.0 / 3.0)));
    check_close("o", &dynf(&out.o), &dynf(&fast), 5e-3).unwrap();
    assert!(
        ratio_of(&out.o, &fast) > 1e-4,
        "the three roundings are visible"
    );
}

fn ratio_of(a: &Array4<f64>, b: &Array4<f64>) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = a.iter().map(|x| x * x).sum();
    (num / den).sqrt()
}

// ----------------------------------------------------------------------------- nsa_fwd (§7)

struct Fwd {
    q: Array4<f64>,
    k: Array4<f64>,
    v: Array4<f64>,
    g: Vec<Array3<f64>>,
}

fn fwd_inputs(rng: &mut Rng, t: usize, hq: usize, h: usize, kd: usize, vd: usize) -> Fwd {
    let g = (0..3)
        .map(|_| {
            rng.array(&[1, t, hq], 0.0, 1.0)
                .into_dimensionality()
                .unwrap()
        })
        .collect();
    Fwd {
        q: u4(rng, [1, t, hq, kd], -5.0, 5.0),
        k: u4(rng, [1, t, h, kd], -5.0, 5.0),
        v: n4(rng, [1, t, h, vd]),
        g,
    }
}

/// `nsa_fwd` against its parts composed by hand: computed selection (with `g_cmp`), given
/// indices with and without `g_cmp`, `g_slc` absent, `window_size` in {0, 1, 16, >= T}, `S` not a
/// power of two, tensor counts, varlen, `G` in {1, 4, 16}.
#[rstest]
#[case(160, 4, 1, 16, true, false, true, 0, Some(5), None)]
#[case(160, 4, 1, 16, true, false, true, 16, Some(4), Some(vec![0, 3, 41, 110, 160]))]
#[case(160, 1, 1, 16, true, false, false, 1, None, Some(vec![0, 3, 41, 110, 160]))] // tensor counts
#[case(128, 16, 1, 32, true, false, true, 200, Some(6), None)] // window >= T
#[case(96, 4, 2, 16, true, true, true, 16, None, None)] // given indices with g_cmp
#[case(96, 4, 2, 16, false, true, true, 16, Some(3), None)] // given indices, no g_cmp
#[case(96, 4, 2, 16, false, true, false, 0, Some(3), None)] // given, ungated o_slc
fn fwd_equals_its_parts(
    #[case] t: usize,
    #[case] hq: usize,
    #[case] h: usize,
    #[case] bs: usize,
    #[case] with_cmp: bool,
    #[case] given_indices: bool,
    #[case] with_slc: bool,
    #[case] window: i64,
    #[case] s_int: Option<i64>,
    #[case] cu: Option<Vec<i64>>,
) {
    let mut rng = Rng::new(t as u64 * 3 + hq as u64 + window as u64);
    let x = fwd_inputs(&mut rng, t, hq, h, 16, 12);
    let cu = cu.as_deref();
    let counts: Array3<i64> = Array3::from_shape_simple_fn((1, t, h), || 1 + rng.below(4) as i64);
    let bc = match s_int {
        Some(n) => BlockCounts::Int(n),
        None => BlockCounts::Tensor(counts.view()),
    };
    let given: Array4<i64> =
        Array4::from_shape_fn((1, t, h, 3), |(_, tt, _, sl)| (tt / bs) as i64 - sl as i64);
    let gates = FwdGates {
        g_cmp: with_cmp.then(|| x.g[0].view()),
        g_slc: with_slc.then(|| x.g[1].view()),
        g_swa: (window > 0).then(|| x.g[2].view()),
    };
    let given_idx = given_indices.then(|| given.view());
    let bc_fwd = (!given_indices).then_some(bc);
    let out = nsa_fwd(
        x.q.view(),
        x.k.view(),
        x.v.view(),
        gates,
        given_idx,
        bc_fwd,
        cu,
        bs as i64,
        window,
        Some(0.1),
    )
    .unwrap();
    // by hand
    let cmp = nsa_compress_kv(
        x.k.view(),
        Some(x.v.view()),
        None,
        None,
        cu,
        bs as i64,
        PartialBlock::MeanOfValid,
    )
    .unwrap();
    let v_cmp = cmp.v_cmp.unwrap();
    let mut want = Array4::<f64>::zeros((1, t, hq, 12));
    let idx: Array4<i64> = if with_cmp {
        let o_cmp = nsa_compression_attention(
            x.q.view(),
            cmp.k_cmp.view(),
            v_cmp.view(),
            cu,
            bs as i64,
            Some(0.1),
            Visibility::Complete,
            PartialBlock::MeanOfValid,
            EmptyLse::NegInf,
        )
        .unwrap()
        .o;
        want += &(&o_cmp * &x.g[0].view().insert_axis(Axis(3)));
        if given_indices {
            assert!(out.block_indices.is_none(), "given indices are used as is");
            given.clone()
        } else {
            let sel = nsa_select_blocks(
                x.q.view(),
                cmp.k_cmp.view(),
                Some(bc),
                cu,
                bs as i64,
                Some(0.1),
                SelectMode::Fla,
                256,
                true,
            )
            .unwrap();
            assert_eq!(out.block_indices.as_ref(), Some(&sel.block_indices));
            sel.block_indices.mapv(i64::from)
        }
    } else {
        assert!(out.block_indices.is_none());
        given.clone()
    };
    let counts_slc = match (given_indices, s_int) {
        (false, None) => Some(BlockCounts::Tensor(counts.view())),
        _ => None,
    };
    let o_slc = nsa_selection_attention(
        x.q.view(),
        x.k.view(),
        x.v.view(),
        idx.view(),
        counts_slc,
        cu,
        bs as i64,
        Some(0.1),
    )
    .unwrap()
    .o;
    want += &if with_slc {
        &o_slc * &x.g[1].view().insert_axis(Axis(3))
    } else {
        o_slc
    };
    if window > 0 {
        let o_swa = window_attention(x.q.view(), x.k.view(), x.v.view(), cu, window, None) // FLA: K ** -0.5 whatever `scale` is
            .unwrap()
            .o;
        want += &(&o_swa * &x.g[2].view().insert_axis(Axis(3)));
    }
    check_close("o", &dynf(&want), &dynf(&out.o), TIGHT).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Varlen isolation: changing one sequence's inputs never changes another sequence's
    /// outputs (bit for bit), with every branch on.
    #[test]
    fn varlen_sequences_are_isolated(seed: u64, cut in 1usize..80, victim in 0usize..2) {
        let mut rng = Rng::new(seed);
        let t = 96;
        let x = fwd_inputs(&mut rng, t, 4, 1, 8, 8);
        let cu = [0i64, cut as i64, t as i64];
        let run = |x: &Fwd| {
            let gv = FwdGates { g_cmp: Some(x.g[0].view()), g_slc: Some(x.g[1].view()), g_swa: Some(x.g[2].view()) };
            nsa_fwd(x.q.view(), x.k.view(), x.v.view(), gv, None, Some(BlockCounts::Int(3)), Some(&cu), 16, 20, None).unwrap()
        };
        let before = run(&x);
        let (lo, hi) = if victim == 0 { (0, cut) } else { (cut, t) };
        let mut y = fwd_inputs(&mut rng, t, 4, 1, 8, 8);
        for (dst, src) in [(&mut y.q, &x.q), (&mut y.k, &x.k), (&mut y.v, &x.v)] {
            // y keeps its fresh values only inside the victim sequence
            let mut keep = src.clone();
            keep.slice_mut(s![.., lo..hi, .., ..]).assign(&dst.slice(s![.., lo..hi, .., ..]));
            *dst = keep;
        }
        for c in 0..3 {
            let mut keep = x.g[c].clone();
            keep.slice_mut(s![.., lo..hi, ..]).assign(&y.g[c].slice(s![.., lo..hi, ..]));
            y.g[c] = keep;
        }
        let after = run(&y);
        let (olo, ohi) = if victim == 0 { (cut, t) } else { (0, cut) };
        prop_assert_eq!(before.o.slice(s![.., olo..ohi, .., ..]), after.o.slice(s![.., olo..ohi, .., ..]));
        prop_assert!(before.o.slice(s![.., lo..hi, .., ..]) != after.o.slice(s![.., lo..hi, .., ..]));
    }

    /// f32 `nsa_fwd` on rounded inputs, given indices, within 1e-5 of f64.
    #[test]
    fn fwd_f32_within_threshold(seed: u64) {
        let mut rng = Rng::new(seed);
        let t = 64;
        let x = fwd_inputs(&mut rng, t, 4, 1, 16, 16);
        let idx = Array4::from_shape_fn((1, t, 1, 2), |(_, tt, _, sl)| (tt / 16) as i64 - sl as i64);
        let (q, k, v) = (narrow(&x.q), narrow(&x.k), narrow(&x.v));
        let g: Vec<_> = x.g.iter().map(narrow).collect();
        let lo = nsa_fwd(q.view(), k.view(), v.view(), FwdGates { g_cmp: Some(g[0].view()), g_slc: Some(g[1].view()), g_swa: Some(g[2].view()) }, Some(idx.view()), None, None, 16, 8, None).unwrap();
        let (q, k, v) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));
        let g: Vec<_> = g.iter().map(|a| a.mapv(f64::from)).collect();
        let hi = nsa_fwd(q.view(), k.view(), v.view(), FwdGates { g_cmp: Some(g[0].view()), g_slc: Some(g[1].view()), g_swa: Some(g[2].view()) }, Some(idx.view()), None, None, 16, 8, None).unwrap();
        prop_assert!(check_close("o", &dynf(&hi.o), &widen(&lo.o), 1e-5).is_ok());
    }
}

// ----------------------------------------------------- MSLK's reference forward (§8)

/// MSLK's `nsa_forward_reference` composed from the ops, against a per-token brute force:
/// drop + projections, `"started"` compressed branch, tile-mean selection expanded per token and
/// head with repeats removed, `w`-key window, W-form gates.
#[test]
fn mslk_reference_forward_composition() {
    let mut rng = Rng::new(88);
    let (t, hq, h, kd, bs, qt, nsel, w) = (128, 4, 2, 8, 16, 32, 3, 20);
    let g = hq / h;
    let q = n4(&mut rng, [1, t, hq, kd]);
    let (k, v) = (n4(&mut rng, [1, t, h, kd]), n4(&mut rng, [1, t, h, kd]));
    let w_k: Array3<f64> = rng.randn((h, kd, kd)) / (kd as f64).sqrt();
    let w_v: Array3<f64> = rng.randn((h, kd, kd)) / (kd as f64).sqrt();
    let gw: Array3<f64> = rng.randn((hq, 3, kd));
    let scale = 1.0 / (kd as f64).sqrt();
    // composed
    let cmp = nsa_compress_kv(
        k.view(),
        Some(v.view()),
        Some(w_k.view()),
        Some(w_v.view()),
        None,
        bs as i64,
        PartialBlock::Drop,
    )
    .unwrap();
    let v_cmp = cmp.v_cmp.unwrap();
    let o_cmp = nsa_compression_attention(
        q.view(),
        cmp.k_cmp.view(),
        v_cmp.view(),
        None,
        bs as i64,
        None,
        Visibility::Started,
        PartialBlock::Drop,
        EmptyLse::NegInf,
    )
    .unwrap()
    .o;
    let rows = nsa_select_blocks(
        q.view(),
        cmp.k_cmp.view(),
        Some(BlockCounts::Int(nsel)),
        None,
        bs as i64,
        None,
        SelectMode::MslkTileMean,
        qt as i64,
        true,
    )
    .unwrap()
    .block_indices;
    let s_m = rows.shape()[3];
    let idx = Array4::from_shape_fn((1, t, hq, s_m), |(_, tt, hh, sl)| {
        let r = rows.slice(s![0, tt / qt, hh, ..]);
        if sl > 0 && r.slice(s![..sl]).iter().any(|&x| x == r[sl]) {
            -1
        } else {
            i64::from(r[sl])
        }
    });
    let rep = |x: &Array4<f64>| {
        Array4::from_shape_fn((1, t, hq, kd), |(_, tt, hh, d)| x[[0, tt, hh / g, d]])
    };
    let (kr, vr) = (rep(&k), rep(&v));
    let o_slc = nsa_selection_attention(
        q.view(),
        kr.view(),
        vr.view(),
        idx.view(),
        None,
        None,
        bs as i64,
        None,
    )
    .unwrap()
    .o;
    let o_swa = window_attention(q.view(), k.view(), v.view(), None, w, None)
        .unwrap()
        .o;
    let out = nsa_gate_combine(
        o_cmp.view(),
        o_slc.view(),
        o_swa.view(),
        Gates::W {
            q: q.view(),
            weight: gw.view(),
        },
    )
    .unwrap();
    // brute force, per token
    let kc = brute_pool(&k, bs, true, None, Some(&w_k));
    let vc = brute_pool(&v, bs, true, None, Some(&w_v));
    let tc = t / bs;
    let (bo_cmp, _) = brute_attention(&q, &kc, &vc, scale, |_, tt, _| {
        (0..tc).filter(|c| c * bs <= tt).collect()
    });
    let (bo_slc, _) = brute_attention(&q, &k, &v, scale, |_, tt, hh| {
        let i = tt / qt;
        let mut qbar = vec![0.0; kd];
        for p in i * qt..(i + 1) * qt {
            for d in 0..kd {
                qbar[d] += q[[0, p, hh, d]] / qt as f64;
            }
        }
        let mut sc: Vec<(f64, usize)> = (0..tc)
            .filter(|j| j * bs < (i + 1) * qt)
            .map(|j| {
                (
                    (0..kd)
                        .map(|d| scale * qbar[d] * kc[[0, j, hh / g, d]])
                        .sum(),
                    j,
                )
            })
            .collect();
        sc.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        let mut blocks: Vec<usize> = sc.iter().take(nsel as usize).map(|x| x.1).collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks
            .into_iter()
            .flat_map(|c| c * bs..((c + 1) * bs).min(tt + 1))
            .filter(|&j| j <= tt)
            .collect()
    });
    let (bo_swa, _) = brute_attention(&q, &k, &v, scale, |_, tt, _| {
        ((tt + 1).saturating_sub(w as usize)..=tt).collect()
    });
    let want = Array4::from_shape_fn((1, t, hq, kd), |(_, tt, hh, d)| {
        (0..3)
            .map(|c| {
                let logit: f64 = (0..kd).map(|e| q[[0, tt, hh, e]] * gw[[hh, c, e]]).sum();
                sig(logit) * [&bo_cmp, &bo_slc, &bo_swa][c][[0, tt, hh, d]]
            })
            .sum()
    });
    check_close("o", &dynf(&want), &dynf(&out.o), 1e-11).unwrap();
}
