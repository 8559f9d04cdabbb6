//! When is `oneOf` the same as `anyOf`? When no value satisfies two of its
//! branches: then "exactly one" and "at least one" agree, and the grammar
//! of `anyOf` is exact. The test here is conservative: `false` whenever it
//! cannot prove that two schemas share no value. Branches that only list
//! required properties are made exclusive instead ([`exclusive_required`]).

use serde_json::Value;

/// Kinds of JSON values, as bits (integers apart from other numbers, so
/// that `integer` and `number` overlap exactly where they should).
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const INTEGER: u8 = 4;
const FRACTION: u8 = 8;
const STRING: u8 = 16;
const ARRAY: u8 = 32;
const OBJECT: u8 = 64;
const ALL: u8 = 127;

/// How deep the proof may look into properties and references.
const MAX_DEPTH: usize = 8;

/// True when no value satisfies both `a` and `b` (local `$ref`s resolved
/// against `root`).
pub(super) fn disjoint(root: &Value, a: &Value, b: &Value) -> bool {
    disjoint_at(root, a, b, 0)
}

/// `oneOf` branches that only say `required` (`[{"required": ["a"]},
/// {"required": ["b"]}]`, "a or b, not both"), rewritten as `anyOf`
/// branches no two of which hold together: where another branch requires
/// exactly one property that branch i does not, branch i forbids it; where
/// another requires none that branch i does not, both would hold and branch
/// i is dropped. `None` when the branches are not of that form, or another
/// branch requires two or more that branch i does not ("not all of them"
/// has no grammar here).
pub(super) fn exclusive_required(branches: &[Value]) -> Option<Vec<Value>> {
    let required: Vec<Vec<&str>> = branches
        .iter()
        .map(|b| {
            let o = b.as_object()?;
            o.keys().all(|k| matches!(k.as_str(), "required" | "title" | "description" | "$comment")).then_some(())?;
            o.get("required")?.as_array()?.iter().map(Value::as_str).collect::<Option<Vec<&str>>>()
        })
        .collect::<Option<_>>()?;
    let mut out = Vec::new();
    'branch: for (i, mine) in required.iter().enumerate() {
        let mut forbidden = serde_json::Map::new();
        for other in required.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, o)| o) {
            let missing: Vec<&&str> = other.iter().filter(|p| !mine.contains(p)).collect();
            match missing.as_slice() {
                [] => continue 'branch,
                [p] => {
                    forbidden.insert(p.to_string(), Value::Bool(false));
                }
                _ => return None,
            }
        }
        let mut b = serde_json::json!({"required": mine, "properties": forbidden});
        // Every branch holds for a value that is not an object, so with two
        // or more of them `oneOf` refuses those.
        if branches.len() > 1 {
            b["type"] = Value::from("object");
        }
        out.push(b);
    }
    Some(out)
}

/// True when every pair of `branches` is [`disjoint`].
pub(super) fn pairwise_disjoint(root: &Value, branches: &[Value]) -> bool {
    branches.iter().enumerate().all(|(i, a)| branches[i + 1..].iter().all(|b| disjoint(root, a, b)))
}

fn disjoint_at(root: &Value, a: &Value, b: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let (a, b) = (deref(root, a), deref(root, b));
    if matches!(a, Value::Bool(false)) || matches!(b, Value::Bool(false)) {
        return true;
    }
    let (Some(ao), Some(bo)) = (a.as_object(), b.as_object()) else { return false };
    let common = kinds(root, a, depth) & kinds(root, b, depth);
    if common == 0 {
        return true;
    }
    if let (Some(va), Some(vb)) = (listed(ao), listed(bo)) {
        return va.iter().all(|x| vb.iter().all(|y| !same_value(x, y)));
    }
    // A listed value list against an arbitrary schema: each value must fail
    // the other schema's kinds (done above) — nothing more is tried.
    if common == OBJECT {
        return objects_disjoint(root, ao, bo, depth) || objects_disjoint(root, bo, ao, depth);
    }
    false
}

/// Objects that cannot satisfy both: a property required by both whose
/// schemas are disjoint, or a property `b` requires that `a` forbids.
fn objects_disjoint(root: &Value, a: &serde_json::Map<String, Value>, b: &serde_json::Map<String, Value>, depth: usize) -> bool {
    let required = |o: &serde_json::Map<String, Value>| -> Vec<String> {
        o.get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let props = |o: &serde_json::Map<String, Value>| o.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
    let (ra, rb) = (required(a), required(b));
    let (pa, pb) = (props(a), props(b));
    for name in ra.iter().filter(|n| rb.contains(n)) {
        if let (Some(x), Some(y)) = (pa.get(name), pb.get(name)) {
            if disjoint_at(root, x, y, depth + 1) {
                return true;
            }
        }
    }
    // `a` allows only its listed properties (and no patterns): a name `b`
    // requires outside them cannot appear in a value of `a`.
    let closed = a.get("additionalProperties") == Some(&Value::Bool(false)) && !a.contains_key("patternProperties");
    closed && rb.iter().any(|n| !pa.contains_key(n))
}

/// The kinds of value a schema allows, as far as `type`, `const`/`enum`
/// and the branches of `anyOf`/`oneOf`/`allOf` tell.
fn kinds(root: &Value, s: &Value, depth: usize) -> u8 {
    if depth > MAX_DEPTH {
        return ALL;
    }
    let s = deref(root, s);
    let Some(o) = s.as_object() else {
        return if s == &Value::Bool(false) { 0 } else { ALL };
    };
    let mut k = match o.get("type") {
        Some(Value::String(t)) => type_kinds(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).map(type_kinds).fold(0, |a, b| a | b),
        _ => ALL,
    };
    if o.get("nullable") == Some(&Value::Bool(true)) {
        k |= NULL;
    }
    if let Some(values) = listed(o) {
        k &= values.iter().map(|v| value_kind(v)).fold(0, |a, b| a | b);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = o.get(key).and_then(Value::as_array) {
            k &= list.iter().map(|b| kinds(root, b, depth + 1)).fold(0, |a, b| a | b);
        }
    }
    if let Some(list) = o.get("allOf").and_then(Value::as_array) {
        for b in list {
            k &= kinds(root, b, depth + 1);
        }
    }
    k
}

fn type_kinds(t: &str) -> u8 {
    match t {
        "null" => NULL,
        "boolean" => BOOLEAN,
        "integer" => INTEGER,
        "number" => INTEGER | FRACTION,
        "string" => STRING,
        "array" => ARRAY,
        "object" => OBJECT,
        _ => ALL,
    }
}

fn value_kind(v: &Value) -> u8 {
    match v {
        Value::Null => NULL,
        Value::Bool(_) => BOOLEAN,
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => INTEGER,
        Value::Number(_) => FRACTION,
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
        Value::Object(_) => OBJECT,
    }
}

/// The values of `const` or `enum`.
fn listed(o: &serde_json::Map<String, Value>) -> Option<Vec<&Value>> {
    match (o.get("const"), o.get("enum")) {
        (Some(c), _) => Some(vec![c]),
        (None, Some(Value::Array(v))) => Some(v.iter().collect()),
        _ => None,
    }
}

/// JSON Schema equality: numbers by value (`1` is `1.0`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w))),
        _ => a == b,
    }
}

/// The schema a local `$ref` chain ends at (the schema itself otherwise).
fn deref<'a>(root: &'a Value, mut s: &'a Value) -> &'a Value {
    for _ in 0..16 {
        // `pointer("")` is the root itself.
        match s.get("$ref").and_then(Value::as_str).and_then(|r| root.pointer(r.strip_prefix('#')?)) {
            Some(t) => s = t,
            None => break,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn disjoint_only_where_provable() {
        let root = json!({"$defs": {"s": {"type": "string"}, "n": {"type": "number"}}});
        let yes = [
            (json!({"type": "string"}), json!({"type": "null"})),
            (json!({"$ref": "#/$defs/s"}), json!({"type": ["integer", "boolean"]})),
            (json!({"type": "integer"}), json!({"const": 1.5})),
            (json!({"enum": ["a", "b"]}), json!({"enum": ["c", 1]})),
            (
                json!({"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]}),
                json!({"properties": {"k": {"const": "y"}}, "required": ["k"], "type": "object"}),
            ),
            (
                json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false}),
                json!({"type": "object", "required": ["b"]}),
            ),
            (json!({"anyOf": [{"type": "string"}, {"type": "null"}]}), json!({"type": "array"})),
        ];
        for (a, b) in &yes {
            assert!(disjoint(&root, a, b) && disjoint(&root, b, a), "{a} / {b}");
        }
        let no = [
            (json!({"type": "integer"}), json!({"$ref": "#/$defs/n"})),
            (json!({"enum": [1, "a"]}), json!({"enum": [1.0]})),
            (json!({"type": "string", "maxLength": 3}), json!({"type": "string", "minLength": 5})),
            (json!({"type": "object", "required": ["a"]}), json!({"type": "object", "required": ["b"]})),
            (json!({}), json!({"type": "null"})),
            (
                json!({"type": "object", "properties": {"k": {"const": "x"}}}),
                json!({"type": "object", "properties": {"k": {"const": "y"}}}),
            ),
        ];
        for (a, b) in &no {
            assert!(!disjoint(&root, a, b), "{a} / {b} share values");
        }
    }
}
