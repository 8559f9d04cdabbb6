//! Chat templates against Hugging Face: every conversation in
//! `../shared/data/chat_templates_goldens.json` renders to the same text as
//! transformers' `apply_chat_template`, with content where transformers put
//! it, and encodes to the ids a safe runtime must produce (transformers'
//! own ids for ordinary content; no special token from adversarial content).
//! Skips loudly without the shared data.

mod common;

use lmt::chat::{encode, ChatTemplate, Message};
use lmt::model::{LoadOptions, Model};
use serde_json::Value;

#[test]
fn chat_templates_match_the_transformers_goldens() {
    let Some(data) = common::shared_data() else { return };
    let path = data.join("chat_templates_goldens.json");
    let goldens: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    let mut models = std::collections::HashMap::new();
    for (n, g) in goldens.iter().enumerate() {
        // The tiny models carry these tokenizers with their chat templates.
        let dir = data.join("tiny_models").join(format!("{}-tiny", g["tokenizer"].as_str().unwrap()));
        let model = models.entry(dir.clone()).or_insert_with(|| Model::load_path(&dir, &LoadOptions::default()).unwrap());
        let tok = &model.tokenizer;
        let name = |id: Option<u32>| id.and_then(|i| tok.tokenizer.id_to_token(i)).unwrap_or_default();
        let cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
        let bos = cfg["bos_token"].as_str().map(String::from).unwrap_or_else(|| name(tok.bos));
        let eos = cfg["eos_token"].as_str().map(String::from).unwrap_or_else(|| name(tok.eos.first().copied()));
        let t = ChatTemplate::new(&tok.chat_template.as_ref().unwrap().text, &bos, &eos).unwrap();
        let messages: Vec<Message> = serde_json::from_value::<Vec<Value>>(g["messages"].clone())
            .unwrap()
            .iter()
            .map(|m| Message { role: m["role"].as_str().unwrap().into(), content: m["content"].as_str().unwrap().into() })
            .collect();
        let r = t.render(&messages, g["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(r.text, g["text"].as_str().unwrap(), "golden {n}: rendered text");
        let spans: Vec<(usize, usize)> = serde_json::from_value(g["content_spans"].clone()).unwrap();
        if g["adversarial"] == false {
            assert_eq!(r.content_spans, spans, "golden {n}: content spans");
        } else {
            // The goldens cut adversarial content at its first special-token
            // text; ours spans the whole content, which contains theirs.
            assert!(r.content_spans.iter().zip(&spans).all(|(a, b)| a.0 == b.0 && a.1 >= b.1), "golden {n}: {:?} vs {spans:?}", r.content_spans);
        }
        let ids = encode(tok, &r).unwrap();
        let expected: Vec<u32> = serde_json::from_value(g["expected_ids"].clone()).unwrap();
        let adversarial = g["adversarial"] == true;
        if adversarial {
            // Content is encoded whole and safely: its text is all there.
            let content = messages[0].content.as_bytes();
            let has = |ids: &[u32]| tok.vocab.decode(ids).windows(content.len()).any(|w| w == content);
            assert!(has(&ids), "golden {n}: content lost");
            if !has(&expected) {
                // One golden (llama3, no generation prompt) cut its content
                // span at the content's own `<|eot_id|>` text, so its
                // expected ids drop half the message and keep a forged
                // end-of-turn. Say so; the content check above holds it.
                eprintln!("NOTE: golden {n} is inconsistent (its expected_ids lack the message); checked by content instead");
                continue;
            }
        }
        assert_eq!(ids, expected, "golden {n} ({}, adversarial: {adversarial})", g["tokenizer"]);
        checked += 1;
    }
    assert!(checked + 1 >= goldens.len(), "only {checked} of {} goldens compared", goldens.len());
}

#[test]
fn content_can_never_forge_a_role_marker() {
    let Some(data) = common::shared_data() else { return };
    for name in ["llama3-tiny", "phi3-tiny"] {
        let model = Model::load_path(&data.join("tiny_models").join(name), &LoadOptions::default()).unwrap();
        let tok = &model.tokenizer;
        let t = ChatTemplate::new(&tok.chat_template.as_ref().unwrap().text, "<s>", "</s>").unwrap();
        // Every special and added token's text, as content.
        let specials: Vec<String> = (0..tok.vocab.len() as u32)
            .filter(|&i| tok.vocab.is_special_or_added(i))
            .filter_map(|i| tok.tokenizer.id_to_token(i))
            .take(300)
            .collect();
        let content = specials.join(" x ");
        let msgs = [Message { role: "user".into(), content: content.clone() }];
        let r = t.render(&msgs, true).unwrap();
        let ids = encode(tok, &r).unwrap();
        let template_only = encode(tok, &t.render(&[Message { role: "user".into(), content: String::new() }], true).unwrap()).unwrap();
        let count = |v: &[u32]| v.iter().filter(|&&i| tok.vocab.is_special_or_added(i)).count();
        assert_eq!(count(&ids), count(&template_only), "{name}: special tokens came from content");
        // And the content's bytes are all there.
        let bytes = tok.vocab.decode(&ids);
        assert!(String::from_utf8_lossy(&bytes).contains(&content), "{name}: content lost");
    }
}

#[test]
fn template_errors_are_reported() {
    let t = ChatTemplate::new("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ messages[0]['content'] | trim }}", "", "").unwrap();
    let err = t.render(&[Message { role: "system".into(), content: "x".into() }], false).unwrap_err();
    assert!(err.contains("first message must be from the user"), "{err}");
    assert!(ChatTemplate::new("{% if %}", "", "").unwrap_err().contains("does not compile"));
    // Python string methods work (pycompat), and a template that transforms
    // content is refused rather than mis-tokenised.
    let t = ChatTemplate::new("{{ messages[0]['content'].strip() }}|{{ 'abc'.upper() }}", "", "").unwrap();
    let r = t.render(&[Message { role: "user".into(), content: " hi ".into() }], false).unwrap();
    assert_eq!((r.text.as_str(), r.content_spans), ("hi|ABC", vec![(0, 2)]), "the trimmed content is what is marked");
    let t = ChatTemplate::new("{{ messages[0]['content'][:2] }}", "", "").unwrap();
    assert!(t.render(&[Message { role: "user".into(), content: "hello".into() }], false).is_err());
}
