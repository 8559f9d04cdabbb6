//! Structural checks of JSON Schemas given to `json=`: keyword value types,
//! local `$ref`s that resolve, regex `pattern`s that compile, and unknown
//! keywords (usually typos). A map literal gets errors at the exact entry;
//! a schema file gets them at the option, with the JSON pointer.

use std::collections::HashMap;

use serde_json::Value;

use crate::diagnostic::{Code, Diagnostic};
use crate::span::{FileId, Span};
use crate::syntax::ast::{Expr, ExprKind};

/// Every keyword the checker knows (draft 4 to 2020-12).
pub const KEYWORDS: &[&str] = &[
    "type", "properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "required", "items",
    "prefixItems", "allOf", "anyOf", "oneOf", "additionalProperties", "additionalItems", "unevaluatedProperties",
    "unevaluatedItems", "not", "contains", "propertyNames", "if", "then", "else", "enum", "const", "default",
    "examples", "title", "description", "$comment", "$schema", "$id", "id", "$anchor", "$dynamicAnchor", "$dynamicRef",
    "$vocabulary", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "contentSchema",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "format", "$ref",
    "uniqueItems", "dependencies", "dependentRequired", "nullable", "discriminator", "x-order",
];

const TYPES: &[&str] = &["null", "boolean", "object", "array", "number", "string", "integer"];

/// A problem at a JSON pointer.
struct Problem {
    pointer: String,
    /// True: point at the key; false: at the value.
    at_key: bool,
    message: String,
    warning: bool,
}

/// Checks a schema written as a map literal.
pub fn check_literal(e: &Expr, file: FileId, out: &mut Vec<Diagnostic>) {
    let mut spans = HashMap::new();
    let Some(value) = to_json(e, String::new(), &mut spans) else { return };
    let mut problems = Vec::new();
    walk(&value, &value, "", &mut problems);
    for p in problems {
        let (key, val) = spans.get(&p.pointer).copied().unwrap_or((e.span, e.span));
        let span = if p.at_key { key } else { val };
        out.push(make(file, span, &p));
    }
}

/// Checks a schema file named by `json="path"`, relative to the template.
pub fn check_file(path: &str, span: Span, semantics: crate::engine::Semantics, ctx: &super::Ctx<'_>, out: &mut Vec<Diagnostic>) {
    let full = match crate::files::resolve_named(path, ctx.base_dir.as_deref(), ctx.root) {
        Ok(f) => f,
        Err(r) => {
            out.push(Diagnostic::new(Code::SchemaFile, ctx.file, span, r.message(path)).with_help(r.help()));
            return;
        }
    };
    // Messages name the path as written (relative to the template), not
    // where it happens to resolve on this machine.
    let text = match ctx.loader.read(&full) {
        Ok(t) => t,
        Err(e) => {
            out.push(
                Diagnostic::new(Code::SchemaFile, ctx.file, span, format!("cannot read the schema file `{path}`: {e}"))
                    .with_help("a string given to `json=` is a path relative to the template; give a map to write the schema inline"),
            );
            return;
        }
    };
    let value: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            out.push(
                Diagnostic::new(Code::SchemaFile, ctx.file, span, format!("`{path}` is not JSON: {e}"))
                    .with_help("the file must hold one JSON Schema document"),
            );
            return;
        }
    };
    let mut problems = Vec::new();
    walk(&value, &value, "", &mut problems);
    let clean = !problems.iter().any(|p| !p.warning);
    for mut p in problems {
        p.message = format!("in `{}` at `{}`: {}", path, if p.pointer.is_empty() { "/" } else { &p.pointer }, p.message);
        out.push(make(ctx.file, span, &p));
    }
    if clean {
        super::options::check_engine_schema(&value, span, semantics, ctx, out);
    }
}

fn make(file: FileId, span: Span, p: &Problem) -> Diagnostic {
    if p.warning {
        Diagnostic::new(Code::UnknownSchemaKeyword, file, span, p.message.clone())
            .with_help("unknown keywords are ignored by JSON Schema; check the spelling")
    } else {
        Diagnostic::new(Code::InvalidSchema, file, span, p.message.clone())
    }
}

/// Converts a literal to JSON, recording (key span, value span) per pointer.
fn to_json(e: &Expr, ptr: String, spans: &mut HashMap<String, (Span, Span)>) -> Option<Value> {
    Some(match &e.kind {
        ExprKind::Map(kv) => {
            let mut m = serde_json::Map::new();
            for (k, v) in kv {
                let key = k.as_str()?.to_string();
                let p = format!("{ptr}/{}", escape(&key));
                spans.insert(p.clone(), (k.span, v.span));
                m.insert(key, to_json(v, p, spans)?);
            }
            Value::Object(m)
        }
        ExprKind::List(items) => {
            let mut a = Vec::new();
            for (i, v) in items.iter().enumerate() {
                let p = format!("{ptr}/{i}");
                spans.insert(p.clone(), (v.span, v.span));
                a.push(to_json(v, p, spans)?);
            }
            Value::Array(a)
        }
        _ => e.to_const()?.to_json(),
    })
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn err(out: &mut Vec<Problem>, pointer: String, message: String) {
    out.push(Problem { pointer, at_key: false, message, warning: false });
}

fn walk(root: &Value, v: &Value, ptr: &str, out: &mut Vec<Problem>) {
    let obj = match v {
        Value::Bool(_) => return,
        Value::Object(o) => o,
        _ => return err(out, ptr.to_string(), "a schema must be a map or a boolean".into()),
    };
    let schema = |out: &mut Vec<Problem>, v: &Value, p: String| walk(root, v, &p, out);
    for (k, val) in obj {
        let p = format!("{ptr}/{}", escape(k));
        match k.as_str() {
            "type" => {
                let ok = |t: &Value| t.as_str().is_some_and(|s| TYPES.contains(&s));
                let fine = match val {
                    Value::String(_) => ok(val),
                    Value::Array(a) => !a.is_empty() && a.iter().all(ok),
                    _ => false,
                };
                if !fine {
                    err(out, p, format!("`type` must be one of {} (or a list of them)", TYPES.join(", ")));
                }
            }
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => match val {
                Value::Object(m) => {
                    for (name, sub) in m {
                        let sp = format!("{p}/{}", escape(name));
                        if k == "patternProperties" {
                            if let Err((_, _, msg)) = super::options::compile_regex(name) {
                                out.push(Problem { pointer: sp.clone(), at_key: true, message: format!("invalid regex: {msg}"), warning: false });
                            }
                        }
                        schema(out, sub, sp);
                    }
                }
                _ => err(out, p, format!("`{k}` must map names to schemas")),
            },
            "required" => {
                if !val.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
                    err(out, p, "`required` must be a list of property names".into());
                }
            }
            "items" => match val {
                Value::Array(a) => a.iter().enumerate().for_each(|(i, s)| schema(out, s, format!("{p}/{i}"))),
                _ => schema(out, val, p),
            },
            "prefixItems" | "allOf" | "anyOf" | "oneOf" => match val {
                Value::Array(a) if !a.is_empty() => a.iter().enumerate().for_each(|(i, s)| schema(out, s, format!("{p}/{i}"))),
                _ => err(out, p, format!("`{k}` must be a non-empty list of schemas")),
            },
            "additionalProperties" | "additionalItems" | "unevaluatedProperties" | "unevaluatedItems" | "not"
            | "contains" | "propertyNames" | "if" | "then" | "else" | "contentSchema" => schema(out, val, p),
            "enum" => {
                if val.as_array().is_none_or(|a| a.is_empty()) {
                    err(out, p, "`enum` must be a non-empty list of values".into());
                }
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" | "minContains"
            | "maxContains" => {
                if val.as_u64().is_none() && !val.as_f64().is_some_and(|f| f >= 0.0 && f.fract() == 0.0) {
                    err(out, p, format!("`{k}` must be a non-negative integer"));
                }
            }
            "minimum" | "maximum" => {
                if !val.is_number() {
                    err(out, p, format!("`{k}` must be a number"));
                }
            }
            "exclusiveMinimum" | "exclusiveMaximum" => {
                if !(val.is_number() || val.is_boolean()) {
                    err(out, p, format!("`{k}` must be a number"));
                }
            }
            "multipleOf" => {
                if !val.as_f64().is_some_and(|f| f > 0.0) {
                    err(out, p, "`multipleOf` must be a number greater than 0".into());
                }
            }
            "pattern" => match val.as_str() {
                Some(s) => {
                    if let Err((_, _, msg)) = super::options::compile_regex(s) {
                        err(out, p, format!("invalid regex in `pattern`: {msg}"));
                    }
                }
                None => err(out, p, "`pattern` must be a string".into()),
            },
            "format" | "$comment" | "$schema" | "$id" | "$anchor" | "title" | "description" => {
                if !val.is_string() {
                    err(out, p, format!("`{k}` must be a string"));
                }
            }
            "$ref" => match val.as_str() {
                Some(r) if r.starts_with('#') => {
                    let pointer = &r[1..];
                    let target = if pointer.is_empty() { Some(root) } else { root.pointer(pointer) };
                    if target.is_none() && !pointer.is_empty() && !pointer.starts_with('/') {
                        // `#anchor` refs are resolved by the engine.
                    } else if target.is_none() {
                        err(out, p, format!("`$ref` `{r}` points at nothing in this schema"));
                    }
                }
                Some(_) => {}
                None => err(out, p, "`$ref` must be a string".into()),
            },
            "uniqueItems" | "deprecated" | "readOnly" | "writeOnly" | "nullable" => {
                if !val.is_boolean() {
                    err(out, p, format!("`{k}` must be `true` or `false`"));
                }
            }
            "dependencies" | "dependentRequired" => {
                if !val.is_object() {
                    err(out, p, format!("`{k}` must be a map"));
                }
            }
            k if KEYWORDS.contains(&k) => {}
            k if k.starts_with("x-") || k.starts_with('$') => {}
            other => {
                let message = match crate::diagnostic::suggest(other, KEYWORDS.iter().copied()) {
                    Some(s) => format!("unknown JSON Schema keyword `{other}`; did you mean `{s}`?"),
                    None => format!("unknown JSON Schema keyword `{other}`"),
                };
                out.push(Problem { pointer: p, at_key: true, message, warning: true });
            }
        }
    }
    for (lo, hi) in [("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"), ("minimum", "maximum")] {
        if let (Some(a), Some(b)) = (obj.get(lo).and_then(Value::as_f64), obj.get(hi).and_then(Value::as_f64)) {
            if a > b {
                err(out, format!("{ptr}/{hi}"), format!("`{hi}` ({b}) is below `{lo}` ({a}): nothing can match"));
            }
        }
    }
}

/// JSON pointers of the objects in `schema` that an explicit
/// `additionalProperties: true` (or `{}`) opens to any other key with no
/// `maxProperties` to bound them.
pub(super) fn open_objects(schema: &Value, pointer: &str, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            let open = matches!(map.get("additionalProperties"), Some(Value::Bool(true))) || map.get("additionalProperties").is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()));
            if open && !map.contains_key("maxProperties") {
                out.push(pointer.to_string());
            }
            // Values of these are data, not schemas.
            for (k, v) in map.iter().filter(|(k, _)| !matches!(k.as_str(), "enum" | "const" | "default" | "examples")) {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                open_objects(v, &format!("{pointer}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                open_objects(v, &format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}
