//! The generation loop: masks from the constraint (and healing's prefix),
//! biases, sampling, forced bytes, stops with their rewind, and the value
//! with its metadata.

use super::*;

/// What a generation needs besides the model.
pub struct GenSpec {
    /// A hard constraint.
    pub constraint: Option<Constraint>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stop regexes.
    pub stop_regex: Vec<String>,
    /// Soft biases.
    pub bias: Option<Bias>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Most tokens.
    pub max_tokens: usize,
    /// Token healing.
    pub heal: bool,
    /// Keep a constrained value that a limit cut short instead of failing.
    pub partial: bool,
}

/// A finished generation.
pub struct Generated {
    /// The value.
    pub text: String,
    /// Its tokens (those that contributed bytes to the value).
    pub tokens: Vec<Token>,
    /// Its metadata.
    pub meta: Meta,
    /// True when `max_tokens` ran out before the value matched its
    /// constraint (a stop's cut is asked for and does not count).
    pub unfinished: bool,
    /// What stopped the generation mid-way, if anything failed; the value
    /// holds what was generated before.
    pub error: Option<Failure>,
}

/// Streaming callbacks for generated text and tokens.
pub trait Sink {
    /// Generated text that is final (no stop can take it back).
    fn text(&mut self, text: &str);
    /// A token was sampled or forced.
    fn token(&mut self, token: &Token);
    /// True when the user asked to stop.
    fn cancelled(&self) -> bool;
}

impl Lm<'_> {
    /// Generates one value.
    pub fn generate(&mut self, spec: &GenSpec, sink: &mut dyn Sink) -> LmResult<Generated> {
        let vocab = self.model.tokenizer.vocab.clone();
        self.decide()?;
        // Token healing: prompt bytes the first token must start with (not part of the value).
        let mut heal: Vec<u8> = if spec.heal { self.heal_back() } else { Vec::new() };
        let healed = heal.clone();
        // Forced value bytes held back for the next token to start with.
        let mut lead: Vec<u8> = Vec::new();
        let mut matcher = spec.constraint.as_ref().map(|c| c.matcher(&self.limits));
        let regexes: Vec<&str> = spec.stop_regex.iter().map(String::as_str).collect();
        let mut stops = StopMatcher::new(&spec.stop, &regexes, &self.limits)?;
        let mut bias_state = spec.bias.as_ref().map(Bias::start);
        let mut sampler = Sampler::new(spec.sampling.clone())?;
        let stop_ids: Vec<u32> = stop_ids(self.model).collect();
        let mut mask = TokenMask::new(self.free_mask.len());
        let mut value: Vec<u8> = Vec::new();
        // This generation's tokens, each with where its bytes start in `value`.
        let mut toks: Vec<(Token, i64)> = Vec::new();
        let gen_start = self.seq.len();
        let mut shown = 0usize;
        let mut finish = FinishReason::MaxTokens;
        let mut stop_text = None;
        let t0 = Instant::now();
        let mut steps = 0;
        // A failure mid-way (the context is full, no token is allowed) keeps
        // what was generated: it is the value, and the error follows it.
        let failed: Option<Failure> = 'run: {
            macro_rules! attempt {
                ($e:expr) => {
                    match $e {
                        Ok(v) => v,
                        Err(e) => break 'run Some(Failure::from(e)),
                    }
                };
            }
            'gen: while steps < spec.max_tokens {
                if sink.cancelled() {
                    finish = FinishReason::Cancelled;
                    break;
                }
                // Fast-forward what the constraint forces, all but its last token.
                if let (Some(m), true) = (matcher.as_mut(), heal.is_empty() && lead.is_empty()) {
                    let forced = attempt!(m.forced_bytes(FORCED_LIMIT));
                    let forced = valid_utf8_prefix(&forced).to_string();
                    if !forced.is_empty() {
                        let ids = attempt!(self.model.tokenizer.encoder.encode(&forced).map_err(Failure::model));
                        let here = m.position();
                        let complete = attempt!(m.feed(forced.as_bytes())) && m.is_complete();
                        m.rewind(here);
                        // A forced/free boundary tokenized alone is rarely what the
                        // model would write: the model picks how the last forced
                        // token continues, unless nothing can follow.
                        let keep = if complete { ids.len() } else { ids.len() - 1 };
                        let mut at = 0;
                        for &id in &ids[..keep] {
                            let b = vocab.bytes(id);
                            attempt!(m.feed(b));
                            let t = self.token(id, Origin::Generated, TokenKind::Forced, None, Vec::new());
                            sink.token(&t);
                            toks.push((t.clone(), value.len() as i64));
                            value.extend_from_slice(b);
                            at += b.len();
                            self.seq.push(t);
                            self.usage.forced_tokens += 1;
                            steps += 1;
                            if let StopEvent::Stop { value_len, text, .. } = stops.push(b) {
                                stop_text = Some(text);
                                finish = FinishReason::Stop;
                                self.cut_at_stop(&mut value, &mut toks, gen_start, value_len, &healed);
                                break 'gen;
                            }
                        }
                        lead = forced.as_bytes()[at..].to_vec();
                        if complete {
                            finish = FinishReason::ConstraintComplete;
                            break;
                        }
                        if steps >= spec.max_tokens {
                            break;
                        }
                    }
                }
                let logits = attempt!(self.feed());
                let tm = Instant::now();
                attempt!(self.next_mask(matcher.as_mut(), &heal, &lead, &mut mask));
                if heal.is_empty() && lead.is_empty() && matcher.as_ref().is_none_or(|m| m.is_accepting()) {
                    stop_ids.iter().for_each(|&t| mask.set(t));
                }
                self.usage.mask_ms += tm.elapsed().as_secs_f64() * 1e3;
                let mut bias = Vec::new();
                if let (Some(b), Some(st)) = (&spec.bias, &bias_state) {
                    b.apply(&vocab, st, |t, off| bias.push((t, off)));
                }
                let s = attempt!(sampler.sample(&logits, Some(&mask), &bias).map_err(|e| match matcher {
                    Some(_) => Failure::constraint(format!("the constraint allows no token the model can emit here ({e})")),
                    None => Failure::from(e),
                }));
                if self.usage.time_to_first_token_ms.is_none() {
                    self.usage.time_to_first_token_ms = Some(self.started.elapsed().as_secs_f64() * 1e3);
                }
                steps += 1;
                if stop_ids.contains(&s.token) {
                    finish = FinishReason::Eos;
                    break;
                }
                let bytes = vocab.bytes(s.token);
                // The value gets the token's bytes after the healed prompt bytes.
                let new = &bytes[heal.len().min(bytes.len())..];
                let kind = if heal.is_empty() { TokenKind::Sampled } else { TokenKind::Healed };
                let top = s
                    .top
                    .iter()
                    .map(|&(id, lp)| Alternative { text: String::from_utf8_lossy(vocab.bytes(id)).into_owned(), logprob: lp })
                    .collect();
                let t = self.token(s.token, Origin::Generated, kind, Some(s.logprob), top);
                sink.token(&t);
                toks.push((t.clone(), value.len() as i64 - heal.len() as i64));
                self.usage.generated_tokens += 1;
                heal.clear();
                lead.clear();
                // (A healed token equal to the prompt bytes adds nothing to the value.)
                if let (Some(m), false) = (matcher.as_mut(), new.is_empty()) {
                    if !attempt!(m.feed(new)) {
                        break 'run Some(Failure::internal(format!(
                            "the sampled token {:?} (after {:?}) does not continue the constraint",
                            String::from_utf8_lossy(bytes),
                            String::from_utf8_lossy(&healed)
                        )));
                    }
                }
                if let (Some(b), Some(st)) = (&spec.bias, bias_state.as_mut()) {
                    b.advance(st, bytes);
                }
                value.extend_from_slice(new);
                match stops.push(new) {
                    StopEvent::Stop { value_len, text, .. } => {
                        stop_text = Some(text);
                        finish = FinishReason::Stop;
                        self.cut_at_stop(&mut value, &mut toks, gen_start, value_len, &healed);
                        break;
                    }
                    StopEvent::Continue { safe } => {
                        self.seq.push(t);
                        let upto = utf8_floor(&value, safe);
                        if upto > shown {
                            sink.text(&String::from_utf8_lossy(&value[shown..upto]));
                            shown = upto;
                        }
                    }
                }
                if matcher.as_ref().is_some_and(|m| m.is_complete()) {
                    finish = FinishReason::ConstraintComplete;
                    break;
                }
            }
            None
        };
        // Healing backed a prompt token out and nothing replaced it: it goes back.
        if !heal.is_empty() {
            self.push_text(&String::from_utf8_lossy(&heal), Origin::Template);
        }
        // Forced bytes the model never got to continue are still the value's.
        if !lead.is_empty() {
            self.push_text(&String::from_utf8_lossy(&lead), Origin::Generated);
            value.extend_from_slice(&lead);
        }
        self.gen_time += t0.elapsed().as_secs_f64();
        if value.len() > shown {
            sink.text(&String::from_utf8_lossy(&value[shown..]));
        }
        if failed.is_some() {
            finish = FinishReason::Error;
        }
        // Checked on the value as kept (forced bytes held back included),
        // and only where a limit cut it.
        let unfinished = finish == FinishReason::MaxTokens
            && spec.constraint.as_ref().is_some_and(|c| {
                let mut m = c.matcher(&self.limits);
                !(m.feed(&value).unwrap_or(false) && m.is_accepting())
            });
        let tokens: Vec<Token> = toks.into_iter().map(|(t, _)| t).collect();
        let meta = Meta {
            logprob: tokens.iter().filter_map(|t| t.logprob).map(f64::from).sum(),
            tokens: tokens.iter().map(|t| t.id).collect(),
            finish_reason: Some(finish),
            stop: stop_text.map(|s| String::from_utf8_lossy(&s).into_owned()),
            choices: Vec::new(),
        };
        Ok(Generated { text: String::from_utf8_lossy(&value).into_owned(), tokens, meta, unfinished, error: failed })
    }

    /// The tokens allowed next: the constraint's (or any generable token),
    /// restricted to those starting with the healed or forced bytes.
    fn next_mask(&self, matcher: Option<&mut crate::engine::Matcher>, heal: &[u8], lead: &[u8], mask: &mut TokenMask) -> LmResult<()> {
        let vocab = &self.model.tokenizer.vocab;
        match matcher {
            Some(m) if !heal.is_empty() => return m.mask_after_prefix(vocab, heal, mask).map_err(Failure::from),
            Some(m) => m.mask(vocab, mask)?,
            None => mask.copy_prefix(&self.free_mask),
        }
        let start = if heal.is_empty() { lead } else { heal };
        if !start.is_empty() {
            let allowed = mask.clone();
            mask.clear();
            if let Some(node) = vocab.trie().find(start) {
                vocab.trie().subtree_tokens(node).filter(|&t| allowed.get(t)).for_each(|t| mask.set(t));
            }
        }
        Ok(())
    }

    /// After a stop at `value_len`: keeps the value's first `value_len`
    /// bytes, takes tokens past the last whole kept one out of the sequence
    /// and queues their kept bytes as text, so the state holds exactly the
    /// kept text.
    fn cut_at_stop(&mut self, value: &mut Vec<u8>, toks: &mut Vec<(Token, i64)>, gen_start: usize, value_len: usize, healed: &[u8]) {
        let vocab = self.model.tokenizer.vocab.clone();
        let ends: Vec<i64> = toks.iter().map(|(t, s)| s + vocab.bytes(t.id).len() as i64).collect();
        // Tokens in the sequence from this generation (the last sampled one was never pushed).
        let in_seq = self.seq.len() - gen_start;
        let keep = ends.iter().take(in_seq).take_while(|&&e| e <= value_len as i64).count();
        let kept_end = if keep == 0 { 0 } else { ends[keep - 1].max(0) as usize };
        let _ = self.truncate(gen_start + keep);
        if keep == 0 && toks.first().is_some_and(|(t, _)| t.kind == TokenKind::Healed) {
            self.push_text(&String::from_utf8_lossy(healed), Origin::Template);
        }
        self.push_text(&String::from_utf8_lossy(&value[kept_end..value_len]), Origin::Generated);
        value.truncate(value_len);
        toks.retain(|(_, s)| *s < value_len as i64);
    }
}

/// End-of-sequence and end-of-turn ids: generation ends at them.
pub(super) fn stop_ids(model: &Model) -> impl Iterator<Item = u32> + '_ {
    let t = &model.tokenizer;
    t.eos.iter().chain(t.eot.iter()).copied()
}
