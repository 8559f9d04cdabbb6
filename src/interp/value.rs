//! Runtime values: what expressions compute and variables hold. Strings that
//! came out of the model ([`Captured`]) carry their metadata and behave as
//! plain strings everywhere else.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

use indexmap::IndexMap;

use crate::state::{Captured, Meta};
use crate::syntax::ast::Const;

/// A value.
#[derive(Debug, Clone, Default)]
pub enum Value {
    /// A name with no value (`x | default(…)`, `x is defined`).
    #[default]
    Undefined,
    /// `none`.
    None,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(Arc<str>),
    /// A generated, selected or captured string with its metadata.
    Captured(Arc<Captured>),
    /// A list.
    List(Arc<Vec<Value>>),
    /// A map with string keys, in insertion order.
    Map(Arc<IndexMap<String, Value>>),
    /// A `def` of module `module`.
    Func {
        /// Its module.
        module: usize,
        /// Index into the module's functions.
        id: u32,
    },
    /// A built-in function or filter called as a function.
    Builtin(&'static str),
    /// An imported module.
    Module(usize),
    /// A grammar block, optionally starting at one of its rules.
    Grammar {
        /// Its module.
        module: usize,
        /// Index into the module's grammars.
        id: u32,
        /// The start rule, when chosen with `.rule`.
        rule: Option<Arc<str>>,
    },
}

impl Value {
    /// A string value.
    pub fn str(s: impl Into<Arc<str>>) -> Value {
        Value::Str(s.into())
    }

    /// A list value.
    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Arc::new(items))
    }

    /// A word for the type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Undefined => "undefined",
            Value::None => "none",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::Str(_) | Value::Captured(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) => "map",
            Value::Func { .. } | Value::Builtin(_) => "function",
            Value::Module(_) => "module",
            Value::Grammar { .. } => "grammar",
        }
    }

    /// The type with its article, for messages: "an integer", "a string".
    pub fn a_type(&self) -> String {
        crate::diagnostic::with_article(self.type_name())
    }

    /// The string, for string values.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            Value::Captured(c) => Some(&c.text),
            _ => None,
        }
    }

    /// Jinja truthiness.
    pub fn is_true(&self) -> bool {
        match self {
            Value::Undefined | Value::None => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::Captured(c) => !c.text.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            _ => true,
        }
    }

    /// A number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        }
    }

    /// From a literal.
    pub fn from_const(c: &Const) -> Value {
        match c {
            Const::None => Value::None,
            Const::Bool(b) => Value::Bool(*b),
            Const::Int(i) => Value::Int(*i),
            Const::Float(f) => Value::Float(*f),
            Const::Str(s) => Value::str(s.as_str()),
            Const::List(l) => Value::list(l.iter().map(Value::from_const).collect()),
            Const::Map(m) => Value::Map(Arc::new(m.iter().map(|(k, v)| (k.clone(), Value::from_const(v))).collect())),
        }
    }

    /// As a literal, for values that are data (not functions, modules or
    /// grammars); a captured string is its text.
    pub fn to_const(&self) -> Option<Const> {
        Some(match self {
            Value::Undefined | Value::None => Const::None,
            Value::Bool(b) => Const::Bool(*b),
            Value::Int(i) => Const::Int(*i),
            Value::Float(f) => Const::Float(*f),
            Value::Str(_) | Value::Captured(_) => Const::Str(self.as_str()?.to_string()),
            Value::List(l) => Const::List(l.iter().map(Value::to_const).collect::<Option<_>>()?),
            Value::Map(m) => Const::Map(m.iter().map(|(k, v)| Some((k.clone(), v.to_const()?))).collect::<Option<_>>()?),
            Value::Func { .. } | Value::Builtin(_) | Value::Module(_) | Value::Grammar { .. } => return None,
        })
    }

    /// From JSON (`--vars`, `fromjson`).
    pub fn from_json(j: &serde_json::Value) -> Value {
        match j {
            serde_json::Value::Null => Value::None,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => n.as_i64().map(Value::Int).unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(f64::NAN))),
            serde_json::Value::String(s) => Value::str(s.as_str()),
            serde_json::Value::Array(a) => Value::list(a.iter().map(Value::from_json).collect()),
            serde_json::Value::Object(o) => Value::Map(Arc::new(o.iter().map(|(k, v)| (k.clone(), Value::from_json(v))).collect())),
        }
    }

    /// To JSON (`tojson`, the JSON report). Functions, modules and
    /// grammars become their description as a string.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Undefined | Value::None => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map(J::Number).unwrap_or(J::Null),
            Value::Str(s) => J::String(s.to_string()),
            Value::Captured(c) => J::String(c.text.clone()),
            Value::List(l) => J::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            other => J::String(other.to_string()),
        }
    }

    /// Equality as `==` sees it (numbers across types, captured = plain strings).
    pub fn equals(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Int(a), Value::Float(b)) | (Value::Float(b), Value::Int(a)) => (*a as f64) == *b,
            (Value::Undefined | Value::None, Value::Undefined | Value::None) => true,
            (Value::List(a), Value::List(b)) => a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x.equals(y)),
            (Value::Map(a), Value::Map(b)) => a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.equals(w))),
            _ => match (self.as_str(), other.as_str()) {
                (Some(a), Some(b)) => a == b,
                _ => match (self, other) {
                    (Value::Bool(a), Value::Bool(b)) => a == b,
                    (Value::Int(a), Value::Int(b)) => a == b,
                    (Value::Float(a), Value::Float(b)) => a == b,
                    (Value::Func { module: m, id: i }, Value::Func { module: n, id: j }) => m == n && i == j,
                    (Value::Builtin(a), Value::Builtin(b)) => a == b,
                    (Value::Module(a), Value::Module(b)) => a == b,
                    _ => false,
                },
            },
        }
    }

    /// Ordering for `<` and `sort`: numbers with numbers, strings with
    /// strings, lists item by item.
    pub fn compare(&self, other: &Value) -> Option<Ordering> {
        if let (Some(a), Some(b)) = (self.as_str(), other.as_str()) {
            return Some(a.cmp(b));
        }
        match (self, other) {
            (Value::Int(a), Value::Int(b)) => Some(a.cmp(b)),
            (Value::List(a), Value::List(b)) => {
                for (x, y) in a.iter().zip(b.iter()) {
                    match x.compare(y)? {
                        Ordering::Equal => {}
                        o => return Some(o),
                    }
                }
                Some(a.len().cmp(&b.len()))
            }
            _ => match (self.as_f64(), other.as_f64()) {
                (Some(a), Some(b)) if !matches!(self, Value::Bool(_)) && !matches!(other, Value::Bool(_)) => a.partial_cmp(&b),
                _ => None,
            },
        }
    }
}

impl fmt::Display for Value {
    /// How a value is written into the prompt by `{{ … }}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Undefined | Value::None => Ok(()),
            Value::Bool(b) => write!(f, "{}", if *b { "true" } else { "false" }),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => {
                if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e16 {
                    write!(f, "{x:.1}")
                } else {
                    write!(f, "{x}")
                }
            }
            Value::Str(s) => f.write_str(s),
            Value::Captured(c) => f.write_str(&c.text),
            Value::List(_) | Value::Map(_) => f.write_str(&self.to_json().to_string()),
            Value::Func { .. } => f.write_str("<function>"),
            Value::Builtin(n) => write!(f, "<built-in {n}>"),
            Value::Module(_) => f.write_str("<module>"),
            Value::Grammar { rule, .. } => match rule {
                Some(r) => write!(f, "<grammar rule {r}>"),
                None => f.write_str("<grammar>"),
            },
        }
    }
}

/// A captured value's metadata as attribute values (`.logprob`, …).
pub fn meta_attr(meta: &Meta, name: &str) -> Option<Value> {
    Some(match name {
        "logprob" => Value::Float(meta.logprob),
        "tokens" => Value::list(meta.tokens.iter().map(|&t| Value::Int(i64::from(t))).collect()),
        "finish_reason" => meta.finish_reason.map_or(Value::None, |r| Value::str(r.as_str())),
        "stop" => meta.stop.as_deref().map_or(Value::None, Value::str),
        "choices" => Value::list(
            meta.choices
                .iter()
                .map(|c| {
                    let mut m = IndexMap::new();
                    m.insert("text".to_string(), Value::str(c.text.as_str()));
                    m.insert("logprob".to_string(), Value::Float(c.logprob));
                    m.insert("probability".to_string(), Value::Float(c.probability));
                    Value::Map(Arc::new(m))
                })
                .collect(),
        ),
        _ => return None,
    })
}

/// The attribute names a captured value has.
pub const META_ATTRS: &[&str] = &["logprob", "tokens", "finish_reason", "stop", "choices"];
