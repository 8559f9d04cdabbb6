//! vLLM's OpenAI-compatible server (0.12 or newer): `/v1/completions` with
//! the prompt as token ids, constraints in `structured_outputs` (`regex`,
//! `grammar`, `json`, `choice`), the generated `token_ids`
//! (`return_token_ids`) and their log-probs; options scored by
//! `prompt_logprobs`, every option in one request (a list of prompts).
//! Shapes are those of vLLM's `CompletionRequest`/`CompletionResponse`; the
//! fixtures in `tests/data/remote/` are written from them.

use serde_json::{json, Value};

use super::{Client, Completion, EngineKind, Remote, RemoteError, RemoteFinish, Request, Wire};

/// A connection to the server whose `/v1/models` answered `models`.
pub fn from_models(client: Client, models: &Value) -> Remote {
    let card = &models["data"][0];
    Remote {
        kind: EngineKind::Vllm,
        client,
        context_length: card["max_model_len"].as_u64().map(|n| n as usize),
        model_file: None,
        model_id: card["id"].as_str().map(str::to_string),
    }
}

/// Sends `req` to `/v1/completions`.
pub fn complete(remote: &Remote, req: &Request<'_>) -> Result<Completion, RemoteError> {
    let resp = remote.client.post_json("/v1/completions", &body(remote.model_id.as_deref(), req))?;
    parse(&resp).map_err(|m| bad_shape(remote, &m))
}

/// Log-probabilities of each option's tokens after `prefix`, in one request.
pub fn score(remote: &Remote, prefix: &[u32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, RemoteError> {
    let resp = remote.client.post_json("/v1/completions", &score_body(remote.model_id.as_deref(), prefix, options))?;
    parse_scores(&resp, prefix.len(), options).map_err(|m| bad_shape(remote, &m))
}

fn bad_shape(remote: &Remote, m: &str) -> RemoteError {
    RemoteError(format!("{}/v1/completions answered in a shape lmt does not know: {m}", remote.client.base()))
}

/// The request body of a generation.
pub fn body(model: Option<&str>, req: &Request<'_>) -> Value {
    let s = req.sampling;
    let mut b = json!({
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": super::top_k_or_none(s.top_k),
        "min_p": s.min_p,
        "seed": super::seed_63(s.seed),
        "stop": req.stop,
        "logprobs": req.top_alternatives,
        "return_token_ids": true,
        "skip_special_tokens": false,
        "include_stop_str_in_output": false,
    });
    if let Some(c) = req.constraint {
        b["structured_outputs"] = match c {
            Wire::Regex(r) => json!({"regex": r}),
            Wire::Gbnf(g) => json!({"grammar": g}),
            Wire::JsonSchema(s) => json!({"json": s}),
            Wire::Choices(c) => json!({"choice": c}),
        };
    }
    b
}

/// The request body that scores `options` after `prefix`.
pub fn score_body(model: Option<&str>, prefix: &[u32], options: &[Vec<u32>]) -> Value {
    let prompts: Vec<Vec<u32>> = options.iter().map(|o| prefix.iter().chain(o).copied().collect()).collect();
    json!({"model": model, "prompt": prompts, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "return_token_ids": true})
}

/// Reads a generation's response.
pub fn parse(v: &Value) -> Result<Completion, String> {
    let c = &v["choices"][0];
    let text = c["text"].as_str().ok_or("no `choices[0].text`")?.to_string();
    let tokens = ids(&c["token_ids"]).map_err(|e| format!("`token_ids`: {e} (vLLM before 0.10.2 does not return them)"))?;
    let logprobs: Vec<f32> = c["logprobs"]["token_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default().iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32).collect();
    let finish = match (c["finish_reason"].as_str(), &c["stop_reason"]) {
        (Some("length"), _) => RemoteFinish::Length,
        (Some("stop"), Value::String(s)) => RemoteFinish::Stop(s.clone()),
        // Stopped by EOS (or a stop token id).
        (Some("stop"), _) => RemoteFinish::Eos,
        (other, _) => return Err(format!("`finish_reason` {other:?}")),
    };
    let usage = &v["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    // Alternatives come keyed by text, not id: not kept.
    let top = vec![Vec::new(); logprobs.len()];
    Ok(Completion { text, tokens, logprobs, top, finish, prompt_computed: prompt.saturating_sub(cached), prompt_cached: cached })
}

/// Reads the option scores from a `prompt_logprobs` response.
pub fn parse_scores(v: &Value, prefix: usize, options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, String> {
    let choices = v["choices"].as_array().ok_or("no `choices`")?;
    let mut out = vec![None; options.len()];
    for c in choices {
        let i = c["index"].as_u64().ok_or("a choice without `index`")? as usize;
        let opt = options.get(i).ok_or_else(|| format!("a choice with index {i} for {} prompts", options.len()))?;
        let lps = c["prompt_logprobs"].as_array().ok_or("a choice without `prompt_logprobs`")?;
        let mut scores = Vec::with_capacity(opt.len());
        for (k, &id) in opt.iter().enumerate() {
            let entry = lps.get(prefix + k).ok_or("fewer `prompt_logprobs` than prompt tokens")?;
            let lp = entry[id.to_string()]["logprob"].as_f64().ok_or_else(|| format!("no log-prob for token {id} at position {}", prefix + k))?;
            scores.push(lp as f32);
        }
        out[i] = Some(scores);
    }
    out.into_iter().enumerate().map(|(i, s)| s.ok_or_else(|| format!("no choice for prompt {i}"))).collect()
}

fn ids(v: &Value) -> Result<Vec<u32>, String> {
    let a = v.as_array().ok_or("missing")?;
    a.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("{x} is not a token id"))).collect()
}
