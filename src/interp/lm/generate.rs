//! The generation loop: masks from the constraint (and healing's prefix),
//! biases, sampling, forced bytes, stops with their rewind, and the value
//! with its metadata.

use super::*;
use crate::model::remote::Wire;

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
    /// The constraint as a remote engine takes it (remote runs only).
    pub wire: Option<Wire>,
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
    /// Log-probs of every token sampled (the one that ended the value and
    /// those a stop cut out included): the generation's part of the run's
    /// score.
    pub decided: f64,
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

/// One generation in progress: the constraint's matcher, stops, bias and
/// sampler states, the value so far and its tokens.
struct Gen<'s> {
    spec: &'s GenSpec,
    /// Prompt bytes the next token must start with (healing; not the value's).
    heal: Vec<u8>,
    /// What healing backed out, for a stop that cuts before any token.
    healed: Vec<u8>,
    /// Forced value bytes held back for the next token to start with.
    lead: Vec<u8>,
    matcher: Option<crate::engine::Matcher>,
    stops: StopMatcher,
    bias_state: Option<crate::engine::BiasState>,
    sampler: Sampler,
    stop_ids: Vec<u32>,
    mask: TokenMask,
    value: Vec<u8>,
    /// This generation's tokens, each with where its bytes start in `value`.
    toks: Vec<(Token, i64)>,
    /// Where this generation's tokens start in the sequence.
    gen_start: usize,
    /// Bytes of `value` already streamed.
    shown: usize,
    finish: FinishReason,
    stop_text: Option<Vec<u8>>,
    steps: usize,
    /// Log-probs of every token sampled, the ending one and those a stop
    /// cut out included: what the run's score counts.
    decided: f64,
}

/// Whether the loop goes on after a step.
enum Next {
    Continue,
    Done,
}

impl Lm<'_> {
    /// Generates one value. A failure part way (the context is full, no
    /// token is allowed) keeps what was generated: it is the value, and the
    /// error is in [`Generated::error`].
    pub fn generate(&mut self, spec: &GenSpec, sink: &mut dyn Sink) -> LmResult<Generated> {
        self.decide()?;
        if let Some(r) = self.remote() {
            return self.generate_remote(r, spec, sink);
        }
        let heal: Vec<u8> = if spec.heal { self.heal_back() } else { Vec::new() };
        let regexes: Vec<&str> = spec.stop_regex.iter().map(String::as_str).collect();
        let mut g = Gen {
            spec,
            healed: heal.clone(),
            heal,
            lead: Vec::new(),
            matcher: spec.constraint.as_ref().map(|c| c.matcher(&self.limits)),
            stops: StopMatcher::new(&spec.stop, &regexes, &self.limits)?,
            bias_state: spec.bias.as_ref().map(Bias::start),
            sampler: Sampler::new(spec.sampling.clone())?,
            stop_ids: stop_ids(self.tok()).collect(),
            mask: TokenMask::new(self.free_mask.len()),
            value: Vec::new(),
            toks: Vec::new(),
            gen_start: self.seq.len(),
            shown: 0,
            finish: FinishReason::MaxTokens,
            stop_text: None,
            steps: 0,
            decided: 0.0,
        };
        let t0 = Instant::now();
        let failed = self.run_steps(&mut g, sink).err();
        self.gen_time += t0.elapsed().as_secs_f64();
        Ok(self.finish_gen(g, failed, sink))
    }

    /// Forced tokens, then one sampled token, until a limit, a stop, the
    /// constraint's end, EOS or Ctrl-C.
    fn run_steps(&mut self, g: &mut Gen<'_>, sink: &mut dyn Sink) -> LmResult<()> {
        while g.steps < g.spec.max_tokens {
            if sink.cancelled() {
                g.finish = FinishReason::Cancelled;
                return Ok(());
            }
            if let Next::Done = self.forced_step(g, sink)? {
                return Ok(());
            }
            if let Next::Done = self.sampled_step(g, sink)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Fast-forwards what the constraint forces, all but its last token: a
    /// forced/free boundary tokenized alone is rarely what the model would
    /// write, so the model picks how the last forced token continues (unless
    /// nothing can follow).
    fn forced_step(&mut self, g: &mut Gen<'_>, sink: &mut dyn Sink) -> LmResult<Next> {
        let Some(m) = g.matcher.as_mut().filter(|_| g.heal.is_empty() && g.lead.is_empty()) else { return Ok(Next::Continue) };
        let forced = m.forced_bytes(FORCED_LIMIT)?;
        let forced = valid_utf8_prefix(&forced).to_string();
        if forced.is_empty() {
            return Ok(Next::Continue);
        }
        let ids = self.tok().encoder.encode(&forced).map_err(Failure::model)?;
        let here = m.position();
        let complete = m.feed(forced.as_bytes())? && m.is_complete();
        m.rewind(here);
        let keep = if complete { ids.len() } else { ids.len() - 1 };
        let tok = self.tok();
        let vocab = &tok.vocab;
        let mut at = 0;
        for &id in &ids[..keep] {
            let b = vocab.bytes(id);
            g.matcher.as_mut().expect("checked above").feed(b)?;
            let t = self.token(id, Origin::Generated, TokenKind::Forced, None, Vec::new());
            sink.token(&t);
            g.toks.push((t.clone(), g.value.len() as i64));
            g.value.extend_from_slice(b);
            at += b.len();
            self.seq.push(t);
            self.usage.forced_tokens += 1;
            g.steps += 1;
            if let StopEvent::Stop { value_len, text, .. } = g.stops.push(b) {
                self.stop_at(g, value_len, text);
                return Ok(Next::Done);
            }
        }
        g.lead = forced.as_bytes()[at..].to_vec();
        if complete {
            g.finish = FinishReason::ConstraintComplete;
            return Ok(Next::Done);
        }
        Ok(if g.steps >= g.spec.max_tokens { Next::Done } else { Next::Continue })
    }

    /// Masks, biases and samples one token, and takes it into the value
    /// (streaming what no stop can take back).
    fn sampled_step(&mut self, g: &mut Gen<'_>, sink: &mut dyn Sink) -> LmResult<Next> {
        let tok = self.tok();
        let vocab = &tok.vocab;
        let Some(s) = self.next_token(g)? else {
            g.finish = FinishReason::Cancelled;
            return Ok(Next::Done);
        };
        g.decided += f64::from(s.logprob);
        self.usage.decisions += 1;
        if self.usage.time_to_first_token_ms.is_none() {
            self.usage.time_to_first_token_ms = Some(self.started.elapsed().as_secs_f64() * 1e3);
        }
        g.steps += 1;
        if g.stop_ids.contains(&s.token) {
            g.finish = FinishReason::Eos;
            return Ok(Next::Done);
        }
        let bytes = vocab.bytes(s.token);
        // The value gets the token's bytes after the healed prompt bytes.
        let new = &bytes[g.heal.len().min(bytes.len())..];
        let kind = if g.heal.is_empty() { TokenKind::Sampled } else { TokenKind::Healed };
        let top = s
            .top
            .iter()
            .map(|&(id, lp)| Alternative { text: String::from_utf8_lossy(vocab.bytes(id)).into_owned(), logprob: lp })
            .collect();
        let t = self.token(s.token, Origin::Generated, kind, Some(s.logprob), top);
        sink.token(&t);
        g.toks.push((t.clone(), g.value.len() as i64 - g.heal.len() as i64));
        self.usage.generated_tokens += 1;
        g.heal.clear();
        g.lead.clear();
        // (A healed token equal to the prompt bytes adds nothing to the value.)
        if let (Some(m), false) = (g.matcher.as_mut(), new.is_empty()) {
            if !m.feed(new)? {
                return Err(Failure::internal(format!(
                    "the sampled token {:?} (after {:?}) does not continue the constraint",
                    String::from_utf8_lossy(bytes),
                    String::from_utf8_lossy(&g.healed)
                )));
            }
        }
        if let (Some(b), Some(st)) = (&g.spec.bias, g.bias_state.as_mut()) {
            b.advance(st, bytes);
        }
        g.value.extend_from_slice(new);
        match g.stops.push(new) {
            StopEvent::Stop { value_len, text, .. } => {
                self.stop_at(g, value_len, text);
                return Ok(Next::Done);
            }
            StopEvent::Continue { safe } => {
                self.seq.push(t);
                let upto = utf8_floor(&g.value, safe);
                if upto > g.shown {
                    sink.text(&String::from_utf8_lossy(&g.value[g.shown..upto]));
                    g.shown = upto;
                }
            }
        }
        if g.matcher.as_ref().is_some_and(|m| m.is_complete()) {
            g.finish = FinishReason::ConstraintComplete;
            return Ok(Next::Done);
        }
        Ok(Next::Continue)
    }

    /// The next token: replayed (no forward pass), or from the logits under
    /// the mask and biases, by the decider or the sampler. `None`: the
    /// decider stopped the run.
    fn next_token(&mut self, g: &mut Gen<'_>) -> LmResult<Option<Sampled>> {
        match self.decider.map(|d| d.replayed()) {
            Some(Some(Decision::Token(s))) => return Ok(Some(s)),
            Some(Some(Decision::Option(_))) => return Err(out_of_step()),
            _ => {}
        }
        let logits = self.feed()?;
        let tm = Instant::now();
        self.next_mask(g.matcher.as_mut(), &g.heal, &g.lead, &mut g.mask)?;
        if g.heal.is_empty() && g.lead.is_empty() && g.matcher.as_ref().is_none_or(|m| m.is_accepting()) {
            g.stop_ids.iter().for_each(|&t| g.mask.set(t));
        }
        self.usage.mask_ms += tm.elapsed().as_secs_f64() * 1e3;
        if let Some(d) = self.decider {
            if g.mask.ones().next().is_none() {
                return Err(Failure::constraint("the constraint allows no token the model can emit here"));
            }
            return Ok(d.token(&self.kv, &logits, &g.mask));
        }
        let mut bias = Vec::new();
        if let (Some(b), Some(st)) = (&g.spec.bias, &g.bias_state) {
            b.apply(&self.tok().vocab, st, |t, off| bias.push((t, off)));
        }
        let constrained = g.matcher.is_some();
        let s = g.sampler.sample(&logits, Some(&g.mask), &bias).map_err(|e| match constrained {
            true => Failure::constraint(format!("the constraint allows no token the model can emit here ({e})")),
            false => Failure::from(e),
        })?;
        Ok(Some(s))
    }

    /// A stop matched: the value ends where the stop starts.
    fn stop_at(&mut self, g: &mut Gen<'_>, value_len: usize, text: Vec<u8>) {
        g.stop_text = Some(text);
        g.finish = FinishReason::Stop;
        self.cut_at_stop(&mut g.value, &mut g.toks, g.gen_start, value_len, &g.healed);
    }

    /// What is left over goes back (healed bytes) or into the value (forced
    /// bytes held back); the rest of the value is streamed; the value is
    /// judged where `max_tokens` cut it.
    fn finish_gen(&mut self, mut g: Gen<'_>, failed: Option<Failure>, sink: &mut dyn Sink) -> Generated {
        // Healing backed a prompt token out and nothing replaced it: it goes back.
        if !g.heal.is_empty() {
            self.push_text(&String::from_utf8_lossy(&g.heal), Origin::Template);
        }
        // Forced bytes the model never got to continue are still the value's.
        if !g.lead.is_empty() {
            self.push_text(&String::from_utf8_lossy(&g.lead), Origin::Generated);
            g.value.extend_from_slice(&g.lead);
        }
        if g.value.len() > g.shown {
            sink.text(&String::from_utf8_lossy(&g.value[g.shown..]));
        }
        if failed.is_some() {
            g.finish = FinishReason::Error;
        }
        // Checked on the value as kept (forced bytes held back included),
        // and only where a limit cut it.
        let unfinished = g.finish == FinishReason::MaxTokens
            && g.spec.constraint.as_ref().is_some_and(|c| {
                let mut m = c.matcher(&self.limits);
                !(m.feed(&g.value).unwrap_or(false) && m.is_accepting())
            });
        let tokens: Vec<Token> = g.toks.into_iter().map(|(t, _)| t).collect();
        let meta = Meta {
            logprob: tokens.iter().filter_map(|t| t.logprob).map(f64::from).sum(),
            tokens: tokens.iter().map(|t| t.id).collect(),
            finish_reason: Some(g.finish),
            stop: g.stop_text.map(|s| String::from_utf8_lossy(&s).into_owned()),
            choices: Vec::new(),
        };
        Generated { text: String::from_utf8_lossy(&g.value).into_owned(), tokens, meta, unfinished, error: failed, decided: g.decided }
    }

    /// The tokens allowed next: the constraint's (or any generable token),
    /// restricted to those starting with the healed or forced bytes.
    fn next_mask(&self, matcher: Option<&mut crate::engine::Matcher>, heal: &[u8], lead: &[u8], mask: &mut TokenMask) -> LmResult<()> {
        let vocab = &self.tok().vocab;
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
        let tok = self.tok();
        let vocab = &tok.vocab;
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
pub(super) fn stop_ids(t: &ModelTokenizer) -> impl Iterator<Item = u32> + '_ {
    t.eos.iter().chain(t.eot.iter()).copied()
}
