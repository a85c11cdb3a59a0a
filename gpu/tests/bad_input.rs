//! Bad input is refused before any launch, with an error naming the argument. These checks
//! work from shapes and dtypes alone, so they run without a GPU.

mod common;

use attn_gpu::cumsum::check_cumsum;
use attn_gpu::gate::check_kda_gate;
use attn_gpu::seq_scan::check_seq_scan;
use attn_reference::{Dtype, ErrorKind};

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

mod decode {
    use attn_gpu::decode::check::{check_decode_attention, check_kv_cache_update, MAX_GRID_YZ};
    use attn_gpu::decode::{flag_error, split_plan, CacheLayout, MAX_SPLITS};
    use attn_reference::{Dtype, ErrorKind};

    const BF: Dtype = Dtype::BF16;
    const I32: Dtype = Dtype::I32;

    /// `decode_attention` with q `[2, 1, 8, 64]` over bshd caches `[3, 100, 2, 64]`, with one
    /// argument replaced: `(arg, shape, dtype)`.
    fn attention(arg: &str, shape: &[usize], dtype: Dtype) -> attn_reference::Result<()> {
        let mut t: Vec<(&str, Vec<usize>, Dtype)> = vec![
            ("q", vec![2, 1, 8, 64], BF),
            ("k_cache", vec![3, 100, 2, 64], BF),
            ("v_cache", vec![3, 100, 2, 64], BF),
            ("cache_seqlens", vec![2], I32),
            ("cache_batch_idx", vec![2], I32),
        ];
        for x in t.iter_mut().filter(|x| x.0 == arg) {
            (x.1, x.2) = (shape.to_vec(), dtype);
        }
        let m = |i: usize| (t[i].1.as_slice(), t[i].2);
        check_decode_attention(m(0), m(1), m(2), m(3), Some(m(4)), CacheLayout::Bshd).map(|_| ())
    }

    pub fn decode_attention_refuses_bad_shapes_and_dtypes() {
        assert!(attention("q", &[2, 1, 8, 64], BF).is_ok());
        let cases: [(&str, &[usize], Dtype, ErrorKind, &str); 11] = [
            ("q", &[2, 1, 8, 32], BF, ErrorKind::Shape, "q"), // D differs from the caches
            ("q", &[2, 1, 7, 64], BF, ErrorKind::Shape, "q"), // H % H_kv != 0
            ("q", &[2, 8, 64], BF, ErrorKind::Shape, "q"),
            ("q", &[2, 1, 8, 64], Dtype::I32, ErrorKind::Dtype, "q"),
            (
                "k_cache",
                &[3, 100, 2, 64],
                Dtype::F16,
                ErrorKind::Dtype,
                "k_cache",
            ),
            ("v_cache", &[3, 99, 2, 64], BF, ErrorKind::Shape, "v_cache"),
            (
                "v_cache",
                &[3, 100, 2, 64],
                Dtype::F32,
                ErrorKind::Dtype,
                "v_cache",
            ),
            (
                "cache_seqlens",
                &[3],
                I32,
                ErrorKind::Shape,
                "cache_seqlens",
            ),
            (
                "cache_seqlens",
                &[2],
                Dtype::I64,
                ErrorKind::Dtype,
                "cache_seqlens",
            ),
            (
                "cache_batch_idx",
                &[1],
                I32,
                ErrorKind::Shape,
                "cache_batch_idx",
            ),
            (
                "cache_batch_idx",
                &[2],
                Dtype::F32,
                ErrorKind::Dtype,
                "cache_batch_idx",
            ),
        ];
        for (arg, shape, dtype, kind, named) in cases {
            let e = attention(arg, shape, dtype).unwrap_err();
            assert_eq!(
                (e.kind, e.arg.as_str()),
                (kind, named),
                "{arg} {shape:?} {dtype}"
            );
        }
        // D > 256 with matching caches
        let q = [1usize, 1, 2, 320];
        let c = [1usize, 10, 2, 320];
        let e = check_decode_attention(
            (&q, BF),
            (&c, BF),
            (&c, BF),
            (&[1], I32),
            None,
            CacheLayout::Bshd,
        )
        .unwrap_err();
        assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Shape, "q"));
        // more batch rows than the grid takes
        let b = MAX_GRID_YZ + 1;
        let (q, c) = ([b, 1, 1, 8], [b, 4, 1, 8]);
        let e = check_decode_attention(
            (&q, BF),
            (&c, BF),
            (&c, BF),
            (&[b], I32),
            None,
            CacheLayout::Bhsd,
        )
        .unwrap_err();
        assert_eq!(e.arg, "q");
    }

    pub fn kv_cache_update_refuses_bad_shapes_and_dtypes() {
        let (kc, k) = ([3usize, 2, 16, 8], [2usize, 4, 2, 8]); // bhsd: H_kv 2, S 16
        let ok = |k_shape: &[usize], v_dtype: Dtype, sl: (&[usize], Dtype), layout| {
            check_kv_cache_update(
                (&kc, BF),
                (&kc, BF),
                (k_shape, BF),
                (k_shape, v_dtype),
                sl,
                None,
                layout,
            )
        };
        let p = ok(&k, BF, (&[2], I32), CacheLayout::Bhsd).unwrap();
        assert_eq!((p.b, p.s, p.h_kv, p.l), (2, 16, 2, 4));
        type Case<'a> = (
            &'a [usize],
            Dtype,
            (&'a [usize], Dtype),
            CacheLayout,
            &'a str,
        );
        let cases: [Case; 5] = [
            (&[2, 17, 2, 8], BF, (&[2], I32), CacheLayout::Bhsd, "k"), // L_new > S
            (&[2, 4, 3, 8], BF, (&[2], I32), CacheLayout::Bhsd, "k"),  // H_kv differs
            (&k, Dtype::F16, (&[2], I32), CacheLayout::Bhsd, "v"),
            (
                &k,
                BF,
                (&[2], Dtype::I64),
                CacheLayout::Bhsd,
                "cache_seqlens",
            ),
            (&k, BF, (&[2], I32), CacheLayout::Bshd, "k"), // bshd reads S = 2 < L_new
        ];
        for (k_shape, v_dtype, sl, layout, named) in cases {
            let e = ok(k_shape, v_dtype, sl, layout).unwrap_err();
            assert_eq!(e.arg, named, "{k_shape:?} {v_dtype} {sl:?} {layout:?}");
        }
    }

    pub fn split_plan_covers_the_cache_from_shapes_alone() {
        for sm in [1usize, 78, 132] {
            for pairs in [1usize, 8, 128, 512, 4096] {
                for s in [0usize, 1, 127, 128, 129, 4096, 8192, 32768, 1 << 20] {
                    let (n, chunk) = split_plan(sm, pairs, s);
                    assert!(
                        n * chunk >= s && (1..=MAX_SPLITS).contains(&n),
                        "{sm} {pairs} {s}"
                    );
                    assert!(
                        n == 1 || (n - 1) * chunk < s,
                        "no empty split: {sm} {pairs} {s}"
                    );
                    assert_eq!(chunk % 128, 0, "chunk {chunk}");
                }
            }
        }
        // one full row of 4096 keys over 8 KV heads spreads over the GPU; short rows stay whole
        let (n, chunk) = split_plan(132, 8, 4096);
        assert!(n >= 8 && chunk == 128, "({n}, {chunk})");
        // a full serving cache (64 rows x 8 KV heads x 32768 keys) runs as short blocks
        let (n, chunk) = split_plan(132, 512, 32768);
        assert!(chunk <= 2048 && n * chunk >= 32768, "({n}, {chunk})");
    }

    pub fn device_flag_words_name_the_argument() {
        assert!(flag_error(0).is_none());
        for (word, arg) in [
            (1, "cache_seqlens"),
            (2, "cache_batch_idx"),
            (4, "cache_batch_idx"),
            (7, "cache_seqlens"),
        ] {
            let e = flag_error(word).unwrap();
            assert_eq!((e.kind, e.arg.as_str()), (ErrorKind::Index, arg), "{word}");
        }
    }
}

mod delta_rule {
    use attn_gpu::delta::{check_fwd_h, check_fwd_h_merge, check_fwd_h_pre_scan, FwdHMeta};
    use attn_reference::delta::{FwdHMergeParams, FwdHParams, FwdHPreScanParams};
    use attn_reference::{Dtype, ErrorKind};

    const B16: Dtype = Dtype::BF16;

    /// A valid bf16 call: B = 1, T = 10, H = 2, HV = 4, K = 8, V = 6, with both gates and a state.
    fn ok_meta<'a>(
        k: &'a [usize],
        w: &'a [usize],
        u: &'a [usize],
        g: &'a [usize],
        gk: &'a [usize],
        h0: &'a [usize],
    ) -> FwdHMeta<'a> {
        FwdHMeta {
            k: (k, B16),
            w: (w, B16),
            u: (u, B16),
            g: Some((g, Dtype::F32)),
            gk: Some((gk, Dtype::F32)),
            initial_state: Some((h0, Dtype::F32)),
        }
    }

    fn err(meta: &FwdHMeta<'_>, cu: Option<&[i64]>, p: &FwdHParams) -> (ErrorKind, String) {
        let e = check_fwd_h(meta, cu, p).unwrap_err();
        (e.kind, e.arg)
    }

    pub fn fwd_h_refuses_every_spec_bad_input_by_name() {
        let (k, w, u) = ([1usize, 10, 2, 8], [1usize, 10, 4, 8], [1usize, 10, 4, 6]);
        let (g, gk, h0) = ([1usize, 10, 4], [1usize, 10, 4, 8], [2usize, 4, 8, 6]);
        let p = FwdHParams::default();
        let cu: &[i64] = &[0, 4, 10];
        let base = ok_meta(&k, &w, &u, &g, &gk, &h0);
        let geo = check_fwd_h(&base, Some(cu), &p).unwrap();
        assert_eq!((geo.n(), geo.hv, geo.k, geo.v), (2, 4, 8, 6));
        let shape = |arg: &str| (ErrorKind::Shape, arg.to_string());
        // ranks and dimensions
        assert_eq!(
            err(
                &FwdHMeta {
                    k: (&[1, 10, 8], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("k")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    w: (&[1, 10, 4, 7], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("w")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    u: (&[1, 9, 4, 6], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("u")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    u: (&[1, 10, 3, 6], B16),
                    w: (&[1, 10, 3, 8], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("u")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    u: (&[1, 10, 4, 0], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("u")
        );
        let big = [1usize, 10, 2, 257];
        assert_eq!(
            err(
                &FwdHMeta {
                    k: (&big, B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("k")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    k: (&[0, 10, 2, 8], B16),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("k")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    g: Some((&[1, 10, 2], Dtype::F32)),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("g")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    gk: Some((&[1, 10, 4, 7], Dtype::F32)),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("gk")
        );
        assert_eq!(
            err(
                &FwdHMeta {
                    initial_state: Some((&[1, 4, 8, 6], Dtype::F32)),
                    ..base
                },
                Some(cu),
                &p
            ),
            shape("initial_state")
        );
        // the state layout follows state_v_first
        let vf = FwdHParams {
            state_v_first: true,
            ..p
        };
        assert_eq!(err(&base, Some(cu), &vf), shape("initial_state"));
        assert!(check_fwd_h(
            &FwdHMeta {
                initial_state: Some((&[2, 4, 6, 8], Dtype::F32)),
                ..base
            },
            Some(cu),
            &vf
        )
        .is_ok());
        // chunk_size and cu_seqlens
        for cs in [0i64, 8, 48, 128] {
            let e = check_fwd_h(
                &base,
                Some(cu),
                &FwdHParams {
                    chunk_size: cs,
                    ..p
                },
            )
            .unwrap_err();
            assert_eq!(e.arg, "chunk_size", "{cs}");
        }
        for bad in [&[1i64, 10][..], &[0, 5, 3, 10], &[0, 9], &[0]] {
            let e = check_fwd_h(&base, Some(bad), &p).unwrap_err();
            assert_eq!(
                (e.kind, e.arg.as_str()),
                (ErrorKind::CuSeqlens, "cu_seqlens"),
                "{bad:?}"
            );
        }
        let b2 = ([2usize, 10, 2, 8], [2usize, 10, 4, 8], [2usize, 10, 4, 6]);
        let m2 = FwdHMeta {
            k: (&b2.0, B16),
            w: (&b2.1, B16),
            u: (&b2.2, B16),
            g: None,
            gk: None,
            initial_state: None,
        };
        assert_eq!(
            check_fwd_h(&m2, Some(&[0, 10]), &p).unwrap_err().arg,
            "cu_seqlens"
        );
        assert!(check_fwd_h(&m2, None, &p).is_ok());
        // dtypes: main data one float dtype (float64 too), float gates and states
        let dt = |m: FwdHMeta<'_>| {
            let e = check_fwd_h(&m, Some(cu), &p).unwrap_err();
            (e.kind, e.arg)
        };
        let dtype = |arg: &str| (ErrorKind::Dtype, arg.to_string());
        assert_eq!(
            dt(FwdHMeta {
                w: (&w, Dtype::F16),
                ..base
            }),
            dtype("w")
        );
        let f64_main = FwdHMeta {
            k: (&k, Dtype::F64),
            w: (&w, Dtype::F64),
            u: (&u, Dtype::F64),
            ..base
        };
        assert!(check_fwd_h(&f64_main, Some(cu), &p).is_ok());
        assert_eq!(
            dt(FwdHMeta {
                k: (&k, Dtype::I32),
                ..base
            }),
            dtype("k")
        );
        assert_eq!(
            dt(FwdHMeta {
                g: Some((&g, Dtype::I64)),
                ..base
            }),
            dtype("g")
        );
        assert_eq!(
            dt(FwdHMeta {
                gk: Some((&gk, Dtype::I32)),
                ..base
            }),
            dtype("gk")
        );
        assert_eq!(
            dt(FwdHMeta {
                initial_state: Some((&h0, Dtype::I32)),
                ..base
            }),
            dtype("initial_state")
        );
        // T = 0 and empty sequences are valid
        let z = ([1usize, 0, 2, 8], [1usize, 0, 4, 8], [1usize, 0, 4, 6]);
        let mz = FwdHMeta {
            k: (&z.0, B16),
            w: (&z.1, B16),
            u: (&z.2, B16),
            g: None,
            gk: None,
            initial_state: None,
        };
        assert!(check_fwd_h(&mz, Some(&[0, 0, 0]), &p).is_ok());
    }

    pub fn pre_scan_refuses_a_state_and_bad_shapes() {
        let (k, w, u) = ([1usize, 10, 2, 8], [1usize, 10, 4, 8], [1usize, 10, 4, 6]);
        let (g, gk, h0) = ([1usize, 10, 4], [1usize, 10, 4, 8], [2usize, 4, 8, 6]);
        let p = FwdHPreScanParams::default();
        let base = ok_meta(&k, &w, &u, &g, &gk, &h0);
        let e = check_fwd_h_pre_scan(&base, Some(&[0, 4, 10]), &p).unwrap_err();
        assert_eq!(e.arg, "initial_state");
        let ok = FwdHMeta {
            initial_state: None,
            ..base
        };
        assert!(check_fwd_h_pre_scan(&ok, Some(&[0, 4, 10]), &p).is_ok());
        let e = check_fwd_h_pre_scan(
            &FwdHMeta {
                w: (&[1, 10, 4, 9], B16),
                ..ok
            },
            None,
            &p,
        )
        .unwrap_err();
        assert_eq!(e.arg, "w");
        let e =
            check_fwd_h_pre_scan(&ok, None, &FwdHPreScanParams { chunk_size: 100 }).unwrap_err();
        assert_eq!(e.arg, "chunk_size");
        let e = check_fwd_h_pre_scan(&ok, Some(&[0, 11]), &p).unwrap_err();
        assert_eq!(e.arg, "cu_seqlens");
    }

    pub fn merge_refuses_bad_hm_offsets_and_states() {
        let hm = [5usize, 2, 8, 14];
        let p = FwdHMergeParams::default();
        let f = Dtype::F32;
        let plan = check_fwd_h_merge((&hm, f), Some((&[2, 2, 8, 6], f)), &[0, 2, 5], &p).unwrap();
        assert_eq!((plan.s, plan.n, plan.hv, plan.k, plan.v), (5, 2, 2, 8, 6));
        let arg = |r: attn_reference::Result<_>| r.unwrap_err().arg;
        assert_eq!(
            arg(check_fwd_h_merge((&[5, 2, 8], f), None, &[0, 5], &p)),
            "hm"
        );
        assert_eq!(
            arg(check_fwd_h_merge((&[5, 2, 8, 8], f), None, &[0, 5], &p)),
            "hm"
        );
        assert!(check_fwd_h_merge((&hm, Dtype::F64), None, &[0, 5], &p).is_ok());
        assert_eq!(
            arg(check_fwd_h_merge((&hm, Dtype::BF16), None, &[0, 5], &p)),
            "hm"
        );
        for bad in [&[0i64][..], &[1, 5], &[0, 3, 2, 5], &[0, 4]] {
            assert_eq!(
                arg(check_fwd_h_merge((&hm, f), None, bad, &p)),
                "subseq_offsets",
                "{bad:?}"
            );
        }
        assert_eq!(
            arg(check_fwd_h_merge(
                (&hm, f),
                Some((&[3, 2, 8, 6], f)),
                &[0, 2, 5],
                &p
            )),
            "initial_state"
        );
        let vf = FwdHMergeParams {
            state_v_first: true,
            ..p
        };
        assert_eq!(
            arg(check_fwd_h_merge(
                (&hm, f),
                Some((&[2, 2, 8, 6], f)),
                &[0, 2, 5],
                &vf
            )),
            "initial_state"
        );
        assert!(check_fwd_h_merge((&hm, f), Some((&[2, 2, 6, 8], f)), &[0, 2, 5], &vf).is_ok());
        assert_eq!(
            arg(check_fwd_h_merge(
                (&hm, f),
                Some((&[2, 2, 8, 6], Dtype::I32)),
                &[0, 2, 5],
                &p
            )),
            "initial_state"
        );
    }
}

gpu_tests!(
    cumsum_refuses_bad_dim_dtype_and_output,
    seq_scans_refuse_bad_rank_chunk_size_and_cu_seqlens,
    kda_gate_refuses_bad_side_inputs,
    decode::decode_attention_refuses_bad_shapes_and_dtypes,
    decode::kv_cache_update_refuses_bad_shapes_and_dtypes,
    decode::split_plan_covers_the_cache_from_shapes_alone,
    decode::device_flag_words_name_the_argument,
    delta_rule::fwd_h_refuses_every_spec_bad_input_by_name,
    delta_rule::pre_scan_refuses_a_state_and_bad_shapes,
    delta_rule::merge_refuses_bad_hm_offsets_and_states
);
