//! Bad input is refused before any launch, with an error naming the argument. These checks
//! work from shapes and dtypes alone, so they run without a GPU.

use attn_gpu::cumsum::check_cumsum;
use attn_gpu::gate::check_kda_gate;
use attn_gpu::seq_scan::check_seq_scan;
use attn_reference::{Dtype, ErrorKind};

#[test]
fn cumsum_refuses_bad_dim_dtype_and_output() {
    let s = [2usize, 3, 4];
    let e = check_cumsum(&s, Dtype::F32, 3, &s, Dtype::F32).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Param, "dim"));
    let e = check_cumsum(&s, Dtype::F32, -4, &s, Dtype::F32).unwrap_err();
    assert_eq!(e.arg, "dim");
    let e = check_cumsum(&s, Dtype::I32, 0, &s, Dtype::F32).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Dtype, "x"));
    let e = check_cumsum(&s, Dtype::F32, 0, &s, Dtype::BF16).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Dtype, "output_dtype"));
    let e = check_cumsum(&s, Dtype::F32, 0, &[2, 3], Dtype::F32).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "y"));
    let e = check_cumsum(&[], Dtype::F32, 0, &[], Dtype::F32).unwrap_err();
    assert_eq!(e.arg, "x");
    // the accepted forms: every dim, negative dims, fp32/fp64/own output dtypes
    for dim in -3..3 {
        for out in [Dtype::F32, Dtype::F64, Dtype::BF16] {
            let p = check_cumsum(&s, Dtype::BF16, dim, &s, out).unwrap();
            assert_eq!(p.outer * p.len * p.inner, 24);
        }
    }
}

#[test]
fn seq_scans_refuse_bad_rank_chunk_size_and_cu_seqlens() {
    let g = [1usize, 10, 2, 4];
    let ok = |cu: Option<&[i64]>, cs| check_seq_scan(&g, Dtype::BF16, cu, cs, &g, Dtype::F32);
    assert!(ok(Some(&[0, 3, 10]), Some(64)).is_ok());
    assert!(ok(None, None).is_ok());
    assert_eq!(ok(None, Some(48)).unwrap_err().arg, "chunk_size");
    assert_eq!(ok(None, Some(0)).unwrap_err().arg, "chunk_size");
    for cu in [&[1i64, 10][..], &[0, 5, 3, 10], &[0, 9], &[0]] {
        let e = ok(Some(cu), Some(16)).unwrap_err();
        assert_eq!(
            (e.kind, e.arg.as_str()),
            (ErrorKind::CuSeqlens, "cu_seqlens"),
            "{cu:?}"
        );
    }
    let g2 = [2usize, 10, 2];
    let e = check_seq_scan(&g2, Dtype::F32, Some(&[0, 10]), Some(16), &g2, Dtype::F32).unwrap_err();
    assert_eq!(e.arg, "cu_seqlens");
    for bad in [&[10usize, 2][..], &[1, 2, 3, 4, 5]] {
        let e = check_seq_scan(bad, Dtype::F32, None, Some(16), bad, Dtype::F32).unwrap_err();
        assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "g"));
    }
    let e = check_seq_scan(&g, Dtype::I64, None, None, &g, Dtype::F32).unwrap_err();
    assert_eq!(e.arg, "g");
    let e = check_seq_scan(&g, Dtype::F32, None, None, &[1, 10, 2, 5], Dtype::F32).unwrap_err();
    assert_eq!(e.arg, "o");
}

#[test]
fn kda_gate_refuses_bad_side_inputs() {
    let g = [1usize, 5, 3, 4];
    let a = [3usize];
    let d = [12usize];
    assert_eq!(
        check_kda_gate(
            &g,
            Dtype::BF16,
            Some((&a, Dtype::F32)),
            Some((&d, Dtype::F32)),
            None
        )
        .unwrap(),
        (1, 5, 3, 4)
    );
    let e = check_kda_gate(&g, Dtype::F32, None, None, None).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Missing, "A_log"));
    assert!(check_kda_gate(&g, Dtype::F32, None, None, Some(-1.0)).is_ok());
    let e = check_kda_gate(&g, Dtype::F32, Some((&[4], Dtype::F32)), None, None).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "A_log"));
    let e = check_kda_gate(
        &g,
        Dtype::F32,
        Some((&a, Dtype::F32)),
        Some((&[11], Dtype::F32)),
        None,
    )
    .unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "dt_bias"));
    let e = check_kda_gate(&g, Dtype::F32, Some((&[3, 1], Dtype::F32)), None, None).unwrap_err();
    assert_eq!(e.arg, "A_log");
    let e = check_kda_gate(&g, Dtype::F32, Some((&a, Dtype::I32)), None, None).unwrap_err();
    assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Dtype, "A_log"));
    let e =
        check_kda_gate(&[1, 5, 12], Dtype::F32, Some((&a, Dtype::F32)), None, None).unwrap_err();
    assert_eq!(e.arg, "g");
}
