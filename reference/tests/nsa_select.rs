//! `nsa_select_blocks` (`conformance/spec/ops-nsa.md` §4) in both modes: brute-force scores, the
//! forced set, the ranking and tie rules, per-token quotas, tile means, phantom entries, and the
//! "Suite must cover" lists.
// rstest cases list every dimension of a case; brute-force oracles index plainly
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

mod nsa_util;

use attn_reference::nsa::{
    nsa_compress_kv, nsa_select_blocks, BlockCounts, PartialBlock, SelectMode,
};
use ndarray::{s, Array3, Array4};
use nsa_util::Rng;
use nsa_util::*;
use proptest::prelude::*;
use rstest::rstest;

/// `k_cmp` of `k` for `mode` (mean_of_valid for `"fla"`, drop for tile means).
fn kcmp(k: &Array4<f64>, bs: usize, cu: Option<&[i64]>, drop: bool) -> Array4<f64> {
    let p = if drop {
        PartialBlock::Drop
    } else {
        PartialBlock::MeanOfValid
    };
    nsa_compress_kv(k.view(), None, None, None, cu, bs as i64, p)
        .unwrap()
        .k_cmp
}

/// Checks one FLA row against brute scores: `m = min(n_sel, IC + 1)` valid entries first, then
/// `-1`; distinct candidates; every selected block scores at least every unselected candidate
/// (exactly ranked: equal scores broken by index).
fn check_fla_row(row: &[i32], score: &[f64], n_sel: usize, ic: usize) -> Result<(), String> {
    let m = n_sel.min(ic + 1).min(row.len());
    let (valid, pad) = row.split_at(m);
    if pad.iter().any(|&x| x != -1) || valid.iter().any(|&x| x < 0 || x as usize > ic) {
        return Err(format!(
            "row {row:?}: expected {m} candidates <= {ic} then -1"
        ));
    }
    let set = as_set(valid);
    if set.len() != m {
        return Err(format!("row {row:?} repeats a block"));
    }
    let cut = valid
        .iter()
        .map(|&c| score[c as usize])
        .fold(f64::INFINITY, f64::min);
    for c in 0..=ic {
        if !set.contains(&(c as i32)) && score[c] > cut + 1e-12 {
            return Err(format!(
                "row {row:?}: unselected {c} scores {} > cut {cut}",
                score[c]
            ));
        }
    }
    Ok(())
}

/// `(B, T, HQ, H, BS, S or counts, varlen)`: `G` in {1, 4, 16, 32}, `S` not a power of two,
/// per-token quotas, `n_sel >= IC + 1`, varlen with zero-length and short sequences.
#[rstest]
#[case(2, 256, 4, 2, 16, Some(6), false)]
#[case(1, 300, 4, 2, 16, None, true)]
#[case(1, 40, 1, 1, 16, Some(4), false)] // every row below the cut
#[case(1, 192, 16, 1, 16, Some(4), false)]
#[case(1, 192, 16, 1, 16, None, true)]
#[case(1, 128, 32, 1, 16, Some(5), false)]
#[case(1, 100, 4, 1, 8, Some(40), false)] // n_sel >= IC + 1 everywhere
fn fla_mode_matches_brute_scores(
    #[case] b: usize,
    #[case] t: usize,
    #[case] hq: usize,
    #[case] h: usize,
    #[case] bs: usize,
    #[case] s_int: Option<usize>,
    #[case] varlen: bool,
) {
    let mut rng = Rng::new((t + hq) as u64);
    let q = u4(&mut rng, [b, t, hq, 16], -5.0, 5.0);
    let k = u4(&mut rng, [b, t, h, 16], -5.0, 5.0);
    let cu = varlen.then(|| vec![0i64, 0, 9, (t / 2) as i64, t as i64]);
    let kc = kcmp(&k, bs, cu.as_deref(), false);
    let counts: Array3<i64> = Array3::from_shape_simple_fn((b, t, h), || 3 + rng.below(6) as i64);
    let bc = match s_int {
        Some(n) => BlockCounts::Int(n as i64),
        None => BlockCounts::Tensor(counts.view()),
    };
    let out = nsa_select_blocks(
        q.view(),
        kc.view(),
        Some(bc),
        cu.as_deref(),
        bs as i64,
        Some(0.1),
        SelectMode::Fla,
        256,
        true,
    )
    .unwrap();
    let s_out = s_int.unwrap_or(8);
    assert_eq!(out.block_indices.shape(), [b, t, h, s_out]);
    let ss = seqs(b, t, cu.as_deref());
    let mut bases = vec![0];
    for &(_, bos, eos) in &ss {
        let last = *bases.last().unwrap();
        bases.push(last + if varlen { (eos - bos).div_ceil(bs) } else { 0 });
    }
    for bb in 0..b {
        for tt in 0..t {
            let n = ss
                .iter()
                .position(|&(sb, bos, eos)| sb == bb && bos <= tt && tt < eos)
                .unwrap();
            let p = tt - ss[n].1;
            for hh in 0..h {
                let score = brute_fla_scores(&q, &kc, bb, tt, p, hh, bases[n], bs, 0.1);
                let n_sel = s_int.unwrap_or(counts[[bb, tt, hh]] as usize);
                let row: Vec<i32> = out.block_indices.slice(s![bb, tt, hh, ..]).to_vec();
                check_fla_row(&row, &score, n_sel, p / bs)
                    .unwrap_or_else(|e| panic!("({bb},{tt},{hh}): {e}"));
                for (c, &sc) in score.iter().enumerate() {
                    assert!(
                        (out.scores[[bb, tt, hh, c]] - sc).abs() < 1e-12,
                        "score ({bb},{tt},{hh},{c})"
                    );
                }
                if p < bs {
                    assert_eq!(as_set(&row), vec![0], "t < BS selects block 0 only");
                } else if p < 2 * bs && n_sel >= 2 {
                    assert_eq!(as_set(&row), vec![0, 1], "t in block 1 selects {{0, 1}}");
                }
            }
        }
    }
}

/// `n_sel < |F|`: the project's tie rule keeps block 0, then `IC - 1`, then `IC`; the block of a
/// position on its block's last token (`NC = IC + 1`) is a candidate.
#[rstest]
#[case(1, &[0])]
#[case(2, &[0, 4])]
#[case(3, &[0, 4, 5])]
fn forced_blocks_tie_rule(#[case] n_sel: i64, #[case] want: &[i32]) {
    let (t, bs) = (96, 16);
    let mut rng = Rng::new(9);
    let q = u4(&mut rng, [1, t, 2, 8], -5.0, 5.0);
    let k = u4(&mut rng, [1, t, 1, 8], -5.0, 5.0);
    let kc = kcmp(&k, bs, None, false);
    let out = nsa_select_blocks(
        q.view(),
        kc.view(),
        Some(BlockCounts::Int(n_sel)),
        None,
        bs as i64,
        None,
        SelectMode::Fla,
        256,
        true,
    )
    .unwrap();
    for tt in [5 * 16, 5 * 16 + 7, 6 * 16 - 1] {
        let row: Vec<i32> = out.block_indices.slice(s![0, tt, 0, ..]).to_vec();
        assert_eq!(row, want, "t = {tt}");
    }
    // the last token of block 4: NC = 5 = IC + 1, all five complete blocks scored
    assert!(out
        .scores
        .slice(s![0, 79, 0, ..5])
        .iter()
        .all(|x| x.is_finite()));
    assert!(out.scores[[0, 79, 0, 5]] == f64::NEG_INFINITY);
}

// ------------------------------------------------------------------ "mslk_tile_mean"

/// Brute tile-mean row (`conformance/spec/ops-nsa.md` §4.2, written out): sorted `S_m` entries.
#[allow(clippy::too_many_arguments)]
fn brute_tile_row(
    q: &Array4<f64>,
    kc: &Array4<f64>,
    b: usize,
    bos: usize,
    base: usize,
    tc: usize,
    i: usize,
    hq: usize,
    qt: usize,
    bs: usize,
    causal: bool,
    s_m: usize,
    scale: f64,
) -> (Vec<i32>, Vec<f64>) {
    let g = q.shape()[2] / kc.shape()[2];
    let kd = q.shape()[3];
    let mut qbar = vec![0.0; kd];
    for p in 0..qt {
        for d in 0..kd {
            qbar[d] += q[[b, bos + i * qt + p, hq, d]] / qt as f64;
        }
    }
    let mut e: Vec<(f64, usize)> = (0..tc.max(s_m))
        .map(|j| {
            let allowed = j < tc && (!causal || j * bs < (i + 1) * qt);
            let z = if allowed {
                scale
                    * (0..kd)
                        .map(|d| qbar[d] * kc[[b, base + j, hq / g, d]])
                        .sum::<f64>()
            } else {
                f64::NEG_INFINITY
            };
            (z, j)
        })
        .collect();
    let scores: Vec<f64> = e.iter().map(|x| x.0).collect();
    e.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    let mut row: Vec<i32> = e[..s_m]
        .iter()
        .map(|&(z, j)| if z == f64::NEG_INFINITY { 0 } else { j as i32 })
        .collect();
    row.sort_unstable();
    (row, scores)
}

/// `(T, HQ, H, BS, qt, k, causal, cu)`: early tiles with duplicate zeros, `block_counts > TC`,
/// non-causal, `G > 1`, `qt` neither a multiple nor a divisor of `BS`, varlen where one sequence
/// has fewer blocks than `S_m`.
#[rstest]
#[case(512, 4, 2, 16, 64, 6, true, None)]
#[case(512, 4, 2, 16, 64, 6, false, None)]
#[case(384, 4, 2, 16, 64, 10, true, Some(vec![0, 128, 384]))]
#[case(320, 2, 1, 128, 64, 1, true, None)]
#[case(192, 4, 1, 32, 48, 5, true, None)] // qt = 48 vs BS = 32
#[case(192, 4, 1, 32, 48, 50, true, None)] // block_counts > TC
#[case(144, 8, 2, 32, 48, 3, false, Some(vec![0, 0, 48, 144]))]
fn tile_mean_matches_brute(
    #[case] t: usize,
    #[case] hq: usize,
    #[case] h: usize,
    #[case] bs: usize,
    #[case] qt: usize,
    #[case] count: usize,
    #[case] causal: bool,
    #[case] cu: Option<Vec<i64>>,
) {
    let mut rng = Rng::new((t + bs + count) as u64);
    let q = u4(&mut rng, [1, t, hq, 16], -5.0, 5.0);
    let k = u4(&mut rng, [1, t, h, 16], -5.0, 5.0);
    let kc = kcmp(&k, bs, cu.as_deref(), true);
    let out = nsa_select_blocks(
        q.view(),
        kc.view(),
        Some(BlockCounts::Int(count as i64)),
        cu.as_deref(),
        bs as i64,
        Some(0.25),
        SelectMode::MslkTileMean,
        qt as i64,
        causal,
    )
    .unwrap();
    let ss = seqs(1, t, cu.as_deref());
    let tc_max = ss.iter().map(|&(_, a, e)| (e - a) / bs).max().unwrap();
    let s_m = count.min(tc_max);
    let nq: usize = ss.iter().map(|&(_, a, e)| (e - a) / qt).sum();
    assert_eq!(out.block_indices.shape(), [1, nq, hq, s_m]);
    let (mut row_i, mut base) = (0, 0);
    let mut heads_differ = false;
    for &(_, bos, eos) in &ss {
        let tc = (eos - bos) / bs;
        for i in 0..(eos - bos) / qt {
            let mut rows = Vec::new();
            for hh in 0..hq {
                let (want, scores) =
                    brute_tile_row(&q, &kc, 0, bos, base, tc, i, hh, qt, bs, causal, s_m, 0.25);
                let got: Vec<i32> = out.block_indices.slice(s![0, row_i, hh, ..]).to_vec();
                assert_eq!(got, want, "tile {row_i} head {hh}");
                for j in 0..tc {
                    let (a, b) = (out.scores[[0, row_i, hh, j]], scores[j]);
                    assert!(a == b || (a - b).abs() < 1e-12, "score {j}: {a} vs {b}");
                }
                let n_valid = if causal {
                    tc.min(((i + 1) * qt).div_ceil(bs))
                } else {
                    tc
                };
                if n_valid <= s_m {
                    let mut dup = vec![0; s_m + 1 - n_valid.max(1)];
                    dup.extend(1..n_valid.max(1) as i32);
                    assert_eq!(got, dup, "duplicate zeros, tile {row_i}");
                }
                rows.push(got);
            }
            let g = hq / h;
            heads_differ |= rows.chunks(g).any(|c| c.iter().any(|r| r != &c[0]));
            row_i += 1;
        }
        base += tc;
    }
    if hq > h && s_m < tc_max && tc_max >= 8 {
        assert!(heads_differ, "heads of a group select independently");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    /// f32 selection equals the f64 one except where the f64 scores nearly tie
    /// (`conformance/spec/ops-nsa.md` §9 band).
    #[test]
    fn fla_f32_agrees_up_to_near_ties(seed: u64) {
        let mut rng = Rng::new(seed);
        let (t, bs) = (128, 16);
        let q = narrow(&u4(&mut rng, [1, t, 4, 16], -5.0, 5.0)).mapv(f64::from);
        let k = narrow(&u4(&mut rng, [1, t, 1, 16], -5.0, 5.0)).mapv(f64::from);
        let kc = kcmp(&k, bs, None, false);
        let hi = nsa_select_blocks(q.view(), kc.view(), Some(BlockCounts::Int(4)), None, 16, None, SelectMode::Fla, 256, true).unwrap();
        let (q32, kc32) = (narrow(&q), narrow(&kc));
        let lo = nsa_select_blocks(q32.view(), kc32.view(), Some(BlockCounts::Int(4)), None, 16, None, SelectMode::Fla, 256, true).unwrap();
        for tt in 0..t {
            let (a, b) = (as_set(&hi.block_indices.slice(s![0, tt, 0, ..]).to_vec()), as_set(&lo.block_indices.slice(s![0, tt, 0, ..]).to_vec()));
            if a != b {
                let cut = a.iter().map(|&c| hi.scores[[0, tt, 0, c as usize]]).fold(f64::INFINITY, f64::min);
                for c in a.iter().chain(&b).filter(|c| !(a.contains(c) && b.contains(c))) {
                    let sc = hi.scores[[0, tt, 0, *c as usize]];
                    prop_assert!((sc - cut).abs() <= 1e-4 * cut, "t {tt}: block {c} score {sc} vs cut {cut}");
                }
            }
        }
    }
}
