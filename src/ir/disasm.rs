//! A readable disassembly of a program, for `lmt check --emit ir` and snapshots.

use std::fmt::Write;

use super::*;
use crate::span::SourceMap;

/// Renders every module of `p`: instructions with their operands resolved
/// and the source line:column of each, then the function and grammar tables.
pub fn disassemble(p: &Program, sources: &SourceMap) -> String {
    let mut out = String::new();
    for (i, m) in p.modules.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let entry = if i == p.entry { " (entry)" } else { "" };
        let _ = writeln!(out, "module {}{}", m.name, entry);
        let file = sources.get(m.file);
        for (pc, (ins, span)) in m.code.iter().zip(&m.spans).enumerate() {
            let lc = file.lines.line_col(&file.text, span.start as usize);
            let text = instr(m, ins);
            let _ = writeln!(out, "  {pc:04}  {text:<48} ; {}:{}", lc.line, lc.column);
        }
        for f in &m.functions {
            let params: Vec<&str> = f.params.iter().map(|s| m.names[*s as usize].as_str()).collect();
            let _ = writeln!(
                out,
                "  def {}({}) entry={:04} defaults={}",
                m.names[f.name as usize],
                params.join(", "),
                f.entry,
                f.defaults
            );
        }
        for g in &m.grammars {
            let _ = writeln!(
                out,
                "  grammar {} start={} rules={}",
                g.name,
                g.start.as_deref().unwrap_or("-"),
                g.grammar.rules.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(",")
            );
        }
    }
    out
}

fn konst(c: &Const) -> String {
    match c {
        Const::Str(s) => format!("{s:?}"),
        other => serde_json::to_string(&other.to_json()).unwrap_or_default(),
    }
}

fn store(m: &CodeModule, s: &Option<Store>) -> String {
    match s {
        Some(s) => format!("{}{}", m.names[s.name as usize], if s.append { "[]" } else { "" }),
        None => "-".into(),
    }
}

fn set(m: &CodeModule, table: &[Vec<Sym>], id: u32) -> String {
    match table.get(id as usize) {
        Some(names) => names.iter().map(|s| m.names[*s as usize].as_str()).collect::<Vec<_>>().join(","),
        None => String::new(),
    }
}

fn instr(m: &CodeModule, i: &Instr) -> String {
    let name = |s: &Sym| m.names[*s as usize].clone();
    match i {
        Instr::Text(c) => format!("TEXT {}", konst(&m.consts[*c as usize])),
        Instr::Emit => "EMIT".into(),
        Instr::Const(c) => format!("CONST {}", konst(&m.consts[*c as usize])),
        Instr::Load(s) => format!("LOAD {}", name(s)),
        Instr::LoadMaybe(s) => format!("LOAD_MAYBE {}", name(s)),
        Instr::Store(s) => format!("STORE {}", store(m, &Some(*s))),
        Instr::Attr(s) => format!("ATTR {}", name(s)),
        Instr::Index => "INDEX".into(),
        Instr::Slice(mask) => format!("SLICE {mask:03b}"),
        Instr::List(n) => format!("LIST {n}"),
        Instr::Map(n) => format!("MAP {n}"),
        Instr::Unary(op) => format!("UNARY {op:?}"),
        Instr::Binary(op) => format!("BINARY {}", op.symbol()),
        Instr::Call { args, kwargs } => format!("CALL args={args} kwargs=[{}]", set(m, &m.kwarg_sets, *kwargs)),
        Instr::Filter { name: n, args, kwargs } => {
            format!("FILTER {} args={args} kwargs=[{}]", name(n), set(m, &m.kwarg_sets, *kwargs))
        }
        Instr::Test { name: n, args, negated } => {
            format!("TEST {}{} args={args}", if *negated { "not " } else { "" }, name(n))
        }
        Instr::Jump(t) => format!("JUMP {t:04}"),
        Instr::JumpIfFalse(t) => format!("JUMP_IF_FALSE {t:04}"),
        Instr::JumpIfFalseOrPop(t) => format!("JUMP_IF_FALSE_OR_POP {t:04}"),
        Instr::JumpIfTrueOrPop(t) => format!("JUMP_IF_TRUE_OR_POP {t:04}"),
        Instr::PushLoop(vars) => format!("PUSH_LOOP {}", vars.iter().map(name).collect::<Vec<_>>().join(",")),
        Instr::Iterate(t) => format!("ITERATE exit={t:04}"),
        Instr::Unpack(n) => format!("UNPACK {n}"),
        Instr::PopLoop(t) => format!("POP_LOOP ran={t:04}"),
        Instr::Gen { target, opts } => format!("GEN {} opts=[{}]", store(m, target), set(m, &m.option_sets, *opts)),
        Instr::SelectIn { target, opts } => {
            format!("SELECT_IN {} opts=[{}]", store(m, target), set(m, &m.option_sets, *opts))
        }
        Instr::SelectBegin { opts, branches } => {
            let table: Vec<String> = m.branch_tables[*branches as usize].iter().map(|p| format!("{p:04}")).collect();
            format!("SELECT_BEGIN opts=[{}] branches=[{}]", set(m, &m.option_sets, *opts), table.join(","))
        }
        Instr::SelectEnd { target } => format!("SELECT_END {}", store(m, target)),
        Instr::RoleBegin => "ROLE_BEGIN".into(),
        Instr::RoleEnd => "ROLE_END".into(),
        Instr::CaptureBegin => "CAPTURE_BEGIN".into(),
        Instr::CaptureEnd(s) => format!("CAPTURE_END {}", store(m, &Some(*s))),
        Instr::HiddenBegin => "HIDDEN_BEGIN".into(),
        Instr::HiddenEnd => "HIDDEN_END".into(),
        Instr::DefineFunction(f) => format!("DEFINE_FUNCTION {}", name(&m.functions[*f as usize].name)),
        Instr::Return => "RETURN".into(),
        Instr::DefineGrammar(g) => format!("DEFINE_GRAMMAR {}", m.grammars[*g as usize].name),
        Instr::Import { module, alias } => format!("IMPORT module#{} as {}", m.imports[*module as usize], name(alias)),
        Instr::Input(s) => format!("INPUT {}", name(s)),
        Instr::InputOr { name: n, skip } => format!("INPUT_OR {} given={skip:04}", name(n)),
        Instr::Halt => "HALT".into(),
    }
}
