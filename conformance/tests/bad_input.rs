//! Public helpers of the suite on malformed input: a typed problem naming the tensor, or a
//! value, never a panic (an overflow). One rstest case per bad input.

use attn_conformance::ops::{delta, longest_sequence};
use attn_conformance::{Problem, Rule, Tensor, Tensors};
use attn_reference::{Dtype, DtypeClass};
use ndarray::{ArrayD, IxDyn};
use rstest::rstest;

fn indices(v: &[i64]) -> Tensor {
    Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.to_vec()).unwrap())
}

#[rstest]
#[case::elements_overflow(Dtype::F32, vec![usize::MAX, 2], 0)]
#[case::bytes_overflow(Dtype::F64, vec![usize::MAX / 4], 0)]
#[case::wrong_byte_count(Dtype::I32, vec![2, 3], 23)]
fn from_le_bytes_refuses_naming_the_tensor(
    #[case] dtype: Dtype,
    #[case] shape: Vec<usize>,
    #[case] nbytes: usize,
) {
    let err = Tensor::from_le_bytes("x", dtype, &shape, &vec![0u8; nbytes]).unwrap_err();
    assert!(
        matches!(&err, Problem::BadTensor { name, .. } if name == "x"),
        "{err}"
    );
}

#[rstest]
#[case::inverted(std::ops::Range { start: 5, end: 2 }, vec![2, 0])]
#[case::past_the_end(7..9, vec![2, 0])]
#[case::clamped(1..100, vec![2, 3])]
fn slice_last_clamps(#[case] range: std::ops::Range<usize>, #[case] shape: Vec<usize>) {
    let t = Tensor::F64(ArrayD::zeros(IxDyn(&[2, 4])));
    assert_eq!(t.slice_last(range).shape(), shape.as_slice());
}

/// The threshold helpers read `cu_seqlens` before any validation: extreme values give a rule,
/// not an overflow.
#[rstest]
#[case::extreme(vec![i64::MIN, i64::MAX], i64::MAX as usize)]
#[case::decreasing(vec![0, 9, 3], 9)]
#[case::valid(vec![0, 5000, 5010], 5000)]
fn sequence_lengths_never_overflow(#[case] cu: Vec<i64>, #[case] longest: usize) {
    let inputs = Tensors::from([
        (
            "g".to_string(),
            Tensor::from_f64(&ArrayD::zeros(IxDyn(&[1, 4, 1])), Dtype::BF16),
        ),
        (
            "k".to_string(),
            Tensor::from_f64(&ArrayD::zeros(IxDyn(&[1, 4, 1, 2])), Dtype::BF16),
        ),
        ("cu_seqlens".to_string(), indices(&cu)),
    ]);
    assert_eq!(longest_sequence(&inputs), longest);
    let long = longest > 4096;
    let want = Rule::Threshold(if long { 1e-2 } else { 5e-3 });
    assert_eq!(
        delta::threshold(&inputs, "k", DtypeClass::Half, 5e-3, 1e-2, 1e-5),
        want
    );
}
