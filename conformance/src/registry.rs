//! The op registry: the families' tables gathered into [`OPS`] (in the order of the spec's files),
//! looking an op up, and binding a case to its op: which inputs it needs and of which kind, its
//! parameters with their defaults, which outputs and tolerances it may name.
//!
//! Adding an op is one entry in its family's `OPS` table under [`crate::ops`] (with its runners
//! beside it); adding a family is one more table in `FAMILIES`.

use crate::case::Case;
use crate::error::{Problem, Result};
use crate::ops;
use crate::params::Params;
use crate::spec::{InputKind, OpSpec};
use std::path::Path;

/// The families' tables, in the order of the spec's files.
const FAMILIES: &[&[OpSpec]] = &[
    ops::scans::OPS,
    ops::gates::OPS,
    ops::decode::OPS,
    ops::delta::OPS,
    ops::nsa::OPS,
];

const fn count(families: &[&[OpSpec]]) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < families.len() {
        n += families[i].len();
        i += 1;
    }
    n
}

/// The families' tables as one array (a `const fn`, so [`OPS`] stays a plain static slice).
const fn gather<const N: usize>(families: &[&[OpSpec]]) -> [OpSpec; N] {
    let mut all = [families[0][0]; N];
    let (mut n, mut f) = (0, 0);
    while f < families.len() {
        let mut i = 0;
        while i < families[f].len() {
            all[n] = families[f][i];
            n += 1;
            i += 1;
        }
        f += 1;
    }
    all
}

const ALL: [OpSpec; count(FAMILIES)] = gather(FAMILIES);

/// Every op of the spec, in the order of its files.
pub static OPS: &[OpSpec] = &ALL;

/// Per op, the outputs whose candidate values the reference takes as inputs before computing the
/// other outputs (`conformance/spec/ops-nsa.md` §7: `nsa_fwd`'s `o` uses the candidate's
/// `block_indices`).
const TAKEN: &[&[(&str, &str)]] = &[ops::nsa::TAKEN_FROM_CANDIDATE];

/// The outputs of op `id` that the reference takes from the candidate (see `TAKEN`).
pub fn taken_from_candidate(id: &str) -> Vec<&'static str> {
    TAKEN
        .iter()
        .flat_map(|t| t.iter())
        .filter(|(op, _)| *op == id)
        .map(|(_, out)| *out)
        .collect()
}

/// The registry entry of op `id`.
pub fn find(id: &str) -> Option<&'static OpSpec> {
    OPS.iter().find(|o| o.id == id)
}

/// Whether GPU runners can run here: some op has one and a GPU answers at run time (the
/// driver, NVRTC and a device are probed once per process); `Err` says why not.
pub fn gpu_status() -> std::result::Result<(), String> {
    if !OPS.iter().any(|o| o.gpu.is_some()) {
        return Err("this build of attn-conform has no GPU runner for any op".into());
    }
    ops::device::status()
}

/// The registry entry of the case's op.
pub fn spec_of(case: &Case) -> Result<&'static OpSpec, Problem> {
    find(&case.op).ok_or_else(|| Problem::UnknownOp(case.op.clone()))
}

/// The case's validated parameters, its op's defaults filled in.
pub fn params_of(case: &Case) -> Result<Params, Problem> {
    Params::resolve(&case.op, spec_of(case)?.params, &case.params)
}

/// Checks everything the registry can tell about a case without running its op: known op,
/// parameters, tolerance keys, input and output names, required inputs, index-vs-float input
/// dtypes and input ranks (from each input's layout); returns the parameters. (The file format itself was checked when the case was read;
/// shape agreement is the reference's to check when the op runs.)
pub fn check(case: &Case) -> Result<Params, Problem> {
    let spec = spec_of(case)?;
    let params = params_of(case)?;
    if let Some(name) = case.tolerance.keys().find(|n| !spec.compares(n)) {
        return Err(Problem::BadTolerance(format!(
            "`{name}` is not an output of `{}` (outputs: {})",
            case.op,
            spec.output_names()
        )));
    }
    for (name, t) in &case.inputs {
        let Some(input) = spec.input(name) else {
            return Err(Problem::UnexpectedTensor {
                name: format!("in.{name}"),
                why: format!("inputs of `{}`: {}", case.op, spec.input_names()),
            });
        };
        let (ok, expected) = match input.kind {
            InputKind::Float => (t.dtype().is_float(), "a float dtype"),
            InputKind::Index => (!t.dtype().is_float(), "int32 or int64"),
        };
        if !ok {
            return Err(
                attn_reference::Error::dtype(name.as_str(), expected, t.dtype().name()).into(),
            );
        }
        let ranks = input.ranks();
        if !ranks.is_empty() && !ranks.contains(&t.shape().len()) {
            let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
            let expected = format!("rank {} {}", ranks.join(" or "), input.shape);
            return Err(attn_reference::Error::shape(name.as_str(), expected, t.shape()).into());
        }
    }
    if let Some(missing) = spec
        .inputs
        .iter()
        .find(|i| i.required && !case.inputs.contains_key(i.name))
    {
        return Err(Problem::MissingInput(missing.name.into()));
    }
    if let Some(name) = case.outputs.keys().find(|n| spec.output(n).is_none()) {
        return Err(Problem::UnexpectedTensor {
            name: format!("out.{name}"),
            why: format!("outputs of `{}`: {}", case.op, spec.output_names()),
        });
    }
    Ok(params)
}

/// Reads a case file and [`check`]s it against its op; every error names the file.
pub fn read(path: impl AsRef<Path>) -> Result<Case> {
    let path = path.as_ref();
    let case = Case::read(path)?;
    check(&case).map_err(|p| p.at(path))?;
    Ok(case)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_found() {
        for op in OPS {
            assert_eq!(OPS.iter().filter(|o| o.id == op.id).count(), 1, "{}", op.id);
            assert!(std::ptr::eq(find(op.id).unwrap(), op));
        }
        assert!(find("no_such_op").is_none());
    }

    #[test]
    fn every_default_parses_and_has_its_type() {
        for op in OPS {
            for p in op.params {
                let d = p
                    .default_value()
                    .unwrap_or_else(|e| panic!("{}.{}: {e}", op.id, p.name));
                if let Some(v) = d {
                    assert!(p.ty.accepts(&v), "{}.{}", op.id, p.name);
                }
            }
        }
    }

    #[test]
    fn names_are_unique_within_an_op() {
        for op in OPS {
            let mut n: Vec<_> = op.inputs.iter().map(|i| i.name).collect();
            n.sort();
            n.dedup();
            assert_eq!(n.len(), op.inputs.len(), "{}", op.id);
            let mut p: Vec<_> = op.params.iter().map(|i| i.name).collect();
            p.sort();
            p.dedup();
            assert_eq!(p.len(), op.params.len(), "{}", op.id);
        }
    }
}
