//! GGUF tokenizer metadata written from a Hugging Face `tokenizer.json`
//! the way llama.cpp's converter (`convert_hf_to_gguf.py` with gguf-py's
//! vocab classes) writes it: token texts by id (holes as `[PAD{id}]`,
//! unused), token types (control for special added tokens, user-defined for
//! other added tokens, byte for `<0xNN>`), merges as `"left right"`, the
//! pre-tokenizer's name, special ids, `add_bos_token` and the chat template.
#![allow(dead_code)]

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as V};
use serde_json::Value;

/// How the vocabulary is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `gpt2` with this `tokenizer.ggml.pre`.
    Bpe(&'static str),
    /// `llama` with every score -1000, as gguf-py's `LlamaHfVocab` writes a
    /// tokenizer.json-only model (no `tokenizer.model`).
    SpmHf,
    /// `llama` with scores in the order of the tokenizer.json's merges
    /// (transformers wrote those merges from the `tokenizer.model` scores,
    /// best first), as `_set_vocab_sentencepiece` writes real ones.
    SpmScored,
}

/// The metadata entries for the tokenizer in `dir` (its `tokenizer.json`
/// and `tokenizer_config.json`).
pub fn metadata(dir: &Path, kind: Kind) -> Vec<(String, V)> {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
    let config: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    let size = vocab.values().chain(added.iter().map(|a| &a["id"])).map(|v| v.as_u64().unwrap() as usize + 1).max().unwrap();
    let mut tokens: Vec<Option<String>> = vec![None; size];
    let mut types = vec![1i32; size];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = Some(t.clone());
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        let content = a["content"].as_str().unwrap().to_string();
        let looks_special = content.starts_with('<') && content.ends_with('>') && content.len() > 2;
        types[id] = if a["special"] == true || looks_special { 3 } else { 4 };
        tokens[id] = Some(content);
    }
    let merges: Vec<(String, String)> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::String(s) => {
                let (a, b) = s.split_once(' ').unwrap();
                (a.to_string(), b.to_string())
            }
            Value::Array(p) => (p[0].as_str().unwrap().to_string(), p[1].as_str().unwrap().to_string()),
            _ => panic!("merge {m}"),
        })
        .collect();
    let mut rank: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, (a, b)) in merges.iter().enumerate() {
        rank.entry(format!("{a}{b}")).or_insert(i);
    }
    let mut scores = vec![0f32; size];
    for (id, t) in tokens.iter().enumerate() {
        let t = t.as_deref().unwrap_or("");
        if t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && matches!(kind, Kind::SpmHf | Kind::SpmScored) {
            types[id] = 6;
        }
        scores[id] = match kind {
            Kind::SpmHf => -1000.0,
            Kind::SpmScored if types[id] == 1 => rank.get(t).map_or(-1e9, |&r| -(r as f32)),
            _ => 0.0,
        };
    }
    let tokens: Vec<String> = tokens.into_iter().enumerate().map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]"))).collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.starts_with("[PAD") && !vocab.contains_key(t) {
            types[i] = 5;
        }
    }
    let id_of = |key: &str| -> Option<u32> {
        let v = &config[key];
        let name = v.as_str().or_else(|| v["content"].as_str())?;
        tokens.iter().position(|t| t == name).map(|i| i as u32)
    };
    // The converter names the model after its directory when nothing else says.
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut md: Vec<(String, V)> = vec![
        ("general.name".into(), V::String(name)),
        ("tokenizer.ggml.model".into(), V::String(if matches!(kind, Kind::Bpe(_)) { "gpt2" } else { "llama" }.into())),
        ("tokenizer.ggml.tokens".into(), V::Array(tokens.iter().cloned().map(V::String).collect())),
        ("tokenizer.ggml.token_type".into(), V::Array(types.iter().map(|&t| V::I32(t)).collect())),
    ];
    match kind {
        Kind::Bpe(pre) => {
            let merges = merges.iter().map(|(a, b)| V::String(format!("{a} {b}"))).collect();
            md.push(("tokenizer.ggml.merges".into(), V::Array(merges)));
            md.push(("tokenizer.ggml.pre".into(), V::String(pre.into())));
        }
        Kind::SpmHf | Kind::SpmScored => {
            md.push(("tokenizer.ggml.scores".into(), V::Array(scores.iter().map(|&s| V::F32(s)).collect())));
        }
    }
    for (key, name) in [("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"), ("unknown_token_id", "unk_token"), ("padding_token_id", "pad_token")] {
        if let Some(id) = id_of(name) {
            md.push((format!("tokenizer.ggml.{key}"), V::U32(id)));
        }
    }
    if let Some(b) = config["add_bos_token"].as_bool() {
        md.push(("tokenizer.ggml.add_bos_token".into(), V::Bool(b)));
    }
    if let Some(t) = config["chat_template"].as_str() {
        md.push(("tokenizer.chat_template".into(), V::String(t.into())));
    }
    md
}

/// Writes a vocabulary-only GGUF (as `convert_hf_to_gguf.py --vocab-only`),
/// with a tiny Llama's model keys so that llama.cpp loads it (vocab only).
pub fn write_vocab_only(dir: &Path, kind: Kind, out: &Path) {
    let mut md = metadata(dir, kind);
    md.push(("general.architecture".into(), V::String("llama".into())));
    for (k, v) in [("block_count", 1), ("context_length", 512), ("embedding_length", 64), ("feed_forward_length", 128), ("attention.head_count", 4), ("attention.head_count_kv", 4), ("rope.dimension_count", 16)] {
        md.push((format!("llama.{k}"), V::U32(v)));
    }
    md.push(("llama.attention.layer_norm_rms_epsilon".into(), V::F32(1e-5)));
    let refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut f, &refs, &[]).unwrap();
}
