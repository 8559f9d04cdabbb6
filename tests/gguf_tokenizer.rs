//! Tokenizers read from GGUF metadata against independent references:
//! llama.cpp's own tokenization of the real SmolLM2 GGUF
//! (`../shared/data/smollm2/llamacpp_q4_1.json`) and of SentencePiece GGUFs
//! made from the shared tokenizers (`tests/data/llamacpp_spm_goldens.json`,
//! written by llama.cpp's `goldens` harness on exactly the files the helper
//! writes); Hugging Face's `tokenizer.json` for byte-level BPE GGUFs and for
//! SentencePiece GGUFs with real scores; transformers' chat goldens through
//! a GGUF's own chat template.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use common::gguf_vocab::{self, Kind};
use lmt::chat::{encode, ChatTemplate, Message};
use lmt::model::{LoadOptions, Model};
use lmt::model::tokenizer::{GgufVocab, ModelTokenizer, TextEncoder};
use serde_json::Value;

fn read_gguf_tokenizer(path: &Path) -> ModelTokenizer {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let v = GgufVocab::read(&content).unwrap().expect("a tokenizer in the GGUF");
    ModelTokenizer::from_gguf(&v, path).unwrap()
}

/// Texts that exercise the pre-tokenizers: digits, contractions, runs of
/// spaces and newlines, non-Latin scripts, emoji, code.
const CORPUS: &[&str] = &[
    "Hello world",
    "The capital of France is Paris. It's 2024 and we'll see 1234567 things.",
    "  leading spaces and trailing   ",
    "Tabs\tand\nnewlines\n\n\nmany\r\n",
    "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
    "日本語のテキスト 😀 and a URL: http://example.com/path?q=1&b=2",
    "Ünïcödé àccents — em dash … ellipsis «quotes» I'M YOU'RE",
    "{\"name\": \"Ada\", \"age\": 36, \"tags\": [\"math\", \"poetry\"]}",
    "3.14159 -42 1e10 0x1F 100,000,000",
    "a",
    " ",
    "",
];

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lmt-gguf-tok-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_smollm2_gguf_tokenizes_as_llama_cpp() {
    let (Some(gguf), Some(data)) = (common::smollm2_gguf(), common::shared_data()) else { return };
    let tok = read_gguf_tokenizer(&gguf);
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(data.join("smollm2/llamacpp_q4_1.json")).unwrap()).unwrap();
    let mut n = 0;
    for case in golden["tokenization"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.encoder.encode(text).unwrap(), want, "{text:?}");
        n += 1;
    }
    assert!(n >= 10, "only {n} texts");
    // Plain prompts start as llama.cpp's: no BOS (add_bos_token is false).
    assert_eq!(tok.bos, None);
    assert_eq!(tok.bos_token, Some(1), "the named BOS stays known to chat templates");
    for case in golden["greedy"].as_array().unwrap() {
        let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let mut ids: Vec<u32> = tok.bos.into_iter().collect();
        ids.extend(tok.encoder.encode(case["prompt"].as_str().unwrap()).unwrap());
        assert_eq!(ids, want);
    }
    assert_eq!(tok.eos, [2], "<|im_end|> ends generation");
    assert!(tok.eot.contains(&2));
    let ct = tok.chat_template.as_ref().expect("the GGUF's chat template");
    assert!(ct.text.contains("<|im_start|>") && ct.origin.contains("tokenizer.chat_template"), "{}", ct.origin);
}

#[test]
fn byte_level_ggufs_tokenize_as_their_tokenizer_json() {
    for (name, dir, pre) in [("llama3", "llama3", "llama-bpe"), ("gpt2", "gpt2", "gpt-2")] {
        let Some((_, dir)) = common::real_tokenizers().into_iter().find(|(n, _)| n == dir) else { continue };
        let out = temp(name).join("vocab.gguf");
        gguf_vocab::write_vocab_only(&dir, Kind::Bpe(pre), &out);
        let gguf = read_gguf_tokenizer(&out);
        let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let reference = TextEncoder::new(&hf);
        assert_eq!(gguf.vocab.len(), hf.get_vocab_size(true), "{name}: vocabulary");
        let hf_vocab = lmt::engine::Vocab::from_tokenizer(&hf);
        for id in 0..gguf.vocab.len() as u32 {
            assert_eq!(gguf.vocab.bytes(id), hf_vocab.bytes(id), "{name}: bytes of {id}");
            assert_eq!(gguf.vocab.kind(id), hf_vocab.kind(id), "{name}: kind of {id}");
        }
        for text in CORPUS {
            assert_eq!(gguf.encoder.encode(text).unwrap(), reference.encode(text).unwrap(), "{name}: {text:?}");
            // Template text: special tokens written in it are those tokens.
            let templ = format!("{}{text}{}", special(&hf, 0), special(&hf, 1));
            let want: Vec<u32> = hf.encode(templ.as_str(), false).unwrap().get_ids().to_vec();
            let got: Vec<u32> = gguf.encoder.encode_template(&templ).unwrap().into_iter().map(|p| p.0).collect();
            assert_eq!(got, want, "{name}: template {templ:?}");
        }
        std::fs::remove_dir_all(out.parent().unwrap()).ok();
    }
}

/// The text of the `i`-th special added token.
fn special(tok: &tokenizers::Tokenizer, i: usize) -> String {
    let mut specials: Vec<(u32, String)> =
        tok.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, t)| (id, t.content)).collect();
    specials.sort();
    specials[i % specials.len()].1.clone()
}

#[test]
fn sentencepiece_ggufs_with_real_scores_tokenize_as_their_tokenizer_json() {
    for (name, dir) in common::real_tokenizers().into_iter().filter(|(n, _)| n == "llama2" || n == "phi3") {
        let out = temp(&format!("{name}-scored")).join("vocab.gguf");
        gguf_vocab::write_vocab_only(&dir, Kind::SpmScored, &out);
        let gguf = read_gguf_tokenizer(&out);
        let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let reference = TextEncoder::new(&hf);
        for text in CORPUS {
            assert_eq!(gguf.encoder.encode(text).unwrap(), reference.encode(text).unwrap(), "{name}: {text:?}");
            assert_eq!(gguf.encoder.encode_split(text).unwrap(), reference.encode_split(text).unwrap(), "{name}: {text:?} with prefix");
        }
        std::fs::remove_dir_all(out.parent().unwrap()).ok();
    }
}

#[test]
fn sentencepiece_ggufs_without_scores_tokenize_as_llama_cpp() {
    let golden: Value = serde_json::from_str(include_str!("data/llamacpp_spm_goldens.json")).unwrap();
    let mut checked = 0;
    for (name, dir) in common::real_tokenizers().into_iter().filter(|(n, _)| n == "llama2" || n == "phi3") {
        let out = temp(&format!("{name}-hf")).join("vocab.gguf");
        gguf_vocab::write_vocab_only(&dir, Kind::SpmHf, &out);
        // Where the goldens' files were written for llama.cpp to read.
        if let Some(keep) = std::env::var_os("LMT_KEEP_GGUF_FIXTURES") {
            std::fs::copy(&out, Path::new(&keep).join(format!("{name}-spm-hf.gguf"))).unwrap();
        }
        let gguf = read_gguf_tokenizer(&out);
        let cases = golden[name.as_str()]["tokenization"].as_array().unwrap();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            // llama.cpp writes the prefix space at the start of a text.
            assert_eq!(gguf.encoder.encode_split(text).unwrap(), want, "{name}: {text:?}");
            checked += 1;
        }
        std::fs::remove_dir_all(out.parent().unwrap()).ok();
    }
    if checked == 0 {
        common::skip("no SentencePiece tokenizer in the shared data");
    }
}

#[test]
fn gguf_chat_templates_render_the_transformers_goldens() {
    let Some(data) = common::shared_data() else { return };
    let goldens: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(data.join("chat_templates_goldens.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (tokenizer, kind) in [("llama3", Kind::Bpe("llama-bpe")), ("phi3", Kind::SpmScored)] {
        let dir = data.join("tokenizers").join(tokenizer);
        let out = temp(&format!("{tokenizer}-chat")).join("vocab.gguf");
        gguf_vocab::write_vocab_only(&dir, kind, &out);
        let tok = read_gguf_tokenizer(&out);
        let ct = tok.chat_template.as_ref().expect("the chat template from the GGUF");
        let name = |id: Option<u32>| id.map(|i| String::from_utf8_lossy(tok.vocab.bytes(i)).into_owned()).unwrap_or_default();
        let t = ChatTemplate::new(&ct.text, &name(tok.bos_token), &name(tok.eos.first().copied())).unwrap();
        for g in goldens.iter().filter(|g| g["tokenizer"] == tokenizer && g["adversarial"] == false) {
            let messages: Vec<Message> = g["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| Message { role: m["role"].as_str().unwrap().into(), content: m["content"].as_str().unwrap().into() })
                .collect();
            let r = t.render(&messages, g["add_generation_prompt"].as_bool().unwrap()).unwrap();
            assert_eq!(r.text, g["text"].as_str().unwrap(), "{tokenizer}: text");
            let expected: Vec<u32> = serde_json::from_value(g["expected_ids"].clone()).unwrap();
            assert_eq!(encode(&tok, &r).unwrap(), expected, "{tokenizer}: {:?}", r.text);
            checked += 1;
        }
        std::fs::remove_dir_all(out.parent().unwrap()).ok();
    }
    assert!(checked >= 3, "only {checked} goldens compared");
}

#[test]
fn broken_gguf_tokenizers_are_named_errors() {
    let Some((_, dir)) = common::real_tokenizers().into_iter().find(|(n, _)| n == "gpt2") else { return };
    let good = gguf_vocab::metadata(&dir, Kind::Bpe("gpt-2"));
    let cases: Vec<(&str, Box<dyn Fn(&mut Vec<(String, gguf_file::Value)>)>)> = vec![
        ("tokenizer.ggml.pre", Box::new(|md| set(md, "tokenizer.ggml.pre", gguf_file::Value::String("no-such-pre".into())))),
        ("tokenizer.ggml.model", Box::new(|md| set(md, "tokenizer.ggml.model", gguf_file::Value::String("wordpiece".into())))),
        ("tokenizer.ggml.tokens", Box::new(|md| set(md, "tokenizer.ggml.tokens", gguf_file::Value::U32(7)))),
        ("tokenizer.ggml.token_type", Box::new(|md| set(md, "tokenizer.ggml.token_type", gguf_file::Value::Array(vec![gguf_file::Value::I32(1)])))),
        ("tokenizer.ggml.merges", Box::new(|md| set(md, "tokenizer.ggml.merges", gguf_file::Value::Array(vec![gguf_file::Value::String("nospace".into())])))),
        ("tokenizer.ggml.eos_token_id", Box::new(|md| set(md, "tokenizer.ggml.eos_token_id", gguf_file::Value::U32(9_999_999)))),
        ("tokenizer.ggml.add_bos_token", Box::new(|md| set(md, "tokenizer.ggml.add_bos_token", gguf_file::Value::String("yes".into())))),
    ];
    for (key, corrupt) in cases {
        let mut md = good.clone();
        corrupt(&mut md);
        let content = content_of(&md);
        let err = GgufVocab::read(&content).and_then(|v| v.expect("a tokenizer").build().map(|_| ()));
        let msg = err.expect_err(key).to_string();
        assert!(msg.contains(key) && msg.contains("--tokenizer"), "{key}: {msg}");
    }
}

fn set(md: &mut Vec<(String, gguf_file::Value)>, key: &str, v: gguf_file::Value) {
    md.retain(|(k, _)| k != key);
    md.push((key.to_string(), v));
}

/// The metadata as a GGUF reader sees it (written and read back).
fn content_of(md: &[(String, gguf_file::Value)]) -> gguf_file::Content {
    let refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut buf = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut buf, &refs, &[]).unwrap();
    buf.set_position(0);
    gguf_file::Content::read(&mut buf).unwrap()
}

#[test]
fn a_directory_with_a_gguf_and_a_hub_tokenizer_renders_the_chat_goldens() {
    let (Some(gguf), Some(data)) = (common::smollm2_gguf(), common::shared_data()) else { return };
    let dir = temp("smollm2-dir");
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        std::fs::copy(data.join("smollm2").join(f), dir.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(&gguf, dir.join("model.gguf")).unwrap();
    let goldens: Value = serde_json::from_str(&std::fs::read_to_string(data.join("smollm2/chat_goldens.json")).unwrap()).unwrap();
    let by_dir = Model::load_path(&dir, &LoadOptions::default()).unwrap();
    let by_flag = Model::load_path(&gguf, &LoadOptions { tokenizer: Some(dir.clone()), ..LoadOptions::default() }).unwrap();
    for model in [&by_dir, &by_flag] {
        let tok = &model.tokenizer;
        let ct = tok.chat_template.as_ref().unwrap();
        assert!(ct.origin.ends_with("chat_template.jinja"), "{}", ct.origin);
        assert_eq!(tok.bos, None, "transformers adds no BOS for SmolLM2");
        let t = ChatTemplate::new(&ct.text, "<|im_start|>", "<|im_end|>").unwrap();
        let mut checked = 0;
        for (i, c) in goldens["conversations"].as_array().unwrap().iter().enumerate() {
            if ![1, 2, 3, 5].contains(&(i + 1)) {
                continue;
            }
            let messages: Vec<Message> = serde_json::from_value::<Vec<Value>>(c["messages"].clone())
                .unwrap()
                .iter()
                .map(|m| Message { role: m["role"].as_str().unwrap().into(), content: m["content"].as_str().unwrap().into() })
                .collect();
            let r = t.render(&messages, c["add_generation_prompt"].as_bool().unwrap_or(false)).unwrap();
            assert_eq!(r.text, c["text"].as_str().unwrap(), "conversation {}", i + 1);
            let want: Vec<u32> = serde_json::from_value(c["hf_ids"].clone()).unwrap();
            assert_eq!(encode(tok, &r).unwrap(), want, "conversation {}", i + 1);
            checked += 1;
        }
        assert_eq!(checked, 4);
    }
    std::fs::remove_dir_all(&dir).ok();
}
