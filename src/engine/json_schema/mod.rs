//! JSON Schema to a grammar (the GBNF AST), compiled by [`super::Cfg`].
//!
//! Exact where it claims support; anything it cannot enforce is an error
//! naming the keyword (never silently ignored): `oneOf` and `not` beyond
//! the forms below, `uniqueItems: true`, `multipleOf`, unknown `format`s,
//! remote `$ref`s. Properties may come in any order, each at most once (a
//! [`Expr::Permutation`]), with additional properties anywhere among them
//! where the schema allows them: for generation an object that lists its
//! keys is closed unless it says otherwise ([`Semantics::Generation`]); validation
//! semantics ([`Semantics::Validation`]) allow what the schema does not forbid.
//!
//! Differences of regular languages (a [`Expr::Except`], one automaton)
//! make the rest exact: keys by `patternProperties` and "any other key"
//! (the string minus the listed names and the patterns); a `pattern` or
//! `format` with lengths; `oneOf` over regular branches (each minus the
//! others) where they are not provably disjoint ([`disjoint`]); `not` of a
//! regular schema beside a regular one. Where values are compared through
//! their texts, only the one canonical text of each value is taken
//! ([`canonical`]).

mod disjoint;
mod numbers;
mod object;

use std::collections::HashMap;

use regex_syntax::hir::{self, Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Look};
use serde_json::Value;

use super::{Dfa, EngineError, Limits};
use numbers::{integer_regex, number_regex, NUMBER};
use super::grammar::{Expr, Grammar, Rule};

/// White space the generated JSON may contain between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whitespace {
    /// None at all: `{"a":1}`.
    Compact,
    /// Up to this many spaces, tabs or newlines at each place JSON allows them.
    Flexible(u32),
    /// Any amount of white space (llguidance's default; bound it with `max_tokens`).
    Any,
    /// As llama.cpp's JSON grammars: nothing, one space, or one or two line
    /// breaks and up to 20 spaces or tabs of indent. Room for the layouts
    /// models learnt JSON in (`{"a": 1}`, pretty-printed), none for junk.
    Pretty,
}

/// How a schema is read where it leaves room: for generating values, or
/// for validating them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Semantics {
    /// As generation engines read it (llama.cpp, XGrammar's strict mode,
    /// OpenAI's structured outputs): an object that lists `properties` or
    /// `patternProperties` takes no other key and a tuple no other item
    /// unless the schema opens them (`{"type": "object"}` alone stays open),
    /// and listed properties come in the schema's order. An open object
    /// invites a small model to ramble, and any order lets it wander: keys
    /// in the order a schema gives them are the rail the model follows.
    #[default]
    Generation,
    /// JSON Schema's validation semantics: anything not forbidden is
    /// allowed, properties in any order.
    Validation,
}

/// A schema's grammar, and what the grammar alone cannot enforce.
#[derive(Debug, Clone)]
pub struct SchemaGrammar {
    /// The grammar; its start rule is `root`.
    pub grammar: Grammar,
    /// Some object takes keys it does not list (other keys or keys by
    /// pattern), which must not repeat each other: the matcher sees to it.
    pub other_keys: bool,
}

/// Compiles `schema` to a grammar whose start rule is `root`.
pub fn schema_grammar(schema: &Value, ws: Whitespace, semantics: Semantics) -> Result<SchemaGrammar, EngineError> {
    let mut c = Conv { root: schema, rules: Vec::new(), refs: HashMap::new(), ws, semantics, other_keys: false, depth: 0 };
    let body = c.schema(schema)?;
    c.rules.insert(0, Rule { name: "root".into(), body });
    Ok(SchemaGrammar { grammar: Grammar { rules: c.rules }, other_keys: c.other_keys })
}

fn lit(s: &str) -> Expr {
    Expr::Literal(s.to_string())
}
fn seq(v: Vec<Expr>) -> Expr {
    Expr::Seq(v)
}
fn alt(v: Vec<Expr>) -> Expr {
    if v.len() == 1 {
        return v.into_iter().next().expect("one");
    }
    Expr::Alt(v)
}
fn rx(r: &str) -> Expr {
    Expr::Regex(r.to_string())
}
fn rep(x: Expr, min: u32, max: Option<u32>) -> Expr {
    Expr::Repeat { inner: Box::new(x), min, max }
}
fn reference(name: &str) -> Expr {
    Expr::Ref(name.to_string())
}

/// The one text of each JSON string and number value: escapes only where
/// needed (short forms where JSON has them, lowercase hex), numbers without
/// exponent, trailing fraction zeros or `-0`.
const CANONICAL: &str = r#""(?:[^"\\\x00-\x1F]|\\["\\bfnrt]|\\u00(?:0[0-7]|0b|0e|0f|1[0-9a-f]))*"|0|-?(?:[1-9][0-9]*(?:\.[0-9]*[1-9])?|0\.[0-9]*[1-9])"#;

const STRING_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))"#;

/// Bytes of `enum` texts past which the list is a lexeme of its own.
const LONG_ENUM: usize = 256;

/// Validation keywords the engine refuses, with the reason (some only in
/// some forms: `oneOf`, `not`, `multipleOf`; see `docs/reference.md`).
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("oneOf", "its branches may overlap, and exactly-one-of cannot be enforced while generating"),
    ("not", "negation cannot be enforced while generating"),
    ("if", "conditional schemas are not supported"),
    ("then", "conditional schemas are not supported"),
    ("else", "conditional schemas are not supported"),
    ("multipleOf", "multiples are not supported"),
    ("contains", "not supported"),
    ("minContains", "not supported"),
    ("maxContains", "not supported"),
    ("propertyNames", "not supported"),
    ("dependentSchemas", "not supported"),
    ("unevaluatedProperties", "not supported"),
    ("unevaluatedItems", "not supported"),
    ("$dynamicRef", "not supported"),
    ("$recursiveRef", "not supported"),
];

/// Keywords that constrain values (the others annotate).
pub const VALIDATION: &[&str] = &[
    "type", "enum", "const", "anyOf", "allOf", "oneOf", "not", "nullable", "properties", "required",
    "additionalProperties", "patternProperties", "minProperties", "maxProperties", "items", "prefixItems",
    "minItems", "maxItems", "uniqueItems", "additionalItems", "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "$ref", "contains",
    "propertyNames", "dependencies", "if", "then", "else",
];

/// Keywords that only annotate.
const ANNOTATIONS: &[&str] = &[
    "title", "description", "default", "examples", "$schema", "$id", "id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType", "contentEncoding",
];

struct Conv<'s> {
    root: &'s Value,
    rules: Vec<Rule>,
    refs: HashMap<String, String>,
    ws: Whitespace,
    semantics: Semantics,
    /// Some object compiled so far takes keys it does not list.
    other_keys: bool,
    depth: usize,
}

fn unsupported(k: &str, why: &str) -> EngineError {
    EngineError::Unsupported(format!("JSON Schema keyword `{k}`: {why}"))
}

impl<'s> Conv<'s> {
    fn ws(&self) -> Expr {
        match self.ws {
            Whitespace::Compact => seq(vec![]),
            Whitespace::Flexible(n) => rep(Expr::Class { negated: false, ranges: vec![(' ', ' '), ('\t', '\t'), ('\n', '\n')] }, 0, Some(n)),
            Whitespace::Any => rep(Expr::Class { negated: false, ranges: vec![(' ', ' '), ('\t', '\t'), ('\n', '\n'), ('\r', '\r')] }, 0, None),
            Whitespace::Pretty => rx(r"(?: |\n{1,2}[ \t]{0,20})?"),
        }
    }

    /// A value written as one lexeme of its own (see `%` rules in `cfg`),
    /// shared by every place that uses the same regex.
    fn atomic(&mut self, regex: String) -> Expr {
        let body = rx(&regex);
        self.shared(format!("%{regex}"), body)
    }

    /// A reference to the rule of `body`, made once per `key`.
    fn shared(&mut self, key: String, body: Expr) -> Expr {
        let name = match self.refs.get(&key) {
            Some(n) => n.clone(),
            None => {
                let n = format!("%v{}", self.refs.len());
                self.refs.insert(key, n.clone());
                self.add_rule(n.clone(), body);
                n
            }
        };
        reference(&name)
    }

    /// The branches of `anyOf` (or else `oneOf`), each with the keywords
    /// beside it applied; branches nothing satisfies are left out.
    fn branches(&mut self, obj: &serde_json::Map<String, Value>) -> Result<Vec<Expr>, EngineError> {
        let list = obj.get("anyOf").or_else(|| obj.get("oneOf")).and_then(Value::as_array).ok_or_else(|| unsupported("anyOf", "must be a list"))?;
        let base: serde_json::Map<String, Value> = obj.iter().filter(|(k, _)| *k != "anyOf" && *k != "oneOf").map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut alts = Vec::new();
        for sub in list {
            let combined = if base.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
                sub.clone()
            } else {
                merge_all_of(&serde_json::Map::new(), &Value::Array(vec![Value::Object(base.clone()), sub.clone()]))?
            };
            match self.schema(&combined) {
                Err(EngineError::Unsatisfiable(_)) => continue,
                other => alts.push(other?),
            }
        }
        Ok(alts)
    }

    /// `oneOf` whose branches are all regular (strings by pattern, format
    /// or enum, numbers, literals): each branch minus the others, which is
    /// exactly "one of". `None` when a branch is not regular.
    fn one_of_regular(&mut self, obj: &serde_json::Map<String, Value>) -> Result<Option<Expr>, EngineError> {
        let branches = self.branches(obj)?;
        if !branches.iter().all(|b| self.is_regular(b, 0)) {
            return Ok(None);
        }
        if branches.len() < 2 {
            return Ok(Some(alt(branches)));
        }
        let exclusive = (0..branches.len()).map(|i| {
            let others: Vec<Expr> = branches.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, b)| b.clone()).collect();
            minus(canonical(branches[i].clone()), alt(others))
        });
        Ok(Some(alt(exclusive.collect())))
    }

    /// `rest` and `not: n`. Handled: `not` of `true`/`false`, of types, of
    /// one required property (objects without it), and of any schema when
    /// both are regular (what `rest` takes minus what `n` takes). `None`
    /// for the rest, which stay an error naming `not`.
    fn negation(&mut self, rest: &serde_json::Map<String, Value>, n: &Value) -> Result<Option<Expr>, EngineError> {
        let Some(n) = n.as_object() else {
            return match n {
                Value::Bool(false) => self.schema(&Value::Object(rest.clone())).map(Some),
                _ => Err(EngineError::Unsatisfiable("`not: true` matches nothing".into())),
            };
        };
        let keys: Vec<&str> = n.keys().map(String::as_str).filter(|k| !ANNOTATIONS.contains(k)).collect();
        if keys.is_empty() {
            return Err(EngineError::Unsatisfiable("`not` of a schema every value satisfies matches nothing".into()));
        }
        let types = |v: Option<&Value>| -> Vec<String> {
            match v {
                Some(Value::String(t)) => vec![t.clone()],
                Some(Value::Array(ts)) => ts.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
                _ => ALL_TYPES.iter().map(|t| t.to_string()).collect(),
            }
        };
        let mut out = rest.clone();
        let have = types(rest.get("type"));
        if keys == ["type"] {
            let gone = types(n.get("type"));
            let number_gone = gone.iter().any(|g| g == "number");
            // "Not an integer" leaves the numbers with a fraction: no type says that.
            let partial = gone.iter().any(|t| t == "integer") && !number_gone;
            if !partial || !have.iter().any(|t| t == "number") {
                let left: Vec<Value> = have.into_iter().filter(|t| !gone.contains(t) && !(t == "integer" && number_gone)).map(Value::String).collect();
                if left.is_empty() {
                    return Err(EngineError::Unsatisfiable("`not` removes every type the schema allows".into()));
                }
                out.insert("type".into(), Value::Array(left));
                return self.schema(&Value::Object(out)).map(Some);
            }
        }
        let required = n.get("required").and_then(Value::as_array).map(Vec::as_slice);
        if let (["required"], Some([Value::String(name)])) = (keys.as_slice(), required) {
            // Only an object can lack a property `required` asks for.
            if !have.iter().any(|t| t == "object") {
                return Err(EngineError::Unsatisfiable("`not: {required}` takes objects only, and the schema allows none".into()));
            }
            out.insert("type".into(), Value::String("object".into()));
            if let Value::Object(p) = out.entry("properties").or_insert_with(|| Value::Object(Default::default())) {
                p.insert(name.clone(), Value::Bool(false));
            }
            return self.schema(&Value::Object(out)).map(Some);
        }
        let base = self.schema(&Value::Object(out))?;
        // What `n` takes among the values of `rest`'s types (an untyped `n`
        // takes objects too, which would make it irregular for nothing).
        let mut within = n.clone();
        if let (Some(t), false) = (rest.get("type"), n.contains_key("type")) {
            within.insert("type".into(), t.clone());
        }
        let taken = match self.schema(&Value::Object(within)) {
            Err(EngineError::Unsatisfiable(_)) => return Ok(Some(base)),
            other => other?,
        };
        if !self.is_regular(&base, 0) || !self.is_regular(&taken, 0) {
            return Ok(None);
        }
        Ok(Some(minus(canonical(base), taken)))
    }

    /// True when `g` names a regular language: no permutation, difference
    /// or recursion through the rules made so far.
    fn is_regular(&self, g: &Expr, depth: usize) -> bool {
        match g {
            Expr::Alt(v) | Expr::Seq(v) => v.iter().all(|x| self.is_regular(x, depth)),
            Expr::Repeat { inner, .. } => self.is_regular(inner, depth),
            Expr::Ref(r) => depth < 32 && self.rules.iter().find(|x| x.name == *r).is_some_and(|x| self.is_regular(&x.body, depth + 1)),
            Expr::Permutation { .. } | Expr::Except { .. } => false,
            Expr::Literal(_) | Expr::Class { .. } | Expr::Regex(_) | Expr::Any => true,
        }
    }

    fn add_rule(&mut self, name: String, body: Expr) {
        self.rules.push(Rule { name, body });
    }

    fn schema(&mut self, s: &Value) -> Result<Expr, EngineError> {
        self.depth += 1;
        if self.depth > 200 {
            self.depth -= 1;
            return Err(EngineError::TooComplex("the schema nests deeper than 200".into()));
        }
        // Deep schemas recurse deeply: grow the stack on the heap when short.
        let out = stacker::maybe_grow(64 * 1024, 1024 * 1024, || self.schema_inner(s));
        self.depth -= 1;
        out
    }

    fn schema_inner(&mut self, s: &Value) -> Result<Expr, EngineError> {
        let obj = match s {
            Value::Bool(true) => return Ok(self.any_value()),
            Value::Bool(false) => return Err(EngineError::Unsatisfiable("the schema `false` matches nothing".into())),
            Value::Object(o) => o,
            _ => return Err(EngineError::Unsupported("a schema must be an object or a boolean".into())),
        };
        if let Some(r) = obj.get("$ref") {
            // Drafts 4 to 7 ignore every keyword beside `$ref`; later drafts
            // apply them too, which is not supported.
            let others: Vec<&String> = obj.keys().filter(|k| *k != "$ref" && VALIDATION.contains(&k.as_str())).collect();
            if !others.is_empty() && !self.siblings_ignored() {
                return Err(unsupported(others[0], "beside `$ref` (draft 2019-09 and later) is not supported"));
            }
            return self.reference(r.as_str().unwrap_or_default());
        }
        // "Exactly one of these property sets": made exclusive, then `anyOf`.
        let one_of = obj.get("oneOf").filter(|_| !obj.contains_key("anyOf")).and_then(Value::as_array);
        if let Some(branches) = one_of.and_then(|b| disjoint::exclusive_required(b)) {
            let mut o = obj.clone();
            o.remove("oneOf");
            o.insert("anyOf".into(), Value::Array(branches));
            return self.schema(&Value::Object(o));
        }
        if let Some(n) = obj.get("not") {
            let mut rest = obj.clone();
            rest.remove("not");
            if let Some(g) = self.negation(&rest, n)? {
                return Ok(g);
            }
        }
        // Known validation keywords that cannot be enforced are refused by
        // name; keywords JSON Schema does not define are annotations and
        // are ignored, as the specification says.
        for k in obj.keys() {
            if let Some((_, why)) = UNSUPPORTED.iter().find(|(name, _)| name == k) {
                if k == "multipleOf" && obj.get(k).and_then(Value::as_f64) == Some(1.0) && obj.get("type").and_then(Value::as_str) == Some("integer") {
                    continue;
                }
                if k == "oneOf" && !obj.contains_key("anyOf") {
                    // Branches no value can satisfy two of: `oneOf` is `anyOf`.
                    if obj.get(k).and_then(Value::as_array).is_some_and(|b| disjoint::pairwise_disjoint(self.root, b)) {
                        continue;
                    }
                    if let Some(g) = self.one_of_regular(obj)? {
                        return Ok(g);
                    }
                }
                return Err(unsupported(k, why));
            }
        }
        // `const` and `enum` list the values; a `type` beside them filters them.
        let listed: Option<Vec<&Value>> = match (obj.get("const"), obj.get("enum")) {
            (Some(c), _) => Some(vec![c]),
            (None, Some(Value::Array(opts))) => Some(opts.iter().collect()),
            (None, Some(_)) => return Err(unsupported("enum", "must be a list")),
            (None, None) => None,
        };
        if let Some(values) = listed {
            let types: Option<Vec<&str>> = match obj.get("type") {
                Some(Value::String(t)) => Some(vec![t.as_str()]),
                Some(Value::Array(ts)) => Some(ts.iter().filter_map(Value::as_str).collect()),
                _ => None,
            };
            let fits = |v: &Value| match &types {
                None => true,
                Some(ts) => ts.iter().any(|t| match (*t, v) {
                    ("null", Value::Null) | ("boolean", Value::Bool(_)) | ("string", Value::String(_)) => true,
                    ("object", Value::Object(_)) | ("array", Value::Array(_)) | ("number", Value::Number(_)) => true,
                    ("integer", Value::Number(n)) => n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0),
                    _ => false,
                }),
            };
            let kept: Vec<String> = values.into_iter().filter(|v| fits(v)).map(json_text).collect();
            if kept.is_empty() {
                return Err(EngineError::Unsatisfiable("no value of `enum`/`const` has the schema's `type`".into()));
            }
            let body = alt(kept.iter().map(|t| lit(t)).collect());
            // A long list is a lexeme of its own, shared by every place that
            // lists it (country codes in two properties are one automaton).
            if kept.iter().map(String::len).sum::<usize>() > LONG_ENUM {
                return Ok(self.shared(format!("%enum\0{}", kept.join("\0")), body));
            }
            return Ok(body);
        }
        if let Some(all) = obj.get("allOf") {
            let resolved = self.resolve_refs(all)?;
            let merged = merge_all_of(obj, &resolved)?;
            return self.schema(&merged);
        }
        if obj.contains_key("anyOf") || obj.contains_key("oneOf") {
            let alts = self.branches(obj)?;
            if alts.is_empty() {
                return Err(EngineError::Unsatisfiable("no branch of `anyOf` can be satisfied".into()));
            }
            return Ok(alt(alts));
        }
        let mut types: Vec<String> = match obj.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
            Some(_) => return Err(unsupported("type", "must be a string or a list")),
            None => ALL_TYPES.iter().map(|t| t.to_string()).collect(),
        };
        if obj.get("nullable") == Some(&Value::Bool(true)) && !types.iter().any(|t| t == "null") {
            types.push("null".into());
        }
        let mut alts = Vec::new();
        for t in &types {
            alts.push(match t.as_str() {
                "null" => lit("null"),
                "boolean" => alt(vec![lit("true"), lit("false")]),
                "integer" => {
                    let r = integer_regex(obj)?;
                    self.atomic(r)
                }
                "number" => {
                    let r = number_regex(obj)?;
                    self.atomic(r)
                }
                "string" => self.string(obj)?,
                "array" => self.array(obj)?,
                "object" => self.object(obj)?,
                other => return Err(unsupported("type", &format!("unknown type `{other}`"))),
            });
        }
        Ok(alt(alts))
    }

    /// True when the schema's draft ignores keywords beside `$ref`
    /// (drafts 4 to 7, or no `$schema` at all).
    fn siblings_ignored(&self) -> bool {
        match self.root.get("$schema").and_then(Value::as_str) {
            None => true,
            Some(s) => ["draft-03", "draft-04", "draft-05", "draft-06", "draft-07"].iter().any(|d| s.contains(d)),
        }
    }

    /// The `allOf` branches with `$ref`-only branches replaced by their targets.
    fn resolve_refs(&self, all: &Value) -> Result<Value, EngineError> {
        let list = all.as_array().ok_or_else(|| unsupported("allOf", "must be a list"))?;
        let mut out = Vec::new();
        for b in list {
            let mut b = b.clone();
            for _ in 0..16 {
                let Some(r) = b.get("$ref").and_then(Value::as_str).map(str::to_string) else { break };
                let pointer = r.strip_prefix('#').ok_or_else(|| unsupported("$ref", &format!("only local references are supported, not `{r}`")))?;
                // `pointer("")` is the root itself.
                b = self.root.pointer(pointer).cloned().ok_or_else(|| unsupported("$ref", &format!("`{r}` points at nothing")))?;
            }
            if b.get("$ref").is_some() {
                return Err(unsupported("allOf", "references nest too deep"));
            }
            out.push(b);
        }
        Ok(Value::Array(out))
    }

    fn any_value(&mut self) -> Expr {
        if !self.refs.contains_key("<any>") {
            self.refs.insert("<any>".into(), "any".into());
            let ws = self.ws();
            let member = seq(vec![rx(&format!("\"{STRING_CHAR}*\"")), ws.clone(), lit(":"), ws.clone(), reference("any")]);
            let object = seq(vec![
                lit("{"),
                ws.clone(),
                rep(seq(vec![member.clone(), ws.clone(), rep(seq(vec![lit(","), ws.clone(), member, ws.clone()]), 0, None)]), 0, Some(1)),
                lit("}"),
            ]);
            let item = seq(vec![reference("any"), ws.clone()]);
            let array = seq(vec![
                lit("["),
                ws.clone(),
                rep(seq(vec![item.clone(), rep(seq(vec![lit(","), ws, item]), 0, None)]), 0, Some(1)),
                lit("]"),
            ]);
            let body = alt(vec![object, array, rx(&format!("\"{STRING_CHAR}*\"")), rx(NUMBER), lit("true"), lit("false"), lit("null")]);
            self.add_rule("any".into(), body);
        }
        reference("any")
    }

    fn reference(&mut self, r: &str) -> Result<Expr, EngineError> {
        if let Some(name) = self.refs.get(r) {
            return Ok(reference(name));
        }
        let Some(pointer) = r.strip_prefix('#') else {
            return Err(unsupported("$ref", &format!("only local references (`#/...`) are supported, not `{r}`")));
        };
        let target = self.root.pointer(pointer).ok_or_else(|| unsupported("$ref", &format!("`{r}` points at nothing")))?;
        let name = format!("ref{}", self.refs.len());
        self.refs.insert(r.to_string(), name.clone());
        let body = self.schema(target)?;
        self.add_rule(name.clone(), body);
        Ok(reference(&name))
    }

    fn string(&mut self, obj: &serde_json::Map<String, Value>) -> Result<Expr, EngineError> {
        // Known formats are enforced; others are annotations, as the
        // specification says of formats a validator does not know.
        let (min, max) = counts(obj, "minLength", "maxLength")?;
        // A format or pattern with lengths: the strings of the one minus
        // those of other lengths (`^[class]+$` forms take the lengths into
        // their count instead, which is cheaper).
        let shaped = match (obj.get("format").and_then(Value::as_str).and_then(format_regex), obj.get("pattern").and_then(Value::as_str)) {
            (Some(f), _) => Some(f.to_string()),
            (None, Some(p)) if min > 0 || max.is_some() => match counted_pattern(p, min, max)? {
                Some(counted) => return Ok(self.atomic(format!("\"{counted}\""))),
                None => Some(pattern_in_string(p)?),
            },
            (None, Some(p)) => Some(pattern_in_string(p)?),
            (None, None) => None,
        };
        if let Some(r) = shaped {
            let mut wrong = Vec::new();
            if min > 0 {
                wrong.push(format!("{STRING_CHAR}{{0,{}}}", min - 1));
            }
            if let Some(m) = max {
                wrong.push(format!("{STRING_CHAR}{{{},}}", m + 1));
            }
            if wrong.is_empty() {
                return Ok(self.atomic(format!("\"{r}\"")));
            }
            let body = minus(rx(&format!("\"{r}\"")), rx(&format!("\"(?:{})\"", wrong.join("|"))));
            return Ok(self.shared(format!("%{r}\0{min}\0{max:?}"), body));
        }
        // The character's regex is parsed once (and cached); each count
        // repeats its syntax tree.
        let body = seq(vec![lit("\""), rep(rx(STRING_CHAR), min, max), lit("\"")]);
        Ok(self.shared(format!("%\"{STRING_CHAR}{{{min},{max:?}}}\""), body))
    }

    fn array(&mut self, obj: &serde_json::Map<String, Value>) -> Result<Expr, EngineError> {
        if obj.get("uniqueItems") == Some(&Value::Bool(true)) {
            return Err(unsupported("uniqueItems", "uniqueness cannot be enforced while generating"));
        }
        let ws = self.ws();
        let prefix: Vec<&Value> = obj.get("prefixItems").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
        let items = match obj.get("items") {
            Some(Value::Array(a)) if prefix.is_empty() => {
                // Draft-4 tuples: `items` as a list, `additionalItems` after.
                let tuple: Vec<&Value> = a.iter().collect();
                return self.tuple(obj, tuple, obj.get("additionalItems").or(self.closed()));
            }
            other => other,
        };
        if !prefix.is_empty() {
            return self.tuple(obj, prefix, items.or(self.closed()));
        }
        let item = match items {
            Some(s) => self.schema(s)?,
            None => self.any_value(),
        };
        let (min, max) = counts(obj, "minItems", "maxItems")?;
        let one = seq(vec![item.clone(), ws.clone()]);
        let more = seq(vec![lit(","), ws.clone(), item, ws.clone()]);
        let list = match (min, max) {
            (_, Some(0)) => seq(vec![]),
            (0, m) => rep(seq(vec![one, rep(more, 0, m.map(|m| m - 1))]), 0, Some(1)),
            (n, m) => seq(vec![one, rep(more, n - 1, m.map(|m| m - 1))]),
        };
        Ok(seq(vec![lit("["), ws, list, lit("]")]))
    }

    fn tuple(&mut self, obj: &serde_json::Map<String, Value>, items: Vec<&Value>, rest: Option<&Value>) -> Result<Expr, EngineError> {
        let ws = self.ws();
        let min = counts(obj, "minItems", "maxItems")?.0 as usize;
        if obj.contains_key("maxItems") {
            return Err(unsupported("maxItems", "with a tuple (`prefixItems`) is not supported"));
        }
        let rest = match rest {
            None | Some(Value::Bool(true)) => Some(self.any_value()),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.schema(s)?),
        };
        // Items i.. as a comma-separated tail; item i may be absent only when
        // fewer than `min` are required and nothing follows it.
        let mut tail = rest.map(|r| rep(seq(vec![lit(","), ws.clone(), r, ws.clone()]), 0, None)).unwrap_or(seq(vec![]));
        let compiled: Vec<Expr> = items.iter().map(|s| self.schema(s)).collect::<Result<_, _>>()?;
        for (i, it) in compiled.into_iter().enumerate().rev() {
            let sep = if i == 0 { seq(vec![]) } else { seq(vec![lit(","), ws.clone()]) };
            let present = seq(vec![sep, it, ws.clone(), tail]);
            tail = if i >= min { rep(present, 0, Some(1)) } else { present };
        }
        Ok(seq(vec![lit("["), ws, tail, lit("]")]))
    }

}


/// What `base` takes that `except` does not.
fn minus(base: Expr, except: Expr) -> Expr {
    Expr::Except { base: Box::new(base), except: Box::new(except) }
}

/// The texts of `g` that are the one text of their value. Texts are
/// compared where values are meant (`1.0` is `1`, `"\u0041"` is `"A"`):
/// kept to one text per value (no needless escape, no exponent, trailing
/// zero or `-0`), a difference of texts is the difference of the values.
fn canonical(g: Expr) -> Expr {
    minus(g, minus(rx(&format!("\"{STRING_CHAR}*\"|{NUMBER}")), rx(CANONICAL)))
}

/// One of `patternProperties`: the ECMAScript pattern, the regex of the
/// JSON keys (quotes included) whose text it matches, and the value's schema.
struct PatternKey<'a> {
    pattern: &'a str,
    key: String,
    dfa: Dfa,
    schema: &'a Value,
}

impl PatternKey<'_> {
    /// True when the pattern matches the property name `name`.
    fn matches(&self, name: &str) -> bool {
        let text = json_text(&Value::String(name.to_string()));
        self.dfa.feed(self.dfa.start(), text.as_bytes()).is_some_and(|s| self.dfa.is_accepting(s))
    }
}

/// Most `patternProperties` in one object.
const MAX_PATTERNS: usize = 64;

/// The object's `patternProperties`. Two patterns that share a key must
/// share its schema too: a key they both match would need both.
fn pattern_keys(obj: &serde_json::Map<String, Value>) -> Result<Vec<PatternKey<'_>>, EngineError> {
    let mut out: Vec<PatternKey> = Vec::new();
    let all = obj.get("patternProperties").and_then(Value::as_object);
    // Each pair is checked for overlap: a product of two automata.
    if all.is_some_and(|a| a.len() > MAX_PATTERNS) {
        return Err(EngineError::TooComplex(format!("more than {MAX_PATTERNS} `patternProperties` in one object")));
    }
    let limits = Limits::default();
    for (pattern, schema) in all.into_iter().flatten() {
        let key = format!("\"{}\"", pattern_in_string(pattern)?);
        let dfa = Dfa::regex(&key, &limits)?;
        for other in out.iter().filter(|o| o.schema != schema) {
            // Some key matches both: what one takes minus what only it takes.
            if !dfa.difference(&dfa.difference(&other.dfa, &limits)?, &limits)?.is_empty() {
                let why = format!("the patterns {pattern:?} and {:?} match some keys in common and have different schemas", other.pattern);
                return Err(unsupported("patternProperties", &why));
            }
        }
        out.push(PatternKey { pattern, key, dfa, schema });
    }
    Ok(out)
}

/// True for the schemas every value satisfies (`true`, `{}`).
fn is_true(s: &Value) -> bool {
    matches!(s, Value::Bool(true)) || s.as_object().is_some_and(|o| o.is_empty())
}

/// Counts above this are past any generation: as a maximum they bound
/// nothing, as a minimum they cannot be met.
const MAX_COUNT: u64 = 100_000;

/// A `min…`/`max…` pair of counts (lengths, items), checked and clamped.
fn counts(obj: &serde_json::Map<String, Value>, min_key: &str, max_key: &str) -> Result<(u32, Option<u32>), EngineError> {
    let min = obj.get(min_key).and_then(Value::as_u64).unwrap_or(0);
    if min > MAX_COUNT {
        return Err(EngineError::TooComplex(format!("`{min_key}` {min} is past what can be generated ({MAX_COUNT})")));
    }
    let max = obj.get(max_key).and_then(Value::as_u64).filter(|&m| m <= MAX_COUNT);
    if let Some(m) = max {
        if m < min {
            return Err(EngineError::Unsatisfiable(format!("`{max_key}` {m} is below `{min_key}` {min}")));
        }
    }
    Ok((min as u32, max.map(|m| m as u32)))
}

/// Every JSON type: a schema without `type` allows them all, each keyword
/// constraining only values of its own type (`items` applies to arrays…).
const ALL_TYPES: &[&str] = &["null", "boolean", "object", "array", "string", "number"];

/// Compact JSON text of a value (as literals in the grammar).
fn json_text(v: &Value) -> String {
    serde_json::to_string(v).expect("JSON serialises")
}

/// `allOf` merged into one schema: object keywords combine, everything else
/// must agree.
fn merge_all_of(base: &serde_json::Map<String, Value>, all: &Value) -> Result<Value, EngineError> {
    let list = all.as_array().ok_or_else(|| unsupported("allOf", "must be a list"))?;
    let mut out: serde_json::Map<String, Value> = base.iter().filter(|(k, _)| *k != "allOf").map(|(k, v)| (k.clone(), v.clone())).collect();
    for sub in list {
        let Some(o) = sub.as_object() else { return Err(unsupported("allOf", "branches must be objects")) };
        for (k, v) in o {
            match (k.as_str(), out.get_mut(k)) {
                (_, None) => {
                    out.insert(k.clone(), v.clone());
                }
                ("properties", Some(Value::Object(p))) => {
                    for (name, s) in v.as_object().into_iter().flatten() {
                        // `false` (the property may not appear) wins; `true` adds nothing.
                        let merged = match p.get(name) {
                            None | Some(Value::Bool(true)) => s.clone(),
                            Some(old) if old == s || *s == Value::Bool(true) => old.clone(),
                            Some(Value::Bool(false)) => Value::Bool(false),
                            Some(_) if *s == Value::Bool(false) => Value::Bool(false),
                            // Both apply: merged in turn when the property is compiled.
                            Some(old) => serde_json::json!({"allOf": [old, s]}),
                        };
                        p.insert(name.clone(), merged);
                    }
                }
                ("required", Some(Value::Array(r))) => {
                    for x in v.as_array().into_iter().flatten() {
                        if !r.contains(x) {
                            r.push(x.clone());
                        }
                    }
                }
                (_, Some(old)) if old == v => {}
                // Only validation keywords can disagree; the rest annotate.
                (_, Some(_)) if !VALIDATION.contains(&k.as_str()) => {}
                _ => return Err(unsupported("allOf", &format!("branches disagree on `{k}`"))),
            }
        }
    }
    Ok(Value::Object(out))
}

/// A calendar date: month lengths exact, February 29 only in leap years.
macro_rules! date {
    () => {
        r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
    };
}
const DATE: &str = date!();

fn format_regex(f: &str) -> Option<&'static str> {
    Some(match f {
        "date-time" => concat!(date!(), r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"),
        "date" => DATE,
        "time" => r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?",
        "email" => r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+",
        "uuid" => r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        "ipv4" => r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
        "hostname" => r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
        "uri" | "iri" => r#"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20"\\<>^`{|}]*"#,
        // Or a relative reference (`#frag`, `../a`, `b?q`): no scheme, so
        // no `:` before the first `/`, `?` or `#`.
        "uri-reference" | "iri-reference" => {
            r#"(?:[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20"\\<>^`{|}]*|[^\x00-\x20"\\<>^`{|}:/?#]*(?:[/?#][^\x00-\x20"\\<>^`{|}]*)?)"#
        }
        _ => return None,
    })
}

/// The regex for a JSON string's content whose decoded text matches the
/// schema `pattern` (an unanchored search unless `^…$`). The pattern is
/// limited to characters that need no escape in JSON.
fn pattern_in_string(p: &str) -> Result<String, EngineError> {
    let hir = parse_pattern(p)?;
    // `^$|^a+$` or `^(?:$|a+$)`: each alternative anchored on its own.
    fn branches(h: Hir, starts: bool, ends: bool, out: &mut Vec<(bool, bool, Hir)>) {
        let h = match h.kind() {
            HirKind::Capture(c) => (*c.sub).clone(),
            _ => h,
        };
        let (s, e, core) = strip_anchors(h);
        match core.kind() {
            HirKind::Alternation(v) => v.iter().for_each(|b| branches(b.clone(), starts || s, ends || e, out)),
            _ => out.push((starts || s, ends || e, core)),
        }
    }
    let mut parts = Vec::new();
    branches(hir, false, false, &mut parts);
    let plain = r#"[^"\\\x00-\x1F]*"#;
    let mut alts = Vec::new();
    for (starts, ends, core) in parts {
        let core = no_escapes(&core)?;
        alts.push(format!("{}(?:{core}){}", if starts { "" } else { plain }, if ends { "" } else { plain }));
    }
    Ok(match alts.as_slice() {
        [one] => one.clone(),
        _ => format!("(?:{})", alts.join("|")),
    })
}

/// The string content for a `pattern` that is one repeated character class
/// between anchors (`^[a-z0-9-]+$`) with the schema's lengths folded into
/// the repetition count; `None` for other patterns.
fn counted_pattern(p: &str, min: u32, max: Option<u32>) -> Result<Option<String>, EngineError> {
    let (true, true, core) = strip_anchors(parse_pattern(p)?) else { return Ok(None) };
    let HirKind::Repetition(rep) = core.kind() else { return Ok(None) };
    if !matches!(rep.sub.kind(), HirKind::Class(_)) {
        return Ok(None);
    }
    let lo = rep.min.max(min);
    let hi = match (rep.max, max) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if hi.is_some_and(|h| h < lo) {
        return Err(EngineError::Unsatisfiable(format!("no string of `pattern` {p:?} has a length the schema allows")));
    }
    let counted = Hir::repetition(hir::Repetition { min: lo, max: hi, greedy: true, sub: rep.sub.clone() });
    no_escapes(&counted).map(Some)
}

/// The syntax tree of a schema's `pattern`.
fn parse_pattern(p: &str) -> Result<Hir, EngineError> {
    regex_syntax::ParserBuilder::new().build().parse(p).map_err(|e| EngineError::Regex(format!("`pattern` {p:?}: {e}")))
}

/// Removes a leading `^` and trailing `$`; reports which were there.
fn strip_anchors(h: Hir) -> (bool, bool, Hir) {
    let is = |x: &Hir, l: Look| matches!(x.kind(), HirKind::Look(k) if *k == l || (l == Look::Start && *k == Look::StartLF) || (l == Look::End && *k == Look::EndLF));
    match h.kind() {
        HirKind::Concat(v) => {
            let mut v = v.clone();
            let starts = v.first().is_some_and(|x| is(x, Look::Start));
            if starts {
                v.remove(0);
            }
            let ends = v.last().is_some_and(|x| is(x, Look::End));
            if ends {
                v.pop();
            }
            (starts, ends, Hir::concat(v))
        }
        _ if is(&h, Look::Start) => (true, false, Hir::empty()),
        _ if is(&h, Look::End) => (false, true, Hir::empty()),
        _ => (false, false, h),
    }
}

/// The regex text of `h` with quote, backslash and control characters
/// removed from every class; a literal holding one is refused.
fn no_escapes(h: &Hir) -> Result<String, EngineError> {
    let bad = ClassUnicode::new([ClassUnicodeRange::new('\0', '\x1F'), ClassUnicodeRange::new('"', '"'), ClassUnicodeRange::new('\\', '\\')]);
    fn fix(h: &Hir, bad: &ClassUnicode) -> Result<Hir, EngineError> {
        Ok(match h.kind() {
            HirKind::Class(Class::Unicode(c)) => {
                let mut c = c.clone();
                c.difference(bad);
                Hir::class(Class::Unicode(c))
            }
            HirKind::Class(Class::Bytes(_)) => return Err(unsupported("pattern", "byte classes are not supported")),
            HirKind::Literal(hir::Literal(bytes)) => {
                if bytes.iter().any(|b| *b < 0x20 || *b == b'"' || *b == b'\\') {
                    return Err(unsupported("pattern", "literal quotes, backslashes or control characters are not supported"));
                }
                h.clone()
            }
            HirKind::Look(_) => return Err(unsupported("pattern", "anchors or word boundaries inside the pattern are not supported")),
            HirKind::Repetition(r) => Hir::repetition(hir::Repetition { sub: Box::new(fix(&r.sub, bad)?), ..r.clone() }),
            HirKind::Capture(c) => fix(&c.sub, bad)?,
            HirKind::Concat(v) => Hir::concat(v.iter().map(|x| fix(x, bad)).collect::<Result<_, _>>()?),
            HirKind::Alternation(v) => Hir::alternation(v.iter().map(|x| fix(x, bad)).collect::<Result<_, _>>()?),
            HirKind::Empty => h.clone(),
        })
    }
    Ok(super::context_free::regex_text(&fix(h, &bad)?))
}
