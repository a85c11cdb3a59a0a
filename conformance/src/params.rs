//! The non-tensor arguments of an op: their declared JSON types and defaults, and the validated
//! parameter set a runner reads (every key present, defaults filled in).

use crate::error::Problem;
use serde_json::{Map, Value};

/// The JSON type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    /// A JSON integer.
    Int,
    /// `true` / `false`.
    Bool,
    /// A JSON number, or `null`.
    OptFloat,
    /// A JSON integer, or `null`.
    OptInt,
    /// One of the listed strings.
    Str(&'static [&'static str]),
    /// One of the listed strings, or `null`.
    OptStr(&'static [&'static str]),
}

impl ParamType {
    /// What a value of this type looks like, for messages and `list`.
    pub fn describe(self) -> String {
        let choices = |c: &[&str]| {
            c.iter()
                .map(|s| format!("\"{s}\""))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        match self {
            ParamType::Int => "an integer".into(),
            ParamType::Bool => "a boolean".into(),
            ParamType::OptFloat => "a number or null".into(),
            ParamType::OptInt => "an integer or null".into(),
            ParamType::Str(c) => choices(c),
            ParamType::OptStr(c) => format!("{} | null", choices(c)),
        }
    }

    /// Whether `v` is a value of this type.
    pub fn accepts(self, v: &Value) -> bool {
        match (self, v) {
            (ParamType::Int, Value::Number(n)) => n.is_i64(),
            (ParamType::Bool, Value::Bool(_)) => true,
            (ParamType::OptFloat, Value::Number(_) | Value::Null) => true,
            (ParamType::OptInt, Value::Null) => true,
            (ParamType::OptInt, Value::Number(n)) => n.is_i64(),
            (ParamType::OptStr(_), Value::Null) => true,
            (ParamType::Str(c) | ParamType::OptStr(c), Value::String(s)) => c.contains(&s.as_str()),
            _ => false,
        }
    }
}

/// One parameter of an op: name, JSON type, and its default as JSON text (`None`: required).
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub ty: ParamType,
    pub default: Option<&'static str>,
}

impl ParamSpec {
    /// The parsed default (`Ok(None)` for a required parameter); an error names the parameter.
    pub fn default_value(&self) -> Result<Option<Value>, Problem> {
        let Some(text) = self.default else {
            return Ok(None);
        };
        let v: Value = serde_json::from_str(text).map_err(|e| Problem::ParamType {
            key: self.name.into(),
            expected: format!("a JSON default, {}", self.ty.describe()),
            got: format!("{text:?} ({e})"),
        })?;
        if !self.ty.accepts(&v) {
            return Err(Problem::ParamType {
                key: self.name.into(),
                expected: self.ty.describe(),
                got: format!("default {text}"),
            });
        }
        Ok(Some(v))
    }
}

/// Validated parameters: every declared key present with a value of its declared type.
#[derive(Debug, Clone, PartialEq)]
pub struct Params(Map<String, Value>);

impl Params {
    /// Checks `given` against `specs` (unknown key, wrong type and missing required parameter
    /// are errors naming the key) and fills in the defaults.
    pub fn resolve(
        op: &str,
        specs: &[ParamSpec],
        given: &Map<String, Value>,
    ) -> Result<Params, Problem> {
        if let Some(key) = given
            .keys()
            .find(|k| !specs.iter().any(|s| s.name == k.as_str()))
        {
            return Err(Problem::UnknownParam {
                op: op.into(),
                key: key.clone(),
                known: specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
            });
        }
        let mut out = Map::new();
        for spec in specs {
            let v = match given.get(spec.name) {
                Some(v) if spec.ty.accepts(v) => v.clone(),
                Some(v) => {
                    return Err(Problem::ParamType {
                        key: spec.name.into(),
                        expected: spec.ty.describe(),
                        got: v.to_string(),
                    })
                }
                None => spec
                    .default_value()?
                    .ok_or_else(|| Problem::MissingParam(spec.name.into()))?,
            };
            out.insert(spec.name.into(), v);
        }
        Ok(Params(out))
    }

    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    fn get(&self, key: &str, expected: &str) -> Result<&Value, Problem> {
        self.0.get(key).ok_or_else(|| Problem::ParamType {
            key: key.into(),
            expected: expected.into(),
            got: "nothing (not a parameter of this op)".into(),
        })
    }

    fn wrong(key: &str, expected: &str, v: &Value) -> Problem {
        Problem::ParamType {
            key: key.into(),
            expected: expected.into(),
            got: v.to_string(),
        }
    }

    pub fn int(&self, key: &str) -> Result<i64, Problem> {
        let v = self.get(key, "an integer")?;
        v.as_i64().ok_or_else(|| Self::wrong(key, "an integer", v))
    }

    pub fn bool(&self, key: &str) -> Result<bool, Problem> {
        let v = self.get(key, "a boolean")?;
        v.as_bool().ok_or_else(|| Self::wrong(key, "a boolean", v))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, Problem> {
        match self.get(key, "a number or null")? {
            Value::Null => Ok(None),
            v => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a number or null", v)),
        }
    }

    pub fn opt_int(&self, key: &str) -> Result<Option<i64>, Problem> {
        match self.get(key, "an integer or null")? {
            Value::Null => Ok(None),
            v => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "an integer or null", v)),
        }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, Problem> {
        match self.get(key, "a string or null")? {
            Value::Null => Ok(None),
            v => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a string or null", v)),
        }
    }

    pub fn str(&self, key: &str) -> Result<&str, Problem> {
        let v = self.get(key, "a string")?;
        v.as_str().ok_or_else(|| Self::wrong(key, "a string", v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SPECS: &[ParamSpec] = &[
        ParamSpec {
            name: "chunk_size",
            ty: ParamType::Int,
            default: None,
        },
        ParamSpec {
            name: "reverse",
            ty: ParamType::Bool,
            default: Some("false"),
        },
        ParamSpec {
            name: "scale",
            ty: ParamType::OptFloat,
            default: Some("null"),
        },
        ParamSpec {
            name: "layout",
            ty: ParamType::Str(&["a", "b"]),
            default: Some("\"a\""),
        },
    ];

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn defaults_fill_and_given_values_win() {
        let p = Params::resolve("op", SPECS, &map(json!({"chunk_size": 64, "scale": 2}))).unwrap();
        assert_eq!(p.int("chunk_size").unwrap(), 64);
        assert!(!p.bool("reverse").unwrap());
        assert_eq!(p.opt_f64("scale").unwrap(), Some(2.0));
        assert_eq!(p.str("layout").unwrap(), "a");
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (json!({"chunk_size": 64, "revers": true}), "revers"),
            (json!({"chunk_size": 64.5}), "chunk_size"),
            (json!({"chunk_size": 64, "reverse": "yes"}), "reverse"),
            (json!({"chunk_size": 64, "layout": "c"}), "layout"),
            (json!({"chunk_size": 64, "scale": "x"}), "scale"),
            (json!({}), "chunk_size"),
        ];
        for (given, key) in cases {
            let e = Params::resolve("op", SPECS, &map(given.clone())).unwrap_err();
            assert!(e.to_string().contains(&format!("`{key}`")), "{given}: {e}");
        }
    }
}
