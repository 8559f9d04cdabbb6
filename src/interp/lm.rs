//! The one model state of a run: the decided token sequence, the KV cache
//! holding a prefix of it, and the text not yet tokenized. Everything that
//! touches the model or the engine goes through here.
//!
//! Text is tokenized lazily: emitted text waits as pending pieces until
//! something needs logits (a `gen`, a `select`), then all of it is decided
//! and fed in one forward pass. Deciding re-tokenizes the last one or two
//! tokens together with the new text, and backs them out when canonical
//! tokenization differs, so token boundaries are what the tokenizer would
//! give the whole text. Nothing else already in the cache is fed again.

use std::time::Instant;

use crate::chat::{ChatTemplate, Message, Rendered};
use crate::engine::{Bias, Constraint, Limits, StopEvent, StopMatcher, TokenMask};
use crate::state::{Choice, FinishReason, Meta};
use crate::model::{log_softmax, KvState, Model, ModelError, Sampler, SamplingParams};
use crate::state::{Alternative, Origin, Token, TokenKind, Usage};
use crate::state::{Failure, RunErrorKind};

/// Most tokens of an existing sequence re-tokenized with new text.
const BACK_OFF: usize = 2;
/// Most bytes a constraint may force at once.
const FORCED_LIMIT: usize = 256;
/// Pending text outside a turn is decided once it is this large.
const SETTLE_BYTES: usize = 32 << 10;
/// Alternatives recorded per sampled token (for the HTML report).
pub const TOP_ALTERNATIVES: usize = 5;

/// Text waiting to be tokenized.
#[derive(Debug, Clone)]
enum Piece {
    /// Plain text: never a special token.
    Text(String, Origin),
    /// Chat-template text: its special tokens are parsed.
    Marker(String),
}

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

/// The model side of a run.
pub struct Lm<'m> {
    model: &'m Model,
    kv: KvState,
    /// Decided tokens; `kv` holds a prefix of them.
    seq: Vec<Token>,
    pending: Vec<Piece>,
    /// Bytes pushed to `pending` since it was last decided (at least its size).
    pending_bytes: usize,
    /// The longest token's bytes: bounds how few tokens pending text can make.
    max_token_bytes: usize,
    /// Logits after the last token of `kv`, when `kv` holds all of `seq`.
    logits: Option<Vec<f32>>,
    free_mask: TokenMask,
    template: Option<ChatTemplate>,
    /// What the chat template has written so far (contents included).
    transcript: String,
    /// Finished chat turns.
    pub messages: Vec<Message>,
    /// Where the open turn's content starts in `pending`, while none of it is decided.
    turn_content_at: Option<usize>,
    limits: Limits,
    /// Counters.
    pub usage: Usage,
    started: Instant,
    gen_time: f64,
}

/// A place to go back to (`hidden`).
#[derive(Debug, Clone, Copy)]
pub struct Mark(usize);

/// A point between REPL entries to return to ([`Lm::restore`]).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The token ids then.
    ids: Vec<u32>,
    /// The last tokens then, in full (what later text may re-tokenize).
    tail: Vec<Token>,
    transcript: String,
    messages: usize,
}

/// Tokens a checkpoint keeps in full: later entries re-tokenize at most a
/// few at the boundary; older ones are rebuilt from their ids.
const CHECKPOINT_TAIL: usize = 16;

/// An error of the model side: a message.
pub type LmResult<T> = Result<T, Failure>;

impl<'m> Lm<'m> {
    /// A fresh state on `model`.
    pub fn new(model: &'m Model, limits: Limits) -> LmResult<Lm<'m>> {
        let tok = &model.tokenizer;
        let dim = model.decoder.config.vocab_size.max(tok.vocab.len());
        let mut free_mask = TokenMask::new(dim);
        for id in 0..tok.vocab.len() as u32 {
            if tok.vocab.is_generable(id) {
                free_mask.set(id);
            }
        }
        stop_ids(model).for_each(|id| free_mask.set(id));
        let template = match &tok.chat_template {
            Some(src) => {
                let name = |id: Option<u32>| id.map(|i| String::from_utf8_lossy(tok.vocab.bytes(i)).into_owned()).unwrap_or_default();
                let t = ChatTemplate::new(&src.text, &name(tok.bos_token), &name(tok.eos.first().copied()))
                    .map_err(|e| Failure::model(format!("the chat template from {}: {e}", src.origin)))?;
                Some(t)
            }
            None => None,
        };
        Ok(Lm {
            model,
            kv: model.decoder.new_state(),
            seq: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            max_token_bytes: (0..model.tokenizer.vocab.len() as u32).map(|t| model.tokenizer.vocab.bytes(t).len()).max().unwrap_or(1),
            logits: None,
            free_mask,
            template,
            transcript: String::new(),
            messages: Vec::new(),
            turn_content_at: None,
            limits,
            usage: Usage::default(),
            started: Instant::now(),
            gen_time: 0.0,
        })
    }

    /// Queues plain text (it can never become a special token).
    pub fn push_text(&mut self, text: &str, origin: Origin) {
        if text.is_empty() {
            return;
        }
        self.pending_bytes += text.len();
        // Same-origin neighbours are one piece: a loop's thousands of
        // small pieces cost what one string does.
        match self.pending.last_mut() {
            Some(Piece::Text(t, o)) if *o == origin => t.push_str(text),
            _ => self.pending.push(Piece::Text(text.to_string(), origin)),
        }
    }

    /// Keeps pending text bounded while a template emits text: outside a
    /// chat turn it is decided once it passes [`SETTLE_BYTES`]; and text
    /// that cannot fit in the model's context is an error as soon as that
    /// is certain, not after it has filled memory.
    pub fn settle(&mut self) -> LmResult<()> {
        if self.pending_bytes < SETTLE_BYTES {
            return Ok(());
        }
        if self.turn_content_at.is_none() {
            self.decide()?;
        }
        let max = self.model.decoder.config.max_position_embeddings;
        // No token covers more bytes than the longest one in the vocabulary.
        let least_tokens = self.pending_bytes / self.max_token_bytes.max(1);
        if self.seq.len() + least_tokens > max {
            return Err(ModelError::ContextFull { max }.into());
        }
        Ok(())
    }

    /// Drops the white-space-only template text at the end of what is
    /// pending when it is exactly `text` (none of it decided yet).
    pub fn drop_pending_whitespace(&mut self, text: &str) -> bool {
        let keep =
            self.pending.iter().rposition(|p| !matches!(p, Piece::Text(t, Origin::Template) if t.trim().is_empty())).map_or(0, |i| i + 1);
        let tail: String = self.pending[keep..].iter().map(|p| if let Piece::Text(t, _) = p { t.as_str() } else { "" }).collect();
        if tail != text {
            return false;
        }
        self.pending.truncate(keep);
        true
    }

    /// Opens a chat turn: queues the template's text up to the content.
    pub fn role_begin(&mut self, role: &str) -> LmResult<()> {
        let r = self.render_with(&[message(role, "")])?;
        let at = r.content_spans.last().map(|s| s.0).ok_or_else(|| Failure::model("the chat template does not write the message's content"))?;
        self.pending.push(Piece::Marker(r.text[self.transcript.len()..at].to_string()));
        self.transcript = r.text[..at].to_string();
        self.turn_content_at = Some(self.pending.len());
        Ok(())
    }

    /// Closes a chat turn whose content was `content`: queues the
    /// template's text after it, up to where a next turn would begin (text
    /// a template writes only at the very end, such as Phi-3's EOS, is left
    /// for [`Lm::close_conversation`]).
    pub fn role_end(&mut self, role: &str, content: &str) -> LmResult<()> {
        let r = self.render_with(&[message(role, content)])?;
        let end = r.content_spans.last().map(|s| s.1).ok_or_else(|| Failure::model("the chat template does not write the message's content"))?;
        let mut suffix = r.text[end..].to_string();
        // A template may transform content (Llama 3 trims it): while the
        // turn's text is still pending, it is fed as the template wrote it.
        let start = r.content_spans.last().map_or(end, |s| s.0);
        if let Some(i) = self.turn_content_at.take().filter(|&i| i <= self.pending.len()) {
            let written: Option<String> =
                self.pending[i..].iter().map(|p| if let Piece::Text(t, _) = p { Some(t.as_str()) } else { None }).collect();
            if written.as_deref() == Some(content) && r.text[start..end] != *content {
                let origin = match self.pending.get(i) {
                    Some(Piece::Text(_, o)) => *o,
                    _ => Origin::Template,
                };
                self.pending.truncate(i);
                self.push_text(&r.text[start..end], origin);
            }
        }
        let probe = if role == "user" { "assistant" } else { "user" };
        if let Some(next) =
            self.render_with(&[message(role, content), message(probe, "x")]).ok().filter(|n| n.text.starts_with(&r.text[..end]))
        {
            let shared = suffix.chars().zip(next.text[end..].chars()).take_while(|(a, b)| a == b).map(|(a, _)| a.len_utf8()).sum();
            suffix.truncate(shared);
        }
        self.transcript = format!("{}{suffix}", &r.text[..end]);
        self.pending.push(Piece::Marker(suffix));
        self.messages.push(message(role, content));
        Ok(())
    }

    /// Queues what the chat template writes after the last turn of a
    /// conversation (Phi-3 ends it with EOS), so the sequence is the
    /// template's whole rendering.
    pub fn close_conversation(&mut self) -> LmResult<()> {
        if let Some(t) = &self.template {
            if !self.messages.is_empty() {
                let r = t.render(&self.messages, false).map_err(Failure::model)?;
                if let Some(tail) = r.text.strip_prefix(&self.transcript).filter(|t| !t.is_empty()) {
                    self.pending.push(Piece::Marker(tail.to_string()));
                    self.transcript = r.text;
                }
            }
        }
        Ok(())
    }

    /// The conversation so far with `more` messages after it; it must
    /// extend what the template wrote before.
    fn render_with(&self, more: &[Message]) -> LmResult<Rendered> {
        let t = self.template.as_ref().ok_or_else(|| {
            Failure::model(
                "this model has no chat template (none in its GGUF metadata, chat_template.jinja or tokenizer_config.json), \
                 so role blocks cannot be rendered: pass one with --chat-template FILE",
            )
        })?;
        let msgs: Vec<Message> = self.messages.iter().chain(more).cloned().collect();
        let r = t.render(&msgs, false).map_err(Failure::model)?;
        if !r.text.starts_with(&self.transcript) {
            return Err(Failure::new(
                RunErrorKind::Model,
                "the chat template renders earlier turns differently once a new turn is added; lmt needs a template that only appends",
            ));
        }
        Ok(r)
    }

    /// Decides pending text and returns a mark to [`Lm::rewind`] to.
    pub fn mark(&mut self) -> LmResult<Mark> {
        self.decide()?;
        Ok(Mark(self.seq.len()))
    }

    /// Forgets everything after `m` (text and cache), as if never written.
    pub fn rewind(&mut self, m: Mark) -> LmResult<()> {
        self.pending.clear();
        self.pending_bytes = 0;
        self.truncate(m.0)
    }

    /// Decides pending text and records the whole state to [`Lm::restore`] later.
    pub fn checkpoint(&mut self) -> LmResult<Checkpoint> {
        self.decide()?;
        let tail = self.seq[self.seq.len().saturating_sub(CHECKPOINT_TAIL)..].to_vec();
        Ok(Checkpoint {
            ids: self.seq.iter().map(|t| t.id).collect(),
            tail,
            transcript: self.transcript.clone(),
            messages: self.messages.len(),
        })
    }

    /// Returns to `cp`: the cache keeps the longest prefix the sequence
    /// shares with it (later text may have re-tokenized its last tokens) and
    /// feeds the rest again, so the cache holds exactly the old sequence.
    pub fn restore(&mut self, cp: &Checkpoint) -> LmResult<()> {
        self.pending.clear();
        self.pending_bytes = 0;
        self.turn_content_at = None;
        let common = self.seq.iter().zip(&cp.ids).take_while(|(t, &id)| t.id == id).count();
        self.truncate(common)?;
        let tail_from = cp.ids.len() - cp.tail.len();
        for (i, &id) in cp.ids.iter().enumerate().skip(common) {
            let t = match i.checked_sub(tail_from) {
                Some(j) => cp.tail[j].clone(),
                None => self.token(id, Origin::Template, TokenKind::Prompt, None, Vec::new()),
            };
            self.seq.push(t);
        }
        self.transcript = cp.transcript.clone();
        self.messages.truncate(cp.messages);
        if self.kv.len() < self.seq.len() {
            self.feed()?;
        }
        Ok(())
    }

    /// The decided token sequence.
    pub fn tokens(&self) -> &[Token] {
        &self.seq
    }

    /// Decides everything pending and, with `feed`, feeds it (at the end of
    /// a run, so the record and the cache agree; a later generation feeds
    /// what is left).
    pub fn finish(&mut self, feed: bool) -> LmResult<()> {
        self.decide()?;
        if feed && self.kv.len() < self.seq.len() {
            self.feed()?;
        }
        self.sync_usage();
        Ok(())
    }

    /// The usage so far, with pending text decided (so its tokens count).
    pub fn usage_now(&mut self) -> LmResult<Usage> {
        self.decide()?;
        self.sync_usage();
        Ok(self.usage.clone())
    }

    /// Copies the decoder's counters into the usage.
    pub fn sync_usage(&mut self) {
        let s = self.kv.stats;
        self.usage.forward_passes = s.passes;
        self.usage.forward_tokens = s.tokens;
        self.usage.sequence_tokens = self.seq.len() as u64;
        self.usage.total_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.usage.tokens_per_second = if self.gen_time > 0.0 { self.usage.generated_tokens as f64 / self.gen_time } else { 0.0 };
    }

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
        let mut stops = StopMatcher::new(&spec.stop, &regexes, &self.limits).map_err(Failure::from)?;
        let mut bias_state = spec.bias.as_ref().map(Bias::start);
        let mut sampler = Sampler::new(spec.sampling.clone()).map_err(Failure::from)?;
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
            Some(m) => m.mask(vocab, mask).map_err(Failure::from)?,
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

    /// Scores `options` (each followed by `follow`) after the current text:
    /// total log-probabilities, in one batched pass.
    pub fn score(&mut self, options: &[String], follow: &str) -> LmResult<Vec<(f64, usize)>> {
        self.decide()?;
        let healed = self.heal_back();
        let prefix = match String::from_utf8(healed) {
            Ok(p) => p,
            Err(e) => {
                // Not text on its own: put it back and score without healing.
                self.push_text(&String::from_utf8_lossy(e.as_bytes()), Origin::Template);
                self.decide()?;
                String::new()
            }
        };
        self.feed()?;
        let continues = self.seq.last().is_some_and(|t| !is_boundary(t, &self.model.tokenizer.vocab));
        let mut ids = Vec::new();
        for o in options {
            let text = format!("{prefix}{o}{follow}");
            let r = Rendered { content_spans: vec![(0, text.len())], text };
            ids.push(crate::chat::encode_in(&self.model.tokenizer, &r, continues).map_err(Failure::model)?.into_iter().map(|(id, _)| id).collect());
        }
        let lps = self.model.decoder.score(&mut self.kv, &ids).map_err(Failure::from)?;
        self.usage.scored_tokens += ids.iter().map(|i| i.len() as u64).sum::<u64>();
        // Healing's token goes back as pending text, to be decided with the choice.
        if !prefix.is_empty() {
            self.pending.insert(0, Piece::Text(prefix, Origin::Template));
        }
        Ok(lps.iter().map(|l| (l.iter().map(|&x| f64::from(x)).sum(), l.len())).collect())
    }

    /// The probability that the next token does not begin any of `literals`
    /// (how likely the model is to leave the literal options of a select).
    pub fn off_literals_logprob(&mut self, literals: &[String]) -> LmResult<f64> {
        self.decide()?;
        let logits = self.feed()?;
        let lp = log_softmax(&logits);
        let c = Constraint::choices(literals, &self.limits).map_err(Failure::from)?;
        let mut mask = TokenMask::new(self.free_mask.len());
        c.matcher(&self.limits).mask(&self.model.tokenizer.vocab, &mut mask).map_err(Failure::from)?;
        let on: f64 = mask.ones().filter(|&t| (t as usize) < lp.len()).map(|t| f64::from(lp[t as usize]).exp()).sum();
        Ok((1.0 - on).max(1e-12).ln())
    }

    /// Backs the last token out when it is prompt text that generation may
    /// continue (token healing); returns its bytes (empty when none).
    fn heal_back(&mut self) -> Vec<u8> {
        let vocab = &self.model.tokenizer.vocab;
        let n = self.seq.len();
        let healable = n >= 2
            && self.seq[n - 1].kind == TokenKind::Prompt
            && matches!(self.seq[n - 1].origin, Origin::Template | Origin::Variable)
            && !vocab.is_special_or_added(self.seq[n - 1].id);
        if !healable {
            return Vec::new();
        }
        let bytes = vocab.bytes(self.seq[n - 1].id).to_vec();
        let _ = self.truncate(n - 1);
        bytes
    }

    /// Shortens the sequence (and the cache) to `len` tokens.
    fn truncate(&mut self, len: usize) -> LmResult<()> {
        if len >= self.seq.len() {
            return Ok(());
        }
        self.seq.truncate(len);
        if self.kv.len() > len {
            self.usage.rewound_tokens += (self.kv.len() - len) as u64;
            self.kv.truncate(len).map_err(Failure::from)?;
            self.logits = None;
        }
        Ok(())
    }

    /// Feeds the decided tokens the cache lacks in one pass; returns the
    /// logits after the last token.
    fn feed(&mut self) -> LmResult<Vec<f32>> {
        if self.kv.len() == self.seq.len() {
            if let Some(l) = &self.logits {
                return Ok(l.clone());
            }
            // The logits were dropped by a rewind: feed the last token again.
            if self.kv.is_empty() {
                return Err(Failure::model("nothing to generate from: the model has no BOS token and no text comes before this point"));
            }
            let n = self.kv.len() - 1;
            self.usage.rewound_tokens += 1;
            self.kv.truncate(n).map_err(Failure::from)?;
        }
        let ids: Vec<u32> = self.seq[self.kv.len()..].iter().map(|t| t.id).collect();
        self.usage.reused_tokens += self.kv.len() as u64;
        let l = self.model.decoder.append(&mut self.kv, &ids).map_err(Failure::from)?;
        self.logits = Some(l.clone());
        Ok(l)
    }

    /// Tokenizes pending pieces onto the sequence, re-tokenizing the last
    /// tokens with them and backing those out when the boundary changes.
    fn decide(&mut self) -> LmResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let tok = &self.model.tokenizer;
        let vocab = tok.vocab.clone();
        let pieces = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        self.turn_content_at = None;
        if self.seq.is_empty() {
            if let Some(bos) = tok.bos {
                let bos_text = String::from_utf8_lossy(vocab.bytes(bos)).into_owned();
                let written = matches!(pieces.first(), Some(Piece::Marker(m)) if !bos_text.is_empty() && m.starts_with(&bos_text));
                if !written {
                    let t = self.token(bos, Origin::Bos, TokenKind::Prompt, None, Vec::new());
                    self.seq.push(t);
                    self.usage.prompt_tokens += 1;
                }
            }
        }
        // The tail that may merge with the new text: plain tokens since the last boundary.
        let mut k = 0;
        while k < BACK_OFF && k < self.seq.len() && !is_boundary(&self.seq[self.seq.len() - 1 - k], &vocab) {
            k += 1;
        }
        let mut tail = vocab.decode(&self.seq[self.seq.len() - k..].iter().map(|t| t.id).collect::<Vec<_>>());
        while k > 0 && std::str::from_utf8(&tail).is_err() {
            k -= 1;
            tail = vocab.decode(&self.seq[self.seq.len() - k..].iter().map(|t| t.id).collect::<Vec<_>>());
        }
        let continues = self.seq.len() > k && !is_boundary(&self.seq[self.seq.len() - k - 1], &vocab);
        let mut text = String::from_utf8(tail).unwrap_or_default();
        let mut spans = Vec::new();
        let mut origins: Vec<(usize, Origin)> = Vec::new();
        if !text.is_empty() {
            spans.push((0, text.len()));
            origins.push((0, self.seq[self.seq.len() - k].origin));
        }
        for p in &pieces {
            let start = text.len();
            match p {
                Piece::Text(t, o) => {
                    text.push_str(t);
                    origins.push((start, *o));
                    // Adjacent plain pieces are one stretch of content.
                    match spans.last_mut() {
                        Some(s) if s.1 == start => s.1 = text.len(),
                        _ => spans.push((start, text.len())),
                    }
                }
                Piece::Marker(m) => {
                    text.push_str(m);
                    origins.push((start, Origin::Role));
                }
            }
        }
        let r = Rendered { text, content_spans: spans };
        let ids = crate::chat::encode_in(tok, &r, continues).map_err(Failure::model)?;
        let tail_ids: Vec<u32> = self.seq[self.seq.len() - k..].iter().map(|t| t.id).collect();
        let new = if ids.iter().map(|x| x.0).take(k).eq(tail_ids.iter().copied()) {
            &ids[k..]
        } else {
            let n = self.seq.len() - k;
            self.truncate(n)?;
            &ids[..]
        };
        // Token offsets only grow: walk the pieces' origins alongside.
        let mut piece = 0;
        for &(id, at) in new {
            while piece + 1 < origins.len() && origins[piece + 1].0 <= at {
                piece += 1;
            }
            let origin = if vocab.is_special_or_added(id) {
                Origin::Role
            } else {
                origins.get(piece).filter(|(s, _)| *s <= at).map_or(Origin::Template, |(_, o)| *o)
            };
            let t = self.token(id, origin, TokenKind::Prompt, None, Vec::new());
            self.seq.push(t);
            self.usage.prompt_tokens += 1;
        }
        Ok(())
    }

    fn token(&self, id: u32, origin: Origin, kind: TokenKind, logprob: Option<f32>, top: Vec<Alternative>) -> Token {
        let text = String::from_utf8_lossy(self.model.tokenizer.vocab.bytes(id)).into_owned();
        Token { id, text, origin, kind, logprob, top }
    }

    /// The chosen option's metadata from scores.
    pub fn choices(options: &[String], scores: &[f64]) -> Vec<Choice> {
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        let mut out: Vec<Choice> = options
            .iter()
            .zip(scores)
            .map(|(o, &s)| Choice { text: o.clone(), logprob: s, probability: (s - max).exp() / total })
            .collect();
        out.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
        out
    }
}

fn message(role: &str, content: &str) -> Message {
    Message { role: role.to_string(), content: content.to_string() }
}

/// End-of-sequence and end-of-turn ids: generation ends at them.
fn stop_ids(model: &Model) -> impl Iterator<Item = u32> + '_ {
    let t = &model.tokenizer;
    t.eos.iter().chain(t.eot.iter()).copied()
}

/// A token after which text starts a new stretch: BOS, special and added tokens.
fn is_boundary(t: &Token, vocab: &crate::engine::Vocab) -> bool {
    t.origin == Origin::Bos || vocab.is_special_or_added(t.id)
}

fn valid_utf8_prefix(b: &[u8]) -> &str {
    match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// The largest length ≤ `n` that does not cut a UTF-8 sequence of `b`.
fn utf8_floor(b: &[u8], n: usize) -> usize {
    let mut i = n.min(b.len());
    while i > 0 && i < b.len() && (b[i] & 0xC0) == 0x80 {
        i -= 1;
    }
    i
}
