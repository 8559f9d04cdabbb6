//! `gen` and `select`: option values to engine and sampler settings, and
//! how a select chooses.

use std::collections::HashMap;

use super::lm::{GenSpec, Lm};
use crate::state::{Choice, Meta};
use super::*;
use crate::engine::{Bias, Constraint, Semantics, Whitespace};
use crate::model::{Sampler, SamplingParams};

/// Default `max_tokens`.
const DEFAULT_MAX_TOKENS: usize = 256;
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
    fn get(&mut self, key: String, make: impl FnOnce() -> Result<Constraint, crate::engine::EngineError>) -> Result<Constraint, String> {
        if let Some(c) = self.map.get(&key) {
            return Ok(c.clone());
        }
        let c = make().map_err(|e| e.to_string())?;
        self.map.insert(key, c.clone());
        Ok(c)
    }
}

type Opts = IndexMap<String, Value>;

impl Vm<'_, '_> {
    fn pop_options(&mut self, set: u32) -> Opts {
        let names: Vec<String> = self.module().option_sets[set as usize].iter().map(|&s| self.name(s).to_string()).collect();
        let vals = self.pop_n(names.len());
        names.into_iter().zip(vals).collect()
    }

    /// `{% gen %}`.
    pub(super) fn gen(&mut self, target: Option<Store>, set: u32) -> Result<(), Step> {
        let o = self.pop_options(set);
        let spec = self.gen_spec(&o)?;
        self.generate(target, &spec, None)
    }

    /// Generates with `spec` into the prompt and stores the value; a
    /// select's scores (`choices`) become its metadata.
    fn generate(&mut self, target: Option<Store>, spec: &GenSpec, choices: Option<(Vec<Choice>, f64)>) -> Result<(), Step> {
        let node = self.core.state.nodes.len();
        let hidden = !self.hidden.is_empty();
        let quiet = self.frame().quiet;
        let mut sink = GenSink { on_event: &mut *self.on_event, cancel: self.opts.cancel.as_deref(), hidden };
        let g = self.core.lm.generate(spec, &mut sink).map_err(Step::Err)?;
        if !quiet {
            self.core.state.nodes.push(Node::Text { text: g.text.clone(), origin: Origin::Generated, tokens: g.tokens, hidden });
            self.account(&g.text);
        }
        self.core.state.logprob += g.meta.logprob;
        let mut meta = g.meta;
        if let Some((c, score)) = choices {
            meta.choices = c;
            meta.logprob = score;
        }
        // A limit is not an answer (a stop the template asked for is).
        let unfinished = (g.unfinished && !spec.partial).then(|| {
            format!(
                "the value {:?} is unfinished: `max_tokens={}` ran out before it matched its constraint (give `partial=true` to keep unfinished values)",
                g.text, spec.max_tokens
            )
        });
        if let Some(t) = target {
            let c = CaptureFrame { text: g.text, node, choices: None };
            self.finish_capture(t, c, meta)?;
        }
        // The value and its capture are in the record before any error.
        match g.error.or(unfinished) {
            Some(e) => Err(Step::Err(e)),
            None => Ok(()),
        }
    }

    fn gen_spec(&mut self, o: &Opts) -> Result<GenSpec, Step> {
        let limits = self.opts.limits.clone();
        let max_tokens = match o.get("max_tokens") {
            None => DEFAULT_MAX_TOKENS,
            Some(Value::Int(n)) if *n >= 1 => usize::try_from(*n).unwrap_or(usize::MAX),
            Some(v) => return Err(Step::Err(format!("`max_tokens` must be an integer ≥ 1, not {v}"))),
        };
        let mut constraint = None;
        if let Some(v) = o.get("regex") {
            let p = v.as_str().ok_or_else(|| Step::Err("`regex` must be a string".into()))?.to_string();
            constraint = Some(self.core.cache.get(format!("regex:{p}"), || Constraint::regex(&p, &limits)).map_err(Step::Err)?);
        }
        if let Some(v) = o.get("grammar") {
            let Value::Grammar { module, id, rule } = v else {
                return Err(Step::Err(format!("`grammar` must name a `{{% grammar %}}` block, not {}", v.a_type())));
            };
            let g = &self.program.modules[*module].grammars[*id as usize];
            let start = rule.as_deref().map(str::to_string).or_else(|| g.start.clone()).unwrap_or_else(|| "root".into());
            let key = format!("grammar:{module}:{id}:{start}");
            let grammar = crate::engine::Grammar::from(&g.grammar);
            constraint = Some(self.core.cache.get(key, || Constraint::grammar(&grammar, &start, &limits)).map_err(Step::Err)?);
        }
        if let Some(v) = o.get("json") {
            let schema = match v {
                Value::Map(_) | Value::Bool(true) => v.to_json(),
                _ => match v.as_str() {
                    Some(path) => self.read_schema(path)?,
                    None => return Err(Step::Err(format!("`json` must be a schema map or a path, not {}", v.a_type()))),
                },
            };
            let semantics = match o.get("json_open") {
                None => Semantics::Generation,
                Some(Value::Bool(b)) => if *b { Semantics::Validation } else { Semantics::Generation },
                Some(v) => return Err(Step::Err(format!("`json_open` must be a boolean, not {}", v.a_type()))),
            };
            let key = format!("json:{semantics:?}:{schema}");
            // llama.cpp's white space: the layouts models learnt JSON in.
            // With none allowed, SmolLM2 wrote `{"order_id":"1234…` until
            // `max_tokens` where pretty-printed output closed.
            constraint = Some(
                self.core.cache.get(key, || Constraint::json_schema(&schema, Whitespace::Pretty, semantics, &limits)).map_err(Step::Err)?,
            );
        }
        let bias = match o.get("bias") {
            None => None,
            Some(Value::Map(m)) => {
                let mut pairs = Vec::new();
                for (k, v) in m.iter() {
                    let w = v.as_f64().ok_or_else(|| Step::Err(format!("the bias for `{k}` must be a number")))?;
                    pairs.push((k.as_str(), w as f32));
                }
                Some(Bias::new(&pairs, &limits).map_err(|e| Step::Err(e.to_string()))?)
            }
            Some(v) => return Err(Step::Err(format!("`bias` must be a map of regex to number, not {}", v.a_type()))),
        };
        let heal = o.get("heal").is_none_or(Value::is_true);
        Ok(GenSpec {
            constraint,
            stop: strings(o.get("stop"), "stop")?,
            stop_regex: strings(o.get("stop_regex"), "stop_regex")?,
            bias,
            sampling: self.sampling(o, self.opts.temperature)?,
            max_tokens,
            heal,
            partial: o.get("partial").is_some_and(Value::is_true),
        })
    }

    fn sampling(&mut self, o: &Opts, default_temperature: f32) -> Result<SamplingParams, Step> {
        let num = |k: &str, d: f64| -> Result<f64, Step> {
            match o.get(k) {
                None => Ok(d),
                Some(v) => v.as_f64().ok_or_else(|| Step::Err(format!("`{k}` must be a number"))),
            }
        };
        let seed = match o.get("seed") {
            Some(Value::Int(s)) => Some(*s as u64),
            _ => None,
        };
        let p = SamplingParams {
            temperature: num("temperature", f64::from(default_temperature))? as f32,
            top_k: num("top_k", 0.0)? as usize,
            top_p: num("top_p", 1.0)? as f32,
            min_p: num("min_p", 0.0)? as f32,
            seed: self.next_seed(seed),
            top_alternatives: super::lm::TOP_ALTERNATIVES,
        };
        p.validate().map_err(|e| Step::Err(e.to_string()))?;
        Ok(p)
    }

    fn read_schema(&self, path: &str) -> Result<serde_json::Value, Step> {
        let file = self.module().file;
        let base = self.sources.get(file).path.as_ref().and_then(|p| p.parent());
        let full = crate::files::resolve_named(path, base, self.sources.root.as_deref()).map_err(|r| Step::Err(r.message(path)))?;
        let text = crate::files::read_file(&full).map_err(|e| Step::Err(format!("cannot read the schema `{path}`: {e}")))?;
        serde_json::from_str(&text).map_err(|e| Step::Err(format!("the schema `{path}` is not JSON: {e}")))
    }

    /// `{% select x in LIST %}`.
    pub(super) fn select_in(&mut self, target: Option<Store>, set: u32) -> Result<(), Step> {
        let o = self.pop_options(set);
        let list = self.pop();
        let options: Vec<String> = match &list {
            Value::List(l) => l.iter().map(Value::to_string).collect(),
            other => return Err(Step::Err(format!("`select … in` needs a list, not {}", other.a_type()))),
        };
        if options.is_empty() {
            return Err(Step::Err("`select … in` got an empty list: there is nothing to choose".into()));
        }
        let bytes: usize = options.iter().map(String::len).sum();
        if options.len() > MAX_SELECT_OPTIONS || bytes > MAX_SELECT_BYTES {
            return Err(Step::Err(format!(
                "`select … in` got {} options of {bytes} bytes in all: the limits are {MAX_SELECT_OPTIONS} options and {} KiB (each option is scored by the model)",
                options.len(),
                MAX_SELECT_BYTES >> 10
            )));
        }
        let pc = self.frame().pc;
        let follow = self.follow_text(pc);
        let mode = score_mode(&o)?;
        let (choices, scores) = self.score_literals(&options, &follow, mode)?;
        if mode == "greedy" {
            let c = Constraint::choices(&options, &self.opts.limits).map_err(|e| Step::Err(e.to_string()))?;
            let spec = GenSpec {
                constraint: Some(c),
                stop: Vec::new(),
                stop_regex: Vec::new(),
                bias: None,
                sampling: self.sampling(&o, 0.0)?,
                max_tokens: SELECT_MAX_TOKENS,
                heal: true,
                partial: false,
            };
            let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            return self.generate(target, &spec, Some((choices, best)));
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
    pub(super) fn select_begin(&mut self, set: u32, table: u32) -> Result<(), Step> {
        let o = self.pop_options(set);
        let m = self.module();
        let entries = m.branch_tables[table as usize].clone();
        // Each branch's literal start, how many Text instructions it spans, and whether that is all of it.
        let mut branches: Vec<(String, usize, bool)> = Vec::new();
        let mut end = 0;
        for &e in &entries {
            let (mut text, mut pc) = (String::new(), e as usize);
            while let Some(Instr::Text(c)) = m.code.get(pc) {
                if let crate::syntax::ast::Const::Str(s) = &m.consts[*c as usize] {
                    text.push_str(s);
                }
                pc += 1;
            }
            let literal =
                matches!(m.code.get(pc), Some(Instr::Jump(to)) if matches!(m.code.get(*to as usize), Some(Instr::SelectEnd { .. })));
            if let Some(Instr::Jump(to)) = m.code.get(pc) {
                end = *to as usize;
            }
            branches.push((text, pc - e as usize, literal));
        }
        let mode = score_mode(&o)?;
        let options: Vec<String> = branches.iter().map(|b| b.0.clone()).collect();
        let (choices, scores) = if branches.iter().all(|b| b.2) {
            let follow = self.follow_text(end + 1);
            self.score_literals(&options, &follow, if mode == "greedy" { "full" } else { mode })?
        } else {
            self.score_mixed(&branches, mode)?
        };
        let k = self.pick(&o, &scores)?;
        let meta = Meta { logprob: scores[k], choices, ..Meta::default() };
        self.captures.push(CaptureFrame { text: String::new(), node: self.core.state.nodes.len(), choices: Some(meta) });
        self.emit(&branches[k].0, Origin::Generated)?;
        self.jump(entries[k] + branches[k].1 as u32);
        Ok(())
    }

    /// End of a branching select: stores what the chosen branch wrote.
    pub(super) fn select_end(&mut self, target: Option<Store>) -> Result<(), Step> {
        let mut c = self.captures.pop().ok_or_else(|| Step::Err("internal: no select in progress".into()))?;
        let meta = c.choices.take().unwrap_or_default();
        match target {
            Some(t) => self.finish_capture(t, c, meta),
            None => Ok(()),
        }
    }

    /// Scores literal options; returns the distribution and each option's score.
    fn score_literals(&mut self, options: &[String], follow: &str, mode: &str) -> Result<(Vec<Choice>, Vec<f64>), Step> {
        let raw = self.core.lm.score(options, follow).map_err(Step::Err)?;
        let scores: Vec<f64> = raw.iter().map(|&(sum, n)| if mode == "mean" { sum / n.max(1) as f64 } else { sum }).collect();
        Ok((Lm::choices(options, &scores), scores))
    }

    /// Branches some of which generate: literal ones are scored whole, one
    /// that starts with text by that text, and one that starts by
    /// generating by the probability that the next token begins none of
    /// the literal options.
    fn score_mixed(&mut self, branches: &[(String, usize, bool)], mode: &str) -> Result<(Vec<Choice>, Vec<f64>), Step> {
        let texts: Vec<String> = branches.iter().filter(|b| !b.0.is_empty()).map(|b| b.0.clone()).collect();
        let raw = if texts.is_empty() { Vec::new() } else { self.core.lm.score(&texts, "").map_err(Step::Err)? };
        let off = if branches.iter().any(|b| b.0.is_empty()) {
            let literals: Vec<String> = branches.iter().filter(|b| b.2).map(|b| b.0.clone()).collect();
            if literals.is_empty() {
                0.0
            } else {
                self.core.lm.off_literals_logprob(&literals).map_err(Step::Err)?
            }
        } else {
            0.0
        };
        let mut it = raw.into_iter();
        let scores: Vec<f64> = branches
            .iter()
            .map(|b| match b.0.is_empty() {
                true => off,
                false => it.next().map_or(0.0, |(sum, n)| if mode == "mean" { sum / n.max(1) as f64 } else { sum }),
            })
            .collect();
        let labels: Vec<String> = branches.iter().map(|b| if b.0.is_empty() { "<generated>".to_string() } else { b.0.clone() }).collect();
        Ok((Lm::choices(&labels, &scores), scores))
    }

    /// The best option, or one sampled from the scores at `temperature`.
    fn pick(&mut self, o: &Opts, scores: &[f64]) -> Result<usize, Step> {
        // The scores are the options' logits: the token sampler picks among them.
        let p = self.sampling(o, 0.0)?;
        let logits: Vec<f32> = scores.iter().map(|&s| s as f32).collect();
        let s = Sampler::new(p).and_then(|mut s| s.sample(&logits, None, &[])).map_err(|e| Step::Err(e.to_string()))?;
        Ok(s.token as usize)
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

fn score_mode(o: &Opts) -> Result<&'static str, Step> {
    match o.get("score") {
        None => Ok("full"),
        Some(v) => match v.as_str() {
            Some("full") => Ok("full"),
            Some("mean") => Ok("mean"),
            Some("greedy") => Ok("greedy"),
            _ => Err(Step::Err(format!("`score` must be \"full\", \"mean\" or \"greedy\", not {v}"))),
        },
    }
}

/// A string or list of strings option.
fn strings(v: Option<&Value>, name: &str) -> Result<Vec<String>, Step> {
    match v {
        None | Some(Value::None) => Ok(Vec::new()),
        Some(Value::List(l)) => {
            l.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| Step::Err(format!("`{name}` must hold strings")))).collect()
        }
        Some(x) => {
            x.as_str().map(|s| vec![s.to_string()]).ok_or_else(|| Step::Err(format!("`{name}` must be a string or a list of strings")))
        }
    }
}
