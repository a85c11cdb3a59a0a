//! The `attn-conform` commands (`verify`, `run`, `list`, `report`), writing to given streams and
//! returning the exit status: 0 all passed, 1 a comparison failed, 2 an input could not be used.

use crate::case::Case;
use crate::case::Tensors;
use crate::error::{Error, Problem};
use crate::fixtures::{case_files, fixtures_lookup, Manifests};
use crate::listing::{listing, OpListing};
use crate::ops::device::cp_group;
use crate::registry;
use crate::report::{self, Format, Report};
use crate::table;
use crate::verify::{
    context_parallel_ops, reference_case, verify_with_reference, Device, Row, Selection,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const EXIT_PASS: u8 = 0;
pub const EXIT_FAIL: u8 = 1;
pub const EXIT_UNUSABLE: u8 = 2;

/// The output streams of a command.
pub struct Io<'a> {
    pub out: &'a mut dyn Write,
    pub err: &'a mut dyn Write,
}

/// Reads, checks against its manifest, and verifies one case file.
pub fn verify_file(
    path: &Path,
    manifests: &mut Manifests,
    selection: Selection,
) -> Result<(String, Vec<Row>), Error> {
    let (case, rows, _) = verify_file_with_reference(path, manifests, selection, None)?;
    Ok((case.op, rows))
}

/// [`verify_file`], also checking the context-parallel runner over `gpus` GPUs where the op has
/// one ([`verify_with_reference`]), and returning the case and the reference's outputs.
pub fn verify_file_with_reference(
    path: &Path,
    manifests: &mut Manifests,
    selection: Selection,
    gpus: Option<usize>,
) -> Result<(Case, Vec<Row>, Tensors), Error> {
    let bytes = std::fs::read(path).map_err(|e| Problem::Io(e).at(path))?;
    manifests.check(path, &bytes)?;
    let case = Case::from_bytes(path, &bytes)?;
    let (rows, reference) =
        verify_with_reference(&case, selection, gpus).map_err(|p| p.at(path))?;
    Ok((case, rows, reference))
}

/// Writes the reference's outputs for `case` as `<dir>/<op>/<file name>`; returns the path.
/// Refuses to overwrite the case itself, or a file `written` earlier in the same command (two
/// cases of one op with the same file name).
pub fn dump_reference(
    dir: &Path,
    case: &Case,
    reference: Tensors,
    written: &mut BTreeSet<PathBuf>,
) -> Result<PathBuf, Error> {
    let sub = dir.join(&case.op);
    std::fs::create_dir_all(&sub).map_err(|e| Problem::Io(e).at(&sub))?;
    let name = case.path.file_name().map_or_else(
        || std::ffi::OsString::from("case.safetensors"),
        |n| n.to_os_string(),
    );
    let path = sub.join(name);
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&path, &case.path) {
        return Err(Problem::NotWritten("it is the case being verified".into()).at(&path));
    }
    if !written.insert(path.canonicalize().unwrap_or_else(|_| path.clone())) {
        return Err(Problem::NotWritten(format!(
            "the reference of another case of the same name was written there (from {})",
            case.path.display()
        ))
        .at(&path));
    }
    let spec = registry::spec_of(case).map_err(|p| p.at(&case.path))?;
    reference_case(case, spec, reference).write(&path)?;
    Ok(path)
}

/// Refuses `--device gpu` without a GPU (false); says on one line of stderr why no GPU kernel
/// runs under `--device all`, naming the flag only when the user `given` it.
fn gpu_gate(selection: Selection, given: bool, io: &mut Io<'_>) -> bool {
    let Err(why) = registry::gpu_status() else {
        return true;
    };
    match selection {
        Selection::Gpu => {
            let _ = writeln!(io.err, "error: --device gpu: {why}");
            false
        }
        Selection::All if given => {
            let _ = writeln!(
                io.err,
                "note: --device all: no GPU kernel runs ({why}); only the stored outputs are checked"
            );
            true
        }
        Selection::All => {
            let _ = writeln!(
                io.err,
                "note: no GPU kernel runs ({why}); only the stored outputs are checked \
                 (--device cpu checks only them, --device gpu requires a GPU)"
            );
            true
        }
        Selection::Cpu => true,
    }
}

/// The last line of `verify` and `run`: `N passed, M failed, K unusable`.
pub fn summary_line(passed: usize, failed: usize, unusable: usize) -> String {
    format!("{passed} passed, {failed} failed, {unusable} unusable")
}

fn status(unusable: usize, failed: usize) -> u8 {
    if unusable > 0 {
        EXIT_UNUSABLE
    } else if failed > 0 {
        EXIT_FAIL
    } else {
        EXIT_PASS
    }
}

/// Opens the group of `--gpus N` (false, saying why on stderr, when it cannot be opened: `N`
/// above the host's GPUs, no GPU, no NCCL).
fn gpus_gate(gpus: Option<usize>, io: &mut Io<'_>) -> bool {
    let Some(n) = gpus else {
        return true;
    };
    match cp_group(n) {
        Ok(_) => true,
        Err(e) => {
            let _ = writeln!(io.err, "error: --gpus {n}: {e}");
            false
        }
    }
}

/// `verify [--device] [--gpus N] [--json] [--dump-reference DIR] FILE_OR_DIR...`: one row per
/// compared output, the diagnostics of each failure, then `N passed, M failed, K unusable` (on
/// stderr with `--json`, whose stdout is the JSON array of rows); each unusable file's reason is
/// on stderr. `device` is `None` when the user gave no `--device` (then `cpu`). With `gpus`, the
/// context-parallel runner over that many GPUs is a candidate too (rows `gpus=N`); a case of an
/// op without one is reported skipped on stderr and counted on the summary line
/// (`, S skipped (no context-parallel path)`), and no case run that way at all is exit 2. With
/// `dump`, the reference's outputs of every usable case are written there ([`dump_reference`]).
pub fn verify(
    paths: &[PathBuf],
    device: Option<Selection>,
    gpus: Option<usize>,
    json: bool,
    dump: Option<&Path>,
    io: &mut Io<'_>,
) -> u8 {
    let selection = device.unwrap_or(Selection::Cpu);
    let mut unusable = 0;
    let files = match case_files(paths) {
        Ok(f) if f.is_empty() => {
            let _ = writeln!(
                io.err,
                "error: no .safetensors case file under the given paths"
            );
            return EXIT_UNUSABLE;
        }
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(io.err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    let mut manifests = Manifests::default();
    for dir in paths.iter().filter(|p| p.is_dir()) {
        for e in manifests.missing(dir).unwrap_or_else(|e| vec![e]) {
            let _ = writeln!(io.err, "error: {e}");
            unusable += 1;
        }
    }
    if !gpu_gate(selection, device.is_some(), io) || !gpus_gate(gpus, io) {
        return EXIT_UNUSABLE;
    }
    let (mut rows, mut dumped, mut skipped) = (Vec::new(), BTreeSet::new(), 0);
    for f in &files {
        let written = verify_file_with_reference(f, &mut manifests, selection, gpus).and_then(
            |(case, r, reference)| {
                rows.extend(r);
                if let Some(n) = gpus.filter(|_| !context_parallel_ops().contains(&&*case.op)) {
                    skipped += 1;
                    let _ = writeln!(
                        io.err,
                        "skipped: {}: `{}` has no context-parallel path (--gpus {n} runs {}); \
                         only its other candidates were checked",
                        f.display(),
                        case.op,
                        context_parallel_ops().join(", ")
                    );
                }
                dump.map(|dir| dump_reference(dir, &case, reference, &mut dumped))
                    .transpose()
            },
        );
        match written {
            Ok(Some(path)) => {
                let _ = writeln!(io.err, "reference written to {}", path.display());
            }
            Ok(None) => {}
            Err(e) => {
                let _ = writeln!(io.err, "error: {e}");
                unusable += 1;
            }
        }
    }
    let passed = rows.iter().filter(|r| r.pass).count();
    let failed = rows.len() - passed;
    let mut summary = summary_line(passed, failed, unusable);
    if gpus.is_some() {
        summary += &format!(", {skipped} skipped (no context-parallel path)");
    }
    if json {
        let _ = writeln!(
            io.out,
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        let _ = writeln!(io.err, "{summary}");
    } else {
        if !rows.is_empty() {
            let _ = write!(io.out, "{}", rows_table(&rows));
        }
        for r in rows.iter().filter(|r| !r.pass) {
            if let Some(d) = &r.diagnostics {
                let _ = writeln!(io.out, "  {} {} {}: {d}", r.file, r.device, r.output);
            }
        }
        let _ = writeln!(io.out, "{summary}");
    }
    let ran_cp = rows.iter().any(|r| matches!(r.device, Device::Gpus(_)));
    if let Some(n) = gpus.filter(|_| !ran_cp && unusable == 0) {
        let _ = writeln!(
            io.err,
            "error: --gpus {n}: no case was run on the context-parallel path (ops with one: {})",
            context_parallel_ops().join(", ")
        );
        return EXIT_UNUSABLE;
    }
    status(unusable, failed)
}

fn sci(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.3e}")
    }
}

fn threshold(t: Option<f64>) -> String {
    t.map_or("exact".into(), |t| format!("{t:.0e}"))
}

fn rows_table(rows: &[Row]) -> String {
    let header = [
        "file",
        "op",
        "device",
        "output",
        "shape",
        "dtype",
        "max_abs",
        "ratio",
        "threshold",
        "result",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let result = match (&r.reason, r.pass) {
                (_, true) if r.near_ties.is_some_and(|n| n > 0) => {
                    format!(
                        "PASS ({} rows by the near-tie band)",
                        r.near_ties.unwrap_or(0)
                    )
                }
                (_, true) => "PASS".to_string(),
                (Some(why), false) => format!("FAIL ({why})"),
                (None, false) => "FAIL".to_string(),
            };
            vec![
                r.file.clone(),
                r.op.clone(),
                r.device.to_string(),
                r.output.clone(),
                format!("{:?}", r.shape),
                r.dtype.clone(),
                sci(r.max_abs),
                sci(r.ratio),
                threshold(r.threshold),
                result,
            ]
        })
        .collect();
    table::plain(&header, &cells)
}

/// One `run` summary row: the cases of one op on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub op: String,
    pub device: Device,
    pub cases: usize,
    pub passed: usize,
    /// The worst ratio of any compared output, failed or not (the largest `ratio / threshold`;
    /// under the exact rule any difference is worse than every ratio), the threshold it was held
    /// to (`null`: exact) and its file. `NaN` (JSON `null`) when no output could be measured
    /// (each was missing or of the wrong shape): the failures below the table say why.
    pub worst_ratio: f64,
    pub threshold: Option<f64>,
    pub worst_file: String,
}

/// Folds rows into one summary per (op, device); a case passes when all its rows pass.
pub fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut by: BTreeMap<(String, Device), BTreeMap<String, Vec<&Row>>> = BTreeMap::new();
    for r in rows {
        by.entry((r.op.clone(), r.device))
            .or_default()
            .entry(r.file.clone())
            .or_default()
            .push(r);
    }
    by.into_iter()
        .map(|((op, device), files)| {
            // the first of the largest margins, in file order
            let worst = files
                .values()
                .flatten()
                .filter_map(|&r| r.margin().map(|m| (m, r)))
                .fold(None::<(f64, &Row)>, |best, (m, r)| match best {
                    Some((b, _)) if b >= m => best,
                    _ => Some((m, r)),
                })
                .map(|(_, r)| r);
            Summary {
                op,
                device,
                cases: files.len(),
                passed: files
                    .values()
                    .filter(|rs| rs.iter().all(|r| r.pass))
                    .count(),
                worst_ratio: worst.map_or(f64::NAN, |r| r.ratio),
                threshold: worst.and_then(|r| r.threshold),
                worst_file: worst.map_or(String::new(), |r| r.file.clone()),
            }
        })
        .collect()
}

fn progress(n: usize) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(n as u64), ProgressDrawTarget::hidden());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
        pb.set_style(style);
    }
    pb
}

/// `run [--fixtures DIR] [--device] [--json]`: every case under the fixtures folder on every
/// selected device, one summary row per (op, device), then `N passed, M failed, K unusable`
/// (cases); exit 1 on any failure. `device` is `None` when the user gave no `--device` (then
/// `all`).
pub fn run(fixtures: Option<&Path>, device: Option<Selection>, json: bool, io: &mut Io<'_>) -> u8 {
    let selection = device.unwrap_or(Selection::All);
    let (dir, from) = match fixtures_lookup(fixtures) {
        Ok(found) => found,
        Err(e) => {
            let _ = writeln!(io.err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    let mut manifests = Manifests::default();
    let mut unusable = 0;
    for e in manifests.missing(&dir).unwrap_or_else(|e| vec![e]) {
        let _ = writeln!(io.err, "error: {e}");
        unusable += 1;
    }
    let files = match case_files(std::slice::from_ref(&dir)) {
        Ok(f) if f.is_empty() => {
            let _ = writeln!(
                io.err,
                "error: no .safetensors case file under {} ({from}); pass --fixtures DIR or set \
                 ATTN_FIXTURES",
                dir.display()
            );
            return EXIT_UNUSABLE;
        }
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(io.err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    if !gpu_gate(selection, device.is_some(), io) {
        return EXIT_UNUSABLE;
    }
    let pb = progress(files.len());
    let (start, tty) = (Instant::now(), std::io::stderr().is_terminal());
    let mut rows = Vec::new();
    for f in &files {
        if tty && pb.is_hidden() && start.elapsed() > Duration::from_millis(300) {
            pb.set_draw_target(ProgressDrawTarget::stderr());
        }
        pb.set_message(f.display().to_string());
        match verify_file(f, &mut manifests, selection) {
            Ok((_, r)) => rows.extend(r),
            Err(e) => {
                pb.suspend(|| writeln!(io.err, "error: {e}")).ok();
                unusable += 1;
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    let summaries = summarize(&rows);
    let (cases, passed) = summaries
        .iter()
        .fold((0, 0), |(c, p), s| (c + s.cases, p + s.passed));
    let line = summary_line(passed, cases - passed, unusable);
    if json {
        let _ = writeln!(
            io.out,
            "{}",
            serde_json::to_string_pretty(&summaries).unwrap_or_default()
        );
        let _ = writeln!(io.err, "{line}");
    } else {
        let _ = write!(io.out, "{}", summary_table(&summaries));
        for r in rows.iter().filter(|r| !r.pass) {
            let why = r.reason.as_deref().unwrap_or("");
            let _ = writeln!(
                io.out,
                "FAIL {} {} {} {}: {why}",
                r.file, r.op, r.device, r.output
            );
            if let Some(d) = &r.diagnostics {
                let _ = writeln!(io.out, "    {d}");
            }
        }
        let _ = writeln!(io.out, "{line}");
    }
    status(unusable, cases - passed)
}

fn summary_table(s: &[Summary]) -> String {
    let header = [
        "op",
        "device",
        "cases",
        "passed",
        "worst_ratio",
        "threshold",
        "result",
    ];
    let cells: Vec<Vec<String>> = s
        .iter()
        .map(|s| {
            vec![
                s.op.clone(),
                s.device.to_string(),
                s.cases.to_string(),
                s.passed.to_string(),
                sci(s.worst_ratio),
                threshold(s.threshold),
                if s.passed == s.cases { "PASS" } else { "FAIL" }.to_string(),
            ]
        })
        .collect();
    table::plain(&header, &cells)
}

/// `list [OP] [--json]`: every op with its inputs' and outputs' layouts and dtypes, parameters
/// and defaults, devices and spec section; with `OP`, that op's whole contract. An unknown `OP` is
/// exit 2.
pub fn list(op: Option<&str>, json: bool, io: &mut Io<'_>) -> u8 {
    let ops: Vec<OpListing> = match op {
        None => listing(),
        Some(id) => match registry::find(id) {
            Some(spec) => vec![OpListing::of(spec)],
            None => {
                let _ = writeln!(
                    io.err,
                    "error: unknown op `{id}` (`attn-conform list` shows the known ones)"
                );
                return EXIT_UNUSABLE;
            }
        },
    };
    let text = match (json, op) {
        (true, None) => serde_json::to_string_pretty(&ops).unwrap_or_default() + "\n",
        (true, Some(_)) => serde_json::to_string_pretty(&ops[0]).unwrap_or_default() + "\n",
        (false, None) => ops.iter().map(OpListing::brief).collect(),
        (false, Some(_)) => ops[0].contract(),
    };
    let _ = write!(io.out, "{text}");
    EXIT_PASS
}

/// `report [DIR] [--markdown|--html]`: per upstream implementation (`source.impl`) and op, the
/// cases passed, failed and unusable and the worst ratio against its threshold, over every case
/// under `dir` (default: the fixtures folder `run` finds); exit as `run`.
pub fn report(dir: Option<&Path>, format: Format, io: &mut Io<'_>) -> u8 {
    let found = match dir {
        Some(d) if !d.is_dir() => {
            let _ = writeln!(io.err, "error: {}: not a folder", d.display());
            return EXIT_UNUSABLE;
        }
        Some(d) => Ok((d.to_path_buf(), "given")),
        None => fixtures_lookup(None),
    };
    let (dir, _) = match found {
        Ok(found) => found,
        Err(e) => {
            let _ = writeln!(io.err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    let files = match case_files(std::slice::from_ref(&dir)) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(io.err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    if files.is_empty() {
        let _ = writeln!(
            io.err,
            "error: no .safetensors case file under {}",
            dir.display()
        );
        return EXIT_UNUSABLE;
    }
    let mut manifests = Manifests::default();
    let mut r = Report::default();
    for f in &files {
        let o = report::outcome(f, &mut manifests);
        if let Err(e) = &o.result {
            let _ = writeln!(io.err, "error: {e}");
        }
        r.add(&o);
    }
    let _ = write!(io.out, "{}", r.render(format));
    let (passed, failed, unusable) = r.totals();
    let _ = writeln!(io.err, "{}", summary_line(passed, failed, unusable));
    status(unusable, failed)
}
