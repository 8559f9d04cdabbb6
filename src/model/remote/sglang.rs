//! SGLang's native API: `/generate` with `input_ids`, constraints in
//! `sampling_params` (`regex`, `ebnf`, `json_schema`; choices as EBNF lmt
//! writes), token ids and log-probs from `meta_info.output_token_logprobs`;
//! options scored by `input_token_logprobs` (`return_logprob` from
//! `logprob_start_len`, no new tokens), every option in one request (a
//! batch of `input_ids`). Shapes are those of SGLang's `GenerateReqInput`
//! and its `meta_info`; the fixtures in `tests/data/remote/` are written
//! from them.

use serde_json::{json, Value};

use super::{Client, Completion, EngineKind, Remote, RemoteError, RemoteFinish, Request, Wire};

/// A connection to the server whose `/get_model_info` answered `info`.
pub fn from_model_info(client: Client, info: &Value) -> Remote {
    let path = info["model_path"].as_str();
    Remote {
        kind: EngineKind::Sglang,
        client,
        context_length: info["context_length"].as_u64().or(info["max_context_length"].as_u64()).map(|n| n as usize),
        model_file: path.map(std::path::PathBuf::from).filter(|p| p.exists()),
        model_id: path.map(str::to_string),
    }
}

/// Sends `req` to `/generate`.
pub fn complete(remote: &Remote, req: &Request<'_>) -> Result<Completion, RemoteError> {
    let resp = remote.client.post_json("/generate", &body(req))?;
    parse(&resp).map_err(|m| bad_shape(remote, &m))
}

/// Log-probabilities of each option's tokens after `prefix`, in one request.
pub fn score(remote: &Remote, prefix: &[u32], options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, RemoteError> {
    let resp = remote.client.post_json("/generate", &score_body(prefix, options))?;
    parse_scores(&resp, options).map_err(|m| bad_shape(remote, &m))
}

fn bad_shape(remote: &Remote, m: &str) -> RemoteError {
    RemoteError(format!("{}/generate answered in a shape lmt does not know: {m}", remote.client.base()))
}

/// The request body of a generation.
pub fn body(req: &Request<'_>) -> Value {
    let s = req.sampling;
    let mut params = json!({
        "max_new_tokens": req.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": super::top_k_or_none(s.top_k),
        "min_p": s.min_p,
        "sampling_seed": super::seed_63(s.seed),
        "stop": req.stop,
        "skip_special_tokens": false,
    });
    match req.constraint {
        None => {}
        Some(Wire::Regex(r)) => params["regex"] = json!(r),
        Some(Wire::Gbnf(g)) => params["ebnf"] = json!(g),
        Some(Wire::Choices(c)) => params["ebnf"] = json!(crate::engine::choices_gbnf(c)),
        // SGLang takes the schema as a JSON string.
        Some(Wire::JsonSchema(s)) => params["json_schema"] = json!(s.to_string()),
    }
    json!({
        "input_ids": req.prompt,
        "sampling_params": params,
        "return_logprob": true,
        "logprob_start_len": -1,
        "top_logprobs_num": req.top_alternatives,
    })
}

/// The request body that scores `options` after `prefix`.
pub fn score_body(prefix: &[u32], options: &[Vec<u32>]) -> Value {
    let inputs: Vec<Vec<u32>> = options.iter().map(|o| prefix.iter().chain(o).copied().collect()).collect();
    json!({
        "input_ids": inputs,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": true,
        "logprob_start_len": prefix.len(),
    })
}

/// Reads a generation's response.
pub fn parse(v: &Value) -> Result<Completion, String> {
    let text = v["text"].as_str().ok_or("no `text`")?.to_string();
    let meta = &v["meta_info"];
    let entries = meta["output_token_logprobs"].as_array().ok_or("no `meta_info.output_token_logprobs`")?;
    let mut tokens = Vec::with_capacity(entries.len());
    let mut logprobs = Vec::with_capacity(entries.len());
    for e in entries {
        let (lp, id) = triple(e)?;
        logprobs.push(lp.ok_or("an output token without a log-prob")?);
        tokens.push(id);
    }
    let top = meta["output_top_logprobs"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|alts| alts.as_array().map(Vec::as_slice).unwrap_or_default().iter().filter_map(|a| triple(a).ok()).filter_map(|(lp, id)| Some((id, lp?))).collect())
        .collect();
    let reason = &meta["finish_reason"];
    let finish = match (reason["type"].as_str(), &reason["matched"]) {
        (Some("length"), _) => RemoteFinish::Length,
        (Some("stop"), Value::String(s)) => RemoteFinish::Stop(s.clone()),
        // A stop token (EOS) or nothing named.
        (Some("stop"), _) => RemoteFinish::Eos,
        (other, _) => return Err(format!("`meta_info.finish_reason.type` {other:?}")),
    };
    // SGLang counts EOS among the output tokens but leaves it out of the text.
    let prompt = meta["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = meta["cached_tokens"].as_u64().unwrap_or(0);
    Ok(Completion { text, tokens, logprobs, top, finish, prompt_computed: prompt.saturating_sub(cached), prompt_cached: cached })
}

/// Reads the option scores from a batch of `input_token_logprobs`.
pub fn parse_scores(v: &Value, options: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, String> {
    let items = v.as_array().ok_or("not a list of results for a batch")?;
    if items.len() != options.len() {
        return Err(format!("{} results for {} prompts", items.len(), options.len()));
    }
    items
        .iter()
        .zip(options)
        .map(|(item, opt)| {
            let entries = item["meta_info"]["input_token_logprobs"].as_array().ok_or("no `input_token_logprobs`")?;
            // The option's tokens are the last ones scored.
            let from = entries.len().checked_sub(opt.len()).ok_or("fewer `input_token_logprobs` than option tokens")?;
            entries[from..]
                .iter()
                .zip(opt)
                .map(|(e, &want)| match triple(e)? {
                    (Some(lp), id) if id == want => Ok(lp),
                    (_, id) => Err(format!("a log-prob for token {id} where the option has {want}")),
                })
                .collect()
        })
        .collect()
}

/// `[logprob, token_id, text]`.
fn triple(e: &Value) -> Result<(Option<f32>, u32), String> {
    let id = e[1].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("{e} is not [logprob, token id, text]"))?;
    Ok((e[0].as_f64().map(|x| x as f32), id))
}
