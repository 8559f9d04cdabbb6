//! The interpreter: runs a compiled [`Program`] against a model, keeping one
//! model state ([`lm::Lm`]) for the whole run and the structured record
//! ([`Record`]) beside it. Streams [`Event`]s as it goes.
//!
//! Its own state is a value stack, frames (module, pc, locals, loops) and
//! the open captures, roles and hidden sections. A search forks a run by
//! replaying its decisions in a new one (see [`decide`]).

pub mod decide;
mod error;
pub mod lm;
pub mod ops;
mod gen;
pub mod session;
pub mod value;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use indexmap::IndexMap;

use crate::engine::Limits;
use crate::ir::{CodeModule, Instr, Program, Store, Sym};
use crate::model::{Forward, Model};
use crate::span::{FileId, SourceMap, Span};
use crate::state::{CaptureRecord, Node, Origin, Record, Token};
mod needs;
use lm::{Lm, Sink};
pub use needs::engine_needs;
pub use lm::Backend;
use ops::Args;
use crate::state::{Captured, FinishReason, Meta};
use value::Value;

pub use error::RunError;
use crate::state::{Failure, RunErrorKind};

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Values of the template's inputs.
    pub vars: IndexMap<String, Value>,
    /// Base seed: each `gen` and `select` without its own `seed` gets one derived from it.
    pub seed: u64,
    /// Default temperature (0: greedy).
    pub temperature: f32,
    /// Engine limits.
    pub limits: Limits,
    /// Set to stop the run at the next token.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Score every token of the finished run, template text included
    /// ([`Record::logprob_all`]): one more pass over its tokens.
    pub score_all: bool,
}

/// Something that happened during a run, as it happens.
#[derive(Debug)]
pub enum Event<'a> {
    /// Text entered the prompt (template text, a value, or generated text as it streams).
    Text {
        /// The text.
        text: &'a str,
        /// Where it came from.
        origin: Origin,
        /// Inside `{% hidden %}`.
        hidden: bool,
    },
    /// A token was sampled or forced.
    Token(&'a Token),
    /// A chat turn opened.
    RoleOpen(&'a str),
    /// A chat turn closed.
    RoleClose(&'a str),
    /// A value was stored.
    Capture(&'a CaptureRecord),
    /// The run ended: everything, with usage and finish reason.
    Done(&'a Record),
}

/// What a run produced: the record (always, partial on error or cancel) and the error.
#[derive(Debug)]
pub struct Outcome {
    /// The record.
    pub state: Record,
    /// The error that stopped the run.
    pub error: Option<RunError>,
}

/// An input a program declares with `{% input %}`.
#[derive(Debug, Clone, PartialEq)]
pub struct InputDecl {
    /// Its name.
    pub name: String,
    /// Whether it has a default value.
    pub has_default: bool,
    /// The entry file.
    pub file: FileId,
    /// Where it is declared.
    pub span: Span,
}

/// The first of `names` that `declared` lacks, with why in words: "the
/// template has no input `x` (its inputs are: a, b)".
pub fn undeclared_input<'a>(names: impl IntoIterator<Item = &'a String>, declared: &[InputDecl]) -> Option<(String, String)> {
    let unknown = names.into_iter().find(|k| !declared.iter().any(|d| d.name == **k))?;
    let names: Vec<&str> = declared.iter().map(|d| d.name.as_str()).collect();
    let known = if names.is_empty() { "it declares none".to_string() } else { format!("its inputs are: {}", names.join(", ")) };
    Some((unknown.clone(), format!("the template has no input `{unknown}` ({known})")))
}

/// The inputs a program declares, in order.
pub fn inputs(program: &Program) -> Vec<InputDecl> {
    let m = &program.modules[program.entry];
    m.code
        .iter()
        .zip(&m.spans)
        .filter_map(|(i, &span)| {
            let (sym, has_default) = match i {
                Instr::Input(s) => (*s, false),
                Instr::InputOr { name, .. } => (*name, true),
                _ => return None,
            };
            Some(InputDecl { name: m.names[sym as usize].clone(), has_default, file: m.file, span })
        })
        .collect()
}

/// Runs `program` on `model`, calling `on_event` as things happen.
pub fn run(program: &Program, sources: &SourceMap, model: &Model, opts: &RunOptions, on_event: &mut dyn FnMut(Event<'_>)) -> Outcome {
    run_on(program, sources, model, &model.decoder, opts, on_event)
}

/// Runs `program` on `model` with its forward passes through `forward`
/// (a [`crate::model::Member`] of a batch, for a dataset row).
pub fn run_on(
    program: &Program,
    sources: &SourceMap,
    model: &Model,
    forward: &dyn Forward,
    opts: &RunOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Outcome {
    run_with(program, sources, Backend::Local { model, forward }, None, opts, on_event)
}

/// Runs `program` on `backend` (lmt's runtime or a remote engine), its
/// decisions taken by `decider` when given (a run of a search).
pub fn run_with<'m>(
    program: &Program,
    sources: &SourceMap,
    backend: Backend<'m>,
    decider: Option<&'m dyn decide::Decider>,
    opts: &RunOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Outcome {
    let mut core = match Core::new(backend, opts, program.modules.len()) {
        Ok(mut core) => {
            if let Some(d) = decider {
                core.lm.set_decider(d);
            }
            core
        }
        Err(fail) => {
            let state = Record { finish_reason: FinishReason::Error, error: Some(fail.clone()), ..Record::default() };
            on_event(Event::Done(&state));
            return Outcome { state, error: Some(at_entry(program, fail)) };
        }
    };
    let mut vm = Vm::new(program, sources, opts, &mut core, program.entry, on_event);
    let result = vm.exec();
    let error = match result {
        Ok(()) => {
            if vm.core.state.nodes.iter().rev().find(|n| !is_layout(n)).is_some_and(|n| matches!(n, Node::RoleClose { .. })) {
                vm.drop_layout_whitespace();
            }
            let ended_in_turn = matches!(vm.core.state.nodes.last(), Some(Node::RoleClose { .. }));
            let closed = if ended_in_turn && !vm.cancelled() { vm.core.lm.close_conversation() } else { Ok(()) };
            // Cancelled: the record gets the tokens, the model no more work.
            let cancelled = vm.cancelled();
            if let Err(message) = closed.and_then(|_| vm.core.lm.finish(!cancelled)) {
                Some(vm.error_here(message))
            } else {
                None
            }
        }
        Err(e) => Some(e),
    };
    let cancelled = vm.cancelled();
    let mut error = error;
    if opts.score_all && !cancelled {
        match core.lm.score_sequence() {
            Ok(lp) => core.state.logprob_all = Some(lp),
            Err(fail) if error.is_none() => error = Some(at_entry(program, fail)),
            Err(_) => {}
        }
    }
    core.end(error.as_ref(), cancelled);
    on_event(Event::Done(&core.state));
    Outcome { state: core.state, error }
}

/// A failure of the run as a whole (no instruction to point at): placed at
/// the start of the entry module.
fn at_entry(program: &Program, fail: Failure) -> RunError {
    let m = &program.modules[program.entry];
    RunError { kind: fail.kind, message: fail.message, file: m.file, span: Span::default() }
}

/// Deepest call nesting (a `def` calling itself is bounded).
const MAX_FRAMES: usize = 256;

#[derive(Debug, Clone)]
struct Frame {
    module: usize,
    pc: usize,
    /// A `def`'s locals; `None` at a module's top level.
    locals: Option<HashMap<Sym, Value>>,
    loops: Vec<LoopState>,
    kind: FrameKind,
    /// An imported module's top level: its text is dropped.
    quiet: bool,
}

#[derive(Debug, Clone, Copy)]
enum FrameKind {
    Entry,
    Import { alias: Sym },
    Call,
}

#[derive(Debug, Clone)]
struct LoopState {
    items: Arc<Vec<Value>>,
    next: usize,
    /// The loop variables' values before the loop (`None`: undefined).
    saved: Vec<(Sym, Option<Value>)>,
}

#[derive(Debug, Clone)]
struct CaptureFrame {
    text: String,
    /// Index of the node where it opened.
    node: usize,
    /// For a select: the options' scores.
    choices: Option<Meta>,
}

/// What outlives one execution of code: the model state, the record and
/// the variables. [`run`] makes one for a program; a REPL
/// [`session::Session`] keeps one across its entries.
struct Core<'m> {
    lm: Lm<'m>,
    state: Record,
    /// Top-level variables of each module, by its own symbols.
    globals: Vec<HashMap<Sym, Value>>,
    imported: Vec<bool>,
    defaults: HashMap<(usize, u32), Vec<Value>>,
    cache: gen::ConstraintCache,
    /// Random draws so far (each gen/select without a seed gets the next).
    draws: u64,
    /// Which modules are REPL entries: their top levels share one
    /// namespace, [`Core::shared`], by name.
    entries: Vec<bool>,
    shared: HashMap<String, Value>,
}

impl<'m> Core<'m> {
    fn new(backend: Backend<'m>, opts: &RunOptions, modules: usize) -> Result<Core<'m>, Failure> {
        let mut core = Core {
            lm: Lm::new(backend, opts.limits.clone())?,
            state: Record::default(),
            globals: Vec::new(),
            imported: Vec::new(),
            defaults: HashMap::new(),
            cache: gen::ConstraintCache::default(),
            draws: 0,
            entries: Vec::new(),
            shared: HashMap::new(),
        };
        core.grow(modules);
        Ok(core)
    }

    /// Makes room for modules up to `n`.
    fn grow(&mut self, n: usize) {
        self.globals.resize_with(n, HashMap::new);
        self.imported.resize(n, false);
        self.entries.resize(n, false);
    }

    /// Records how an execution ended, with the model side's record.
    fn end(&mut self, error: Option<&RunError>, cancelled: bool) {
        self.state.finish_reason = match (error, cancelled) {
            (Some(_), _) => FinishReason::Error,
            (None, true) => FinishReason::Cancelled,
            (None, false) => FinishReason::Done,
        };
        self.state.error = error.map(|e| Failure::new(e.kind, e.message.clone()));
        self.sync();
    }

    /// Copies the model side's record (tokens, turns, usage) into the state.
    fn sync(&mut self) {
        self.lm.sync_usage();
        self.state.tokens = self.lm.tokens().to_vec();
        self.state.messages = self.lm.messages().to_vec();
        self.state.usage = self.lm.usage.clone();
    }
}

struct Vm<'a, 'm> {
    program: &'a Program,
    sources: &'a SourceMap,
    opts: &'a RunOptions,
    core: &'a mut Core<'m>,
    stack: Vec<Value>,
    frames: Vec<Frame>,
    captures: Vec<CaptureFrame>,
    role: Option<(String, String)>,
    hidden: Vec<lm::Mark>,
    on_event: &'a mut dyn FnMut(Event<'_>),
}

type Res<T> = Result<T, RunError>;

impl<'a, 'm> Vm<'a, 'm> {
    /// A machine that runs `module`'s top level on `core`.
    fn new(
        program: &'a Program,
        sources: &'a SourceMap,
        opts: &'a RunOptions,
        core: &'a mut Core<'m>,
        module: usize,
        on_event: &'a mut dyn FnMut(Event<'_>),
    ) -> Self {
        let entry = Frame { module, pc: 0, locals: None, loops: Vec::new(), kind: FrameKind::Entry, quiet: false };
        Vm {
            program,
            sources,
            opts,
            core,
            stack: Vec::new(),
            frames: vec![entry],
            captures: Vec::new(),
            role: None,
            hidden: Vec::new(),
            on_event,
        }
    }
}

impl Vm<'_, '_> {
    fn frame(&self) -> &Frame {
        self.frames.last().expect("a frame")
    }

    fn module(&self) -> &CodeModule {
        &self.program.modules[self.frame().module]
    }

    fn error_here(&self, fail: Failure) -> RunError {
        // After the last instruction (pending text fed at the end) there is
        // no frame: the error points at the end of the entry module.
        let (module, pc) = match self.frames.last() {
            Some(f) => (f.module, f.pc.saturating_sub(1)),
            None => (self.program.entry, usize::MAX),
        };
        let m = &self.program.modules[module];
        let pc = pc.min(m.spans.len().saturating_sub(1));
        RunError { kind: fail.kind, message: fail.message, file: m.file, span: m.spans.get(pc).copied().unwrap_or_default() }
    }

    /// Closes what a stopped execution left open, so that a REPL's next
    /// entry starts at the top level: hidden text is rewound, an open turn
    /// is closed with what it holds, unfinished captures are dropped.
    fn unwind(&mut self) -> Result<(), Failure> {
        self.captures.clear();
        if let Some(&m) = self.hidden.first() {
            self.hidden.clear();
            self.core.lm.rewind(m)?;
        }
        if let Some((role, content)) = self.role.take() {
            self.core.lm.role_end(&role, &content)?;
            self.core.state.nodes.push(Node::RoleClose { role: role.clone() });
            (self.on_event)(Event::RoleClose(&role));
        }
        Ok(())
    }

    /// Drops the white space the template wrote since the last turn (line
    /// breaks between role blocks): a chat prompt is the chat template's
    /// rendering of the messages, so layout between turns is not part of it.
    /// Only text not yet fed to the model can go.
    fn drop_layout_whitespace(&mut self) {
        let nodes = &mut self.core.state.nodes;
        let layout = nodes.iter().rev().take_while(|n| is_layout(n)).count();
        let text: String = nodes[nodes.len() - layout..]
            .iter()
            .map(|n| match n {
                Node::Text { text, .. } => text.as_str(),
                _ => "",
            })
            .collect();
        if layout > 0 && self.core.lm.drop_pending_whitespace(&text) {
            nodes.truncate(nodes.len() - layout);
        }
    }

    fn cancelled(&self) -> bool {
        self.opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    fn pop(&mut self) -> Value {
        self.stack.pop().unwrap_or_default()
    }

    fn pop_n(&mut self, n: usize) -> Vec<Value> {
        let at = self.stack.len().saturating_sub(n);
        self.stack.split_off(at)
    }

    fn name(&self, s: Sym) -> &str {
        &self.module().names[s as usize]
    }

    fn exec(&mut self) -> Res<()> {
        loop {
            if self.cancelled() {
                return Ok(());
            }
            let (module, pc) = (self.frame().module, self.frame().pc);
            let Some(instr) = self.program.modules[module].code.get(pc).cloned() else {
                return Err(self.error_here(Failure::internal("ran past the end of the code")));
            };
            self.frames.last_mut().expect("frame").pc += 1;
            if !self.step(instr).map_err(|f| self.error_here(f))? {
                return Ok(());
            }
        }
    }

    /// Runs one instruction; `false` when the program is done.
    fn step(&mut self, instr: Instr) -> Result<bool, Failure> {
        match instr {
            Instr::Text(c) => {
                if let crate::syntax::ast::Const::Str(s) = &self.module().consts[c as usize] {
                    let s = s.clone();
                    self.emit(&s, Origin::Template)?;
                }
            }
            Instr::Emit => {
                let v = self.pop();
                if matches!(v, Value::Undefined) {
                    return Err(Failure::value("this value is undefined"));
                }
                let text = ops::render(&v)?;
                self.emit(&text, Origin::Variable)?;
            }
            Instr::Const(c) => {
                let v = Value::from_const(&self.module().consts[c as usize]);
                self.stack.push(v);
            }
            Instr::Load(s) => {
                let v = self.load(s).ok_or_else(|| Failure::value(format!("`{}` is not defined here", self.name(s))))?;
                self.stack.push(v);
            }
            Instr::LoadMaybe(s) => {
                let v = self.load(s).unwrap_or_default();
                self.stack.push(v);
            }
            Instr::Store(t) => {
                let v = self.pop();
                self.store(t, v)?;
            }
            Instr::Attr(s) => {
                let v = self.pop();
                let name = self.name(s).to_string();
                let r = self.attr(&v, &name)?;
                self.stack.push(r);
            }
            Instr::Index => {
                let i = self.pop();
                let v = self.pop();
                self.stack.push(ops::index(&v, &i)?);
            }
            Instr::Slice(mask) => {
                let mut parts = [None, None, None];
                for bit in (0..3).rev() {
                    if mask & (1 << bit) != 0 {
                        parts[bit] = Some(self.pop());
                    }
                }
                let v = self.pop();
                self.stack.push(ops::slice(&v, parts[0].as_ref(), parts[1].as_ref(), parts[2].as_ref())?);
            }
            Instr::List(n) => {
                let items = self.pop_n(n as usize);
                self.stack.push(Value::list(items));
            }
            Instr::Map(n) => {
                let flat = self.pop_n(2 * n as usize);
                let mut m = IndexMap::new();
                for kv in flat.chunks(2) {
                    let k = kv[0].as_str().map(str::to_string).unwrap_or_else(|| kv[0].to_string());
                    m.insert(k, kv[1].clone());
                }
                self.stack.push(Value::Map(Arc::new(m)));
            }
            Instr::Unary(op) => {
                let v = self.pop();
                self.stack.push(ops::unary(op, &v)?);
            }
            Instr::Binary(op) => {
                let b = self.pop();
                let a = self.pop();
                self.stack.push(ops::binary(op, &a, &b)?);
            }
            Instr::Call { args, kwargs } => self.call(args as usize, kwargs)?,
            Instr::Filter { name, args, kwargs } => {
                let kw = self.kwargs(kwargs);
                let pos = self.pop_n(args as usize);
                let v = self.pop();
                let r = ops::filter(self.name(name), &v, &Args { pos: &pos, kw: &kw })?;
                self.stack.push(r);
            }
            Instr::Test { name, args, negated } => {
                let a = self.pop_n(args as usize);
                let v = self.pop();
                let r = ops::test(self.name(name), &v, &a)?;
                self.stack.push(Value::Bool(r != negated));
            }
            Instr::Jump(t) => self.jump(t),
            Instr::JumpIfFalse(t) => {
                if !self.pop().is_true() {
                    self.jump(t);
                }
            }
            Instr::JumpIfFalseOrPop(t) => {
                if self.stack.last().is_some_and(|v| !v.is_true()) {
                    self.jump(t);
                } else {
                    self.pop();
                }
            }
            Instr::JumpIfTrueOrPop(t) => {
                if self.stack.last().is_some_and(Value::is_true) {
                    self.jump(t);
                } else {
                    self.pop();
                }
            }
            Instr::PushLoop(vars) => {
                let v = self.pop();
                let items: Vec<Value> = match &v {
                    Value::List(l) => l.to_vec(),
                    Value::Map(m) => m.keys().map(|k| Value::str(k.as_str())).collect(),
                    _ => match v.as_str() {
                        Some(s) => s.chars().map(|c| Value::str(c.to_string())).collect(),
                        None => return Err(Failure::value(format!("cannot loop over {}", v.a_type()))),
                    },
                };
                let saved = vars.iter().map(|&s| (s, self.stored(s))).collect();
                self.frames.last_mut().expect("frame").loops.push(LoopState { items: Arc::new(items), next: 0, saved });
            }
            Instr::Iterate(t) => {
                let l = self.frames.last_mut().expect("frame").loops.last_mut().ok_or_else(|| Failure::internal("no loop"))?;
                if l.next < l.items.len() {
                    let item = l.items[l.next].clone();
                    l.next += 1;
                    self.stack.push(item);
                } else {
                    self.jump(t);
                }
            }
            Instr::Unpack(n) => {
                let v = self.pop();
                if n == 1 {
                    self.stack.push(v);
                } else {
                    match &v {
                        Value::List(l) if l.len() == n as usize => self.stack.extend(l.iter().cloned()),
                        _ => return Err(Failure::value(format!("cannot unpack {} into {n} names", describe_len(&v)))),
                    }
                }
            }
            Instr::PopLoop(t) => {
                let l = self.frames.last_mut().expect("frame").loops.pop();
                if let Some(l) = &l {
                    for (s, old) in &l.saved {
                        self.put_back(*s, old.clone());
                    }
                }
                if l.is_some_and(|l| !l.items.is_empty()) {
                    self.jump(t);
                }
            }
            Instr::Gen { target, opts } => self.gen(target, opts)?,
            Instr::SelectIn { target, opts } => self.select_in(target, opts)?,
            Instr::SelectBegin { opts, branches } => self.select_begin(opts, branches)?,
            Instr::SelectEnd { target } => self.select_end(target)?,
            Instr::RoleBegin => {
                let v = self.pop();
                let role = v.as_str().ok_or_else(|| Failure::value(format!("a role name must be a string, not {}", v.a_type())))?.to_string();
                if !crate::syntax::ast::is_role_name(&role) {
                    return Err(Failure::value(format!(
                        "{role:?} is not a role name: a role name is a plain word (a letter, then letters, digits, `_` or `-`; at most {})",
                        crate::syntax::ast::MAX_ROLE_NAME
                    )));
                }
                if self.role.is_none() {
                    self.drop_layout_whitespace();
                }
                self.core.lm.role_begin(&role)?;
                self.core.state.nodes.push(Node::RoleOpen { role: role.clone() });
                (self.on_event)(Event::RoleOpen(&role));
                self.role = Some((role, String::new()));
            }
            Instr::RoleEnd => {
                if let Some((role, content)) = self.role.take() {
                    self.core.lm.role_end(&role, &content)?;
                    self.core.state.nodes.push(Node::RoleClose { role: role.clone() });
                    (self.on_event)(Event::RoleClose(&role));
                }
            }
            Instr::CaptureBegin => {
                self.captures.push(CaptureFrame { text: String::new(), node: self.core.state.nodes.len(), choices: None })
            }
            Instr::CaptureEnd(t) => {
                let c = self.captures.pop().ok_or_else(|| Failure::internal("no capture"))?;
                self.finish_capture(t, c, Meta::default())?;
            }
            Instr::HiddenBegin => {
                let m = self.core.lm.mark()?;
                self.hidden.push(m);
            }
            Instr::HiddenEnd => {
                if let Some(m) = self.hidden.pop() {
                    self.core.lm.rewind(m)?;
                }
            }
            Instr::DefineFunction(id) => {
                let f = &self.module().functions[id as usize];
                let (name, n) = (f.name, f.defaults as usize);
                let d = self.pop_n(n);
                let module = self.frame().module;
                self.core.defaults.insert((module, id), d);
                self.store(Store { name, append: false }, Value::Func { module, id })?;
            }
            Instr::Return => {
                self.frames.pop();
                self.stack.push(Value::str(""));
            }
            // Grammars are found by name (`grammar_named`): nothing to bind.
            Instr::DefineGrammar(_) => {}
            Instr::Import { module, alias } => {
                let target = self.module().imports[module as usize];
                if self.core.imported[target] {
                    self.store(Store { name: alias, append: false }, Value::Module(target))?;
                } else {
                    if self.frames.len() >= MAX_FRAMES {
                        return Err(Failure::limit("imports nest too deeply"));
                    }
                    self.core.imported[target] = true;
                    self.frames.push(Frame {
                        module: target,
                        pc: 0,
                        locals: None,
                        loops: Vec::new(),
                        kind: FrameKind::Import { alias },
                        quiet: true,
                    });
                }
            }
            Instr::Input(s) => {
                let name = self.name(s).to_string();
                let v = self
                    .opts
                    .vars
                    .get(&name)
                    .cloned()
                    .ok_or_else(|| Failure::new(RunErrorKind::MissingInput, format!("the input `{name}` was not given: pass it with `--var {name}=VALUE`")))?;
                self.store(Store { name: s, append: false }, v)?;
            }
            Instr::InputOr { name, skip } => {
                if let Some(v) = self.opts.vars.get(self.name(name)).cloned() {
                    self.store(Store { name, append: false }, v)?;
                    self.jump(skip);
                }
            }
            Instr::Halt => {
                let f = self.frames.pop().expect("frame");
                match f.kind {
                    FrameKind::Entry => return Ok(false),
                    FrameKind::Import { alias } => self.store(Store { name: alias, append: false }, Value::Module(f.module))?,
                    FrameKind::Call => self.stack.push(Value::str("")),
                }
            }
        }
        Ok(true)
    }

    fn jump(&mut self, to: u32) {
        self.frames.last_mut().expect("frame").pc = to as usize;
    }

    fn load(&self, s: Sym) -> Option<Value> {
        let f = self.frame();
        let name = self.name(s);
        if name == "loop" {
            if let Some(l) = f.loops.last() {
                let i = l.next.saturating_sub(1) as i64;
                let n = l.items.len() as i64;
                return Some(ops::map(vec![
                    ("index".into(), Value::Int(i + 1)),
                    ("index0".into(), Value::Int(i)),
                    ("first".into(), Value::Bool(i == 0)),
                    ("last".into(), Value::Bool(i + 1 == n)),
                    ("length".into(), Value::Int(n)),
                    ("revindex".into(), Value::Int(n - i)),
                    ("revindex0".into(), Value::Int(n - i - 1)),
                ]));
            }
        }
        if let Some(v) = f.locals.as_ref().and_then(|l| l.get(&s)) {
            return Some(v.clone());
        }
        if self.core.entries[f.module] {
            if let Some(v) = self.core.shared.get(name) {
                return Some(v.clone());
            }
            // A grammar block of this entry or, the latest first, an earlier one.
            let found =
                (0..=f.module).rev().filter(|&m| self.core.entries[m]).find_map(|m| grammar_named(&self.program.modules[m], m, name));
            if found.is_some() {
                return found;
            }
        } else if let Some(v) = self.core.globals[f.module].get(&s) {
            return Some(v.clone());
        }
        grammar_named(&self.program.modules[f.module], f.module, name)
            .or_else(|| crate::builtins::function(name).map(|(b, _)| Value::Builtin(b.name)))
    }

    /// The value `s` holds where [`Self::store`] would write it (not the
    /// names a load falls back on).
    fn stored(&self, s: Sym) -> Option<Value> {
        let f = self.frame();
        match &f.locals {
            Some(l) => l.get(&s).cloned(),
            None if self.core.entries[f.module] => self.core.shared.get(self.name(s)).cloned(),
            None => self.core.globals[f.module].get(&s).cloned(),
        }
    }

    /// Gives `s` back the value [`Self::stored`] read (or none).
    fn put_back(&mut self, s: Sym, old: Option<Value>) {
        let f = self.frames.last_mut().expect("frame");
        match &mut f.locals {
            Some(l) => restore(l, s, old),
            None if self.core.entries[f.module] => restore(&mut self.core.shared, self.program.modules[f.module].names[s as usize].clone(), old),
            None => restore(&mut self.core.globals[f.module], s, old),
        }
    }

    fn store(&mut self, t: Store, v: Value) -> Result<(), Failure> {
        let f = self.frames.last_mut().expect("frame");
        match &mut f.locals {
            Some(l) => put(l, t.name, v, t.append),
            None if self.core.entries[f.module] => {
                let name = self.program.modules[f.module].names[t.name as usize].clone();
                put(&mut self.core.shared, name, v, t.append)
            }
            None => put(&mut self.core.globals[f.module], t.name, v, t.append),
        }
    }

    fn attr(&self, v: &Value, name: &str) -> Result<Value, Failure> {
        match v {
            Value::Module(m) => {
                let module = &self.program.modules[*m];
                module
                    .names
                    .iter()
                    .position(|n| n == name)
                    .and_then(|s| self.core.globals[*m].get(&(s as Sym)).cloned())
                    .or_else(|| grammar_named(module, *m, name))
                    .ok_or_else(|| Failure::value(format!("module `{}` defines no `{name}`", module.name)))
            }
            Value::Grammar { module, id, rule: None } => Ok(Value::Grammar { module: *module, id: *id, rule: Some(name.into()) }),
            _ => ops::attr(v, name),
        }
    }

    fn kwargs(&mut self, set: u32) -> Vec<(String, Value)> {
        if set == u32::MAX {
            return Vec::new();
        }
        let names: Vec<String> = self.module().kwarg_sets[set as usize].iter().map(|&s| self.name(s).to_string()).collect();
        let vals = self.pop_n(names.len());
        names.into_iter().zip(vals).collect()
    }

    fn call(&mut self, args: usize, kwargs: u32) -> Result<(), Failure> {
        let kw = self.kwargs(kwargs);
        let pos = self.pop_n(args);
        match self.pop() {
            // The one builtin that reads the run: its counters so far.
            Value::Builtin("usage") => {
                let u = self.core.lm.usage_now()?;
                let counts = [
                    ("prompt_tokens", u.prompt_tokens),
                    ("generated_tokens", u.generated_tokens),
                    ("forced_tokens", u.forced_tokens),
                    ("sequence_tokens", u.sequence_tokens),
                    ("forward_passes", u.forward_passes),
                    ("forward_tokens", u.forward_tokens),
                    ("reused_tokens", u.reused_tokens),
                    ("rewound_tokens", u.rewound_tokens),
                    ("scored_tokens", u.scored_tokens),
                ];
                self.stack.push(ops::map(counts.iter().map(|(k, v)| (k.to_string(), Value::Int(*v as i64))).collect()));
            }
            Value::Builtin(name) => {
                let r = ops::call_builtin(name, &Args { pos: &pos, kw: &kw })?;
                self.stack.push(r);
            }
            Value::Func { module, id } => {
                if self.frames.len() >= MAX_FRAMES {
                    return Err(Failure::limit(format!("calls nest deeper than {MAX_FRAMES} (a `def` that calls itself without end?)")));
                }
                let m = &self.program.modules[module];
                let f = &m.functions[id as usize];
                let fname = &m.names[f.name as usize];
                if pos.len() > f.params.len() {
                    return Err(Failure::value(format!("`{fname}` takes {} arguments, {} given", f.params.len(), pos.len())));
                }
                let mut locals: HashMap<Sym, Value> = f.params.iter().copied().zip(pos).collect();
                for (k, v) in kw {
                    let p = f
                        .params
                        .iter()
                        .find(|&&p| m.names[p as usize] == k)
                        .ok_or_else(|| Failure::value(format!("`{fname}` has no parameter `{k}`")))?;
                    locals.insert(*p, v);
                }
                let defaults = self.core.defaults.get(&(module, id)).cloned().unwrap_or_default();
                let first_default = f.params.len() - defaults.len();
                for (i, &p) in f.params.iter().enumerate() {
                    if let std::collections::hash_map::Entry::Vacant(slot) = locals.entry(p) {
                        let d = i.checked_sub(first_default).and_then(|j| defaults.get(j).cloned());
                        let d = d.ok_or_else(|| Failure::value(format!("`{fname}` needs its argument `{}`", m.names[p as usize])))?;
                        slot.insert(d);
                    }
                }
                let quiet = self.frame().quiet;
                self.frames.push(Frame {
                    module,
                    pc: f.entry as usize,
                    locals: Some(locals),
                    loops: Vec::new(),
                    kind: FrameKind::Call,
                    quiet,
                });
            }
            other => return Err(Failure::value(format!("{} cannot be called", other.a_type()))),
        }
        Ok(())
    }

    /// Writes text into the prompt and the record.
    fn emit(&mut self, text: &str, origin: Origin) -> Result<(), Failure> {
        if text.is_empty() || self.frame().quiet {
            return Ok(());
        }
        self.core.lm.push_text(text, origin);
        let hidden = !self.hidden.is_empty();
        // Text right after a capture opened is inside it: a node of its own.
        let len = self.core.state.nodes.len();
        let merge = !self.captures.iter().any(|c| c.node == len);
        self.core.state.push_text(text, origin, hidden, merge);
        (self.on_event)(Event::Text { text, origin, hidden });
        self.account(text);
        self.core.lm.settle()
    }

    /// Adds text already in the prompt to open captures and the open role.
    fn account(&mut self, text: &str) {
        for c in &mut self.captures {
            c.text.push_str(text);
        }
        if self.hidden.is_empty() {
            if let Some((_, content)) = &mut self.role {
                content.push_str(text);
            }
        }
    }

    fn finish_capture(&mut self, t: Store, c: CaptureFrame, meta: Meta) -> Result<(), Failure> {
        let name = self.name(t.name).to_string();
        self.core.state.nodes.insert(c.node, Node::CaptureOpen { name: name.clone() });
        self.core.state.nodes.push(Node::CaptureClose { name: name.clone() });
        let value = Captured { text: c.text, meta };
        self.record_capture(t, name, value)
    }

    fn record_capture(&mut self, t: Store, name: String, value: Captured) -> Result<(), Failure> {
        let rec = CaptureRecord { name, list: t.append, value: value.clone() };
        (self.on_event)(Event::Capture(&rec));
        self.core.state.captures.push(rec);
        self.store(t, Value::Captured(Arc::new(value)))
    }

    /// A seed for the next random draw: the option's, or one derived from the run's.
    fn next_seed(&mut self, given: Option<u64>) -> u64 {
        self.core.draws += 1;
        given.unwrap_or_else(|| self.opts.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(self.core.draws))
    }
}

/// Streams generated text and tokens to the event callback.
struct GenSink<'x> {
    on_event: &'x mut dyn FnMut(Event<'_>),
    cancel: Option<&'x AtomicBool>,
    hidden: bool,
}

impl Sink for GenSink<'_> {
    fn text(&mut self, text: &str) {
        (self.on_event)(Event::Text { text, origin: Origin::Generated, hidden: self.hidden });
    }
    fn token(&mut self, token: &Token) {
        (self.on_event)(Event::Token(token));
    }
    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// White-space-only template text outside any capture or role.
fn is_layout(n: &Node) -> bool {
    matches!(n, Node::Text { text, origin: Origin::Template, hidden: false, .. } if text.trim().is_empty())
}

/// Assigns `key` in `scope`, or appends to the list there.
/// Sets `key` to `old`, or removes it when `old` is `None`.
fn restore<K: std::hash::Hash + Eq>(scope: &mut HashMap<K, Value>, key: K, old: Option<Value>) {
    match old {
        Some(v) => scope.insert(key, v),
        None => scope.remove(&key),
    };
}

fn put<K: std::hash::Hash + Eq>(scope: &mut HashMap<K, Value>, key: K, v: Value, append: bool) -> Result<(), Failure> {
    if !append {
        scope.insert(key, v);
        return Ok(());
    }
    let mut list = match scope.remove(&key) {
        None | Some(Value::Undefined) => Arc::new(Vec::new()),
        Some(Value::List(l)) if l.len() < ops::MAX_ITEMS => l,
        Some(other) => {
            let fail = match &other {
                Value::List(_) => Failure::limit(format!("the list would have over {} items (the limit for lists)", ops::MAX_ITEMS)),
                _ => Failure::value(format!("cannot append to {}", other.a_type())),
            };
            scope.insert(key, other);
            return Err(fail);
        }
    };
    // In place when nothing else holds the list: appends in a loop stay linear.
    Arc::make_mut(&mut list).push(v);
    scope.insert(key, Value::List(list));
    Ok(())
}

/// The grammar block called `name` in module `m`, as a value.
fn grammar_named(module: &CodeModule, m: usize, name: &str) -> Option<Value> {
    let id = module.grammars.iter().position(|g| g.name == name)?;
    Some(Value::Grammar { module: m, id: id as u32, rule: None })
}

fn describe_len(v: &Value) -> String {
    match v {
        Value::List(l) => format!("a list of {}", l.len()),
        other => other.a_type(),
    }
}
