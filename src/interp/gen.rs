//! Running `gen` and `select`: their options read into typed settings
//! (through the one option table), compiled into engine and sampler
//! settings, and how a select chooses.

use std::collections::HashMap;

use super::lm::{GenSpec, Lm};
use crate::state::{Choice, Meta};
use super::*;
use crate::engine::{Bias, Constraint, Semantics};
use crate::model::remote::Wire;
use crate::model::{Sampler, SamplingParams};
use crate::options::{self, Opt, OptValue, SchemaArg, ScoreMode};

/// Most tokens a greedy select may take.
const SELECT_MAX_TOKENS: usize = 4096;
/// Most options a `select … in` scores.
const MAX_SELECT_OPTIONS: usize = 10_000;
/// Most bytes of option text a `select … in` scores.
const MAX_SELECT_BYTES: usize = 1 << 20;
/// How much of the text after a select is scored with each option.
const FOLLOW_CHARS: usize = 32;

/// Compiled constraints of a run, by what they were compiled from.
#[derive(Default)]
pub(super) struct ConstraintCache {
    map: HashMap<String, Constraint>,
}

impl ConstraintCache {
    fn get(&mut self, key: String, make: impl FnOnce() -> Result<Constraint, crate::engine::EngineError>) -> Result<Constraint, Failure> {
        if let Some(c) = self.map.get(&key) {
            return Ok(c.clone());
        }
        let c = make()?;
        self.map.insert(key, c.clone());
        Ok(c)
    }
}

/// A `gen`'s options, read once; every field starts at the option
/// table's default.
#[derive(Default)]
struct GenOptions {
    max_tokens: usize,
    stop: Vec<String>,
    stop_regex: Vec<String>,
    regex: Option<String>,
    grammar: Option<Value>,
    json: Option<SchemaArg>,
    json_open: bool,
    bias: Vec<(String, f64)>,
    temperature: Option<f64>,
    top_p: f64,
    top_k: usize,
    min_p: f64,
    seed: Option<u64>,
    heal: bool,
    partial: bool,
}

/// A `select`'s options, read once (defaults from the table).
#[derive(Default)]
struct SelectOptions {
    score: ScoreMode,
    temperature: f64,
    seed: Option<u64>,
}

/// Reads the options of `table` into `set`, defaults first (from the
/// table), then each value given, read as the checker reads literals.
fn read_options(table: &'static [options::OptionSpec], given: Vec<(String, Value)>, mut set: impl FnMut(Opt, OptValue, &Value)) -> Result<(), Failure> {
    for spec in table {
        set(spec.opt, spec.default.value(), &Value::None);
    }
    for (name, value) in given {
        let spec = options::find(table, &name).ok_or_else(|| Failure::internal(format!("no option `{name}`")))?;
        let read = match (spec.opt, &value) {
            (Opt::Grammar, Value::Grammar { .. }) => OptValue::Default,
            _ => match value.to_const() {
                Some(c) => options::parse_value(spec, &c).map_err(|e| Failure::new(RunErrorKind::OptionValue, e.message))?,
                None => return Err(Failure::new(RunErrorKind::OptionValue, format!("`{name}` takes {}, not {}", crate::diagnostic::with_article(spec.ty), value.a_type()))),
            },
        };
        set(spec.opt, read, &value);
    }
    Ok(())
}

impl GenOptions {
    fn read(given: Vec<(String, Value)>) -> Result<GenOptions, Failure> {
        let mut o = GenOptions::default();
        read_options(options::GEN_OPTIONS, given, |opt, v, raw| match (opt, v) {
            (Opt::Grammar, _) if matches!(raw, Value::Grammar { .. }) => o.grammar = Some(raw.clone()),
            (Opt::MaxTokens, OptValue::Int(n)) => o.max_tokens = usize::try_from(n).unwrap_or(usize::MAX),
            (Opt::Stop, OptValue::Strings(v)) => o.stop = v,
            (Opt::StopRegex, OptValue::Strings(v)) => o.stop_regex = v,
            (Opt::Regex, OptValue::Strings(mut v)) => o.regex = v.pop(),
            (Opt::Json, OptValue::Schema(a)) => o.json = Some(a),
            (Opt::JsonOpen, OptValue::Bool(b)) => o.json_open = b,
            (Opt::Bias, OptValue::Bias(v)) => o.bias = v,
            (Opt::Temperature, OptValue::Number(x)) => o.temperature = Some(x),
            (Opt::TopP, OptValue::Number(x)) => o.top_p = x,
            (Opt::TopK, OptValue::Int(n)) => o.top_k = usize::try_from(n).unwrap_or(usize::MAX),
            (Opt::MinP, OptValue::Number(x)) => o.min_p = x,
            (Opt::Seed, OptValue::Int(n)) => o.seed = Some(n),
            (Opt::Heal, OptValue::Bool(b)) => o.heal = b,
            (Opt::Partial, OptValue::Bool(b)) => o.partial = b,
            _ => {} // `none`: the default stays
        })?;
        Ok(o)
    }
}

impl SelectOptions {
    fn read(given: Vec<(String, Value)>) -> Result<SelectOptions, Failure> {
        let mut o = SelectOptions::default();
        read_options(options::SELECT_OPTIONS, given, |opt, v, _| match (opt, v) {
            (Opt::Score, OptValue::Score(m)) => o.score = m,
            (Opt::Temperature, OptValue::Number(x)) => o.temperature = x,
            (Opt::Seed, OptValue::Int(n)) => o.seed = Some(n),
            _ => {}
        })?;
        Ok(o)
    }
}

impl Vm<'_, '_> {
    fn pop_options(&mut self, set: u32) -> Vec<(String, Value)> {
        let names: Vec<String> = self.module().option_sets[set as usize].iter().map(|&s| self.name(s).to_string()).collect();
        let vals = self.pop_n(names.len());
        names.into_iter().zip(vals).collect()
    }

    /// `{% gen %}`.
    pub(super) fn gen(&mut self, target: Option<Store>, set: u32) -> Result<(), Failure> {
        let o = GenOptions::read(self.pop_options(set))?;
        let spec = self.gen_spec(o)?;
        self.generate(target, &spec, None).map(drop)
    }

    /// Generates with `spec` into the prompt and stores the value; a
    /// select's scores (`choices`) become its metadata, and the chosen
    /// option's score its log-probability. Returns the value and its
    /// metadata.
    fn generate(&mut self, target: Option<Store>, spec: &GenSpec, choices: Option<Vec<Choice>>) -> Result<(String, Meta), Failure> {
        let node = self.core.state.nodes.len();
        let hidden = !self.hidden.is_empty();
        let quiet = self.frame().quiet;
        let mut sink = GenSink { on_event: &mut *self.on_event, cancel: self.opts.cancel.as_deref(), hidden };
        let g = self.core.lm.generate(spec, &mut sink)?;
        if !quiet {
            self.core.state.nodes.push(Node::Text { text: g.text.clone(), origin: Origin::Generated, tokens: g.tokens, hidden });
            self.account(&g.text);
        }
        self.core.state.logprob += g.decided;
        let mut meta = g.meta;
        if let Some(c) = choices {
            if let Some(chosen) = c.iter().find(|x| x.text == g.text) {
                meta.logprob = chosen.logprob;
            }
            meta.choices = c;
        }
        // A limit is not an answer (a stop the template asked for is).
        let unfinished = (g.unfinished && !spec.partial).then(|| {
            Failure::new(RunErrorKind::Unfinished, format!(
                "the value {:?} is unfinished: `max_tokens={}` ran out before it matched its constraint (give `partial=true` to keep unfinished values)",
                g.text, spec.max_tokens
            ))
        });
        if let Some(t) = target {
            let c = CaptureFrame { text: g.text.clone(), node, choices: None };
            self.finish_capture(t, c, meta.clone())?;
        }
        // The value and its capture are in the record before any error.
        match g.error.or(unfinished) {
            Some(e) => Err(e),
            None => Ok((g.text, meta)),
        }
    }

    fn gen_spec(&mut self, o: GenOptions) -> Result<GenSpec, Failure> {
        let limits = self.opts.limits.clone();
        let remote = self.core.lm.remote().is_some();
        let mut constraint = None;
        let mut wire = None;
        if let Some(p) = &o.regex {
            constraint = Some(self.core.cache.get(format!("regex:{p}"), || Constraint::regex(p, &limits))?);
            wire = remote.then(|| Wire::Regex(p.clone()));
        }
        if let Some(Value::Grammar { module, id, rule }) = &o.grammar {
            let program = self.program;
            let g = &program.modules[*module].grammars[*id as usize];
            let start = rule.as_deref().map(str::to_string).or_else(|| g.start.clone()).unwrap_or_else(|| "root".into());
            let key = format!("grammar:{module}:{id}:{start}");
            // Lowered to the engine's IR only when not cached yet.
            let make = || Constraint::grammar(&crate::engine::Grammar::from(&g.grammar), &start, &limits);
            constraint = Some(self.core.cache.get(key, make)?);
            if remote {
                wire = Some(Wire::Gbnf(crate::engine::grammar_gbnf(&g.grammar, &start)?));
            }
        }
        if let Some(json) = &o.json {
            let schema = match json {
                SchemaArg::File(path) => self.read_schema(path)?,
                SchemaArg::Inline(s) => s.clone(),
            };
            let semantics = if o.json_open { Semantics::Validation } else { Semantics::Generation };
            let key = format!("json:{semantics:?}:{schema}");
            wire = remote.then(|| Wire::JsonSchema(schema.clone()));
            constraint = Some(
                self.core.cache.get(key, || Constraint::json_schema(&schema, options::JSON_WHITESPACE, semantics, &limits))?,
            );
        }
        let bias = match o.bias.is_empty() {
            true => None,
            false if remote => return Err(Failure::model("`bias` needs the model's logits at every token, which a remote engine does not give")),
            false => {
                let pairs: Vec<(&str, f32)> = o.bias.iter().map(|(k, w)| (k.as_str(), *w as f32)).collect();
                Some(Bias::new(&pairs, &limits).map_err(Failure::constraint)?)
            }
        };
        let temperature = o.temperature.unwrap_or(f64::from(self.opts.temperature));
        Ok(GenSpec {
            constraint,
            sampling: self.sampling(temperature, o.top_k, o.top_p, o.min_p, o.seed)?,
            stop: o.stop,
            stop_regex: o.stop_regex,
            bias,
            max_tokens: o.max_tokens,
            heal: o.heal,
            partial: o.partial,
            wire,
        })
    }

    fn sampling(&mut self, temperature: f64, top_k: usize, top_p: f64, min_p: f64, seed: Option<u64>) -> Result<SamplingParams, Failure> {
        let p = SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            min_p: min_p as f32,
            seed: self.next_seed(seed),
            top_alternatives: super::lm::TOP_ALTERNATIVES,
        };
        p.validate().map_err(|e| Failure::new(RunErrorKind::OptionValue, e.to_string()))?;
        Ok(p)
    }

    fn read_schema(&self, path: &str) -> Result<serde_json::Value, Failure> {
        let file = self.module().file;
        let base = self.sources.get(file).path.as_ref().and_then(|p| p.parent());
        let full = crate::files::resolve_named(path, base, self.sources.root.as_deref()).map_err(|r| Failure::new(RunErrorKind::File, r.message(path)))?;
        let text = crate::files::read_file(&full).map_err(|e| Failure::new(RunErrorKind::File, format!("cannot read the schema `{path}`: {e}")))?;
        serde_json::from_str(&text).map_err(|e| Failure::new(RunErrorKind::File, format!("the schema `{path}` is not JSON: {e}")))
    }

    /// `{% select x in LIST %}`.
    pub(super) fn select_in(&mut self, target: Option<Store>, set: u32) -> Result<(), Failure> {
        let o = SelectOptions::read(self.pop_options(set))?;
        let list = self.pop();
        let options: Vec<String> = match &list {
            Value::List(l) => l.iter().map(Value::to_string).collect(),
            other => return Err(Failure::value(format!("`select … in` needs a list, not {}", other.a_type()))),
        };
        if options.is_empty() {
            return Err(Failure::value("`select … in` got an empty list: there is nothing to choose"));
        }
        let bytes: usize = options.iter().map(String::len).sum();
        if options.len() > MAX_SELECT_OPTIONS || bytes > MAX_SELECT_BYTES {
            return Err(Failure::limit(format!(
                "`select … in` got {} options of {bytes} bytes in all: the limits are {MAX_SELECT_OPTIONS} options and {} KiB (each option is scored by the model)",
                options.len(),
                MAX_SELECT_BYTES >> 10
            )));
        }
        if !self.core.lm.can_score() {
            return self.select_greedy(target, &options, &o, Vec::new()).map(drop);
        }
        let pc = self.frame().pc;
        let follow = self.follow_text(pc);
        let (choices, scores) = self.score_literals(&options, &follow, o.score)?;
        if o.score == ScoreMode::Greedy {
            return self.select_greedy(target, &options, &o, choices).map(drop);
        }
        let k = self.pick(&o, &scores)?;
        let node = self.core.state.nodes.len();
        self.emit(&options[k], Origin::Generated)?;
        if let Some(t) = target {
            let meta = Meta { logprob: scores[k], choices, ..Meta::default() };
            let c = CaptureFrame { text: options[k].clone(), node, choices: None };
            self.finish_capture(t, c, meta)?;
        }
        Ok(())
    }

    /// `{% select %}a{% or %}b{% end %}`: scores the branches, then runs the chosen one.
    pub(super) fn select_begin(&mut self, set: u32, table: u32) -> Result<(), Failure> {
        let o = SelectOptions::read(self.pop_options(set))?;
        let m = self.module();
        let entries = m.branch_tables[table as usize].clone();
        let (branches, end) = m.select_branches(table);
        let options: Vec<String> = branches.iter().map(|b| b.0.clone()).collect();
        let literal = branches.iter().all(|b| b.2);
        // Without scores (a remote engine lacking prompt log-probs) the
        // option is generated under a constraint to the options.
        let by_generation = literal && (o.score == ScoreMode::Greedy || !self.core.lm.can_score());
        let (choices, scores) = if !self.core.lm.can_score() {
            if !literal {
                return Err(Failure::model("a select whose branches generate needs the model's logits, which a remote engine does not give"));
            }
            (Vec::new(), Vec::new())
        } else if literal {
            let follow = self.follow_text(end + 1);
            self.score_literals(&options, &follow, o.score)?
        } else {
            // The checker warns (W0704): a branch that generates has no
            // text to decode greedily, so such selects score in full.
            let mode = if o.score == ScoreMode::Greedy { ScoreMode::Full } else { o.score };
            self.score_mixed(&branches, mode)?
        };
        let node = self.core.state.nodes.len();
        let k = if by_generation {
            // The chosen text is generated; the capture (opened by
            // `SelectEnd`'s caller) holds it, with the scores as metadata.
            self.captures.push(CaptureFrame { text: String::new(), node, choices: None });
            let (text, meta) = self.select_greedy(None, &options, &o, choices)?;
            let k = options.iter().position(|x| *x == text).ok_or_else(|| Failure::internal(format!("greedy select chose {text:?}")))?;
            self.captures.last_mut().expect("pushed above").choices = Some(meta);
            k
        } else {
            let k = self.pick(&o, &scores)?;
            let meta = Meta { logprob: scores[k], choices, ..Meta::default() };
            self.captures.push(CaptureFrame { text: String::new(), node, choices: Some(meta) });
            self.emit(&branches[k].0, Origin::Generated)?;
            k
        };
        self.jump(entries[k] + branches[k].1 as u32);
        Ok(())
    }

    /// End of a branching select: stores what the chosen branch wrote.
    pub(super) fn select_end(&mut self, target: Option<Store>) -> Result<(), Failure> {
        let mut c = self.captures.pop().ok_or_else(|| Failure::internal("no select in progress"))?;
        let meta = c.choices.take().unwrap_or_default();
        match target {
            Some(t) => self.finish_capture(t, c, meta),
            None => Ok(()),
        }
    }

    /// `score="greedy"`: the option is generated token by token under a
    /// constraint to the options (at the select's temperature); the
    /// scores stay as metadata. Returns the chosen text and its metadata.
    fn select_greedy(&mut self, target: Option<Store>, options: &[String], o: &SelectOptions, choices: Vec<Choice>) -> Result<(String, Meta), Failure> {
        let c = Constraint::choices(options, &self.opts.limits).map_err(Failure::constraint)?;
        let wire = self.core.lm.remote().map(|_| Wire::Choices(options.to_vec()));
        let spec = GenSpec {
            wire,
            constraint: Some(c),
            stop: Vec::new(),
            stop_regex: Vec::new(),
            bias: None,
            sampling: self.sampling(o.temperature, 0, 1.0, 0.0, o.seed)?,
            max_tokens: SELECT_MAX_TOKENS,
            heal: true,
            partial: false,
        };
        self.generate(target, &spec, Some(choices))
    }

    /// Scores literal options; returns the distribution and each option's score.
    fn score_literals(&mut self, options: &[String], follow: &str, mode: ScoreMode) -> Result<(Vec<Choice>, Vec<f64>), Failure> {
        let raw = self.core.lm.score(options, follow)?;
        let scores: Vec<f64> = raw.iter().map(|&(sum, n)| if mode == ScoreMode::Mean { sum / n.max(1) as f64 } else { sum }).collect();
        Ok((Lm::choices(options, &scores), scores))
    }

    /// Branches some of which generate: literal ones are scored whole, one
    /// that starts with text by that text, and one that starts by
    /// generating by the probability that the next token begins none of
    /// the literal options.
    fn score_mixed(&mut self, branches: &[(String, usize, bool)], mode: ScoreMode) -> Result<(Vec<Choice>, Vec<f64>), Failure> {
        let texts: Vec<String> = branches.iter().filter(|b| !b.0.is_empty()).map(|b| b.0.clone()).collect();
        let raw = if texts.is_empty() { Vec::new() } else { self.core.lm.score(&texts, "")? };
        let off = if branches.iter().any(|b| b.0.is_empty()) {
            let literals: Vec<String> = branches.iter().filter(|b| b.2).map(|b| b.0.clone()).collect();
            if literals.is_empty() {
                0.0
            } else {
                self.core.lm.off_literals_logprob(&literals)?
            }
        } else {
            0.0
        };
        let mut it = raw.into_iter();
        let scores: Vec<f64> = branches
            .iter()
            .map(|b| match b.0.is_empty() {
                true => off,
                false => it.next().map_or(0.0, |(sum, n)| if mode == ScoreMode::Mean { sum / n.max(1) as f64 } else { sum }),
            })
            .collect();
        let labels: Vec<String> = branches.iter().map(|b| if b.0.is_empty() { "<generated>".to_string() } else { b.0.clone() }).collect();
        Ok((Lm::choices(&labels, &scores), scores))
    }

    /// The best option, or one sampled from the scores at `temperature`.
    /// The choice adds its score to the run's.
    fn pick(&mut self, o: &SelectOptions, scores: &[f64]) -> Result<usize, Failure> {
        // The scores are the options' logits: the token sampler picks among them.
        let p = self.sampling(o.temperature, 0, 1.0, 0.0, o.seed)?;
        let k = match self.core.lm.decide_option(scores)? {
            // Stopped by the search: the run ends at the next instruction.
            Some(k) => k.unwrap_or(0).min(scores.len().saturating_sub(1)),
            None => {
                let logits: Vec<f32> = scores.iter().map(|&s| s as f32).collect();
                let s = Sampler::new(p).and_then(|mut s| s.sample(&logits, None, &[])).map_err(|e| Failure::value(e.to_string()))?;
                s.token as usize
            }
        };
        self.core.state.logprob += scores.get(k).copied().unwrap_or(0.0);
        self.core.lm.usage.decisions += 1;
        Ok(k)
    }

    /// The template text right after instruction `pc`, if it is text: what
    /// options are scored with, so options that are prefixes of each other
    /// compare fairly.
    fn follow_text(&self, pc: usize) -> String {
        let m = self.module();
        match m.code.get(pc) {
            Some(Instr::Text(c)) => match &m.consts[*c as usize] {
                crate::syntax::ast::Const::Str(s) => s.chars().take(FOLLOW_CHARS).collect(),
                _ => String::new(),
            },
            _ => String::new(),
        }
    }
}
