//! Expressions: names (defined, maybe, later), calls and their arguments, filters and tests, `grammar=` references.

use super::*;

impl<'a> Checker<'a> {
    /// Checks the value of `grammar=`: a grammar, optionally `.rule`, or a
    /// module's grammar.
    pub(super) fn grammar_ref(&mut self, e: &Expr) {
        let file = self.file();
        let not_grammar = |what: String, span: Span| {
            Diagnostic::new(Code::NotAGrammar, file, span, what)
                .with_help("define a grammar with `{% grammar name %}root ::= …{% end %}` and write `grammar=name`")
        };
        match &e.kind {
            ExprKind::Str(s) => {
                let is_grammar = matches!(self.binding(s).map(|b| &b.kind), Some(BindKind::Grammar { .. }));
                let help = if is_grammar {
                    format!("write the grammar's name without quotes: `grammar={s}`")
                } else {
                    "write `grammar=name` for `{% grammar name %}`; to match a regex, use `regex=\"…\"`".to_string()
                };
                let d = not_grammar("`grammar=` takes the name of a grammar, not a string".into(), e.span).with_help(help);
                self.push(d);
            }
            ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                Some(BindKind::Def(_)) => self.push(not_grammar(format!("`{n}` is a def, not a grammar"), e.span)),
                Some(BindKind::Module(_)) => self.push(not_grammar(format!("`{n}` is a module; name one of its grammars, as `{n}.NAME`"), e.span)),
                _ => {}
            },
            ExprKind::Attr(base, rule) => match &base.kind {
                ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                    Some(BindKind::Grammar { rules }) => {
                        if rules.contains(&rule.name) {
                            self.entry_rules.push((n.clone(), rule.name.clone()));
                        } else {
                            let help = match suggest(&rule.name, rules.iter().map(String::as_str)) {
                                Some(s) => format!("did you mean `{n}.{s}`?"),
                                None => format!("its rules are: {}", rules.join(", ")),
                            };
                            self.push(
                                Diagnostic::new(Code::NotAGrammar, file, rule.span, format!("grammar `{n}` has no rule `{}`", rule.name))
                                    .with_help(help),
                            );
                        }
                    }
                    Some(BindKind::Module(Some(info))) => match info.exports.get(&rule.name) {
                        Some(Export::Grammar { .. }) | None => {}
                        Some(_) => self.push(not_grammar(format!("`{n}.{}` is not a grammar", rule.name), rule.span)),
                    },
                    _ => {}
                },
                ExprKind::Attr(inner, gname) => {
                    if let ExprKind::Name(m) = &inner.kind {
                        if let Some(BindKind::Module(Some(info))) = self.binding(m).map(|b| b.kind.clone()) {
                            if let Some(Export::Grammar { rules, .. }) = info.exports.get(&gname.name) {
                                if !rules.contains(&rule.name) {
                                    self.push(
                                        Diagnostic::new(Code::NotAGrammar, file, rule.span, format!("grammar `{m}.{}` has no rule `{}`", gname.name, rule.name))
                                            .with_help(format!("its rules are: {}", rules.join(", "))),
                                    );
                                }
                            }
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }

    pub(super) fn expr(&mut self, e: &Expr, flow: &Flow) {
        match &e.kind {
            ExprKind::Str(_) | ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None | ExprKind::Error => {}
            ExprKind::List(items) => items.iter().for_each(|i| self.expr(i, flow)),
            ExprKind::Map(kv) => kv.iter().for_each(|(k, v)| {
                self.expr(k, flow);
                self.expr(v, flow);
            }),
            ExprKind::Name(n) => self.use_name(n, e.span, flow),
            ExprKind::Attr(base, attr) => {
                if let ExprKind::Name(m) = &base.kind {
                    if let Some(BindKind::Module(Some(info))) = self.binding(m).map(|b| b.kind.clone()) {
                        if !info.exports.contains_key(&attr.name) {
                            let help = match suggest(&attr.name, info.exports.keys().map(String::as_str)) {
                                Some(s) => format!("did you mean `{m}.{s}`?"),
                                None => format!("`{}` defines: {}", info.name, info.exports.keys().cloned().collect::<Vec<_>>().join(", ")),
                            };
                            self.push(
                                Diagnostic::new(Code::UnknownAttribute, self.file(), attr.span, format!("module `{m}` has no `{}`", attr.name))
                                    .with_help(help),
                            );
                        }
                    }
                }
                self.expr(base, flow);
            }
            ExprKind::Index(v, i) => {
                self.expr(v, flow);
                self.expr(i, flow);
            }
            ExprKind::Slice { value, start, stop, step } => {
                self.expr(value, flow);
                for x in [start, stop, step].into_iter().flatten() {
                    self.expr(x, flow);
                }
            }
            ExprKind::Call(f, args) => {
                self.call(f, args, e.span);
                self.expr(f, flow);
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Filter(v, name, args) => {
                match builtins::filter(&name.name) {
                    Some(b) => self.builtin_args(b, 0, args, name.span, "filter"),
                    None => self.unknown_builtin(Code::UnknownFilter, "filter", name, builtins::FILTERS),
                }
                // `x | default(…)` is how a possibly undefined name is read.
                let guarded = name.name == "default" && matches!(v.kind, ExprKind::Name(_));
                if !guarded {
                    self.expr(v, flow);
                }
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Test { value, name, args, .. } => {
                match builtins::test(&name.name) {
                    Some(b) => self.builtin_args(b, 0, args, name.span, "test"),
                    None => self.unknown_builtin(Code::UnknownTest, "test", name, builtins::TESTS),
                }
                let guarded = matches!(name.name.as_str(), "defined" | "undefined") && matches!(value.kind, ExprKind::Name(_));
                if !guarded {
                    self.expr(value, flow);
                }
                args.iter().for_each(|a| self.expr(&a.value, flow));
            }
            ExprKind::Unary(_, v) => self.expr(v, flow),
            ExprKind::Binary(_, a, b) => {
                self.expr(a, flow);
                self.expr(b, flow);
            }
            ExprKind::Cond { cond, then, otherwise } => {
                self.expr(cond, flow);
                self.expr(then, flow);
                self.expr(otherwise, flow);
            }
        }
    }

    pub(super) fn unknown_builtin(&mut self, code: Code, what: &str, name: &Ident, table: &[builtins::Builtin]) {
        let help = match suggest(&name.name, table.iter().map(|f| f.name)) {
            Some(s) => format!("did you mean `{s}`?"),
            None => format!("{what}s are: {}", table.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")),
        };
        self.push(Diagnostic::new(code, self.file(), name.span, format!("unknown {what} `{}`", name.name)).with_help(help));
    }

    pub(super) fn use_name(&mut self, n: &str, span: Span, flow: &Flow) {
        let id = self.id(n);
        if flow.definite.has(id) {
            return;
        }
        let file = self.file();
        let def_span = self.binding(n).map(|b| b.span);
        if flow.maybe.has(id) {
            let mut d = Diagnostic::new(Code::MaybeUndefined, file, span, format!("`{n}` may be undefined here"))
                .with_label("defined on some paths only")
                .with_help(format!("define `{n}` before the branch or loop (e.g. `{{% set {n} = none %}}`), or test `{n} is defined`"));
            if let Some(s) = def_span {
                d = d.with_secondary(s, "defined here");
            }
            self.push(d);
            return;
        }
        // Inside a def, the file's names are read when the def is called.
        if self.scopes.len() > 1 && self.scopes[0].contains_key(n) {
            return;
        }
        if builtins::function(n).is_some() {
            return;
        }
        let local_scope = self.scopes.last().and_then(|s| s.get(n)).map(|b| b.span);
        if let Some(later) = local_scope {
            self.push(
                Diagnostic::new(Code::UsedBeforeDefined, file, span, format!("`{n}` is used before it is defined"))
                    .with_label("used here")
                    .with_secondary(later, "defined later here")
                    .with_help(format!("move the definition of `{n}` above this use")),
            );
            return;
        }
        let mut candidates: Vec<&str> = flow.definite.iter().map(|i| self.names[i as usize].as_str()).collect();
        for s in &self.scopes {
            candidates.extend(s.keys().map(String::as_str));
        }
        let help = match suggest(n, candidates) {
            Some(s) => format!("did you mean `{s}`?"),
            None if n == "loop" => "`loop` exists only inside a `for` block".to_string(),
            None => format!("declare it as an input with `{{% input {n} %}}` (then pass `--var {n}=…`), or define it with `{{% set {n} = … %}}`"),
        };
        self.push(
            Diagnostic::new(Code::UnknownName, file, span, format!("unknown name `{n}`")).with_label("not defined").with_help(help),
        );
    }

    pub(super) fn call(&mut self, f: &Expr, args: &[Arg], span: Span) {
        let sig = match &f.kind {
            ExprKind::Name(n) => match self.binding(n).map(|b| b.kind.clone()) {
                Some(BindKind::Def(p)) => Some((n.clone(), p)),
                Some(_) => None,
                None => {
                    if let Some((b, offset)) = builtins::function(n) {
                        self.builtin_args(b, offset, args, f.span, "function");
                    }
                    None
                }
            },
            ExprKind::Attr(base, name) => match &base.kind {
                ExprKind::Name(m) => match self.binding(m).map(|b| b.kind.clone()) {
                    Some(BindKind::Module(Some(info))) => match info.exports.get(&name.name) {
                        Some(Export::Def(p)) => Some((format!("{m}.{}", name.name), p.clone())),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        let Some((name, params)) = sig else { return };
        let file = self.file();
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        let mut errs = Vec::new();
        if positional > params.len() {
            errs.push(format!("`{name}` takes {} argument{}, but {} were given", params.len(), if params.len() == 1 { "" } else { "s" }, positional));
        }
        let mut given: Vec<&str> = params.iter().take(positional).map(|p| p.name.as_str()).collect();
        for a in args {
            if let Some(k) = &a.name {
                if !params.iter().any(|p| p.name == k.name) {
                    errs.push(format!("`{name}` has no parameter `{}`", k.name));
                } else if given.contains(&k.name.as_str()) {
                    errs.push(format!("argument `{}` of `{name}` is given twice", k.name));
                } else {
                    given.push(&k.name);
                }
            }
        }
        for p in &params {
            if !p.has_default && !given.contains(&p.name.as_str()) {
                errs.push(format!("`{name}` is missing the argument `{}`", p.name));
            }
        }
        let sig_text = params.iter().map(|p| if p.has_default { format!("{}=…", p.name) } else { p.name.clone() }).collect::<Vec<_>>().join(", ");
        for msg in errs {
            self.push(Diagnostic::new(Code::WrongArguments, file, span, msg).with_help(format!("call it as `{name}({sig_text})`")));
        }
    }

    pub(super) fn builtin_args(&mut self, b: &builtins::Builtin, offset: usize, args: &[Arg], span: Span, what: &str) {
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        let (min, max) = (b.min_args + offset, b.max_args + offset);
        let file = self.file();
        let mut errs = Vec::new();
        if positional < min && args.iter().all(|a| a.name.is_none()) {
            errs.push(format!("{what} `{}` needs at least {min} argument{}", b.name, if min == 1 { "" } else { "s" }));
        }
        if positional > max {
            errs.push(format!("{what} `{}` takes at most {max} argument{}, but {positional} were given", b.name, if max == 1 { "" } else { "s" }));
        }
        for a in args {
            if let Some(k) = &a.name {
                if !b.params.contains(&k.name.as_str()) {
                    errs.push(format!("{what} `{}` has no parameter `{}`", b.name, k.name));
                }
            }
        }
        for msg in errs {
            self.push(Diagnostic::new(Code::WrongArguments, file, span, msg).with_help(b.doc.to_string()));
        }
    }
}
