//! A generation on a remote engine: one request with the decided tokens as
//! the prompt and the constraint in the engine's dialect; the answer is cut
//! at lmt's own stops, re-checked by lmt's engine, and its tokens join the
//! sequence with their log-probs, as a local generation's would.
//!
//! Token healing works as locally: the last prompt token is backed out and
//! the constraint sent is "its text, then the value's constraint", so the
//! engine's first token may cross the boundary; its text is taken off the
//! value that comes back.

use super::*;
use crate::model::remote::{Completion, RemoteFinish, Request, Wire};

impl Lm<'_> {
    /// Generates one value through `r` (pending text already decided).
    pub(super) fn generate_remote(&mut self, r: &RemoteModel, spec: &GenSpec, sink: &mut dyn Sink) -> LmResult<Generated> {
        if sink.cancelled() {
            return Ok(Generated::empty(FinishReason::Cancelled));
        }
        // A JSON Schema cannot be prefixed with text: no healing before one.
        let healed = if spec.heal && !matches!(spec.wire, Some(Wire::JsonSchema(_))) { self.heal_text()? } else { String::new() };
        let wire = match healed.as_str() {
            "" => spec.wire.clone(),
            h => Some(healed_wire(h, spec.wire.as_ref())),
        };
        let prompt: Vec<u32> = self.seq.iter().map(|t| t.id).collect();
        if prompt.is_empty() {
            return Err(Failure::model("nothing to generate from: the model has no BOS token and no text comes before this point"));
        }
        let room = self.context_length().saturating_sub(prompt.len());
        if room == 0 {
            return Err(ModelError::ContextFull { max: self.context_length() }.into());
        }
        let req = Request {
            prompt: &prompt,
            max_tokens: spec.max_tokens.min(room),
            sampling: &spec.sampling,
            stop: &spec.stop,
            constraint: wire.as_ref(),
            top_alternatives: TOP_ALTERNATIVES,
        };
        let t0 = Instant::now();
        let answer = r.remote.complete_until(&req, &|| sink.cancelled()).map_err(|e| Failure::model(format!("{}: {e}", r.remote.kind.name())));
        let c = match answer {
            Ok(Some(c)) => c,
            other => {
                // The prompt is as it was before healing.
                self.push_text(&healed, Origin::Template);
                return match other {
                    Err(e) => Err(e),
                    _ => Ok(Generated::empty(FinishReason::Cancelled)),
                };
            }
        };
        self.gen_time += t0.elapsed().as_secs_f64();
        if self.usage.time_to_first_token_ms.is_none() {
            self.usage.time_to_first_token_ms = Some(self.started.elapsed().as_secs_f64() * 1e3);
        }
        self.count_remote_work(&c, prompt.len());
        let taken = self.take_completion(r, spec, c, &healed, sink);
        if taken.is_err() {
            self.push_text(&healed, Origin::Template);
        }
        taken
    }

    /// The engine's work in the run's counters: its passes (one per
    /// generated token, one for the prompt it computed) and the prompt
    /// tokens its cache supplied.
    fn count_remote_work(&mut self, c: &Completion, prompt: usize) {
        let generated = c.logprobs.len().max(c.tokens.len()) as u64;
        self.kv.stats.passes += generated + u64::from(c.prompt_computed > 0);
        self.kv.stats.tokens += c.prompt_computed + generated;
        let reused = (prompt as u64).saturating_sub(c.prompt_computed);
        self.usage.reused_tokens += reused;
        self.usage.prefix_cached_tokens += reused;
    }

    /// The value `c` holds, cut at stops, checked and taken into the
    /// sequence. On an error nothing is taken (the caller puts the healed
    /// text back).
    fn take_completion(&mut self, r: &RemoteModel, spec: &GenSpec, c: Completion, healed: &str, sink: &mut dyn Sink) -> LmResult<Generated> {
        let Some(value) = c.text.strip_prefix(healed) else {
            return Err(Failure::constraint(format!(
                "{} returned {:?}, which does not begin with the prompt text {healed:?} it was constrained to continue",
                r.remote.describe(),
                c.text
            )));
        };
        let mut value = value.as_bytes().to_vec();
        let (mut finish, mut stop_text) = match c.finish {
            RemoteFinish::Eos => (FinishReason::Eos, None),
            RemoteFinish::Length => (FinishReason::MaxTokens, None),
            RemoteFinish::Stop(w) => (FinishReason::Stop, Some(w.into_bytes())),
        };
        // Stop regexes are lmt's alone; stop strings are cut again in case
        // the engine let one through.
        let regexes: Vec<&str> = spec.stop_regex.iter().map(String::as_str).collect();
        let mut stops = StopMatcher::new(&spec.stop, &regexes, &self.limits)?;
        if let StopEvent::Stop { value_len, text, .. } = stops.push(&value) {
            value.truncate(value_len);
            finish = FinishReason::Stop;
            stop_text = Some(text);
        }
        let unfinished = self.recheck(r, spec, &value, &mut finish)?;
        // The engine's tokens while they spell the value; what is left is
        // text to tokenize with what follows.
        let tok = self.tok();
        let vocab = &tok.vocab;
        let stop_ids: Vec<u32> = stop_ids(self.tok()).collect();
        // The tokens spell the healed text, then the value.
        let spelled: Vec<u8> = healed.bytes().chain(value.iter().copied()).collect();
        let mut at = 0;
        let mut tokens = Vec::new();
        for (i, &id) in c.tokens.iter().enumerate() {
            let b = vocab.bytes(id);
            if stop_ids.contains(&id) || b.is_empty() || !spelled[at..].starts_with(b) {
                break;
            }
            let top = c.top.get(i).map(Vec::as_slice).unwrap_or_default();
            let top = top.iter().map(|&(t, lp)| Alternative { text: String::from_utf8_lossy(vocab.bytes(t)).into_owned(), logprob: lp }).collect();
            let kind = if at < healed.len() { TokenKind::Healed } else { TokenKind::Sampled };
            let t = self.token(id, Origin::Generated, kind, c.logprobs.get(i).copied(), top);
            sink.token(&t);
            tokens.push(t);
            at += b.len();
        }
        self.seq.extend(tokens.iter().cloned());
        let text = String::from_utf8_lossy(&value).into_owned();
        // Healed text no token covered goes back as prompt text; value
        // bytes no token covered wait to be tokenized with what follows.
        if at < healed.len() {
            self.push_text(&String::from_utf8_lossy(&healed.as_bytes()[at..]), Origin::Template);
        }
        if at < spelled.len() {
            self.push_text(&String::from_utf8_lossy(&spelled[at.max(healed.len())..]), Origin::Generated);
        }
        sink.text(&text);
        self.usage.generated_tokens += tokens.len() as u64;
        self.usage.decisions += c.logprobs.len() as u64;
        let decided: f64 = c.logprobs.iter().map(|&l| f64::from(l)).sum();
        let meta = Meta {
            logprob: tokens.iter().filter_map(|t| t.logprob).map(f64::from).sum(),
            tokens: tokens.iter().map(|t| t.id).collect(),
            finish_reason: Some(finish),
            stop: stop_text.map(|s| String::from_utf8_lossy(&s).into_owned()),
            choices: Vec::new(),
        };
        Ok(Generated { text, tokens, meta, unfinished, error: None, decided })
    }

    /// Checks the engine's value against the constraint with lmt's own
    /// engine: a value that breaks it is an error naming the engine.
    /// Returns whether a limit cut the value short of matching; a value
    /// that matches completely ends for that reason.
    fn recheck(&self, r: &RemoteModel, spec: &GenSpec, value: &[u8], finish: &mut FinishReason) -> LmResult<bool> {
        let Some(constraint) = &spec.constraint else { return Ok(false) };
        let mut m = constraint.matcher(&self.limits);
        let continues = m.feed(value).unwrap_or(false);
        let accepting = continues && m.is_accepting();
        let cut_short = matches!(finish, FinishReason::MaxTokens | FinishReason::Stop);
        if !continues || !(accepting || cut_short) {
            return Err(Failure::constraint(format!(
                "{} returned {:?}, which does not match the value's constraint (lmt checks every value an engine returns)",
                r.remote.describe(),
                String::from_utf8_lossy(value)
            )));
        }
        if m.is_complete() && *finish == FinishReason::Eos {
            *finish = FinishReason::ConstraintComplete;
        }
        Ok(*finish == FinishReason::MaxTokens && !accepting)
    }
}

/// The constraint "`healed`, then what `wire` allows" (anything, without one).
fn healed_wire(healed: &str, wire: Option<&Wire>) -> Wire {
    let lit = regex_syntax::escape(healed);
    match wire {
        None => Wire::Regex(format!("{lit}[\\s\\S]*")),
        Some(Wire::Regex(r)) => Wire::Regex(format!("{lit}(?:{r})")),
        Some(Wire::Choices(c)) => Wire::Choices(c.iter().map(|o| format!("{healed}{o}")).collect()),
        Some(Wire::Gbnf(g)) => Wire::Gbnf(crate::engine::gbnf_after(healed, g)),
        // Not healed (see `generate_remote`).
        Some(Wire::JsonSchema(s)) => Wire::JsonSchema(s.clone()),
    }
}

impl Generated {
    /// A generation that produced nothing.
    fn empty(finish: FinishReason) -> Generated {
        let meta = Meta { finish_reason: Some(finish), ..Meta::default() };
        Generated { text: String::new(), tokens: Vec::new(), meta, unfinished: false, error: None, decided: 0.0 }
    }
}
