//! The NSA index rule of `conformance/spec/ops-nsa.md` §9, shared by the NSA GPU tests.

use attn_reference::nsa::SelectMode;
use attn_reference::Dtype;
use ndarray::ArrayD;

/// The index rule of `conformance/spec/ops-nsa.md` §9: per row, the valid entries as a set ("fla")
/// or the row exactly (tile mode); a differing row passes when every block of the symmetric
/// difference scores within the band of the row's cut. Returns the rows that passed by the band.
pub fn assert_index_rule(
    what: &str,
    got: &ArrayD<i32>,
    want: &ndarray::Array4<i32>,
    scores: &ndarray::Array4<f64>,
    mode: SelectMode,
    delta: f64,
) -> usize {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let s = want.shape()[3];
    let mut banded = 0;
    let rows = got.len() / s.max(1);
    for (i, (g, w)) in got
        .as_slice()
        .unwrap()
        .chunks(s.max(1))
        .zip(want.as_slice().unwrap().chunks(s.max(1)))
        .enumerate()
        .take(rows)
    {
        let (mut gs, mut ws) = (g.to_vec(), w.to_vec());
        if mode == SelectMode::Fla {
            gs.sort_unstable();
            ws.sort_unstable();
        }
        if gs == ws {
            continue;
        }
        let sc = scores.as_slice().unwrap();
        let width = scores.shape()[3];
        let score = |c: i32| sc[i * width + c as usize];
        let valid = |r: &[i32]| r.iter().copied().filter(|&c| c >= 0).collect::<Vec<_>>();
        let cut = valid(&ws)
            .iter()
            .map(|&c| score(c))
            .fold(f64::INFINITY, f64::min);
        let diff: Vec<i32> = valid(&gs)
            .into_iter()
            .filter(|c| !ws.contains(c))
            .chain(valid(&ws).into_iter().filter(|c| !gs.contains(c)))
            .collect();
        let band = match mode {
            SelectMode::Fla => delta * cut,
            SelectMode::MslkTileMean => delta * cut.abs().max(1.0),
        };
        let ok = gs.iter().filter(|&&c| c < 0).count() == ws.iter().filter(|&&c| c < 0).count()
            && diff
                .iter()
                .all(|&c| (c as usize) < width && (score(c) - cut).abs() <= band);
        assert!(ok, "{what}: row {i}: got {g:?}, want {w:?} (cut {cut})");
        banded += 1;
    }
    banded
}

pub fn delta_for(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F64 => 1e-9,
        Dtype::F32 => 1e-4,
        _ => 5e-2,
    }
}
