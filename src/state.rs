//! The structured record of a run: an ordered list of nodes (text with its
//! origin, role boundaries, capture boundaries), the model's token sequence
//! with each token's origin, the captures with their metadata, the chat
//! messages and the usage. Never a string with tags in it: the terminal
//! view, JSON and HTML are all derived from it (`crate::render`).

use crate::chat::Message;
use crate::diagnostic::Code;

/// A string from the model, with what is known about how it was produced.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Captured {
    /// The text.
    pub text: String,
    /// Its metadata.
    #[serde(flatten)]
    pub meta: Meta,
}

/// Metadata of a captured value: `.logprob`, `.tokens`, `.finish_reason`,
/// `.stop`, `.choices`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Meta {
    /// Sum of the model's log-probabilities of the sampled tokens (or the
    /// chosen option's score for a select).
    pub logprob: f64,
    /// The token ids generated.
    pub tokens: Vec<u32>,
    /// Why generation ended (`None` for plain captures).
    pub finish_reason: Option<FinishReason>,
    /// The stop string or regex match that ended it.
    pub stop: Option<String>,
    /// For a select: every option, most likely first.
    pub choices: Vec<Choice>,
}

/// One option of a select with its score.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Choice {
    /// The option.
    pub text: String,
    /// Its score: a log-probability (`full`), a mean log-probability per token (`mean`).
    pub logprob: f64,
    /// Its share of the options' probability.
    pub probability: f64,
}

/// Why a generation (or a run) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop string or regex matched.
    Stop,
    /// The model emitted end-of-sequence (or end-of-turn).
    Eos,
    /// `max_tokens` was reached.
    MaxTokens,
    /// The constraint was complete and nothing more could follow.
    ConstraintComplete,
    /// The run was cancelled (Ctrl-C).
    Cancelled,
    /// An error stopped it.
    Error,
    /// The program ran to its end (runs only).
    Done,
}

impl FinishReason {
    /// The name used in JSON and as `.finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Eos => "eos",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::ConstraintComplete => "constraint_complete",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
            FinishReason::Done => "done",
        }
    }
}

/// What kind of failure stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunErrorKind {
    /// A value of the wrong type or out of range for an operation, an
    /// undefined name, a failed filter, test or call.
    Value,
    /// An input the template declares was not given.
    MissingInput,
    /// A `gen` or `select` option value computed at run time is wrong.
    OptionValue,
    /// A constraint the engine refuses, or one no token can continue.
    Constraint,
    /// `max_tokens` cut a constrained value short of matching.
    Unfinished,
    /// The text does not fit the model's context.
    ContextFull,
    /// A bound on values, calls or work (string size, list items, call
    /// depth, `select … in` options).
    Limit,
    /// A file the template names cannot be read.
    File,
    /// The model, its tokenizer or its chat template failed.
    Model,
    /// A fault of lmt itself.
    Internal,
}

impl serde::Serialize for RunErrorKind {
    /// As its code's name (`unfinished-value`), as `--json` writes it.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code().name())
    }
}

impl RunErrorKind {
    /// The diagnostic code of this kind.
    pub fn code(self) -> Code {
        match self {
            RunErrorKind::Value => Code::Runtime,
            RunErrorKind::MissingInput => Code::MissingInput,
            RunErrorKind::OptionValue => Code::OptionValue,
            RunErrorKind::Constraint => Code::ConstraintFailed,
            RunErrorKind::Unfinished => Code::UnfinishedValue,
            RunErrorKind::ContextFull => Code::ContextFull,
            RunErrorKind::Limit => Code::RunLimit,
            RunErrorKind::File => Code::RunFile,
            RunErrorKind::Model => Code::ModelFailed,
            RunErrorKind::Internal => Code::Internal,
        }
    }
}

/// Why a run failed: what the record keeps, and what operations, the
/// model state and the generation loop return (the interpreter adds the
/// span).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Failure {
    /// What kind of failure.
    pub kind: RunErrorKind,
    /// What went wrong.
    pub message: String,
}

impl Failure {
    /// The failure as the `--json` document writes it: code, kind, message.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.kind.code().as_str(), "kind": self.kind, "message": self.message})
    }

    /// A failure of `kind`.
    pub fn new(kind: RunErrorKind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into() }
    }

    /// A value error.
    pub fn value(message: impl Into<String>) -> Failure {
        Failure::new(RunErrorKind::Value, message)
    }

    /// A failure of the model, its tokenizer or its chat template.
    pub fn model(message: impl Into<String>) -> Failure {
        Failure::new(RunErrorKind::Model, message)
    }

    /// A limit reached.
    pub fn limit(message: impl Into<String>) -> Failure {
        Failure::new(RunErrorKind::Limit, message)
    }

    /// A constraint failure.
    pub fn constraint(message: impl ToString) -> Failure {
        Failure::new(RunErrorKind::Constraint, message.to_string())
    }

    /// A fault of lmt itself.
    pub fn internal(message: impl Into<String>) -> Failure {
        Failure::new(RunErrorKind::Internal, message)
    }
}

/// Where a piece of text or a token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Text written in the template.
    Template,
    /// A value written by `{{ … }}`.
    Variable,
    /// Produced by the model (`gen`, or the option a `select` chose).
    Generated,
    /// Written by the chat template (role markers and their text).
    Role,
    /// The beginning-of-sequence token.
    Bos,
}

/// How a token entered the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Prompt text, tokenized and fed.
    Prompt,
    /// Sampled by the model.
    Sampled,
    /// The only continuation the constraint allowed (fast-forwarded).
    Forced,
    /// Sampled in place of the prompt's last token (token healing).
    Healed,
}

/// A likely alternative to a sampled token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Alternative {
    /// The token's text (lossy for partial UTF-8).
    pub text: String,
    /// Its log-probability.
    pub logprob: f32,
}

/// One token of the model's sequence.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Token {
    /// The id.
    pub id: u32,
    /// Its text (lossy for partial UTF-8).
    pub text: String,
    /// Where it came from.
    pub origin: Origin,
    /// How it was chosen.
    pub kind: TokenKind,
    /// The model's log-probability of it, for sampled tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
    /// The most likely tokens at its place, for sampled tokens.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<Alternative>,
}

/// One node of the record.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "node", rename_all = "snake_case")]
pub enum Node {
    /// Text in the prompt.
    Text {
        /// The text.
        text: String,
        /// Where it came from.
        origin: Origin,
        /// For generated text: its tokens (sampled, forced or healed; a
        /// healed token's text starts with prompt text).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tokens: Vec<Token>,
        /// Inside `{% hidden %}`: removed from the model state afterwards.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        hidden: bool,
    },
    /// A chat turn opens (its marker text is in the token sequence).
    RoleOpen {
        /// The role.
        role: String,
    },
    /// The chat turn closes.
    RoleClose {
        /// The role.
        role: String,
    },
    /// A capture, gen or select begins.
    CaptureOpen {
        /// The variable.
        name: String,
    },
    /// It ends.
    CaptureClose {
        /// The variable.
        name: String,
    },
}

/// A stored value from the model or a `capture`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CaptureRecord {
    /// The variable.
    pub name: String,
    /// Appended to a list (`{% gen xs[] %}`) rather than assigned.
    pub list: bool,
    /// The value and its metadata.
    #[serde(flatten)]
    pub value: Captured,
}

/// What a run cost.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Usage {
    /// Prompt tokens fed (template text, values, role markers, BOS).
    pub prompt_tokens: u64,
    /// Tokens sampled by the model.
    pub generated_tokens: u64,
    /// Tokens a constraint forced (fed without sampling).
    pub forced_tokens: u64,
    /// Tokens already in the KV cache at each forward pass, summed: work the cache saved.
    pub reused_tokens: u64,
    /// Tokens a dataset run's shared prefix cache supplied (computed once
    /// for several rows; counted in `reused_tokens` too).
    pub prefix_cached_tokens: u64,
    /// Tokens taken back out of the cache (stop rewinds, token-boundary
    /// repairs, healing, hidden sections) — each was computed once more than it stays.
    pub rewound_tokens: u64,
    /// Tokens computed only to score `select` options.
    pub scored_tokens: u64,
    /// Decisions the run took, the terms of its `logprob`: tokens sampled
    /// (the one that ended a value included) and options selects chose by
    /// score.
    pub decisions: u64,
    /// Forward passes.
    pub forward_passes: u64,
    /// Tokens through the model in all passes.
    pub forward_tokens: u64,
    /// Length of the final token sequence.
    pub sequence_tokens: u64,
    /// Milliseconds from the start of the run to the first sampled token.
    pub time_to_first_token_ms: Option<f64>,
    /// Sampled tokens per second of generation time.
    pub tokens_per_second: f64,
    /// Milliseconds spent computing constraint masks.
    pub mask_ms: f64,
    /// Milliseconds in the run.
    pub total_ms: f64,
}

impl Usage {
    /// Adds `other`'s counters (a total over several runs; rates and times
    /// stay per run and are left alone).
    pub fn add_counters(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.generated_tokens += other.generated_tokens;
        self.forced_tokens += other.forced_tokens;
        self.reused_tokens += other.reused_tokens;
        self.prefix_cached_tokens += other.prefix_cached_tokens;
        self.rewound_tokens += other.rewound_tokens;
        self.scored_tokens += other.scored_tokens;
        self.decisions += other.decisions;
        self.forward_passes += other.forward_passes;
        self.forward_tokens += other.forward_tokens;
        self.sequence_tokens += other.sequence_tokens;
    }
}

/// The whole record of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Record {
    /// Nodes in order.
    pub nodes: Vec<Node>,
    /// The model's token sequence (what the KV cache holds).
    pub tokens: Vec<Token>,
    /// Every stored model value and capture, in order.
    pub captures: Vec<CaptureRecord>,
    /// The chat turns, with their content.
    pub messages: Vec<Message>,
    /// The run's score: the log-probabilities of its decisions summed
    /// (sampled tokens, the ones ending a value included, and options
    /// selects chose).
    pub logprob: f64,
    /// The log-probability of every token after the first, template text
    /// included (when asked for: `RunOptions::score_all`).
    pub logprob_all: Option<f64>,
    /// What it cost.
    pub usage: Usage,
    /// Why the run ended.
    pub finish_reason: FinishReason,
    /// The error that stopped it, when one did.
    pub error: Option<Failure>,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            nodes: Vec::new(),
            tokens: Vec::new(),
            captures: Vec::new(),
            messages: Vec::new(),
            logprob: 0.0,
            logprob_all: None,
            usage: Usage::default(),
            finish_reason: FinishReason::Done,
            error: None,
        }
    }
}

impl Record {
    /// The visible text: every text node but hidden ones, role markers left
    /// out (they are in the token sequence, not the text).
    pub fn text(&self) -> String {
        self.nodes
            .iter()
            .filter_map(|n| match n {
                Node::Text { text, hidden: false, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The model's token ids, in order.
    pub fn token_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.id).collect()
    }

    /// Appends text, merging with the previous text node of the same kind
    /// when `merge` (not across a boundary such as a capture's start).
    pub fn push_text(&mut self, text: &str, origin: Origin, hidden: bool, merge: bool) {
        if text.is_empty() {
            return;
        }
        if merge && origin != Origin::Generated {
            if let Some(Node::Text { text: t, origin: o, tokens, hidden: h }) = self.nodes.last_mut() {
                if *o == origin && *h == hidden && tokens.is_empty() {
                    t.push_str(text);
                    return;
                }
            }
        }
        self.nodes.push(Node::Text { text: text.to_string(), origin, tokens: Vec::new(), hidden });
    }
}
