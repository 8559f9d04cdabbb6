//! Remote engines: a serving engine (llama.cpp's `llama-server`, vLLM,
//! SGLang; other OpenAI-compatible servers are detected and refused) runs
//! the model; lmt sends prompts as token ids of its own tokenization,
//! constraints in the engine's dialect, and reads back text, token ids,
//! log-probs and why generation stopped; where the engine gives log-probs
//! of given text, select options are scored by them.
//!
//! What each engine can do is a table ([`EngineKind::capabilities`]): the
//! interpreter refuses, before any request, a template that needs more.

mod http;
pub mod llama_server;
pub mod sglang;
pub mod vllm;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::tokenizer::ModelTokenizer;
use super::SamplingParams;
pub use http::Client;

/// The serving engines lmt knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// llama.cpp's `llama-server` (`/completion`, GBNF grammars).
    LlamaServer,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// SGLang's server.
    Sglang,
    /// Another OpenAI-compatible completions server.
    Openai,
}

/// What an engine can do for a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Generation from a prompt of token ids.
    pub generate: bool,
    /// Per-token logits or masks lmt applies itself (bias, selects with
    /// generating branches, beam search). No remote engine has them.
    pub token_logits: bool,
    /// Regex, grammar, JSON Schema and choice constraints enforced by the
    /// server.
    pub constraints: bool,
    /// Log-probabilities of given text (prompt log-probs): select scoring.
    pub prompt_scoring: bool,
}

impl EngineKind {
    /// Every kind, in the order `--engine` lists them.
    pub const ALL: [EngineKind; 4] = [EngineKind::LlamaServer, EngineKind::Vllm, EngineKind::Sglang, EngineKind::Openai];

    /// The name `--engine` takes.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::LlamaServer => "llama-server",
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Openai => "openai",
        }
    }

    /// The kind named `s`.
    pub fn parse(s: &str) -> Option<EngineKind> {
        EngineKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// What lmt can do through this engine today.
    pub fn capabilities(self) -> Capabilities {
        match self {
            EngineKind::LlamaServer => Capabilities { generate: true, token_logits: false, constraints: true, prompt_scoring: false },
            EngineKind::Vllm | EngineKind::Sglang => Capabilities { generate: true, token_logits: false, constraints: true, prompt_scoring: true },
            // Detected; no adapter (token-id prompts and ids back are not standard).
            EngineKind::Openai => Capabilities { generate: false, token_logits: false, constraints: false, prompt_scoring: false },
        }
    }
}

/// How to reach an engine.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// `http(s)://host:port`.
    pub url: String,
    /// The engine, when not detected.
    pub engine: Option<EngineKind>,
    /// Sent as `Authorization: Bearer …`.
    pub api_key: Option<String>,
    /// Longest wait for one response.
    pub timeout: Duration,
    /// Retries of a request that got 429, a 5xx status or no connection.
    pub retries: u32,
}

impl RemoteOptions {
    /// Options for `url` with the defaults: detected engine, the key from
    /// `LMT_API_KEY`, 120 s per response, 2 retries.
    pub fn new(url: &str) -> RemoteOptions {
        RemoteOptions {
            url: url.trim_end_matches('/').to_string(),
            engine: None,
            api_key: std::env::var("LMT_API_KEY").ok().filter(|k| !k.is_empty()),
            timeout: Duration::from_secs(120),
            retries: 2,
        }
    }
}

/// Why a request to an engine failed.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteError(pub String);

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A constraint in a form engines take.
#[derive(Debug, Clone, PartialEq)]
pub enum Wire {
    /// A regex matched whole (Rust syntax).
    Regex(String),
    /// A GBNF grammar with a `root` rule, in llama.cpp's notation.
    Gbnf(String),
    /// A JSON Schema.
    JsonSchema(Value),
    /// One of these literal texts.
    Choices(Vec<String>),
}

/// One generation request, engine-neutral.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The prompt, as lmt tokenized it.
    pub prompt: &'a [u32],
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Temperature, top-k/p, min-p and the seed.
    pub sampling: &'a SamplingParams,
    /// Stop strings (the engine ends before them).
    pub stop: &'a [String],
    /// The constraint, if any.
    pub constraint: Option<&'a Wire>,
    /// Alternatives to report per token.
    pub top_alternatives: usize,
}

/// `top_k` as OpenAI-style engines take it (vLLM, SGLang): -1 for none.
fn top_k_or_none(k: usize) -> i64 {
    if k == 0 {
        -1
    } else {
        i64::try_from(k).unwrap_or(i64::MAX)
    }
}

/// A seed in the signed 64-bit range those engines accept.
fn seed_63(seed: u64) -> u64 {
    seed >> 1
}

/// Why a remote generation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteFinish {
    /// The model ended it (EOS, or the grammar allowed nothing more).
    Eos,
    /// `max_tokens` ran out.
    Length,
    /// A stop string matched (it is not in the text).
    Stop(String),
}

/// What an engine generated.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The text (without a stop string that ended it).
    pub text: String,
    /// Token ids generated, as the engine reports them.
    pub tokens: Vec<u32>,
    /// Each token's log-probability under the model.
    pub logprobs: Vec<f32>,
    /// The most likely alternatives at each token.
    pub top: Vec<Vec<(u32, f32)>>,
    /// Why it ended.
    pub finish: RemoteFinish,
    /// Prompt tokens the engine computed for this request.
    pub prompt_computed: u64,
    /// Prompt tokens it took from its cache.
    pub prompt_cached: u64,
}

/// A connection to an engine, with what it serves.
#[derive(Debug, Clone)]
pub struct Remote {
    /// Which engine.
    pub kind: EngineKind,
    /// The HTTP client (base URL, key, timeout, retries).
    pub client: Client,
    /// The model's context length, when the engine says.
    pub context_length: Option<usize>,
    /// The model file the engine loaded, when it says and it is readable
    /// here (a server on this machine): its tokenizer is the one to use.
    pub model_file: Option<PathBuf>,
    /// The model's name in requests (OpenAI-style APIs).
    pub model_id: Option<String>,
}

impl Remote {
    /// Connects and finds out what the engine is (or checks it is the
    /// one `opts` names).
    pub fn connect(opts: &RemoteOptions) -> Result<Remote, RemoteError> {
        let client = Client::new(opts);
        if let Some(props) = client.get_json("/props").ok().filter(|p| p.get("default_generation_settings").is_some()) {
            let remote = llama_server::from_props(client, &props);
            return match opts.engine {
                Some(k) if k != EngineKind::LlamaServer => {
                    Err(RemoteError(format!("{} is llama-server (its /props says so), not {}", opts.url, k.name())))
                }
                _ => Ok(remote),
            };
        }
        let kind = match opts.engine {
            Some(k) => k,
            None => detect_other(&client)?,
        };
        match kind {
            EngineKind::LlamaServer => Err(RemoteError(format!("{} does not answer /props as llama-server does", opts.url))),
            EngineKind::Vllm => {
                let models = client.get_json("/v1/models")?;
                Ok(vllm::from_models(client, &models))
            }
            EngineKind::Sglang => {
                let info = client.get_json("/get_model_info")?;
                Ok(sglang::from_model_info(client, &info))
            }
            EngineKind::Openai => Err(RemoteError(format!(
                "{} is an OpenAI-compatible server of no kind lmt knows: lmt needs prompts as token ids and the ids it generated (llama-server, vLLM or SGLang; name one with --engine)",
                opts.url
            ))),
        }
    }

    /// Generates once.
    pub fn complete(&self, req: &Request<'_>) -> Result<Completion, RemoteError> {
        match self.kind {
            EngineKind::LlamaServer => llama_server::complete(&self.client, req),
            EngineKind::Vllm => vllm::complete(self, req),
            EngineKind::Sglang => sglang::complete(self, req),
            EngineKind::Openai => Err(RemoteError("generation through a plain OpenAI-compatible server is not supported".into())),
        }
    }

    /// [`Remote::complete`] on a thread of its own while this one polls
    /// `cancelled`: `Ok(None)` once it says so (the request is abandoned and
    /// its answer dropped), so Ctrl-C never waits for a long generation.
    pub fn complete_until(&self, req: &Request<'_>, cancelled: &dyn Fn() -> bool) -> Result<Option<Completion>, RemoteError> {
        use std::sync::mpsc::{channel, RecvTimeoutError};
        let remote = self.clone();
        let (prompt, sampling, stop, wire) = (req.prompt.to_vec(), req.sampling.clone(), req.stop.to_vec(), req.constraint.cloned());
        let (max_tokens, top_alternatives) = (req.max_tokens, req.top_alternatives);
        let (send, answer) = channel();
        std::thread::spawn(move || {
            let req = Request { prompt: &prompt, max_tokens, sampling: &sampling, stop: &stop, constraint: wire.as_ref(), top_alternatives };
            let _ = send.send(remote.complete(&req));
        });
        loop {
            match answer.recv_timeout(Duration::from_millis(50)) {
                Ok(done) => return done.map(Some),
                Err(RecvTimeoutError::Timeout) if cancelled() => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(RemoteError("the request ended without an answer".into())),
            }
        }
    }

    /// Log-probabilities of each option's tokens after `prefix`, in one
    /// request (engines with prompt log-probs).
    pub fn score(&self, prefix: &[u32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, RemoteError> {
        match self.kind {
            EngineKind::Vllm => vllm::score(self, prefix, options),
            EngineKind::Sglang => sglang::score(self, prefix, options),
            other => Err(RemoteError(format!("{} gives no log-probs of given text", other.name()))),
        }
    }

    /// `llama-server at http://…`, for messages.
    pub fn describe(&self) -> String {
        format!("{} at {}", self.kind.name(), self.client.base())
    }
}

/// Tells vLLM, SGLang and other OpenAI-compatible servers apart.
fn detect_other(client: &Client) -> Result<EngineKind, RemoteError> {
    if client.get_json("/get_model_info").is_ok() {
        return Ok(EngineKind::Sglang);
    }
    let models = client.get_json("/v1/models")?;
    let owner = models["data"][0]["owned_by"].as_str().unwrap_or("");
    Ok(if owner == "vllm" { EngineKind::Vllm } else { EngineKind::Openai })
}

/// The tokenizer of the hub model `id` (what vLLM and SGLang name their
/// model by) and its context length: its tokenizer files from the Hugging
/// Face cache, downloaded (without the weights) when absent and allowed.
pub fn hub_tokenizer(id: &str) -> Result<(ModelTokenizer, usize), super::ModelError> {
    let (repo, revision) = match super::ModelSpec::parse(id)? {
        super::ModelSpec::Hub { repo, revision } => (repo, revision),
        _ => return Err(super::ModelError::Config(format!("`{id}` is not a hub model id"))),
    };
    let dir = super::HubEnv::from_process().tokenizer_dir(&repo, &revision)?;
    let ids = super::TokenIds::from_hf_file(&dir.join("config.json"))?;
    let tokenizer = ModelTokenizer::load(&dir.join("tokenizer.json"), &ids)?;
    // (Only a bound on prompts: the engine's own context length comes first.)
    Ok((tokenizer, ids.context.unwrap_or(4096)))
}

/// A remote engine with the tokenizer lmt tokenizes its prompts with.
#[derive(Debug)]
pub struct RemoteModel {
    /// The connection.
    pub remote: Remote,
    /// The model's tokenizer (and chat template).
    pub tokenizer: ModelTokenizer,
    /// The context length: the engine's, else the tokenizer's model config's.
    pub context_length: usize,
}
