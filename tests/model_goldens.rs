//! The tiny random models Hugging Face transformers saved (in
//! `../shared/data/tiny_models`) load from their directories through lmt's
//! loader and reproduce what transformers computed: top-20 logits, argmax,
//! logit sums, and the greedy continuation. Skips loudly without the data.

mod common;

use std::path::PathBuf;

use lmt::model::{log_softmax, LoadOptions, Model, ModelConfig};
use serde_json::Value;

const MODELS: [&str; 5] = ["llama3-tiny", "mistral-tiny", "phi3-tiny", "qwen2-tiny", "qwen3-tiny"];

fn model_dirs() -> Vec<(String, PathBuf)> {
    common::shared_dirs("tiny_models", &MODELS, "goldens.json")
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |b, (i, &x)| if x > v[b] { i } else { b })
}

#[test]
fn tiny_models_match_the_transformers_goldens() {
    let dirs = model_dirs();
    if dirs.is_empty() {
        return;
    }
    for (name, dir) in dirs {
        let model = Model::load_path(&dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let m = &model.decoder;
        let goldens: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
        for g in goldens["goldens"].as_array().unwrap() {
            let text = g["text"].as_str().unwrap();
            let ids: Vec<u32> = g["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let mut st = m.new_state();
            let logits = m.append(&mut st, &ids).unwrap();
            assert_eq!(logits.len(), m.config.vocab_size, "{name}: logit dimension");
            let top_ids = g["last_logits_top20_ids"].as_array().unwrap();
            let top_vals = g["last_logits_top20_values"].as_array().unwrap();
            for (id, val) in top_ids.iter().zip(top_vals) {
                let (id, val) = (id.as_u64().unwrap() as usize, val.as_f64().unwrap() as f32);
                let d = (logits[id] - val).abs();
                assert!(d < 1e-4, "{name} {text:?}: logit of {id} is {} not {val} (diff {d})", logits[id]);
            }
            assert_eq!(argmax(&logits) as u64, g["argmax"].as_u64().unwrap(), "{name} {text:?}: argmax");
            let sum: f64 = logits.iter().map(|&v| v as f64).sum();
            let sum_sq: f64 = logits.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let (gs, gsq) = (g["sum"].as_f64().unwrap(), g["sum_sq"].as_f64().unwrap());
            assert!((sum - gs).abs() < 1e-5 * logits.len() as f64, "{name} {text:?}: sum {sum} vs {gs}");
            assert!((sum_sq - gsq).abs() < 1e-4 * gsq.abs().max(1.0), "{name} {text:?}: sum of squares {sum_sq} vs {gsq}");
            // Greedy continuation: our argmax must be transformers' token on
            // every step whose recorded margin is clear of float rounding;
            // feeding transformers' tokens keeps later steps comparable.
            let greedy: Vec<u32> = g["greedy_16"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let margins: Vec<f64> = g["greedy_margins"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let mut logits = logits;
            let mut checked = 0;
            for (step, (&tok, &margin)) in greedy.iter().zip(&margins).enumerate() {
                if margin > 1e-3 {
                    assert_eq!(argmax(&logits) as u32, tok, "{name} {text:?}: greedy step {step} (margin {margin})");
                    checked += 1;
                }
                logits = m.append(&mut st, &[tok]).unwrap();
            }
            assert!(checked >= 12, "{name}: only {checked} clear greedy steps");
        }
    }
}

#[test]
fn both_config_forms_read_the_same() {
    for (name, dir) in model_dirs() {
        let old = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
        let new = ModelConfig::from_hf_file(&dir.join("config.transformers5.json")).unwrap();
        assert_eq!(old, new, "{name}: config.json and the transformers 5 form differ");
    }
}

#[test]
fn special_ids_come_from_the_configs() {
    for (name, dir) in model_dirs() {
        let model = Model::load_path(&dir, &LoadOptions::default()).unwrap();
        let t = &model.tokenizer;
        let id = |s: &str| t.tokenizer.token_to_id(s).unwrap();
        let (bos, eos, eot) = match name.as_str() {
            // transformers adds no BOS here: this tokenizer.json's
            // post-processor (converted from tiktoken) has no template.
            "llama3-tiny" => (None, id("<|eot_id|>"), id("<|eot_id|>")),
            "mistral-tiny" => (Some(id("<s>")), id("</s>"), id("</s>")),
            // Phi-3's tokenizer_config says add_bos_token: false.
            "phi3-tiny" => (None, id("<|endoftext|>"), id("<|end|>")),
            // Qwen's <|endoftext|> is EOS, not a BOS.
            _ => (None, id("<|endoftext|>"), id("<|endoftext|>")),
        };
        assert_eq!(t.bos, bos, "{name}: BOS");
        assert!(t.eos.contains(&eos), "{name}: EOS {eos} not in {:?}", t.eos);
        assert!(t.eot.contains(&eot), "{name}: end of turn {eot} not in {:?}", t.eot);
        assert_eq!(t.vocab.eos(), &t.eos[..], "{name}: the engine's EOS is the model's");
        assert_eq!(t.chat_template.is_some(), matches!(name.as_str(), "llama3-tiny" | "phi3-tiny"), "{name}: chat template");
        // The logit dimension can exceed the tokenizer's vocabulary.
        assert!(model.decoder.config.vocab_size >= t.vocab.len(), "{name}");
        // A prompt's log-probs are proper.
        let mut st = model.decoder.new_state();
        let lp = log_softmax(&model.decoder.append(&mut st, &[bos.unwrap_or(eos), 100, 200]).unwrap());
        let total: f64 = lp.iter().map(|&v| (v as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-4, "{name}: probabilities sum to {total}");
    }
}
