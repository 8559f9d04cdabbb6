//! llama.cpp's `llama-server`: `/props` for what it serves, `/completion`
//! with the prompt as token ids, constraints as GBNF (lmt writes it from
//! regexes and choices) or a JSON Schema, and the generated token ids and
//! log-probs read back. Request and response shapes are those of its
//! README (tools/server in the llama.cpp tree).

use serde_json::{json, Value};

use super::{Client, Completion, EngineKind, RemoteError, RemoteFinish, Remote, Request, Wire};

/// A connection to the server `props` (its `/props`) describes.
pub fn from_props(client: Client, props: &Value) -> Remote {
    let settings = &props["default_generation_settings"];
    let context_length = settings["n_ctx"].as_u64().or(props["n_ctx"].as_u64()).map(|n| n as usize);
    let model_file = props["model_path"].as_str().map(std::path::PathBuf::from).filter(|p| p.is_file());
    Remote { kind: EngineKind::LlamaServer, client, context_length, model_file, model_id: None }
}

/// Sends `req` to `/completion`.
pub fn complete(client: &Client, req: &Request<'_>) -> Result<Completion, RemoteError> {
    let body = body(req)?;
    let resp = client.post_json("/completion", &body)?;
    parse(&resp).map_err(|m| RemoteError(format!("{}/completion answered in a shape lmt does not know: {m}", client.base())))
}

/// The `/completion` body for `req`: lmt's sampling settings and nothing of
/// the server's own (its repeat penalty, DRY and default top-k/p are off).
pub fn body(req: &Request<'_>) -> Result<Value, RemoteError> {
    let s = req.sampling;
    let mut b = json!({
        "prompt": req.prompt,
        "n_predict": req.max_tokens,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        // The server's seed is 32 bits, and 2^32-1 means "random".
        "seed": s.seed % u64::from(u32::MAX),
        "repeat_penalty": 1.0,
        "dry_multiplier": 0.0,
        "stop": req.stop,
        "n_probs": req.top_alternatives.max(1),
        "return_tokens": true,
        "cache_prompt": true,
        "stream": false,
    });
    let grammar = match req.constraint {
        None => None,
        Some(Wire::Gbnf(g)) => Some(g.clone()),
        Some(Wire::Regex(r)) => Some(crate::engine::regex_gbnf(r).map_err(|e| RemoteError(format!("the regex {r:?} has no GBNF form for llama-server: {e}")))?),
        Some(Wire::Choices(c)) => Some(crate::engine::choices_gbnf(c)),
        Some(Wire::JsonSchema(schema)) => {
            b["json_schema"] = schema.clone();
            None
        }
    };
    if let Some(g) = grammar {
        b["grammar"] = Value::String(g);
    }
    Ok(b)
}

/// Reads a `/completion` response.
pub fn parse(v: &Value) -> Result<Completion, String> {
    let text = v["content"].as_str().ok_or("no `content`")?.to_string();
    let ids = |x: &Value| -> Result<u32, String> {
        x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("a token id {x} that is not one"))
    };
    let tokens: Vec<u32> = v["tokens"].as_array().ok_or("no `tokens` (the server is older than `return_tokens`)")?.iter().map(ids).collect::<Result<_, _>>()?;
    let mut logprobs = Vec::new();
    let mut top = Vec::new();
    for p in v["completion_probabilities"].as_array().map(Vec::as_slice).unwrap_or_default() {
        logprobs.push(p["logprob"].as_f64().ok_or("a token without `logprob`")? as f32);
        let alts = p["top_logprobs"].as_array().map(Vec::as_slice).unwrap_or_default();
        top.push(alts.iter().filter_map(|a| Some((ids(&a["id"]).ok()?, a["logprob"].as_f64()? as f32))).collect());
    }
    let finish = match v["stop_type"].as_str().unwrap_or("") {
        "eos" => RemoteFinish::Eos,
        "limit" => RemoteFinish::Length,
        "word" => RemoteFinish::Stop(v["stopping_word"].as_str().unwrap_or("").to_string()),
        other => return Err(format!("`stop_type` {other:?}")),
    };
    let timings = &v["timings"];
    let prompt_computed = timings["prompt_n"].as_u64().or(v["tokens_evaluated"].as_u64()).unwrap_or(0);
    let prompt_cached = timings["cache_n"].as_u64().unwrap_or(0);
    Ok(Completion { text, tokens, logprobs, top, finish, prompt_computed, prompt_cached })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SamplingParams;

    #[test]
    fn a_response_is_read() {
        let v = json!({
            "content": "201 rome", "tokens": [34, 32, 33, 216, 4522], "stop_type": "limit", "stopping_word": "",
            "timings": {"cache_n": 5, "prompt_n": 1},
            "completion_probabilities": [{"id": 34, "logprob": -1.5, "top_logprobs": [{"id": 7042, "logprob": -0.25}]}]
        });
        let c = parse(&v).unwrap();
        assert_eq!(c.tokens, vec![34, 32, 33, 216, 4522]);
        assert_eq!(c.logprobs, vec![-1.5]);
        assert_eq!(c.top, vec![vec![(7042, -0.25)]]);
        assert_eq!((c.finish, c.prompt_computed, c.prompt_cached), (RemoteFinish::Length, 1, 5));
        assert!(parse(&json!({"content": "x", "tokens": [], "stop_type": "weird"})).is_err());
    }

    #[test]
    fn constraints_become_grammars() {
        let s = SamplingParams::default();
        let wire = Wire::Regex("[ab]{2}".into());
        let req = Request { prompt: &[1, 2], max_tokens: 4, sampling: &s, stop: &[], constraint: Some(&wire), top_alternatives: 5 };
        let b = body(&req).unwrap();
        assert_eq!(b["grammar"], "root ::= ([a-b]){2}\n");
        assert_eq!(b["prompt"], json!([1, 2]));
        let wire = Wire::JsonSchema(json!({"type": "integer"}));
        let b = body(&Request { constraint: Some(&wire), ..req }).unwrap();
        assert_eq!(b["json_schema"], json!({"type": "integer"}));
        assert!(b.get("grammar").is_none());
    }
}
