//! Objects: listed properties (in the schema's order for generation, in any
//! order as a [`Expr::Permutation`] for validation), required ones, keys by
//! pattern and other keys, property dependencies and property counts.

use std::borrow::Cow;

use serde_json::Value;

use super::*;

impl Conv<'_> {
    /// `false` where an unsaid `additional*` closes a schema.
    pub(super) fn closed(&self) -> Option<&'static Value> {
        static FALSE: Value = Value::Bool(false);
        (self.semantics == Semantics::Generation).then_some(&FALSE)
    }

    pub(super) fn object(&mut self, obj: &serde_json::Map<String, Value>) -> Result<Expr, EngineError> {
        let ws = self.ws();
        let lists_keys = obj.contains_key("properties") || obj.contains_key("patternProperties");
        let additional = obj.get("additionalProperties").or(if lists_keys { self.closed() } else { None });
        let mut props: Vec<(String, Cow<Value>)> = obj
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.iter().map(|(k, v)| (k.clone(), Cow::Borrowed(v))).collect())
            .unwrap_or_default();
        let required: Vec<&str> = obj.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let patterns = pattern_keys(obj)?;
        let matched = |k: &str| -> Vec<&PatternKey> { patterns.iter().filter(|p| p.matches(k)).collect() };
        // A required name without a schema may hold any value, unless
        // nothing but the listed properties (and the patterns') is allowed.
        static ANY: Value = Value::Bool(true);
        static NONE: Value = Value::Bool(false);
        for r in &required {
            if !props.iter().any(|(k, _)| k == r) {
                if additional == Some(&Value::Bool(false)) && matched(r).is_empty() {
                    return Err(EngineError::Unsatisfiable(format!("`{r}` is required but no property of that name is allowed")));
                }
                props.push((r.to_string(), Cow::Borrowed(&ANY)));
            }
        }
        // "If x is there, so are these": every name in one is a member, so
        // the parser knows which were written (a name no key may have, a
        // member that never appears: see below).
        let deps = dependencies(obj)?;
        for (x, ys) in &deps {
            for name in std::iter::once(x).chain(ys) {
                if !props.iter().any(|(k, _)| k == *name) {
                    let allowed = additional != Some(&Value::Bool(false)) || !matched(name).is_empty();
                    props.push((name.to_string(), Cow::Borrowed(if allowed { &ANY } else { &NONE })));
                }
            }
        }
        // A listed name that a pattern matches takes both schemas.
        for (k, sub) in &mut props {
            for p in matched(k) {
                if is_true(p.schema) || **sub == *p.schema {
                    continue;
                }
                *sub = if is_true(sub) {
                    Cow::Borrowed(p.schema)
                } else {
                    let both = Value::Array(vec![sub.clone().into_owned(), p.schema.clone()]);
                    Cow::Owned(merge_all_of(&serde_json::Map::new(), &both).map_err(|_| {
                        unsupported("patternProperties", &format!("property `{k}` also matches /{}/ and the two schemas cannot be merged", p.pattern))
                    })?)
                };
            }
        }
        let names: Vec<&str> = props.iter().map(|(k, _)| k.as_str()).collect();
        // `minProperties: 1` beyond the required ones: not empty.
        let min = obj.get("minProperties").and_then(Value::as_u64).unwrap_or(0);
        let nonempty = required.is_empty() && min == 1;
        if min as usize > required.len() && !nonempty {
            return Err(unsupported("minProperties", "more than the required properties (but for a non-empty object) is not supported"));
        }
        let max_props = obj.get("maxProperties").map(|m| m.as_u64().ok_or_else(|| unsupported("maxProperties", "must be a count"))).transpose()?;
        let mut extra_keys: Vec<Expr> = Vec::new();
        let listed = || alt(names.iter().map(|n| lit(&json_text(&Value::String(n.to_string())))).collect());
        let minus_names = |key: Expr| if names.is_empty() { key } else { minus(key, listed()) };
        // Extra keys are any key but the listed ones (and the patterns').
        let other_key = if patterns.is_empty() {
            minus_names(rx(&format!("\"{STRING_CHAR}*\"")))
        } else {
            let mut taken: Vec<Expr> = patterns.iter().map(|p| rx(&p.key)).collect();
            if !names.is_empty() {
                taken.push(listed());
            }
            minus(rx(&format!("\"{STRING_CHAR}*\"")), alt(taken))
        };
        for p in &patterns {
            let value = self.schema(p.schema)?;
            extra_keys.push(seq(vec![minus_names(rx(&p.key)), ws.clone(), lit(":"), ws.clone(), value]));
        }
        match additional {
            Some(Value::Bool(false)) => {}
            None | Some(Value::Bool(true)) => {
                let any = self.any_value();
                extra_keys.push(seq(vec![other_key.clone(), ws.clone(), lit(":"), ws.clone(), any]));
            }
            Some(s) => {
                let value = self.schema(s)?;
                extra_keys.push(seq(vec![other_key.clone(), ws.clone(), lit(":"), ws.clone(), value]));
            }
        }
        self.other_keys |= !extra_keys.is_empty();
        let extra = (!extra_keys.is_empty()).then(|| alt(extra_keys));
        let mut compiled: Vec<(&str, Expr, bool)> = Vec::new();
        for (k, sub) in &props {
            let req = required.contains(&k.as_str());
            match self.schema(sub) {
                // An optional property no value can satisfy just never appears
                // (its name stays excluded from the extra keys).
                Err(EngineError::Unsatisfiable(_)) if !req => continue,
                other => compiled.push((k, other?, req)),
            }
        }
        // A property whose companions never appear never appears either.
        while let Some(x) = deps.iter().find(|(x, ys)| compiled.iter().any(|c| c.0 == *x) && ys.iter().any(|y| !compiled.iter().any(|c| c.0 == *y))).map(|d| d.0) {
            if required.contains(&x) {
                return Err(EngineError::Unsatisfiable(format!("`{x}` is required, but a property it depends on can never appear")));
            }
            compiled.retain(|c| c.0 != x);
        }
        let index = |n: &str| compiled.iter().position(|c| c.0 == n);
        let requires: Vec<(usize, Vec<usize>)> = deps.iter().filter_map(|(x, ys)| Some((index(x)?, ys.iter().filter_map(|y| index(y)).collect()))).collect();
        // Members in any order, each at most once: the parser makes a state
        // per set of members written as it reaches them. Each member is a
        // rule of its own, so equal members share their symbols.
        let id = self.rules.len();
        let members: Vec<(Expr, bool)> = compiled
            .into_iter()
            .enumerate()
            .map(|(j, (k, value, req))| {
                let key = lit(&json_text(&Value::String(k.to_string())));
                let rule = format!("obj{id}_m{j}");
                self.add_rule(rule.clone(), seq(vec![key, ws.clone(), lit(":"), ws.clone(), value, ws.clone()]));
                (reference(&rule), req)
            })
            .collect();
        let extra = extra.map(|x| Box::new(seq(vec![x, ws.clone()])));
        // A bound past any generation bounds nothing (as with lengths).
        if let Some(at_most) = max_props.filter(|&m| m <= MAX_COUNT).map(|m| m as usize) {
            let required: Vec<&Expr> = members.iter().filter(|(_, r)| *r).map(|(m, _)| m).collect();
            if at_most < required.len() || (at_most == 0 && nonempty) {
                return Err(EngineError::Unsatisfiable("`maxProperties` is below the properties that must be there".into()));
            }
            // At most one item needs no permutation; at most as many as there
            // can be bounds nothing.
            if at_most <= 1 {
                // A member that brings others cannot be the only one.
                let alone = |j: usize| requires.iter().all(|(i, js)| *i != j || js.iter().all(|&k| k == j));
                let alone: Vec<&Expr> = members.iter().enumerate().filter(|(j, _)| alone(*j)).map(|(_, (m, _))| m).collect();
                if required.len() == 1 && !alone.iter().any(|m| std::ptr::eq(*m, required[0])) {
                    return Err(EngineError::Unsatisfiable("a required property depends on another, and `maxProperties` allows one".into()));
                }
                let items: Vec<Expr> = match required.as_slice() {
                    [only] => vec![(*only).clone()],
                    _ => alone.into_iter().cloned().chain(extra.as_deref().cloned()).collect(),
                };
                let one = if at_most == 0 || items.is_empty() {
                    seq(vec![])
                } else if nonempty || required.len() == 1 {
                    alt(items)
                } else {
                    rep(alt(items), 0, Some(1))
                };
                return Ok(seq(vec![lit("{"), ws, one, lit("}")]));
            }
            if extra.is_some() || at_most < members.len() || !requires.is_empty() {
                return Err(unsupported("maxProperties", "above 1, with other keys allowed or fewer than the listed properties, is not supported"));
            }
        }
        let sep = seq(vec![lit(","), ws.clone()]);
        if self.semantics == Semantics::Generation && !nonempty && requires.is_empty() {
            let body = self.in_order(id, &members, extra.map(|x| *x), &sep);
            return Ok(seq(vec![lit("{"), ws, body, lit("}")]));
        }
        let permutation = Expr::Permutation { members, extra, sep: Box::new(sep), nonempty, requires };
        Ok(seq(vec![lit("{"), ws, permutation, lit("}")]))
    }

    /// Members in the schema's order, the optional ones skippable, then any
    /// number of `extra` members: a rule per position for "nothing written
    /// yet" (`f`) and "something written, so a comma comes first" (`r`),
    /// so the grammar grows linearly with the members.
    fn in_order(&mut self, id: usize, members: &[(Expr, bool)], extra: Option<Expr>, sep: &Expr) -> Expr {
        let name = |kind: char, i: usize| format!("obj{id}_{kind}{i}");
        let n = members.len();
        let more = extra.as_ref().map(|x| rep(seq(vec![sep.clone(), x.clone()]), 0, None)).unwrap_or_else(|| seq(vec![]));
        self.add_rule(name('r', n), more);
        let first_extra = extra.map(|x| rep(seq(vec![x, reference(&name('r', n))]), 0, Some(1))).unwrap_or_else(|| seq(vec![]));
        self.add_rule(name('f', n), first_extra);
        for (i, (m, required)) in members.iter().enumerate().rev() {
            let (rest, first) = (reference(&name('r', i + 1)), reference(&name('f', i + 1)));
            let written = seq(vec![sep.clone(), m.clone()]);
            let r = if *required { seq(vec![written, rest.clone()]) } else { seq(vec![rep(written, 0, Some(1)), rest.clone()]) };
            let here = seq(vec![m.clone(), rest]);
            let f = if *required { here } else { alt(vec![here, first]) };
            self.add_rule(name('r', i), r);
            self.add_rule(name('f', i), f);
        }
        reference(&name('f', 0))
    }
}

/// The object's property dependencies (`dependencies` with lists,
/// `dependentRequired`): each name with the names it requires.
fn dependencies(obj: &serde_json::Map<String, Value>) -> Result<Vec<(&str, Vec<&str>)>, EngineError> {
    let mut out = Vec::new();
    for key in ["dependencies", "dependentRequired"] {
        for (x, v) in obj.get(key).and_then(Value::as_object).into_iter().flatten() {
            let Some(ys) = v.as_array() else {
                return Err(unsupported(key, "dependencies on a schema (rather than a list of names) are not supported"));
            };
            out.push((x.as_str(), ys.iter().map(|y| y.as_str().ok_or_else(|| unsupported(key, "must list names"))).collect::<Result<_, _>>()?));
        }
    }
    Ok(out)
}
