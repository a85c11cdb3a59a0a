//! Corrupted case files never crash the reader or the checker: a few hundred variants of small
//! committed fixtures (bit flips, truncations, edited header lengths, edited header JSON: shapes,
//! dtypes, offsets, the op, the params), derived from a fixed seed, go through `Case::parse` and
//! `verify_case` in-process (no panic) and through `attn-conform verify` (exit 0, 1 or 2, never
//! a crash). The cargo-fuzz target `conformance/fuzz` does the same from arbitrary bytes.

mod common;

use attn_conformance::verify::{verify_case, Selection};
use attn_conformance::Case;
use common::Rng;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const SEED: u64 = 0x1a77_c0de;
/// Corrupted variants per fixture.
const PER_FIXTURE: usize = 80;
/// The fixtures corrupted: the smallest committed case of each of these ops.
const OPS: [&str; 4] = [
    "cumsum",
    "chunk_global_cumsum",
    "nsa_select_blocks",
    "kda_gate",
];

fn smallest_case(op: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(op);
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .min_by_key(|p| (std::fs::metadata(p).unwrap().len(), p.clone()))
        .unwrap_or_else(|| panic!("no case under {}", dir.display()))
}

/// The header JSON and the data of a safetensors file.
fn split(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, &bytes[8 + n..])
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let text = serde_json::to_vec(header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(data);
    out
}

/// A value a fuzzer would try in place of a number, string or list.
fn odd_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1u64 << 40),
        3 => json!(i64::MIN),
        4 => json!(1.5),
        5 => json!(1e300),
        6 => json!("x"),
        7 => Value::Null,
        8 => json!([]),
        _ => json!({}),
    }
}

/// One edit of the header JSON: a tensor's shape, dtype or offsets, or a metadata entry.
fn edit_header(rng: &mut Rng, header: &mut Value) -> String {
    let obj = header.as_object_mut().unwrap();
    let tensors: Vec<String> = obj
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    if !tensors.is_empty() && rng.below(2) == 0 {
        let name = &tensors[rng.below(tensors.len() as u64) as usize];
        let t = obj.get_mut(name).unwrap();
        match rng.below(5) {
            0 => {
                let shape = t["shape"].as_array_mut().unwrap();
                if shape.is_empty() || rng.below(3) == 0 {
                    shape.push(json!(rng.below(4)));
                } else {
                    let i = rng.below(shape.len() as u64) as usize;
                    let d = shape[i].as_u64().unwrap();
                    shape[i] = json!(
                        [0, d + 1, d.saturating_sub(1), d * 2, 1 << 33][rng.below(5) as usize]
                    );
                }
                format!("{name}: shape {}", t["shape"])
            }
            1 => {
                let shape = t["shape"].as_array_mut().unwrap();
                shape.pop();
                format!("{name}: shape {}", t["shape"])
            }
            2 => {
                let d = [
                    "F16", "BF16", "F32", "F64", "I8", "I32", "I64", "U8", "BOOL", "F8_E4M3", "?",
                ];
                t["dtype"] = json!(d[rng.below(d.len() as u64) as usize]);
                format!("{name}: dtype {}", t["dtype"])
            }
            3 => {
                let off = t["data_offsets"].as_array_mut().unwrap();
                let i = rng.below(2) as usize;
                let v = off[i].as_u64().unwrap();
                off[i] = json!([0, v + 1, v.saturating_sub(1), v + 4096][rng.below(4) as usize]);
                format!("{name}: data_offsets {}", t["data_offsets"])
            }
            _ => {
                let v = odd_value(rng);
                t[["shape", "dtype", "data_offsets"][rng.below(3) as usize]] = v;
                format!("{name}: {t}")
            }
        }
    } else {
        let meta = obj.entry("__metadata__").or_insert_with(|| json!({}));
        let meta = meta.as_object_mut().unwrap();
        let keys: Vec<String> = meta.keys().cloned().collect();
        let key = keys[rng.below(keys.len() as u64) as usize].clone();
        match rng.below(4) {
            0 => {
                meta.remove(&key);
                format!("metadata: no {key}")
            }
            1 if key == "params" || key == "source" || key == "tolerance" => {
                // metadata values are strings holding JSON: edit one entry inside
                let mut inner: Value = serde_json::from_str(meta[&key].as_str().unwrap()).unwrap();
                if let Some(m) = inner.as_object_mut() {
                    let ks: Vec<String> = m.keys().cloned().collect();
                    let v = odd_value(rng);
                    if ks.is_empty() {
                        m.insert("block_counts".into(), v);
                    } else {
                        m.insert(ks[rng.below(ks.len() as u64) as usize].clone(), v);
                    }
                }
                meta.insert(key.clone(), json!(inner.to_string()));
                format!("metadata: {key} = {}", meta[&key])
            }
            2 => {
                let ops = [
                    "cumsum",
                    "kda_gate",
                    "decode_attention",
                    "nsa_fwd",
                    "gdn_fwd",
                    "nope",
                ];
                meta.insert(
                    "op".into(),
                    json!(ops[rng.below(ops.len() as u64) as usize]),
                );
                format!("metadata: op {}", meta["op"])
            }
            _ => {
                meta.insert(key.clone(), json!("{\"trunc"));
                format!("metadata: {key} not JSON")
            }
        }
    }
}

/// One corrupted variant of `bytes` and what was done to it.
fn corrupt(rng: &mut Rng, bytes: &[u8]) -> (Vec<u8>, String) {
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    match rng.below(8) {
        0 | 1 => {
            let mut b = bytes.to_vec();
            let flips = 1 + rng.below(4);
            let mut at = vec![];
            for _ in 0..flips {
                // mostly in the length and the header, where a flip changes the structure
                let end = if rng.below(4) == 0 {
                    b.len()
                } else {
                    header_end
                };
                let i = rng.below(end as u64) as usize;
                b[i] ^= 1 << rng.below(8);
                at.push(i);
            }
            (b, format!("bit flips at {at:?}"))
        }
        2 => {
            let n = rng.below(bytes.len() as u64) as usize;
            (bytes[..n].to_vec(), format!("truncated to {n} bytes"))
        }
        3 => {
            let mut b = bytes.to_vec();
            let len = header_end as u64 - 8;
            let choices = [
                0,
                len - 1,
                len + 1,
                bytes.len() as u64 - 8,
                bytes.len() as u64,
                1 << 40,
                u64::MAX,
            ];
            let n = choices[rng.below(choices.len() as u64) as usize];
            b[..8].copy_from_slice(&n.to_le_bytes());
            (b, format!("header length {n}"))
        }
        _ => {
            let (mut header, data) = split(bytes);
            let what = edit_header(rng, &mut header);
            (join(&header, data), what)
        }
    }
}

#[test]
fn corrupted_cases_are_errors_never_crashes() {
    let mut rng = Rng::new(SEED);
    let dir = tempfile::tempdir().unwrap();
    let mut panics = vec![];
    let (mut n, mut parsed, mut verified) = (0, 0, 0);
    for op in OPS {
        let path = smallest_case(op);
        let bytes = std::fs::read(&path).unwrap();
        for i in 0..PER_FIXTURE {
            let (b, what) = corrupt(&mut rng, &bytes);
            let name = format!("{op}_{i:03}.safetensors");
            std::fs::write(dir.path().join(&name), &b).unwrap();
            let run = std::panic::catch_unwind(|| {
                Case::parse(Path::new(&name), &b)
                    .ok()
                    .map(|case| verify_case(&case, Selection::Cpu).is_ok())
            });
            match run {
                Err(_) => panics.push(format!("{name} ({}: {what})", path.display())),
                Ok(Some(ok)) => {
                    parsed += 1;
                    verified += ok as usize;
                }
                Ok(None) => {}
            }
            n += 1;
        }
    }
    assert!(
        panics.is_empty(),
        "{} of {n} panicked:\n{}",
        panics.len(),
        panics.join("\n")
    );
    eprintln!("{n} corrupted cases: {parsed} parsed, {verified} of them verified");
    // the corruptions reach the checker, not only the reader
    assert!(
        parsed >= n / 5,
        "only {parsed} of {n} corrupted cases parsed"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .args(["verify", "--device", "cpu"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        matches!(o.status.code(), Some(0..=2)) && !stderr.contains("panicked"),
        "attn-conform verify on {n} corrupted cases: {:?}\n{stderr}",
        o.status
    );
}
