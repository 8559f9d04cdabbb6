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

use std::sync::Arc;
use std::time::Instant;

mod generate;
mod remote;
mod score;
mod turns;

pub use generate::{GenSpec, Generated, Sink};
use generate::stop_ids;
use turns::Conversation;

use super::decide::{Decider, Decision};
use crate::chat::{ChatTemplate, Message, Rendered};
use crate::engine::{Bias, Constraint, Limits, StopEvent, StopMatcher, TokenMask};
use crate::state::{Choice, FinishReason, Meta};
use crate::model::remote::RemoteModel;
use crate::model::tokenizer::ModelTokenizer;
use crate::model::{log_softmax, Forward, KvState, Model, ModelError, Sampled, Sampler, SamplingParams};
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

/// What runs a run's model work.
#[derive(Clone, Copy)]
pub enum Backend<'m> {
    /// lmt's own runtime: the model, and what runs its forward passes (its
    /// decoder, or a batch member).
    Local {
        /// The model.
        model: &'m Model,
        /// The forward passes.
        forward: &'m dyn Forward,
    },
    /// A serving engine: whole generations per request.
    Remote(&'m RemoteModel),
}

impl<'m> Backend<'m> {
    /// The model's own runtime, its passes through its decoder.
    pub fn local(model: &'m Model) -> Backend<'m> {
        Backend::Local { model, forward: &model.decoder }
    }

    /// The tokenizer prompts are made with.
    pub fn tokenizer(&self) -> &'m ModelTokenizer {
        match *self {
            Backend::Local { model, .. } => &model.tokenizer,
            Backend::Remote(r) => &r.tokenizer,
        }
    }
}

/// The model side of a run.
pub struct Lm<'m> {
    backend: Backend<'m>,
    /// The cache of a local backend (a remote one keeps only the ids).
    kv: KvState,
    /// Decided tokens; `kv` holds a prefix of them.
    seq: Vec<Token>,
    pending: Vec<Piece>,
    /// Bytes pushed to `pending` since it was last decided (at least its size).
    pending_bytes: usize,
    /// The longest token's bytes: bounds how few tokens pending text can make.
    max_token_bytes: usize,
    /// Logits after the last token of `kv`, when `kv` holds all of `seq`
    /// (shared with whoever asked for them: a vocabulary-sized copy per
    /// token is what a dataset row's thread would otherwise spend).
    logits: Option<Arc<Vec<f32>>>,
    free_mask: TokenMask,
    /// The chat template, the finished turns and what it has written.
    chat: Conversation,
    /// Where the open turn's content starts in `pending`, while none of it is decided.
    turn_content_at: Option<usize>,
    limits: Limits,
    /// Counters.
    pub usage: Usage,
    started: Instant,
    gen_time: f64,
    /// Takes the decisions instead of the samplers (a search's run).
    decider: Option<&'m dyn Decider>,
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
    pub fn new(backend: Backend<'m>, limits: Limits) -> LmResult<Lm<'m>> {
        let tok = backend.tokenizer();
        let (dim, kv) = match backend {
            Backend::Local { model, .. } => (model.decoder.config.vocab_size.max(tok.vocab.len()), model.decoder.new_state()),
            Backend::Remote(_) => (tok.vocab.len(), KvState::detached()),
        };
        let mut free_mask = TokenMask::new(dim);
        for id in 0..tok.vocab.len() as u32 {
            if tok.vocab.is_generable(id) {
                free_mask.set(id);
            }
        }
        stop_ids(tok).for_each(|id| free_mask.set(id));
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
            backend,
            kv,
            seq: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            max_token_bytes: (0..tok.vocab.len() as u32).map(|t| tok.vocab.bytes(t).len()).max().unwrap_or(1),
            logits: None,
            free_mask,
            chat: Conversation { template, transcript: String::new(), messages: Vec::new() },
            turn_content_at: None,
            limits,
            usage: Usage::default(),
            started: Instant::now(),
            gen_time: 0.0,
            decider: None,
        })
    }

    /// The tokenizer prompts are made with.
    fn tok(&self) -> &'m ModelTokenizer {
        self.backend.tokenizer()
    }

    /// The model's context length, in tokens.
    fn context_length(&self) -> usize {
        match self.backend {
            Backend::Local { model, .. } => model.decoder.config.max_position_embeddings,
            Backend::Remote(r) => r.context_length,
        }
    }

    /// The forward passes of a local backend.
    fn forward(&self) -> LmResult<&'m dyn Forward> {
        match self.backend {
            Backend::Local { forward, .. } => Ok(forward),
            Backend::Remote(r) => Err(Failure::internal(format!("a forward pass was asked of {}", r.remote.describe()))),
        }
    }

    /// A fresh cache on the local backend's model.
    fn new_state(&self) -> LmResult<KvState> {
        match self.backend {
            Backend::Local { model, .. } => Ok(model.decoder.new_state()),
            Backend::Remote(r) => Err(Failure::internal(format!("a model state was asked of {}", r.remote.describe()))),
        }
    }

    /// The remote engine, when the run has one.
    pub fn remote(&self) -> Option<&'m RemoteModel> {
        match self.backend {
            Backend::Remote(r) => Some(r),
            Backend::Local { .. } => None,
        }
    }

    /// Whether options can be scored (log-probs of given text): always
    /// locally, remotely where the engine gives prompt log-probs.
    pub fn can_score(&self) -> bool {
        self.remote().is_none_or(|r| r.remote.kind.capabilities().prompt_scoring)
    }

    /// Lets `decider` take this run's decisions.
    pub fn set_decider(&mut self, decider: &'m dyn Decider) {
        self.decider = Some(decider);
    }

    /// The option a select takes when a decider decides (`None`: the
    /// select samples by its own options). A replayed option needs no
    /// state; `Some(None)`: the decider stopped the run.
    pub fn decide_option(&mut self, scores: &[f64]) -> LmResult<Option<Option<usize>>> {
        let Some(d) = self.decider else { return Ok(None) };
        Ok(Some(match d.replayed() {
            Some(Decision::Option(k)) => Some(k),
            Some(Decision::Token(_)) => return Err(out_of_step()),
            None => d.option(&self.kv, scores),
        }))
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
        let max = self.context_length();
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
            transcript: self.chat.transcript.clone(),
            messages: self.chat.messages.len(),
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
        self.chat.transcript = cp.transcript.clone();
        self.chat.messages.truncate(cp.messages);
        if self.remote().is_none() && self.kv.len() < self.seq.len() {
            self.feed()?;
        }
        Ok(())
    }

    /// The finished chat turns.
    pub fn messages(&self) -> &[Message] {
        &self.chat.messages
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
        if feed && self.remote().is_none() && self.kv.len() < self.seq.len() {
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

    /// Backs the last token out when it is prompt text that generation may
    /// continue (token healing); returns its bytes (empty when none).
    fn heal_back(&mut self) -> Vec<u8> {
        let vocab = &self.tok().vocab;
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

    /// [`Lm::heal_back`] as text: a token that is not text on its own (part
    /// of a character) goes back, and nothing is healed.
    fn heal_text(&mut self) -> LmResult<String> {
        match String::from_utf8(self.heal_back()) {
            Ok(text) => Ok(text),
            Err(e) => {
                self.push_text(&String::from_utf8_lossy(e.as_bytes()), Origin::Template);
                self.decide()?;
                Ok(String::new())
            }
        }
    }

    /// Shortens the sequence (and the cache) to `len` tokens.
    fn truncate(&mut self, len: usize) -> LmResult<()> {
        if len >= self.seq.len() {
            return Ok(());
        }
        self.seq.truncate(len);
        if self.kv.len() > len {
            self.usage.rewound_tokens += (self.kv.len() - len) as u64;
            self.kv.truncate(len)?;
            self.logits = None;
        }
        Ok(())
    }

    /// Feeds the decided tokens the cache lacks in one pass; returns the
    /// logits after the last token.
    fn feed(&mut self) -> LmResult<Arc<Vec<f32>>> {
        if self.kv.len() == self.seq.len() {
            if let Some(l) = &self.logits {
                return Ok(Arc::clone(l));
            }
            // The logits were dropped by a rewind: feed the last token again.
            if self.kv.is_empty() {
                return Err(Failure::model("nothing to generate from: the model has no BOS token and no text comes before this point"));
            }
            let n = self.kv.len() - 1;
            self.usage.rewound_tokens += 1;
            self.kv.truncate(n)?;
        }
        let ids: Vec<u32> = self.seq[self.kv.len()..].iter().map(|t| t.id).collect();
        let cached = self.kv.stats.cached;
        let l = self.forward()?.append(&mut self.kv, &ids)?;
        // Tokens a shared prefix cache supplied were in the cache too.
        self.usage.reused_tokens += (self.kv.len() - ids.len()) as u64;
        self.usage.prefix_cached_tokens += self.kv.stats.cached - cached;
        let l = Arc::new(l);
        self.logits = Some(Arc::clone(&l));
        Ok(l)
    }

    /// Tokenizes pending pieces onto the sequence, re-tokenizing the last
    /// tokens with them and backing those out when the boundary changes.
    fn decide(&mut self) -> LmResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let tok = self.tok();
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
        let text = String::from_utf8_lossy(self.tok().vocab.bytes(id)).into_owned();
        Token { id, text, origin, kind, logprob, top }
    }

}



/// A token after which text starts a new stretch: BOS, special and added tokens.
/// A replayed run met another kind of decision than its parent took there
/// (replays are deterministic: a bug).
fn out_of_step() -> Failure {
    Failure::internal("a run replaying the decisions of the run it was forked from went out of step")
}

fn is_boundary(t: &Token, vocab: &crate::engine::Vocab) -> bool {
    t.origin == Origin::Bos || vocab.is_special_or_added(t.id)
}

fn valid_utf8_prefix(b: &[u8]) -> &str {
    match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// The largest length ≤ `n` that does not cut a UTF-8 sequence of `b`,
/// also one whose last bytes have not arrived yet (a character split
/// across tokens is streamed whole, with its last token).
fn utf8_floor(b: &[u8], n: usize) -> usize {
    let i = n.min(b.len());
    // The start of the last character before `i` (at most 3 continuation bytes back).
    let mut start = i;
    while start > 0 && i - start < 4 && (b[start - 1] & 0xC0) == 0x80 {
        start -= 1;
    }
    let Some(lead) = start.checked_sub(1).map(|j| b[j]) else { return i };
    let width = match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        // ASCII, or not a lead byte: nothing to wait for.
        _ => return i,
    };
    if i - (start - 1) < width {
        start - 1
    } else {
        i
    }
}

#[cfg(test)]
mod tests {
    use super::utf8_floor;

    #[test]
    fn utf8_floor_never_ends_inside_a_character() {
        let s = "a₍b".as_bytes(); // ₍ is E2 82 8D
        let want = [0, 1, 1, 1, 4, 5];
        for (n, &w) in want.iter().enumerate() {
            assert_eq!(utf8_floor(s, n), w, "n = {n}");
        }
        // The value so far ends inside a character: its bytes wait.
        assert_eq!(utf8_floor(&s[..3], 3), 1);
        assert_eq!(utf8_floor("é".as_bytes(), 2), 2);
        assert_eq!(utf8_floor(&"😀".as_bytes()[..3], 3), 0);
        // Stray continuation bytes are not waited on.
        assert_eq!(utf8_floor(&[0x80, 0x80], 2), 2);
        assert_eq!(utf8_floor(&[b'x', 0x80, 0x80, 0x80, 0x80], 5), 5);
    }
}
