//! Operators, indexing, filters, tests and built-in functions on [`Value`]s.
//! Errors are `Failure`s of kind value or limit; the interpreter adds the source span.

use std::cmp::Ordering;
use std::sync::Arc;

use indexmap::IndexMap;

use crate::state::Failure;
use super::value::{self, Value, META_ATTRS};
use crate::syntax::ast::{BinaryOp, UnaryOp};

/// Result of an operation: a value or a failure.
pub type OpResult = Result<Value, Failure>;

/// Most items `range` may produce (a loop over model output is bounded).
const MAX_RANGE: i64 = 1_000_000;
/// Longest string a template may build.
pub const MAX_STRING: usize = 16 << 20;
/// Most items a list may hold.
pub const MAX_ITEMS: usize = 1_000_000;

/// Fails when a string of `len` bytes would pass [`MAX_STRING`].
fn check_len(len: usize) -> Result<(), Failure> {
    if len > MAX_STRING {
        return Err(too_long());
    }
    Ok(())
}

fn too_long() -> Failure {
    Failure::limit(format!("the string would be over {} MiB (the limit for values)", MAX_STRING >> 20))
}

/// The length of `v` written as text, counted without writing it, or
/// `None` past `limit`: a list holding itself a few times over would
/// otherwise be written out at exponential size.
fn text_len_within(v: &Value, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        total += match v {
            Value::Str(s) => s.len() + 2,
            Value::Captured(c) => c.text.len() + 2,
            Value::List(l) => {
                stack.extend(l.iter());
                2 + l.len()
            }
            Value::Map(m) => {
                stack.extend(m.values());
                2 + m.keys().map(|k| k.len() + 4).sum::<usize>()
            }
            _ => 24,
        };
        if total > limit {
            return None;
        }
    }
    Some(total)
}

/// `v` as the text `{{ … }}` writes, refused past [`MAX_STRING`].
pub fn render(v: &Value) -> Result<String, Failure> {
    match v {
        Value::List(_) | Value::Map(_) => {
            text_len_within(v, MAX_STRING).ok_or_else(too_long)?;
            Ok(v.to_string())
        }
        _ => Ok(v.to_string()),
    }
}

/// `a` and `b` written one after the other, refused past [`MAX_STRING`].
fn concat(a: &Value, b: &Value) -> OpResult {
    let len = |v: &Value| text_len_within(v, MAX_STRING).unwrap_or(usize::MAX);
    check_len(len(a).saturating_add(len(b)))?;
    Ok(Value::str(format!("{a}{b}")))
}

/// Applies a unary operator.
pub fn unary(op: UnaryOp, v: &Value) -> OpResult {
    match op {
        UnaryOp::Not => Ok(Value::Bool(!v.is_true())),
        UnaryOp::Neg => match v {
            Value::Int(i) => i.checked_neg().map(Value::Int).ok_or_else(|| Failure::value("integer overflow")),
            Value::Float(f) => Ok(Value::Float(-f)),
            _ => Err(Failure::value(format!("cannot negate {}", v.a_type()))),
        },
        UnaryOp::Pos => match v {
            Value::Int(_) | Value::Float(_) => Ok(v.clone()),
            _ => Err(Failure::value(format!("unary `+` needs a number, not {}", v.a_type()))),
        },
    }
}

/// Applies a binary operator (not `and`/`or`, which short-circuit in code).
pub fn binary(op: BinaryOp, a: &Value, b: &Value) -> OpResult {
    use BinaryOp::*;
    let mismatch = || Failure::value(format!("cannot apply `{}` to {} and {}", op.symbol(), a.a_type(), b.a_type()));
    match op {
        Eq => Ok(Value::Bool(a.equals(b))),
        Ne => Ok(Value::Bool(!a.equals(b))),
        Lt | Le | Gt | Ge => {
            let o = a.compare(b).ok_or_else(mismatch)?;
            Ok(Value::Bool(match op {
                Lt => o == Ordering::Less,
                Le => o != Ordering::Greater,
                Gt => o == Ordering::Greater,
                _ => o != Ordering::Less,
            }))
        }
        In | NotIn => {
            let found = contains(b, a).ok_or_else(mismatch)?;
            Ok(Value::Bool(found == (op == In)))
        }
        Concat => concat(a, b),
        Add => match (a, b) {
            (Value::List(x), Value::List(y)) if x.len() + y.len() > MAX_ITEMS => {
                Err(Failure::limit(format!("the list would have over {MAX_ITEMS} items (the limit for lists)")))
            }
            (Value::List(x), Value::List(y)) => Ok(Value::list(x.iter().chain(y.iter()).cloned().collect())),
            _ if a.as_str().is_some() && b.as_str().is_some() => concat(a, b),
            _ => arith(op, a, b).ok_or_else(mismatch)?,
        },
        Mul => match (a, b) {
            (s, Value::Int(n)) | (Value::Int(n), s) if s.as_str().is_some() => {
                let n = usize::try_from(*n).unwrap_or(0);
                let s = s.as_str().unwrap_or("");
                check_len(s.len().saturating_mul(n))?;
                Ok(Value::str(s.repeat(n)))
            }
            _ => arith(op, a, b).ok_or_else(mismatch)?,
        },
        _ => arith(op, a, b).ok_or_else(mismatch)?,
    }
}

/// Arithmetic on numbers: `None` when an operand is not a number.
fn arith(op: BinaryOp, a: &Value, b: &Value) -> Option<OpResult> {
    use BinaryOp::*;
    if let (Value::Int(x), Value::Int(y)) = (a, b) {
        let (x, y) = (*x, *y);
        let overflow = || Failure::value("integer overflow");
        return Some(match op {
            Add => x.checked_add(y).map(Value::Int).ok_or_else(overflow),
            Sub => x.checked_sub(y).map(Value::Int).ok_or_else(overflow),
            Mul => x.checked_mul(y).map(Value::Int).ok_or_else(overflow),
            Div if y == 0 => Err(Failure::value("division by zero")),
            Div => Ok(Value::Float(x as f64 / y as f64)),
            FloorDiv | Mod if y == 0 => Err(Failure::value("division by zero")),
            // Python's floor division and modulo (the result takes the
            // divisor's sign); `i64::MIN // -1` is the one overflow.
            FloorDiv => x
                .checked_div_euclid(y)
                .map(|q| Value::Int(q - i64::from(y < 0 && x.wrapping_rem_euclid(y) != 0)))
                .ok_or_else(overflow),
            Mod => {
                let r = x.wrapping_rem_euclid(y);
                Ok(Value::Int(if y < 0 && r != 0 { r + y } else { r }))
            }
            Pow if y >= 0 => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)).map(Value::Int).ok_or_else(overflow),
            Pow => Ok(Value::Float((x as f64).powf(y as f64))),
            _ => return None,
        });
    }
    let (x, y) = (num(a)?, num(b)?);
    Some(match op {
        Add => Ok(Value::Float(x + y)),
        Sub => Ok(Value::Float(x - y)),
        Mul => Ok(Value::Float(x * y)),
        Div | FloorDiv | Mod if y == 0.0 => Err(Failure::value("division by zero")),
        Div => Ok(Value::Float(x / y)),
        FloorDiv => Ok(Value::Float((x / y).floor())),
        Mod => Ok(Value::Float(x - y * (x / y).floor())),
        Pow => Ok(Value::Float(x.powf(y))),
        _ => return None,
    })
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// `needle in haystack`: `None` when the haystack cannot contain things.
fn contains(haystack: &Value, needle: &Value) -> Option<bool> {
    match haystack {
        Value::List(l) => Some(l.iter().any(|x| x.equals(needle))),
        Value::Map(m) => Some(needle.as_str().is_some_and(|k| m.contains_key(k))),
        _ => Some(haystack.as_str()?.contains(needle.as_str()?)),
    }
}

/// `value.name` for values that are not modules or grammars (those need
/// the program and are resolved by the interpreter).
pub fn attr(v: &Value, name: &str) -> OpResult {
    match v {
        Value::Map(m) => m.get(name).cloned().ok_or_else(|| Failure::value(format!("the map has no key `{name}`"))),
        Value::Captured(c) => {
            value::meta_attr(&c.meta, name).ok_or_else(|| Failure::value(format!("a generated value has no attribute `{name}` (it has {})", META_ATTRS.join(", "))))
        }
        Value::Str(_) if META_ATTRS.contains(&name) => {
            Err(Failure::value(format!("`.{name}` exists only on values the model produced (gen, select, capture)")))
        }
        _ => Err(Failure::value(format!("{} has no attribute `{name}`", v.a_type()))),
    }
}

/// `value[index]`.
pub fn index(v: &Value, i: &Value) -> OpResult {
    let at = |len: usize| -> Result<usize, Failure> {
        let Value::Int(n) = i else {
            return Err(Failure::value(format!("an index must be an integer, not {}", i.a_type())));
        };
        let k = if *n < 0 { len as i64 + n } else { *n };
        usize::try_from(k).ok().filter(|&k| k < len).ok_or_else(|| Failure::value(format!("index {n} is out of range for length {len}")))
    };
    match v {
        Value::List(l) => Ok(l[at(l.len())?].clone()),
        Value::Map(m) => {
            let k = i.as_str().map(str::to_string).unwrap_or_else(|| i.to_string());
            m.get(&k).cloned().ok_or_else(|| Failure::value(format!("the map has no key `{k}`")))
        }
        _ => match v.as_str() {
            Some(s) => {
                let chars: Vec<char> = s.chars().collect();
                Ok(Value::str(chars[at(chars.len())?].to_string()))
            }
            None => Err(Failure::value(format!("cannot index {}", v.a_type()))),
        },
    }
}

/// `value[start:stop:step]`, Python's rules.
pub fn slice(v: &Value, start: Option<&Value>, stop: Option<&Value>, step: Option<&Value>) -> OpResult {
    let int = |x: Option<&Value>| -> Result<Option<i64>, Failure> {
        match x {
            None | Some(Value::None) => Ok(None),
            Some(Value::Int(i)) => Ok(Some(*i)),
            Some(o) => Err(Failure::value(format!("slice bounds must be integers, not {}", o.a_type()))),
        }
    };
    let step = int(step)?.unwrap_or(1);
    if step == 0 {
        return Err(Failure::value("slice step cannot be zero"));
    }
    let pick = |len: usize| -> Result<Vec<usize>, Failure> {
        let len = len as i64;
        let clamp = |x: i64, lo: i64, hi: i64| if x < 0 { (x + len).max(lo) } else { x.min(hi) };
        let mut out = Vec::new();
        if step > 0 {
            let (mut i, end) = (int(start)?.map_or(0, |s| clamp(s, 0, len)), int(stop)?.map_or(len, |s| clamp(s, 0, len)));
            while i < end {
                out.push(i as usize);
                i += step;
            }
        } else {
            let (mut i, end) = (int(start)?.map_or(len - 1, |s| clamp(s, -1, len - 1)), int(stop)?.map_or(-1, |s| clamp(s, -1, len - 1)));
            while i > end {
                out.push(i as usize);
                i += step;
            }
        }
        Ok(out)
    };
    match v {
        Value::List(l) => Ok(Value::list(pick(l.len())?.into_iter().map(|i| l[i].clone()).collect())),
        _ => match v.as_str() {
            Some(s) => {
                let chars: Vec<char> = s.chars().collect();
                Ok(Value::str(pick(chars.len())?.into_iter().map(|i| chars[i]).collect::<String>()))
            }
            None => Err(Failure::value(format!("cannot slice {}", v.a_type()))),
        },
    }
}

/// Arguments of a filter or built-in call: positional then keyword.
pub struct Args<'a> {
    /// Positional values.
    pub pos: &'a [Value],
    /// Keyword values.
    pub kw: &'a [(String, Value)],
}

impl Args<'_> {
    /// Argument `i`, or the keyword `name`.
    fn get(&self, i: usize, name: &str) -> Option<&Value> {
        self.pos.get(i).or_else(|| self.kw.iter().find(|(k, _)| k == name).map(|(_, v)| v))
    }
}

/// Applies filter `name` to `v`.
pub fn filter(name: &str, v: &Value, args: &Args<'_>) -> OpResult {
    let s = || v.as_str().ok_or_else(|| Failure::value(format!("`{name}` needs a string, not {}", v.a_type())));
    let list = || match v {
        Value::List(l) => Ok(l.clone()),
        _ => Err(Failure::value(format!("`{name}` needs a list, not {}", v.a_type()))),
    };
    let str_arg = |i: usize, p: &str| -> Result<Option<String>, Failure> {
        match args.get(i, p) {
            None | Some(Value::None) => Ok(None),
            Some(x) => x.as_str().map(|s| Some(s.to_string())).ok_or_else(|| Failure::value(format!("`{name}`'s `{p}` must be a string"))),
        }
    };
    Ok(match name {
        "len" => Value::Int(match v {
            Value::List(l) => l.len(),
            Value::Map(m) => m.len(),
            _ => s()?.chars().count(),
        } as i64),
        "upper" => Value::str(s()?.to_uppercase()),
        "lower" => Value::str(s()?.to_lowercase()),
        "capitalize" => {
            let t = s()?;
            let mut c = t.chars();
            Value::str(c.next().map(|f| f.to_uppercase().chain(c.flat_map(char::to_lowercase)).collect::<String>()).unwrap_or_default())
        }
        "title" => {
            let mut out = String::new();
            let mut start = true;
            for ch in s()?.chars() {
                if start {
                    out.extend(ch.to_uppercase());
                } else {
                    out.extend(ch.to_lowercase());
                }
                start = !ch.is_alphanumeric();
            }
            Value::str(out)
        }
        "trim" => match str_arg(0, "chars")? {
            Some(chars) => Value::str(s()?.trim_matches(|c| chars.contains(c))),
            None => Value::str(s()?.trim()),
        },
        "int" => match to_int(v) {
            Some(i) => Value::Int(i),
            None => args.get(0, "default").cloned().ok_or_else(|| Failure::value(format!("cannot convert {} to an integer", describe(v))))?,
        },
        "float" => match to_float(v) {
            Some(f) => Value::Float(f),
            None => args.get(0, "default").cloned().ok_or_else(|| Failure::value(format!("cannot convert {} to a float", describe(v))))?,
        },
        "string" => Value::str(render(v)?),
        "join" => {
            let sep = str_arg(0, "sep")?.unwrap_or_default();
            let items = list()?;
            let len = items.iter().try_fold(sep.len().saturating_mul(items.len()), |n, v| {
                text_len_within(v, MAX_STRING).map(|l| n.saturating_add(l))
            });
            check_len(len.unwrap_or(usize::MAX))?;
            Value::str(items.iter().map(Value::to_string).collect::<Vec<_>>().join(&sep))
        }
        "split" => {
            let t = s()?;
            let max = match args.get(1, "maxsplit") {
                Some(Value::Int(n)) if *n >= 0 => Some(*n as usize),
                _ => None,
            };
            let parts: Vec<String> = match (str_arg(0, "sep")?, max) {
                (Some(sep), _) if sep.is_empty() => return Err(Failure::value("`split`'s separator cannot be empty")),
                (Some(sep), Some(m)) => t.splitn(m + 1, sep.as_str()).map(String::from).collect(),
                (Some(sep), None) => t.split(sep.as_str()).map(String::from).collect(),
                (None, _) => t.split_whitespace().map(String::from).collect(),
            };
            Value::list(parts.into_iter().map(Value::str).collect())
        }
        "replace" => {
            let old = str_arg(0, "old")?.unwrap_or_default();
            let new = str_arg(1, "new")?.unwrap_or_default();
            let t = s()?;
            // An empty `old` matches between every character.
            let matches = if old.is_empty() { t.chars().count() + 1 } else { t.matches(old.as_str()).count() };
            check_len(t.len().saturating_add(matches.saturating_mul(new.len())))?;
            match args.get(2, "count") {
                Some(Value::Int(n)) => Value::str(s()?.replacen(&old, &new, (*n).max(0) as usize)),
                _ => Value::str(s()?.replace(&old, &new)),
            }
        }
        "first" | "last" => {
            let items: Vec<Value> = match v {
                Value::List(l) => l.to_vec(),
                _ => s()?.chars().map(|c| Value::str(c.to_string())).collect(),
            };
            let item = if name == "first" { items.first() } else { items.last() };
            item.cloned().unwrap_or(Value::Undefined)
        }
        "default" => {
            let boolean = args.get(1, "boolean").is_some_and(Value::is_true);
            let missing = matches!(v, Value::Undefined) || (boolean && !v.is_true());
            if missing {
                args.get(0, "value").cloned().unwrap_or(Value::str(""))
            } else {
                v.clone()
            }
        }
        "round" => {
            let p = match args.get(0, "precision") {
                Some(Value::Int(p)) => (*p).clamp(0, 15) as i32,
                _ => 0,
            };
            let x = to_float(v)
                .filter(|_| matches!(v, Value::Int(_) | Value::Float(_)))
                .ok_or_else(|| Failure::value(format!("`round` needs a number, not {}", v.a_type())))?;
            let m = 10f64.powi(p);
            Value::Float((x * m).round() / m)
        }
        "abs" => match v {
            Value::Int(i) => Value::Int(i.checked_abs().ok_or(Failure::value("integer overflow"))?),
            Value::Float(f) => Value::Float(f.abs()),
            _ => return Err(Failure::value(format!("`abs` needs a number, not {}", v.a_type()))),
        },
        "tojson" => {
            render(v)?;
            let j = v.to_json();
            match args.get(0, "indent") {
                Some(Value::Int(n)) if *n > 0 => {
                    let indent = " ".repeat((*n).min(16) as usize);
                    let mut buf = Vec::new();
                    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
                    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
                    serde::Serialize::serialize(&j, &mut ser).map_err(|e| Failure::value(e.to_string()))?;
                    Value::str(String::from_utf8(buf).unwrap_or_default())
                }
                _ => Value::str(j.to_string()),
            }
        }
        "fromjson" => {
            let t = s()?;
            let j: serde_json::Value = serde_json::from_str(t).map_err(|e| Failure::value(format!("`fromjson`: not valid JSON ({e}): {}", preview(t))))?;
            Value::from_json(&j)
        }
        "list" => match v {
            Value::List(_) => v.clone(),
            Value::Map(m) => Value::list(m.keys().map(|k| Value::str(k.as_str())).collect()),
            _ => Value::list(s()?.chars().map(|c| Value::str(c.to_string())).collect()),
        },
        "sort" => {
            let mut items = list()?.to_vec();
            let mut failed = false;
            items.sort_by(|a, b| {
                a.compare(b).unwrap_or_else(|| {
                    failed = true;
                    Ordering::Equal
                })
            });
            if failed {
                return Err(Failure::value("`sort` needs items that compare (all numbers or all strings)"));
            }
            if args.get(0, "reverse").is_some_and(Value::is_true) {
                items.reverse();
            }
            Value::list(items)
        }
        "reverse" => match v {
            Value::List(l) => Value::list(l.iter().rev().cloned().collect()),
            _ => Value::str(s()?.chars().rev().collect::<String>()),
        },
        "unique" => {
            let mut out: Vec<Value> = Vec::new();
            for x in list()?.iter() {
                if !out.iter().any(|y| y.equals(x)) {
                    out.push(x.clone());
                }
            }
            Value::list(out)
        }
        "sum" => {
            let mut acc = Value::Int(0);
            for x in list()?.iter() {
                acc = binary(BinaryOp::Add, &acc, x)?;
            }
            acc
        }
        "min" | "max" => {
            let l = list()?;
            let mut best: Option<&Value> = None;
            for x in l.iter() {
                let better = match best {
                    None => true,
                    Some(b) => {
                        let o = x.compare(b).ok_or_else(|| Failure::value(format!("`{name}` needs items that compare")))?;
                        if name == "min" {
                            o == Ordering::Less
                        } else {
                            o == Ordering::Greater
                        }
                    }
                };
                if better {
                    best = Some(x);
                }
            }
            best.cloned().unwrap_or(Value::Undefined)
        }
        "items" | "keys" | "values" => {
            let Value::Map(m) = v else {
                return Err(Failure::value(format!("`{name}` needs a map, not {}", v.a_type())));
            };
            Value::list(
                m.iter()
                    .map(|(k, x)| match name {
                        "items" => Value::list(vec![Value::str(k.as_str()), x.clone()]),
                        "keys" => Value::str(k.as_str()),
                        _ => x.clone(),
                    })
                    .collect(),
            )
        }
        _ => return Err(Failure::value(format!("unknown filter `{name}`"))),
    })
}

/// Applies test `name` to `v`.
pub fn test(name: &str, v: &Value, args: &[Value]) -> Result<bool, Failure> {
    let int = || match v {
        Value::Int(i) => Ok(*i),
        _ => Err(Failure::value(format!("`{name}` needs an integer, not {}", v.a_type()))),
    };
    Ok(match name {
        "defined" => !matches!(v, Value::Undefined),
        "undefined" => matches!(v, Value::Undefined),
        "none" => matches!(v, Value::None),
        "string" => v.as_str().is_some(),
        "number" => matches!(v, Value::Int(_) | Value::Float(_)),
        "integer" => matches!(v, Value::Int(_)),
        "float" => matches!(v, Value::Float(_)),
        "boolean" => matches!(v, Value::Bool(_)),
        "list" => matches!(v, Value::List(_)),
        "mapping" => matches!(v, Value::Map(_)),
        "even" => int()? % 2 == 0,
        "odd" => int()? % 2 != 0,
        "divisibleby" => match args.first() {
            Some(Value::Int(0)) => return Err(Failure::value("`divisibleby(0)`: division by zero")),
            Some(Value::Int(n)) => int()?.wrapping_rem(*n) == 0,
            _ => return Err(Failure::value("`divisibleby` needs an integer argument")),
        },
        _ => return Err(Failure::value(format!("unknown test `{name}`"))),
    })
}

/// Calls the built-in function `name` (`range`, or a filter called as a function).
pub fn call_builtin(name: &str, args: &Args<'_>) -> OpResult {
    if name == "range" {
        let ints: Vec<i64> = args
            .pos
            .iter()
            .map(|a| match a {
                Value::Int(i) => Ok(*i),
                o => Err(Failure::value(format!("`range` needs integers, not {}", o.a_type()))),
            })
            .collect::<Result<_, _>>()?;
        let (start, stop, step) = match ints.as_slice() {
            [stop] => (0, *stop, 1),
            [start, stop] => (*start, *stop, 1),
            [start, stop, step] => (*start, *stop, *step),
            _ => return Err(Failure::value("`range` takes 1 to 3 integers")),
        };
        if step == 0 {
            return Err(Failure::value("`range` step cannot be zero"));
        }
        // In i128: `stop - start` and the step may overflow i64.
        let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
        let count = if step > 0 { (stop - start + step - 1).max(0) / step } else { (start - stop - step - 1).max(0) / -step };
        if count > i128::from(MAX_RANGE) {
            return Err(Failure::limit(format!("`range` would make {count} items (the limit is {MAX_RANGE})")));
        }
        // Every item lies between start and stop, so it fits an i64.
        return Ok(Value::list((0..count).map(|k| Value::Int((start + k * step) as i64)).collect()));
    }
    let Some((first, rest)) = args.pos.split_first() else {
        return Err(Failure::value(format!("`{name}` needs a value to work on")));
    };
    filter(name, first, &Args { pos: rest, kw: args.kw })
}

/// A map value from pairs.
pub fn map(pairs: Vec<(String, Value)>) -> Value {
    Value::Map(Arc::new(pairs.into_iter().collect::<IndexMap<_, _>>()))
}

fn to_int(v: &Value) -> Option<i64> {
    // A float converts when its integer part fits: never saturated.
    let whole = |f: f64| (f.is_finite() && f.trunc() >= -(2f64.powi(63)) && f.trunc() < 2f64.powi(63)).then(|| f.trunc() as i64);
    match v {
        Value::Int(i) => Some(*i),
        Value::Float(f) => whole(*f),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => {
            let t = v.as_str()?.trim();
            t.parse::<i64>().ok().or_else(|| t.parse::<f64>().ok().and_then(whole))
        }
    }
}

fn to_float(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => v.as_str()?.trim().parse().ok(),
    }
}

fn describe(v: &Value) -> String {
    match v.as_str() {
        Some(s) => format!("the string {}", preview(s)),
        None => v.a_type(),
    }
}

/// A string shortened for messages.
pub fn preview(s: &str) -> String {
    let short: String = s.chars().take(40).collect();
    if short.len() < s.len() {
        format!("{short:?}…")
    } else {
        format!("{short:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(op: BinaryOp, x: i64, y: i64) -> OpResult {
        binary(op, &Value::Int(x), &Value::Int(y))
    }

    #[test]
    fn integer_division_and_modulo_follow_python_without_overflow_panics() {
        use BinaryOp::{FloorDiv, Mod};
        for (x, y, q, r) in [(7, 2, 3, 1), (-7, 2, -4, 1), (7, -2, -4, -1), (-7, -2, 3, -1), (6, -3, -2, 0)] {
            assert!(matches!(int(FloorDiv, x, y), Ok(Value::Int(v)) if v == q), "{x} // {y}");
            assert!(matches!(int(Mod, x, y), Ok(Value::Int(v)) if v == r), "{x} % {y}");
        }
        assert_eq!(int(FloorDiv, i64::MIN, -1).unwrap_err(), Failure::value("integer overflow"));
        assert!(matches!(int(Mod, i64::MIN, -1), Ok(Value::Int(0))));
        assert!(matches!(int(Mod, i64::MAX - 1, i64::MAX), Ok(Value::Int(v)) if v == i64::MAX - 1));
        assert!(matches!(int(Mod, i64::MIN, i64::MAX), Ok(Value::Int(v)) if v == i64::MAX - 1));
        assert_eq!(test("divisibleby", &Value::Int(i64::MIN), &[Value::Int(-1)]), Ok(true));
    }
}
