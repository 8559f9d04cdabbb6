//! The vLLM and SGLang adapters against the request and response shapes of
//! those engines' APIs (fixtures in `tests/data/remote/`, written from their
//! documentation and schemas): lmt writes exactly these requests and reads
//! these responses. A live server of either kind is not at hand here; the
//! same adapters then run a template end to end against a stand-in that
//! answers in these shapes (`tests/remote.rs` drives a real llama-server).

use lmt::model::remote::{sglang, vllm, Completion, RemoteFinish, Request, Wire};
use lmt::model::SamplingParams;
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/data/remote/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn greedy() -> SamplingParams {
    SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 42, ..SamplingParams::default() }
}

const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314];

#[test]
fn vllm_requests_and_responses() {
    let s = greedy();
    let stop = ["\n".to_string()];
    let wire = Wire::Regex("[A-Z][a-z]+".into());
    let req = Request { prompt: &PROMPT, max_tokens: 8, sampling: &s, stop: &stop, constraint: Some(&wire), top_alternatives: 5 };
    let models = fixture("vllm_models.json");
    let model = models["data"][0]["id"].as_str();
    assert_eq!(vllm::body(model, &req), fixture("vllm_completion_request.json"));
    let c: Completion = vllm::parse(&fixture("vllm_completion_response.json")).unwrap();
    assert_eq!((c.text.as_str(), c.tokens.as_slice(), c.finish.clone()), (" Paris", &[7042u32][..], RemoteFinish::Eos));
    assert_eq!((c.prompt_computed, c.prompt_cached), (2, 3));
    assert!((c.logprobs[0] + 0.2634).abs() < 1e-6);
    // Each constraint in its `structured_outputs` key.
    for (w, key) in [
        (Wire::Gbnf("root ::= \"a\"\n".into()), "grammar"),
        (Wire::JsonSchema(serde_json::json!({"type": "integer"})), "json"),
        (Wire::Choices(vec!["a".into(), "b".into()]), "choice"),
    ] {
        let b = vllm::body(model, &Request { constraint: Some(&w), ..req.clone() });
        assert_eq!(b["structured_outputs"].as_object().unwrap().keys().collect::<Vec<_>>(), vec![key]);
    }
    // Options scored in one request; answers in any order, found by index.
    let options = vec![vec![260, 1099], vec![7042]];
    let b = vllm::score_body(model, &[504, 3575], &options);
    assert_eq!(b["prompt"], serde_json::json!([[504, 3575, 260, 1099], [504, 3575, 7042]]));
    assert_eq!(b["prompt_logprobs"], 0);
    let scores = vllm::parse_scores(&fixture("vllm_score_response.json"), 2, &options).unwrap();
    assert_eq!(scores, vec![vec![-0.5, -3.25], vec![-1.75]]);
    // A response without the generated ids is refused, not guessed.
    let mut old = fixture("vllm_completion_response.json");
    old["choices"][0].as_object_mut().unwrap().remove("token_ids");
    assert!(vllm::parse(&old).unwrap_err().contains("token_ids"));
}

#[test]
fn sglang_requests_and_responses() {
    let s = greedy();
    let stop = ["\n".to_string()];
    let wire = Wire::JsonSchema(serde_json::json!({"type": "string"}));
    let req = Request { prompt: &PROMPT, max_tokens: 8, sampling: &s, stop: &stop, constraint: Some(&wire), top_alternatives: 5 };
    assert_eq!(sglang::body(&req), fixture("sglang_generate_request.json"));
    let c = sglang::parse(&fixture("sglang_generate_response.json")).unwrap();
    // EOS is among the output tokens (lmt stops its value there).
    assert_eq!((c.text.as_str(), c.tokens.as_slice(), c.finish.clone()), (" Paris", &[7042u32, 2][..], RemoteFinish::Eos));
    assert_eq!((c.prompt_computed, c.prompt_cached), (1, 4));
    assert_eq!(c.top[0], vec![(7042, -0.2634), (260, -2.1)]);
    for (w, key) in [(Wire::Regex("a+".into()), "regex"), (Wire::Gbnf("root ::= \"a\"\n".into()), "ebnf"), (Wire::Choices(vec!["a".into()]), "ebnf")] {
        let b = sglang::body(&Request { constraint: Some(&w), ..req.clone() });
        assert!(b["sampling_params"].get(key).is_some(), "{key}: {b}");
    }
    let options = vec![vec![260, 1099], vec![7042]];
    let b = sglang::score_body(&[504, 3575], &options);
    assert_eq!((b["logprob_start_len"].as_u64(), b["sampling_params"]["max_new_tokens"].as_u64()), (Some(2), Some(0)));
    let scores = sglang::parse_scores(&fixture("sglang_score_response.json"), &options).unwrap();
    assert_eq!(scores, vec![vec![-0.5, -3.25], vec![-1.75]]);
    // Log-probs of other tokens than the option's are an error.
    assert!(sglang::parse_scores(&fixture("sglang_score_response.json"), &[vec![260, 1], vec![7042]]).is_err());
}
