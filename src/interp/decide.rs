//! What takes a run's decisions: each token the model samples and each
//! option a `select` picks by score. Without a [`Decider`] a run samples as
//! its options say; a search over whole runs (`search`) gives each of its
//! runs one, to replay the decisions a run shares with the one it forked
//! from and to choose the rest across runs.

use crate::engine::TokenMask;
use crate::model::{KvState, Sampled};

/// One decision of a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// A sampled token (with the model's log-prob and alternatives).
    Token(Sampled),
    /// The index of a select's option.
    Option(usize),
}

/// Takes a run's decisions in place of its samplers.
///
/// Calls come in the run's order. `kv` is the model state the decision is
/// taken after (a search may keep a copy, so a run forked here starts from
/// it). `None` stops the run here: the decider has set the run's cancel
/// flag, and the run ends as cancelled.
pub trait Decider: Sync {
    /// The decision already taken at this point, while the run replays a
    /// run it was forked from: the token is taken without a forward pass.
    fn replayed(&self) -> Option<Decision>;
    /// The next token, from the model's `logits` among the tokens `mask`
    /// allows.
    fn token(&self, kv: &KvState, logits: &[f32], mask: &TokenMask) -> Option<Sampled>;
    /// The option a select takes, from the options' `scores` (log-probs).
    fn option(&self, kv: &KvState, scores: &[f64]) -> Option<usize>;
}
