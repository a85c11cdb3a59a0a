//! Every validated limit tested on both sides (the largest accepted value runs and matches a
//! brute-force oracle, the first refused value is a typed error naming the argument), and every
//! softmax fed logits of magnitude ~1e4, far past where an unshifted `exp` overflows (~709),
//! against the oracles of `nsa_util` (scalar loops written from the spec, no shared code).

mod nsa_util;

use attn_reference::decode::{decode_attention, CacheLayout, MAX_HEAD_DIM};
use attn_reference::nsa::nsa_select_blocks::MAX_SLOTS;
use attn_reference::nsa::{
    nsa_compression_attention, nsa_select_blocks, nsa_selection_attention, window_attention,
    AttnOut, BlockCounts, EmptyLse, PartialBlock, SelectMode, Visibility,
};
use attn_reference::ErrorKind;
use ndarray::{Array3, Array4, Ix4};
use nsa_util::*;

/// A fresh seed per run (the inputs are random; a failure prints the seed).
fn seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {s}");
    s
}

/// `x` as a `[.., .., .., ..]` array of `[lo, hi)` uniform values.
fn uniform(rng: &mut Rng, shape: [usize; 4], lo: f64, hi: f64) -> Array4<f64> {
    rng.array(&shape, lo, hi)
        .into_dimensionality::<Ix4>()
        .unwrap()
}

/// Every element finite.
fn assert_finite<D: ndarray::Dimension>(what: &str, a: &ndarray::Array<f64, D>) {
    assert!(a.iter().all(|x| x.is_finite()), "{what}: not all finite");
}

/// The decode oracle: for batch `b`, query `i`, head `h`, softmax attention over the visible
/// keys `j < n` (`j <= n - L_q + i` when causal) of cache row `b`, KV head `h / G`.
fn brute_decode(
    q: &Array4<f64>,
    k: &Array4<f64>,
    v: &Array4<f64>,
    lens: &[i64],
    scale: f64,
    causal: bool,
) -> (Array4<f64>, Array3<f64>) {
    let (b, l, h, d) = q.dim();
    let g = h / k.shape()[2];
    let mut o = Array4::zeros((b, l, h, d));
    let mut lse = Array3::zeros((b, h, l));
    for bb in 0..b {
        let n = lens[bb] as usize;
        for i in 0..l {
            let m = if causal {
                (n + i + 1).saturating_sub(l).min(n)
            } else {
                n
            };
            for hh in 0..h {
                let keys: Vec<_> = (0..m)
                    .map(|j| (row(k, bb, j, hh / g), row(v, bb, j, hh / g)))
                    .collect();
                let (or, ls) = softmax_attend(&row(q, bb, i, hh), &keys, scale, d);
                for (x, y) in or.into_iter().enumerate() {
                    o[[bb, i, hh, x]] = y;
                }
                lse[[bb, hh, i]] = ls;
            }
        }
    }
    (o, lse)
}

/// Runs `decode_attention` (bshd caches of `S` rows, `H_kv = 2`, GQA 2) on `[-amp, amp)` inputs
/// and compares it with the oracle; returns the error when the call is refused.
fn decode_case(
    rng: &mut Rng,
    d: usize,
    amp: f64,
    scale: Option<f64>,
) -> Result<(), attn_reference::Error> {
    let (b, l, h_kv, s) = (2, 3, 2, 40);
    let q = uniform(rng, [b, l, 2 * h_kv, d], -amp, amp);
    let k = uniform(rng, [b, s, h_kv, d], -amp, amp);
    let v = uniform(rng, [b, s, h_kv, d], -1.0, 1.0);
    let lens = [s as i64, 1 + rng.below(s) as i64];
    for causal in [false, true] {
        let out = decode_attention(
            q.view(),
            k.view(),
            v.view(),
            &lens,
            None,
            scale,
            causal,
            CacheLayout::Bshd,
        )?;
        let sc = scale.unwrap_or(1.0 / (d as f64).sqrt());
        let (o, lse) = brute_decode(&q, &k, &v, &lens, sc, causal);
        // (a row with no visible key has lse = -inf; check_close wants it matched exactly)
        assert_finite("o", &out.o);
        check_close("o", &dynf(&o), &dynf(&out.o), 1e-12).unwrap();
        check_close("lse", &lse.into_dyn(), &out.lse.into_dyn(), 1e-12).unwrap();
    }
    Ok(())
}

/// `D = 256` (`MAX_HEAD_DIM`) runs and matches the oracle; `D = 257` and `D = 0` are refused,
/// naming `q`. (Kills `d > MAX_HEAD_DIM` → `d >= MAX_HEAD_DIM` in decode.rs.)
#[test]
fn decode_head_dim_256_runs_and_257_is_refused() {
    let mut rng = Rng::new(seed());
    assert_eq!(MAX_HEAD_DIM, 256);
    decode_case(&mut rng, MAX_HEAD_DIM, 1.0, None).unwrap();
    for d in [MAX_HEAD_DIM + 1, 0] {
        let e = decode_case(&mut rng, d, 1.0, None).unwrap_err();
        assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "q"), "D = {d}");
    }
}

/// Scaled logits of magnitude up to ~1e4 (`softmax_scale = 2000` on `[-1, 1)` inputs, `D = 8`):
/// finite and equal to the oracle. (Kills `s - max` → `s + max` in decode.rs `attend`.)
#[test]
fn decode_logits_near_1e4_stay_finite_and_exact() {
    let mut rng = Rng::new(seed());
    decode_case(&mut rng, 8, 1.0, Some(2000.0)).unwrap();
    // large inputs with the default scale: q·k/sqrt(D) up to ~2e3
    decode_case(&mut rng, 16, 25.0, None).unwrap();
}

/// Selection scores (FLA mode) of logits up to ~1e4: finite and equal to the oracle of spec
/// §4.1. (Kills `x - m` → `x + m` in nsa_select_blocks.rs.)
#[test]
fn select_blocks_fla_logits_near_1e4_stay_finite_and_exact() {
    let mut rng = Rng::new(seed());
    let (t, h, g, kd, bs) = (70, 2, 2, 8, 8);
    let q = uniform(&mut rng, [1, t, h * g, kd], -1.0, 1.0);
    let kc = uniform(&mut rng, [1, t.div_ceil(bs), h, kd], -1.0, 1.0);
    let scale = 2000.0;
    let out = nsa_select_blocks(
        q.view(),
        kc.view(),
        Some(BlockCounts::Int(3)),
        None,
        bs as i64,
        Some(scale),
        SelectMode::Fla,
        256,
        true,
    )
    .unwrap();
    for tt in 0..t {
        for hh in 0..h {
            let want = brute_fla_scores(&q, &kc, 0, tt, tt, hh, 0, bs, scale);
            for (c, w) in want.iter().enumerate() {
                let got = out.scores[[0, tt, hh, c]];
                assert!(got.is_finite(), "t {tt} h {hh} block {c}: {got}");
                assert!(
                    (got - w).abs() <= 1e-12,
                    "t {tt} h {hh} block {c}: {got} vs {w}"
                );
            }
        }
    }
}

/// `block_counts = MAX_SLOTS` (2^16) runs: every row keeps all of its `IC + 1` candidates and
/// pads the `2^16` slots with -1; `MAX_SLOTS + 1` (integer or a tensor's largest entry) is
/// refused naming `block_counts`, and so is 0 (the integer must be `>= 1`) while 1 runs.
/// (Kills `s_out > MAX_SLOTS` → `>=`.)
#[test]
fn select_blocks_max_slots_runs_and_one_more_is_refused() {
    let mut rng = Rng::new(seed());
    let (t, h, kd, bs) = (20, 1, 4, 4);
    let q = uniform(&mut rng, [1, t, h, kd], -1.0, 1.0);
    let kc = uniform(&mut rng, [1, t.div_ceil(bs), h, kd], -1.0, 1.0);
    let select = |counts: BlockCounts<'_>| {
        nsa_select_blocks(
            q.view(),
            kc.view(),
            Some(counts),
            None,
            bs as i64,
            None,
            SelectMode::Fla,
            256,
            true,
        )
    };
    let out = select(BlockCounts::Int(MAX_SLOTS)).unwrap();
    assert_eq!(out.block_indices.shape(), &[1, t, h, MAX_SLOTS as usize]);
    for tt in 0..t {
        let r: Vec<i32> = out.block_indices.slice(ndarray::s![0, tt, 0, ..]).to_vec();
        let ic = tt / bs;
        assert_eq!(as_set(&r), (0..=ic as i32).collect::<Vec<_>>(), "t {tt}");
        assert!(r[ic + 1..].iter().all(|&x| x == -1), "t {tt}: padding");
    }
    let one = select(BlockCounts::Int(1)).unwrap();
    assert_eq!(one.block_indices.shape(), &[1, t, h, 1]);
    let mut counts = Array3::<i64>::from_elem((1, t, h), 1);
    counts[[0, rng.below(t), 0]] = MAX_SLOTS + 1;
    for (counts, kind) in [
        (BlockCounts::Int(MAX_SLOTS + 1), ErrorKind::Param),
        (BlockCounts::Tensor(counts.view()), ErrorKind::Param),
        (BlockCounts::Int(0), ErrorKind::Param),
    ] {
        let e = select(counts).unwrap_err();
        assert_eq!((e.kind, e.arg.as_str()), (kind, "block_counts"));
    }
}

/// Random `[1, T, HQ, K]` queries and `[1, T, H, K]` keys with entries in `[-1, 1)`, values
/// `[1, T, H, V]`, for the branch attentions at `scale = 2000` (logits up to ~1e4).
fn branch_inputs(rng: &mut Rng, t: usize) -> (Array4<f64>, Array4<f64>, Array4<f64>) {
    let q = uniform(rng, [1, t, 4, 8], -1.0, 1.0);
    let k = uniform(rng, [1, t, 2, 8], -1.0, 1.0);
    let v = uniform(rng, [1, t, 2, 5], -1.0, 1.0);
    (q, k, v)
}

fn assert_matches(what: &str, got: &AttnOut<f64>, want: &(Array4<f64>, Array3<f64>)) {
    assert_finite(what, &got.o);
    assert_finite(what, &got.lse);
    check_close(what, &dynf(&want.0), &dynf(&got.o), 1e-12).unwrap();
    check_close(
        what,
        &want.1.clone().into_dyn(),
        &got.lse.clone().into_dyn(),
        1e-12,
    )
    .unwrap();
}

/// The three NSA branch attentions (compressed with every block visible and `block_size = 1`,
/// selected with every past block, a window wider than the sequence) on logits up to ~1e4:
/// finite and equal to the brute-force causal / full attention. (Kills `x - m` → `x + m` in
/// nsa/attend.rs, the softmax the branches and `nsa_fwd` share.)
#[test]
fn nsa_branch_attentions_of_logits_near_1e4_stay_finite_and_exact() {
    let mut rng = Rng::new(seed());
    let t = 37;
    let scale = 2000.0;
    let (q, k, v) = branch_inputs(&mut rng, t);
    let cmp = nsa_compression_attention(
        q.view(),
        k.view(),
        v.view(),
        None,
        1,
        Some(scale),
        Visibility::All,
        PartialBlock::Drop,
        EmptyLse::NegInf,
    )
    .unwrap();
    assert_matches(
        "compression",
        &cmp,
        &brute_attention(&q, &k, &v, scale, |_, _, _| (0..t).collect()),
    );
    let causal = brute_attention(&q, &k, &v, scale, |_, tt, _| (0..=tt).collect());
    let bs = 4;
    let idx = Array4::from_shape_fn((1, t, 2, t.div_ceil(bs)), |(_, _, _, s)| s as i64);
    let sel = nsa_selection_attention(
        q.view(),
        k.view(),
        v.view(),
        idx.view(),
        None,
        None,
        bs as i64,
        Some(scale),
    )
    .unwrap();
    assert_matches("selection", &sel, &causal);
    let win = window_attention(q.view(), k.view(), v.view(), None, t as i64, Some(scale)).unwrap();
    assert_matches("window", &win, &causal);
}
