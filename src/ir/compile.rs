//! Lowers checked ASTs to [`CodeModule`]s. Only called on workspaces
//! without errors, but never panics on trees with error nodes either (they
//! compile to `none`).

use std::collections::HashMap;

use super::*;
use crate::syntax::ast::{self, Choices, Expr, ExprKind, Node, RoleName};
use crate::workspace::Workspace;

/// Compiles every module of `ws`.
pub fn compile(ws: &Workspace) -> Program {
    let modules = ws
        .modules
        .iter()
        .map(|m| {
            let name = ws.sources.get(m.file).name.clone();
            let imports: HashMap<&str, usize> = m.imports.iter().map(|(p, f)| (p.as_str(), f.0 as usize)).collect();
            let mut c = Compiler { m: CodeModule { file: m.file, name, ..Default::default() }, names: HashMap::new(), imports };
            c.nodes(&m.template.body);
            c.emit(Instr::Halt, Span::default());
            c.m
        })
        .collect();
    Program { modules, entry: ws.root.0 as usize }
}

struct Compiler<'a> {
    m: CodeModule,
    names: HashMap<String, Sym>,
    imports: HashMap<&'a str, usize>,
}

const NO_KWARGS: u32 = u32::MAX;

impl Compiler<'_> {
    fn emit(&mut self, i: Instr, span: Span) -> Pc {
        self.m.code.push(i);
        self.m.spans.push(span);
        self.m.code.len() as Pc - 1
    }

    fn pc(&self) -> Pc {
        self.m.code.len() as Pc
    }

    /// Points the jump at `at` to `to`.
    fn patch(&mut self, at: Pc, to: Pc) {
        match &mut self.m.code[at as usize] {
            Instr::Jump(t)
            | Instr::JumpIfFalse(t)
            | Instr::JumpIfFalseOrPop(t)
            | Instr::JumpIfTrueOrPop(t)
            | Instr::Iterate(t)
            | Instr::PopLoop(t)
            | Instr::InputOr { skip: t, .. } => *t = to,
            other => unreachable!("patching {other:?}"),
        }
    }

    fn konst(&mut self, c: Const) -> ConstId {
        if let Some(i) = self.m.consts.iter().position(|k| *k == c) {
            return i as ConstId;
        }
        self.m.consts.push(c);
        self.m.consts.len() as ConstId - 1
    }

    fn sym(&mut self, name: &str) -> Sym {
        if let Some(&s) = self.names.get(name) {
            return s;
        }
        self.m.names.push(name.to_string());
        let s = self.m.names.len() as Sym - 1;
        self.names.insert(name.to_string(), s);
        s
    }

    fn store(&mut self, t: &ast::Target) -> Store {
        Store { name: self.sym(&t.name.name), append: t.append }
    }

    fn option_set(&mut self, opts: &[ast::GenOption]) -> u32 {
        let set: Vec<Sym> = opts.iter().map(|o| self.sym(&o.name.name)).collect();
        self.m.option_sets.push(set);
        self.m.option_sets.len() as u32 - 1
    }

    fn options(&mut self, opts: &[ast::GenOption]) -> u32 {
        for o in opts {
            self.expr(&o.value);
        }
        self.option_set(opts)
    }

    fn nodes(&mut self, body: &[Node]) {
        for n in body {
            self.node(n);
        }
    }

    fn node(&mut self, n: &Node) {
        match n {
            Node::Text { value, span } => {
                let c = self.konst(Const::Str(value.clone()));
                self.emit(Instr::Text(c), *span);
            }
            Node::Emit { expr, span } => {
                self.expr(expr);
                self.emit(Instr::Emit, *span);
            }
            Node::Gen(g) => {
                let opts = self.options(&g.options);
                let target = g.target.as_ref().map(|t| self.store(t));
                self.emit(Instr::Gen { target, opts }, g.span);
            }
            Node::Select(s) => {
                let target = s.target.as_ref().map(|t| self.store(t));
                match &s.choices {
                    Choices::List(list) => {
                        self.expr(list);
                        let opts = self.options(&s.options);
                        self.emit(Instr::SelectIn { target, opts }, s.open);
                    }
                    Choices::Branches(bs) => {
                        let opts = self.options(&s.options);
                        let table = self.m.branch_tables.len() as u32;
                        self.m.branch_tables.push(Vec::new());
                        self.emit(Instr::SelectBegin { opts, branches: table }, s.open);
                        let mut exits = Vec::new();
                        for b in bs {
                            let entry = self.pc();
                            self.m.branch_tables[table as usize].push(entry);
                            self.nodes(&b.body);
                            exits.push(self.emit(Instr::Jump(0), b.span));
                        }
                        let end = self.pc();
                        for e in exits {
                            self.patch(e, end);
                        }
                        self.emit(Instr::SelectEnd { target }, s.span);
                    }
                }
            }
            Node::Role(b) => {
                match &b.head {
                    RoleName::Expr(e) => self.expr(e),
                    other => {
                        let name = match other {
                            RoleName::System => "system",
                            RoleName::User => "user",
                            _ => "assistant",
                        };
                        let c = self.konst(Const::Str(name.into()));
                        self.emit(Instr::Const(c), b.open);
                    }
                }
                self.emit(Instr::RoleBegin, b.open);
                self.nodes(&b.body);
                self.emit(Instr::RoleEnd, b.span);
            }
            Node::Capture(b) => {
                self.emit(Instr::CaptureBegin, b.open);
                self.nodes(&b.body);
                let t = self.store(&b.head);
                self.emit(Instr::CaptureEnd(t), b.span);
            }
            Node::Hidden(b) => {
                self.emit(Instr::HiddenBegin, b.open);
                self.nodes(&b.body);
                self.emit(Instr::HiddenEnd, b.span);
            }
            Node::Set { target, value, span } => {
                self.expr(value);
                let t = self.store(target);
                self.emit(Instr::Store(t), *span);
            }
            Node::If(i) => {
                let mut exits = Vec::new();
                for (cond, body) in &i.branches {
                    self.expr(cond);
                    let skip = self.emit(Instr::JumpIfFalse(0), cond.span);
                    self.nodes(body);
                    exits.push(self.emit(Instr::Jump(0), i.span));
                    let next = self.pc();
                    self.patch(skip, next);
                }
                if let Some(e) = &i.else_body {
                    self.nodes(e);
                }
                let end = self.pc();
                for e in exits {
                    self.patch(e, end);
                }
            }
            Node::For(f) => {
                self.expr(&f.iter);
                let vars = f.vars.iter().map(|v| self.sym(&v.name)).collect();
                self.emit(Instr::PushLoop(vars), f.open);
                let top = self.emit(Instr::Iterate(0), f.open);
                self.emit(Instr::Unpack(f.vars.len() as u32), f.open);
                for v in f.vars.iter().rev() {
                    let s = self.sym(&v.name);
                    self.emit(Instr::Store(Store { name: s, append: false }), v.span);
                }
                self.nodes(&f.body);
                self.emit(Instr::Jump(top), f.span);
                let exit = self.pc();
                self.patch(top, exit);
                let pop = self.emit(Instr::PopLoop(0), f.span);
                if let Some(e) = &f.else_body {
                    self.nodes(e);
                }
                let end = self.pc();
                self.patch(pop, end);
            }
            Node::Def(d) => {
                let defaults: Vec<&Expr> = d.params.iter().filter_map(|p| p.default.as_ref()).collect();
                for e in &defaults {
                    self.expr(e);
                }
                let id = self.m.functions.len() as u32;
                let name = self.sym(&d.name.name);
                let params = d.params.iter().map(|p| self.sym(&p.name.name)).collect();
                self.m.functions.push(Function { name, params, defaults: defaults.len() as u32, entry: 0 });
                self.emit(Instr::DefineFunction(id), d.open);
                let skip = self.emit(Instr::Jump(0), d.open);
                self.m.functions[id as usize].entry = self.pc();
                self.nodes(&d.body);
                self.emit(Instr::Return, d.span);
                let after = self.pc();
                self.patch(skip, after);
            }
            Node::Import(i) => {
                let alias = self.sym(&i.alias.name);
                if let Some(&target) = self.imports.get(i.path.as_str()) {
                    self.m.imports.push(target);
                    let module = self.m.imports.len() as u32 - 1;
                    self.emit(Instr::Import { module, alias }, i.span);
                }
            }
            Node::Grammar(g) => {
                let id = self.m.grammars.len() as u32;
                self.m.grammars.push(GrammarDef {
                    name: g.name.name.clone(),
                    grammar: g.grammar.clone(),
                    start: crate::check::start_rule(&g.name.name, &g.grammar),
                });
                self.emit(Instr::DefineGrammar(id), g.open);
            }
            Node::Input { params, span } => {
                for p in params {
                    let s = self.sym(&p.name.name);
                    match &p.default {
                        None => {
                            self.emit(Instr::Input(s), p.name.span);
                        }
                        Some(d) => {
                            let jump = self.emit(Instr::InputOr { name: s, skip: 0 }, p.name.span);
                            self.expr(d);
                            self.emit(Instr::Store(Store { name: s, append: false }), *span);
                            let after = self.pc();
                            self.patch(jump, after);
                        }
                    }
                }
            }
        }
    }

    fn kwargs(&mut self, args: &[ast::Arg]) -> (u32, u32) {
        let mut positional = 0;
        for a in args.iter().filter(|a| a.name.is_none()) {
            self.expr(&a.value);
            positional += 1;
        }
        let names: Vec<Sym> = args
            .iter()
            .filter_map(|a| a.name.as_ref().map(|n| (n, &a.value)))
            .map(|(n, v)| {
                self.expr(v);
                self.sym(&n.name)
            })
            .collect();
        if names.is_empty() {
            return (positional, NO_KWARGS);
        }
        self.m.kwarg_sets.push(names);
        (positional, self.m.kwarg_sets.len() as u32 - 1)
    }

    fn expr(&mut self, e: &Expr) {
        if let Some(c) = e.to_const() {
            let id = self.konst(c);
            self.emit(Instr::Const(id), e.span);
            return;
        }
        match &e.kind {
            ExprKind::Str(_) | ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None => {
                unreachable!("literals fold to constants")
            }
            ExprKind::Error => {
                let id = self.konst(Const::None);
                self.emit(Instr::Const(id), e.span);
            }
            ExprKind::List(items) => {
                items.iter().for_each(|i| self.expr(i));
                self.emit(Instr::List(items.len() as u32), e.span);
            }
            ExprKind::Map(kv) => {
                for (k, v) in kv {
                    self.expr(k);
                    self.expr(v);
                }
                self.emit(Instr::Map(kv.len() as u32), e.span);
            }
            ExprKind::Name(n) => {
                let s = self.sym(n);
                self.emit(Instr::Load(s), e.span);
            }
            ExprKind::Attr(v, a) => {
                self.expr(v);
                let s = self.sym(&a.name);
                self.emit(Instr::Attr(s), e.span);
            }
            ExprKind::Index(v, i) => {
                self.expr(v);
                self.expr(i);
                self.emit(Instr::Index, e.span);
            }
            ExprKind::Slice { value, start, stop, step } => {
                self.expr(value);
                let mut mask = 0u8;
                for (bit, part) in [start, stop, step].into_iter().enumerate() {
                    if let Some(p) = part {
                        self.expr(p);
                        mask |= 1 << bit;
                    }
                }
                self.emit(Instr::Slice(mask), e.span);
            }
            ExprKind::Call(f, args) => {
                self.expr(f);
                let (args, kwargs) = self.kwargs(args);
                self.emit(Instr::Call { args, kwargs }, e.span);
            }
            ExprKind::Filter(v, name, args) => {
                match (&v.kind, name.name.as_str()) {
                    (ExprKind::Name(n), "default") => {
                        let s = self.sym(n);
                        self.emit(Instr::LoadMaybe(s), v.span);
                    }
                    _ => self.expr(v),
                }
                let (args, kwargs) = self.kwargs(args);
                let name = self.sym(&name.name);
                self.emit(Instr::Filter { name, args, kwargs }, e.span);
            }
            ExprKind::Test { value, name, args, negated } => {
                match (&value.kind, name.name.as_str()) {
                    (ExprKind::Name(n), "defined" | "undefined") => {
                        let s = self.sym(n);
                        self.emit(Instr::LoadMaybe(s), value.span);
                    }
                    _ => self.expr(value),
                }
                args.iter().for_each(|a| self.expr(&a.value));
                let name = self.sym(&name.name);
                self.emit(Instr::Test { name, args: args.len() as u32, negated: *negated }, e.span);
            }
            ExprKind::Unary(op, v) => {
                self.expr(v);
                self.emit(Instr::Unary(*op), e.span);
            }
            ExprKind::Binary(op @ (ast::BinaryOp::And | ast::BinaryOp::Or), a, b) => {
                self.expr(a);
                let jump = if *op == ast::BinaryOp::And { Instr::JumpIfFalseOrPop(0) } else { Instr::JumpIfTrueOrPop(0) };
                let j = self.emit(jump, e.span);
                self.expr(b);
                let end = self.pc();
                self.patch(j, end);
            }
            ExprKind::Binary(op, a, b) => {
                self.expr(a);
                self.expr(b);
                self.emit(Instr::Binary(*op), e.span);
            }
            ExprKind::Cond { cond, then, otherwise } => {
                self.expr(cond);
                let skip = self.emit(Instr::JumpIfFalse(0), cond.span);
                self.expr(then);
                let exit = self.emit(Instr::Jump(0), e.span);
                let other = self.pc();
                self.patch(skip, other);
                self.expr(otherwise);
                let end = self.pc();
                self.patch(exit, end);
            }
        }
    }
}
