//! A REPL session: one model state and one namespace for a sequence of
//! entries. Each entry is parsed, checked and compiled on its own (with the
//! names earlier entries defined visible to the checker) and runs where the
//! last one stopped, so it costs only its own tokens. Before each entry the
//! session records what it needs to take it back ([`Session::undo`]).

use std::collections::HashMap;
use std::path::PathBuf;

use super::lm::Checkpoint;
use super::value::Value;
use crate::state::FinishReason;
use super::{Core, Event, RunError, RunOptions, Vm};
use crate::state::Failure;
use crate::check::{self, Export, ModuleInfo, ParamSig, Prelude};
use crate::ir::Program;
use crate::model::Model;
use crate::span::{SourceFile, SourceMap};
use crate::state::{Node, Record};
use crate::workspace::{Loader, Workspace};

/// A live session on one model.
pub struct Session<'m> {
    model: &'m Model,
    opts: RunOptions,
    /// Every entry's modules and the modules they import, indexed like `sources`.
    program: Program,
    sources: SourceMap,
    /// What each module exports (for the checker's view of imported modules).
    infos: Vec<ModuleInfo>,
    core: Core<'m>,
    entries: Vec<Entry>,
}

/// An entry that ran.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its source text.
    pub text: String,
    /// How it ended.
    pub finish_reason: FinishReason,
    before: Snapshot,
}

/// What an entry changes, as it was before the entry.
#[derive(Debug, Clone)]
struct Snapshot {
    lm: Checkpoint,
    nodes: usize,
    /// The last node then: text of the next entry merges into it.
    last_node: Option<Node>,
    captures: usize,
    logprob: f64,
    finish_reason: FinishReason,
    error: Option<Failure>,
    shared: HashMap<String, Value>,
    imported: Vec<bool>,
    draws: u64,
}

impl<'m> Session<'m> {
    /// A fresh session on `model`.
    pub fn new(model: &'m Model, opts: RunOptions) -> Result<Session<'m>, Failure> {
        let mut core = Core::new(super::Backend::local(model), &opts, 0)?;
        // Inputs are the session's variables from the start (`{% input %}` reads them too).
        core.shared.extend(opts.vars.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(Session {
            model,
            opts,
            program: Program { modules: Vec::new(), entry: 0 },
            sources: SourceMap::default(),
            infos: Vec::new(),
            core,
            entries: Vec::new(),
        })
    }

    /// Parses and checks an entry's text against the names defined so far.
    /// `path` is where relative imports and schema files resolve from.
    pub fn load(&self, name: &str, text: &str, path: Option<PathBuf>, loader: &dyn Loader) -> Workspace {
        Workspace::load_entry(name, text, path, loader, &self.prelude())
    }

    /// Runs a loaded entry (one without errors) after the previous ones.
    /// Stopped by an error or a cancel, its partial output is kept and
    /// whatever it left open is closed; either way it can be undone.
    pub fn run(&mut self, ws: &Workspace, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), RunError> {
        let entry = self.add(ws);
        let file = self.program.modules[entry].file;
        let before = self.snapshot().map_err(|f| RunError { kind: f.kind, message: f.message, file, span: Default::default() })?;
        let text = self.sources.get(file).text.to_string();
        let mut vm = Vm::new(&self.program, &self.sources, &self.opts, &mut self.core, entry, on_event);
        let mut error = vm.exec().err();
        let cancelled = vm.cancelled();
        if let Err(m) = vm.unwind().and_then(|_| vm.core.lm.finish(!cancelled)) {
            error = error.or_else(|| Some(vm.error_here(m)));
        }
        self.core.end(error.as_ref(), cancelled);
        on_event(Event::Done(&self.core.state));
        self.entries.push(Entry { text, finish_reason: self.core.state.finish_reason, before });
        error.map_or(Ok(()), Err)
    }

    /// Takes the last entry back: the token sequence and the KV cache, the
    /// record and the variables are as they were before it. Returns it, or
    /// `None` when there is none.
    pub fn undo(&mut self) -> Result<Option<Entry>, Failure> {
        let Some(entry) = self.entries.pop() else { return Ok(None) };
        let s = &entry.before;
        self.core.lm.restore(&s.lm)?;
        let state = &mut self.core.state;
        state.nodes.truncate(s.nodes);
        if let (Some(last), Some(node)) = (state.nodes.last_mut(), &s.last_node) {
            *last = node.clone();
        }
        state.captures.truncate(s.captures);
        state.logprob = s.logprob;
        state.finish_reason = s.finish_reason;
        state.error = s.error.clone();
        self.core.shared = s.shared.clone();
        self.core.imported = s.imported.clone();
        self.core.draws = s.draws;
        self.core.sync();
        Ok(Some(entry))
    }

    /// Starts over on the same model: no entries, an empty cache.
    pub fn reset(&mut self) -> Result<(), Failure> {
        *self = Session::new(self.model, self.opts.clone())?;
        Ok(())
    }

    /// The record so far.
    pub fn state(&self) -> &Record {
        &self.core.state
    }

    /// The entries that ran, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The session's variables, by name.
    pub fn vars(&self) -> Vec<(&str, &Value)> {
        let mut v: Vec<(&str, &Value)> = self.core.shared.iter().map(|(k, v)| (k.as_str(), v)).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// Every file of the session (entries and their imports), for rendering runtime errors.
    pub fn sources(&self) -> &SourceMap {
        &self.sources
    }

    /// The session as one template that re-runs it: the entries' texts in order.
    pub fn template(&self) -> String {
        self.entries.iter().map(|e| e.text.as_str()).collect()
    }

    /// What the entries so far define, as the checker sees it.
    pub fn prelude(&self) -> Prelude {
        let mut p = Prelude::default();
        let entries = self.program.modules.iter().enumerate().filter(|(i, _)| self.core.entries[*i]);
        for (_, m) in entries {
            for g in &m.grammars {
                let rules = g.grammar.rules.iter().map(|r| r.name.clone()).collect();
                p.names.insert(g.name.clone(), Export::Grammar { rules, start: check::start_rule(&g.name, &g.grammar) });
            }
        }
        for (name, v) in &self.core.shared {
            let export = match v {
                Value::Func { module, id } => {
                    let f = &self.program.modules[*module].functions[*id as usize];
                    let names = &self.program.modules[*module].names;
                    let first_default = f.params.len() - f.defaults as usize;
                    let params = f
                        .params
                        .iter()
                        .enumerate()
                        .map(|(i, &s)| ParamSig { name: names[s as usize].clone(), has_default: i >= first_default });
                    Export::Def(params.collect())
                }
                Value::Module(m) => {
                    p.modules.insert(name.clone(), self.infos[*m].clone());
                    Export::Module
                }
                _ => Export::Value,
            };
            p.names.insert(name.clone(), export);
        }
        p
    }

    fn snapshot(&mut self) -> Result<Snapshot, Failure> {
        let state = &self.core.state;
        Ok(Snapshot {
            nodes: state.nodes.len(),
            last_node: state.nodes.last().cloned(),
            captures: state.captures.len(),
            logprob: state.logprob,
            finish_reason: state.finish_reason,
            error: state.error.clone(),
            shared: self.core.shared.clone(),
            imported: self.core.imported.clone(),
            draws: self.core.draws,
            lm: self.core.lm.checkpoint()?,
        })
    }

    /// Adds the files and compiled modules of `ws` to the session; returns
    /// the entry's module.
    fn add(&mut self, ws: &Workspace) -> usize {
        let base = self.sources.len();
        for (_, f) in ws.sources.iter() {
            self.sources.add(SourceFile::clone(f));
        }
        let compiled = crate::ir::compile(ws);
        for (mut m, module) in compiled.modules.into_iter().zip(&ws.modules) {
            m.file.0 += base as u32;
            m.imports.iter_mut().for_each(|i| *i += base);
            self.program.modules.push(m);
            self.infos.push(module.info.clone());
        }
        self.core.grow(self.program.modules.len());
        let entry = base + compiled.entry;
        self.core.entries[entry] = true;
        entry
    }
}
