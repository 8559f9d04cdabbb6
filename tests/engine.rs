//! The grammar engine on real tokenizers (and a trained one): exact token
//! bytes, and masks equal to a brute-force per-token check — no token allowed
//! that leads to a dead state, none forbidden that could still complete.

mod common;

use lmt::engine::{Dfa, Encoding, Limits, TokenKind, TokenMask, Vocab};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn vocabs() -> Vec<(String, Vocab, tokenizers::Tokenizer)> {
    let mut out: Vec<_> = common::real_tokenizers()
        .into_iter()
        .map(|(name, dir)| {
            let (v, t) = Vocab::load(&dir).unwrap();
            (name, v, t)
        })
        .collect();
    let trained = common::trained_byte_level();
    out.push(("trained".into(), Vocab::from_tokenizer(&trained), trained));
    out
}

#[test]
fn token_bytes_round_trip_real_text() {
    let texts = ["Hello, world!", "  two  spaces\n\tand tabs", "café naïve 日本語 😀🎉", "{\"a\": [1, 2.5e-3]}", "\u{1}\u{7f}"];
    for (name, vocab, tok) in vocabs() {
        for text in texts {
            let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
            let bytes = vocab.decode(&ids);
            // SentencePiece tokenizers prepend a space to every encode call.
            let expected = match vocab.encoding() {
                Encoding::SentencePiece => format!(" {text}"),
                _ => text.to_string(),
            };
            assert_eq!(String::from_utf8_lossy(&bytes), expected, "{name}: {text:?} -> {ids:?}");
        }
    }
}

#[test]
fn vocabularies_have_the_expected_shape() {
    for (name, v, _) in vocabs() {
        match name.as_str() {
            "gpt2" => {
                assert_eq!(v.encoding(), Encoding::ByteLevel);
                assert_eq!(v.len(), 50295);
                assert_eq!(v.kind(50256), TokenKind::Special);
                assert_eq!(v.kind(50257), TokenKind::Added, "phi-2's space runs are plain text");
                assert_eq!(v.eos(), &[50256]);
            }
            "llama2" => {
                assert_eq!(v.encoding(), Encoding::SentencePiece);
                assert_eq!(v.len(), 32000);
                // `<0x22>` and `"` are the same byte: both in the trie, one node.
                let quote: Vec<u32> = (0..v.len() as u32).filter(|&i| v.bytes(i) == b"\"").collect();
                assert!(quote.len() >= 2, "{quote:?}");
                assert_eq!(v.eos(), &[2]);
            }
            "phi3" => {
                assert_eq!(v.len(), 32011);
                assert_eq!(v.kind(32000), TokenKind::Special);
                assert_eq!(v.eos(), &[32000]);
            }
            "llama3" => {
                assert_eq!(v.len(), 128256);
                assert_eq!(v.kind(128009), TokenKind::Special);
                assert_eq!(v.eos(), &[128009], "<|eot_id|> from tokenizer_config.json");
                // Partial UTF-8 tokens exist and are kept as raw bytes.
                assert!((0..128000u32).any(|i| std::str::from_utf8(v.bytes(i)).is_err()));
            }
            _ => {
                assert_eq!(v.encoding(), Encoding::ByteLevel);
                assert!(v.eos().len() == 1);
            }
        }
        // Special tokens are never in the trie.
        let in_trie: std::collections::HashSet<u32> = v.trie().token_ids().iter().copied().collect();
        for id in 0..v.len() as u32 {
            assert_eq!(in_trie.contains(&id), v.is_generable(id), "{name} token {id}");
        }
    }
}

const REGEXES: &[&str] = &[
    "[12][0-9]{3}",
    "(yes|no|maybe)",
    "[a-z]+( [a-z]+)*\\.",
    "\\{\"name\": \"[A-Za-z ]{1,20}\", \"age\": (0|[1-9][0-9]?)\\}",
    "NONE|\\([^,()]+, [^,()]+, [^,()]+\\)(<\\|>\\([^,()]+, [^,()]+, [^,()]+\\))*",
    "[^\\n]*",
    "(?s:.{0,12})",
    "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?",
    "[\\p{Han}]{1,4}|😀+",
    " ?(e4|d4|Nf3|c4)",
    // String bodies: dense states that take a slice of the vocabulary
    // (all text; text of up to 16 bytes near the end of a count; plain
    // ASCII where one non-ASCII character is refused).
    "\"[^\"\\\\]*\"",
    "\"[^\"\\\\]{0,300}\", ?",
    "\"[^\"\\\\]{0,20}\"",
    "\"[^\"\\\\é]*\"",
];

fn brute_force(v: &Vocab, d: &Dfa, s: lmt::engine::DfaState, n_logits: usize) -> TokenMask {
    let mut m = TokenMask::new(n_logits);
    for id in 0..n_logits as u32 {
        if v.is_generable(id) && d.feed(s, v.bytes(id)).is_some() {
            m.set(id);
        }
    }
    if d.is_accepting(s) {
        v.eos().iter().for_each(|&e| m.set(e));
    }
    m
}

/// Walks a random path through `d` by sampling allowed tokens, checking the
/// mask against brute force at every step.
fn check_path(v: &Vocab, d: &Dfa, choices: &[u32], name: &str, pattern: &str) {
    let n_logits = v.len() + 7; // logit dimension past the vocabulary
    let mut s = d.start();
    let mut mask = TokenMask::new(n_logits);
    let mut path: Vec<u32> = Vec::new();
    for &c in choices {
        d.mask(v, s, &mut mask);
        let expected = brute_force(v, d, s, n_logits);
        assert_eq!(mask, expected, "{name}: /{pattern}/ after {:?} (tokens {path:?})", String::from_utf8_lossy(&v.decode(&path)));
        let allowed: Vec<u32> = mask.ones().filter(|t| v.is_generable(*t)).collect();
        if allowed.is_empty() {
            assert!(d.is_accepting(s), "{name}: /{pattern}/: nothing allowed in a non-accepting state");
            break;
        }
        let t = allowed[c as usize % allowed.len()];
        s = d.feed(s, v.bytes(t)).expect("allowed token keeps the match alive");
        path.push(t);
    }
}

#[test]
fn regex_masks_equal_brute_force() {
    let vocabs = vocabs();
    let limits = Limits::default();
    let dfas: Vec<(&str, Dfa)> = REGEXES.iter().map(|r| (*r, Dfa::regex(r, &limits).unwrap())).collect();
    let mut runner = TestRunner::new(Config { cases: 12, ..Config::default() });
    for (name, v, _) in &vocabs {
        for (pattern, d) in &dfas {
            runner
                .run(&prop::collection::vec(any::<u32>(), 1..6), |choices| {
                    check_path(v, d, &choices, name, pattern);
                    Ok(())
                })
                .unwrap();
        }
    }
}

/// Random regexes from a small grammar of pieces.
fn regex_strategy() -> impl Strategy<Value = String> {
    let atom = prop::sample::select(vec![
        "a", "b", "ab", " ", "[0-9]", "[a-z]", "[^a]", "\\.", "\"", "é", "😀", "(x|yz)", "[ -~]", "\\n", ".",
    ]);
    let quant = prop::sample::select(vec!["", "", "?", "*", "+", "{2}", "{1,3}"]);
    prop::collection::vec((atom, quant), 1..5).prop_map(|parts| parts.into_iter().map(|(a, q)| format!("(?:{a}){q}")).collect())
}

#[test]
fn random_regexes_and_choices_equal_brute_force() {
    let vocabs = vocabs();
    let limits = Limits::default();
    let mut runner = TestRunner::new(Config { cases: 40, ..Config::default() });
    for (name, v, _) in &vocabs {
        runner
            .run(&(regex_strategy(), prop::collection::vec(any::<u32>(), 1..5)), |(pattern, choices)| {
                let d = Dfa::regex(&pattern, &limits).unwrap();
                check_path(v, &d, &choices, name, &pattern);
                Ok(())
            })
            .unwrap();
        runner
            .run(
                &(prop::collection::vec("[a-c .{}\"é]{0,6}", 1..5), prop::collection::vec(any::<u32>(), 1..5)),
                |(options, choices)| {
                    let d = Dfa::choices(&options, &limits).unwrap();
                    check_path(v, &d, &choices, name, &format!("{options:?}"));
                    Ok(())
                },
            )
            .unwrap();
    }
}

/// A union with a longer mask keeps the shorter one's length: no id past
/// it is counted or listed.
#[test]
fn a_union_with_a_longer_mask_stays_within_its_length() {
    let mut long = TokenMask::new(200);
    [3, 69, 70, 150].into_iter().for_each(|t| long.set(t));
    let mut short = TokenMask::new(70);
    short.set(5);
    short.union_with(&long);
    assert_eq!(short.ones().collect::<Vec<_>>(), [3, 5, 69]);
    assert_eq!(short.count(), 3);
}
