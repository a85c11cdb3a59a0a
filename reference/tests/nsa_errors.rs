//! Every error list of `conformance/spec/ops-nsa.md` §2-§7: each bad input is refused before any
//! work with a typed error naming the argument (and nothing panics). Dtype mismatches cannot be
//! expressed in the typed API (one `T` per call); the conformance runners check those.
// rstest cases list every dimension of a case; brute-force oracles index plainly
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use attn_reference::nsa::nsa_fwd::FwdGates;
use attn_reference::nsa::{
    nsa_compress_kv, nsa_compression_attention, nsa_fwd, nsa_gate_combine, nsa_select_blocks,
    nsa_selection_attention, window_attention, BlockCounts, EmptyLse, Gates, PartialBlock,
    SelectMode, Visibility,
};
use attn_reference::{Error, ErrorKind, Result};
use ndarray::{Array3, Array4};
use rstest::rstest;
use std::str::FromStr;

use ErrorKind::{CuSeqlens, Index, Missing, Param, Shape};

fn t4(shape: [usize; 4]) -> Array4<f64> {
    let mut i = 0u64;
    Array4::from_shape_simple_fn(shape, || {
        i += 1;
        ((i.wrapping_mul(2654435761) % 1000) as f64) / 500.0 - 1.0
    })
}

fn t3(shape: [usize; 3]) -> Array3<f64> {
    Array3::from_elem(shape, 0.5)
}

fn expect<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, arg: &str) {
    let e: Error = r.expect_err("bad input accepted");
    assert_eq!((e.kind, e.arg.as_str()), (kind, arg), "{e}");
}

// ---- §2 nsa_compress_kv

#[rstest]
#[case("v_T", Shape, "v")]
#[case("v_H", Shape, "v")]
#[case("bs0", Param, "block_size")]
#[case("bs3", Param, "block_size")]
#[case("w_k", Shape, "w_k")]
#[case("w_v", Shape, "w_v")]
#[case("w_v_no_v", Missing, "w_v")]
#[case("cu_b2", Shape, "cu_seqlens")]
#[case("cu_end", CuSeqlens, "cu_seqlens")]
fn compress_kv_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    let b = if what == "cu_b2" { 2 } else { 1 };
    let k = t4([b, 20, 2, 8]);
    let v = match what {
        "v_T" => t4([b, 19, 2, 8]),
        "v_H" => t4([b, 20, 3, 8]),
        _ => t4([b, 20, 2, 6]),
    };
    let w_k = t3(if what == "w_k" { [2, 8, 6] } else { [2, 8, 8] });
    let w_v = t3(if what == "w_v" { [2, 8, 8] } else { [2, 6, 6] });
    let bs = match what {
        "bs0" => 0,
        "bs3" => 3,
        _ => 4,
    };
    let cu = [0i64, 5, if what == "cu_end" { 19 } else { 20 }];
    let with_cu = what.starts_with("cu");
    let v_arg = (what != "w_v_no_v").then(|| v.view());
    expect(
        nsa_compress_kv(
            k.view(),
            v_arg,
            Some(w_k.view()),
            Some(w_v.view()),
            with_cu.then_some(&cu[..]),
            bs,
            PartialBlock::Drop,
        ),
        kind,
        arg,
    );
}

#[rstest]
#[case("partial_block", "tail")]
#[case("visibility", "causal")]
#[case("empty_lse", "nan")]
#[case("mode", "mslk")]
fn unknown_names(#[case] arg: &str, #[case] value: &str) {
    let e = match arg {
        "partial_block" => PartialBlock::from_str(value).unwrap_err(),
        "visibility" => Visibility::from_str(value).unwrap_err(),
        "empty_lse" => EmptyLse::from_str(value).unwrap_err(),
        _ => SelectMode::from_str(value).unwrap_err(),
    };
    assert_eq!((e.kind, e.arg.as_str()), (Param, arg));
}

// ---- §3 nsa_compression_attention

#[rstest]
#[case("k_cmp_B", Shape, "k_cmp")]
#[case("k_cmp_K", Shape, "k_cmp")]
#[case("v_cmp_TC", Shape, "v_cmp")]
#[case("v_cmp_H", Shape, "v_cmp")]
#[case("hq", Shape, "q")]
#[case("tc_layout", Shape, "k_cmp")]
#[case("tc_drop", Shape, "k_cmp")]
#[case("scale_neg", Param, "scale")]
#[case("scale_inf", Param, "scale")]
#[case("bs", Param, "block_size")]
#[case("cu", CuSeqlens, "cu_seqlens")]
fn compression_attention_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    // T = 40, BS = 16: 3 rows (mean_of_valid), 2 (drop)
    let q = t4([1, 40, if what == "hq" { 3 } else { 4 }, 8]);
    let kc = t4(match what {
        "k_cmp_B" => [2, 3, 2, 8],
        "k_cmp_K" => [1, 3, 2, 6],
        "tc_layout" => [1, 2, 2, 8],
        _ => [1, 3, 2, 8],
    });
    let vc = t4(match what {
        "v_cmp_TC" => [1, 4, 2, 5],
        "v_cmp_H" => [1, 3, 1, 5],
        _ => [1, kc.shape()[1], 2, 5],
    });
    let partial = if what == "tc_drop" {
        PartialBlock::Drop
    } else {
        PartialBlock::MeanOfValid
    };
    let scale = match what {
        "scale_neg" => Some(-1.0),
        "scale_inf" => Some(f64::INFINITY),
        _ => None,
    };
    let cu = [0i64, 30, 20, 40];
    expect(
        nsa_compression_attention(
            q.view(),
            kc.view(),
            vc.view(),
            (what == "cu").then_some(&cu[..]),
            if what == "bs" { 12 } else { 16 },
            scale,
            Visibility::Complete,
            partial,
            EmptyLse::NegInf,
        ),
        kind,
        arg,
    );
}

// ---- §4 nsa_select_blocks

#[rstest]
#[case("both", Missing, "block_counts")]
#[case("counts_shape", Shape, "block_counts")]
#[case("counts_neg", Index, "block_counts")]
#[case("int0", Param, "block_counts")]
#[case("int_huge", Param, "block_counts")]
#[case("tensor_huge", Param, "block_counts")]
#[case("tensor_mslk", Missing, "block_counts")]
#[case("qt_len", Param, "q_tile_size")]
#[case("qt0", Param, "q_tile_size")]
#[case("causal_fla", Param, "causal")]
#[case("tc_mode", Shape, "k_cmp")]
#[case("hq", Shape, "q")]
#[case("h0", Shape, "k_cmp")]
fn select_blocks_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    let mslk = matches!(what, "tensor_mslk" | "qt_len" | "qt0" | "tc_mode");
    // T = 64, BS = 16: 4 rows in both layouts; tc_mode gives the fla layout of T = 56 instead
    let t = if what == "tc_mode" { 56 } else { 64 };
    let q = t4([1, t, if what == "hq" { 3 } else { 4 }, 8]);
    let h = if what == "h0" { 0 } else { 2 };
    let kc = t4([1, 4, h, 8]);
    let mut counts = Array4::<i64>::from_elem((1, t, 2, 1), 2).remove_axis(ndarray::Axis(3));
    match what {
        "counts_neg" => counts[[0, 5, 1]] = -1,
        "tensor_huge" => counts[[0, 5, 1]] = i64::MAX,
        _ => {}
    }
    let bad_shape = Array3::<i64>::from_elem((1, t, 3), 2);
    let bc = match what {
        "both" => BlockCounts::from_parts(Some(2), Some(counts.view())).map(|_| ()),
        _ => Ok(()),
    };
    if what == "both" {
        return expect(bc, kind, arg);
    }
    let counts_arg = match what {
        "counts_shape" => Some(BlockCounts::Tensor(bad_shape.view())),
        "counts_neg" | "tensor_mslk" | "tensor_huge" => Some(BlockCounts::Tensor(counts.view())),
        "int0" => Some(BlockCounts::Int(0)),
        "int_huge" => Some(BlockCounts::Int(i64::MAX)),
        _ => None,
    };
    let mode = if mslk {
        SelectMode::MslkTileMean
    } else {
        SelectMode::Fla
    };
    let qt = match what {
        "qt_len" => 48,
        "qt0" => 0,
        _ => 32,
    };
    expect(
        nsa_select_blocks(
            q.view(),
            kc.view(),
            counts_arg,
            None,
            16,
            None,
            mode,
            qt,
            what != "causal_fla",
        ),
        kind,
        arg,
    );
}

#[test]
fn tile_error_names_the_sequence() {
    let q = t4([1, 96, 2, 8]);
    let kc = t4([1, 6, 1, 8]);
    let e = nsa_select_blocks(
        q.view(),
        kc.view(),
        None,
        Some(&[0, 64, 96]),
        16,
        None,
        SelectMode::MslkTileMean,
        64,
        true,
    )
    .unwrap_err();
    assert!(e.got.contains("sequence 1 has length 32"), "{e}");
}

// ---- §5 nsa_selection_attention

#[rstest]
#[case("k_T", Shape, "k")]
#[case("k_K", Shape, "k")]
#[case("v_H", Shape, "v")]
#[case("idx", Shape, "block_indices")]
#[case("counts_shape", Shape, "block_counts")]
#[case("counts_big", Index, "block_counts")]
#[case("counts_neg", Index, "block_counts")]
#[case("int_small", Param, "block_counts")]
#[case("hq", Shape, "q")]
#[case("scale", Param, "scale")]
#[case("bs", Param, "block_size")]
#[case("cu", CuSeqlens, "cu_seqlens")]
fn selection_attention_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    let q = t4([1, 32, if what == "hq" { 3 } else { 4 }, 8]);
    let k = t4(match what {
        "k_T" => [1, 31, 2, 8],
        "k_K" => [1, 32, 2, 7],
        _ => [1, 32, 2, 8],
    });
    let v = t4(if what == "v_H" {
        [1, 32, 1, 8]
    } else {
        [1, 32, 2, 8]
    });
    let idx = Array4::<i64>::zeros(if what == "idx" {
        (1, 32, 1, 3)
    } else {
        (1, 32, 2, 3)
    });
    let mut counts = Array3::<i64>::from_elem(
        if what == "counts_shape" {
            (1, 32, 1)
        } else {
            (1, 32, 2)
        },
        1,
    );
    match what {
        "counts_big" => counts[[0, 3, 0]] = 4,
        "counts_neg" => counts[[0, 3, 0]] = -1,
        _ => {}
    }
    let bc = match what {
        "counts_shape" | "counts_big" | "counts_neg" => Some(BlockCounts::Tensor(counts.view())),
        "int_small" => Some(BlockCounts::Int(2)),
        _ => Some(BlockCounts::Int(3)),
    };
    let cu = [1i64, 32];
    expect(
        nsa_selection_attention(
            q.view(),
            k.view(),
            v.view(),
            idx.view(),
            bc,
            (what == "cu").then_some(&cu[..]),
            if what == "bs" { 0 } else { 16 },
            (what == "scale").then_some(0.0),
        ),
        kind,
        arg,
    );
}

// ---- §6 nsa_gate_combine

#[rstest]
#[case("o_slc", Shape, "o_slc")]
#[case("o_swa", Shape, "o_swa")]
#[case("w_and_g", Missing, "gate_proj_weight")]
#[case("some_g", Missing, "g_swa")]
#[case("w_no_q", Missing, "q")]
#[case("w_shape", Shape, "gate_proj_weight")]
#[case("q_shape", Shape, "q")]
#[case("g_shape", Shape, "g_slc")]
fn gate_combine_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    let o = t4([1, 8, 4, 6]);
    let o_slc = t4(if what == "o_slc" {
        [1, 8, 4, 5]
    } else {
        [1, 8, 4, 6]
    });
    let o_swa = t4(if what == "o_swa" {
        [1, 7, 4, 6]
    } else {
        [1, 8, 4, 6]
    });
    let q = t4(if what == "q_shape" {
        [1, 8, 2, 5]
    } else {
        [1, 8, 4, 5]
    });
    let w = t3(if what == "w_shape" {
        [4, 2, 5]
    } else {
        [4, 3, 5]
    });
    let g = t3([1, 8, 4]);
    let g_bad = t3([1, 8, 3]);
    let gates = match what {
        "w_and_g" => Gates::from_parts(Some(q.view()), Some(w.view()), [Some(g.view()); 3]),
        "some_g" => Gates::from_parts(None, None, [Some(g.view()), Some(g.view()), None]),
        "w_no_q" => Gates::from_parts(None, Some(w.view()), [None; 3]),
        "g_shape" => Gates::from_parts(
            None,
            None,
            [Some(g.view()), Some(g_bad.view()), Some(g.view())],
        ),
        _ => Gates::from_parts(Some(q.view()), Some(w.view()), [None; 3]),
    };
    let r = gates.and_then(|gates| nsa_gate_combine(o.view(), o_slc.view(), o_swa.view(), gates));
    expect(r, kind, arg);
}

// ---- §7 nsa_fwd

#[rstest]
#[case("neither", Missing, "block_indices")]
#[case("no_g_swa", Missing, "g_swa")]
#[case("w_neg", Param, "window_size")]
#[case("g_shape", Shape, "g_cmp")]
#[case("int_small", Param, "block_counts")]
#[case("int0", Param, "block_counts")]
#[case("k_T", Shape, "k")]
#[case("bs", Param, "block_size")]
#[case("cu", CuSeqlens, "cu_seqlens")]
fn fwd_errors(#[case] what: &str, #[case] kind: ErrorKind, #[case] arg: &str) {
    let q = t4([1, 32, 16, 8]);
    let k = t4(if what == "k_T" {
        [1, 30, 1, 8]
    } else {
        [1, 32, 1, 8]
    });
    let v = t4([1, 32, 1, 8]);
    let g = t3([1, 32, 16]);
    let g_bad = t3([1, 32, 8]);
    let idx = Array4::<i64>::zeros((1, 32, 1, 4));
    let gates = FwdGates {
        g_cmp: match what {
            "neither" | "int_small" => None,
            "g_shape" => Some(g_bad.view()),
            _ => Some(g.view()),
        },
        g_slc: Some(g.view()),
        g_swa: (what != "no_g_swa").then(|| g.view()),
    };
    let given = (what == "int_small").then(|| idx.view());
    let bc = match what {
        "int_small" => Some(BlockCounts::Int(2)),
        "int0" => Some(BlockCounts::Int(0)),
        _ => None,
    };
    let cu = [0i64, 40];
    let w = if what == "w_neg" { -1 } else { 8 };
    expect(
        nsa_fwd(
            q.view(),
            k.view(),
            v.view(),
            gates,
            given,
            bc,
            (what == "cu").then_some(&cu[..]),
            if what == "bs" { 6 } else { 16 },
            w,
            None,
        ),
        kind,
        arg,
    );
}

#[test]
fn window_size_below_one_is_refused() {
    let q = t4([1, 8, 2, 4]);
    let k = t4([1, 8, 1, 4]);
    expect(
        window_attention(q.view(), k.view(), k.view(), None, 0, None),
        Param,
        "window_size",
    );
}

/// Zero-sized feature dims and zero heads are refused, never a panic.
#[rstest]
#[case([1, 8, 2, 0], [1, 8, 1, 0], [1, 8, 1, 4], "q")]
#[case([1, 8, 2, 4], [1, 8, 1, 4], [1, 8, 1, 0], "v")]
#[case([1, 8, 2, 4], [1, 8, 0, 4], [1, 8, 0, 4], "k")]
fn degenerate_dims(
    #[case] qs: [usize; 4],
    #[case] ks: [usize; 4],
    #[case] vs: [usize; 4],
    #[case] arg: &str,
) {
    let idx = Array4::<i64>::zeros((1, 8, ks[2], 1));
    let r = nsa_selection_attention(
        t4(qs).view(),
        t4(ks).view(),
        t4(vs).view(),
        idx.view(),
        None,
        None,
        4,
        None,
    );
    expect(r, Shape, arg);
}
