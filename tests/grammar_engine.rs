//! The context-free engine: Earley over lexemes. Masks equal brute force
//! (feed each token's bytes), regular grammars agree with the DFA engine, and
//! random walks through a JSON grammar produce JSON.

mod common;

use std::sync::Arc;

use lmt::engine::{Cfg, Dfa, Limits, Parser, Tables, TokenMask, Vocab};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn grammar(src: &str, start: &str) -> Arc<Tables> {
    let mut diags = Vec::new();
    let g = lmt::syntax::gbnf::parse(src, 0, lmt::span::FileId(0), &mut diags);
    assert!(diags.is_empty(), "{diags:?}");
    Arc::new(Tables::new(Cfg::new(&lmt::engine::Grammar::from(&g), start, &Limits::default()).unwrap()))
}

fn accepts(t: &Arc<Tables>, text: &str) -> bool {
    let mut p = Parser::new(t.clone(), 100_000);
    p.feed(text.as_bytes()).unwrap() && p.is_accepting()
}

const JSON: &str = r#"root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]{0,3}
"#;

#[test]
fn recognises_json_and_rejects_near_misses() {
    let t = grammar(JSON, "root");
    for ok in ["{}", "[]", "{\"a\": [1, -2.5e3, true, null, \"x\\n\"]}", "[[[]]]", "\"\\u00e9\"", "0", "{\"k\":{\"k\":{}}}"] {
        assert!(accepts(&t, ok), "{ok}");
    }
    for bad in ["{", "[1,]", "01", "{\"a\" 1}", "\"\n\"", "tru", "[1 2]", "{}}"] {
        assert!(!accepts(&t, bad), "{bad}");
    }
}

#[test]
fn ambiguous_left_recursive_and_nullable_grammars() {
    let expr = grammar("root ::= e\ne ::= e \"+\" e | e \"*\" e | \"(\" e \")\" | [0-9]+\n", "root");
    for ok in ["1", "1+2*3", "((1))+2", "12+34+56"] {
        assert!(accepts(&expr, ok), "{ok}");
    }
    for bad in ["", "+1", "1+", "(1", "1++2"] {
        assert!(!accepts(&expr, bad), "{bad}");
    }
    let nullable = grammar("root ::= a a \"x\" a\na ::= \"\" | \"y\" | a a\n", "root");
    for ok in ["x", "yx", "yyxy", "yyyyyxyyy"] {
        assert!(accepts(&nullable, ok), "{ok}");
    }
    assert!(!accepts(&nullable, "xx"));
    // Lexeme boundaries stay ambiguous: `[a-z]+` then `[a-z0-9]*` then "!".
    let boundary = grammar("root ::= w rest\nw ::= [a-z]+ | w \"-\"\nrest ::= [a-z0-9]* \"!\"\n", "root");
    assert!(accepts(&boundary, "abc!") && accepts(&boundary, "ab9!") && accepts(&boundary, "a-b!"));
    assert!(!accepts(&boundary, "9!"));
}

fn brute_force(p: &mut Parser, v: &Vocab, n: usize) -> TokenMask {
    let mut m = TokenMask::new(n);
    let base = p.len();
    for id in 0..n as u32 {
        if v.is_generable(id) && p.feed(v.bytes(id)).unwrap() {
            m.set(id);
        }
        p.truncate(base);
    }
    if p.is_accepting() {
        v.eos().iter().for_each(|&e| m.set(e));
    }
    m
}

fn walk(t: &Arc<Tables>, v: &Vocab, choices: &[u32], what: &str) -> Vec<u8> {
    let n = v.len() + 3;
    let mut p = Parser::new(t.clone(), 100_000);
    let mut mask = TokenMask::new(n);
    let mut out = Vec::new();
    for &c in choices {
        p.mask(v, &mut mask).unwrap();
        assert_eq!(mask, brute_force(&mut p, v, n), "{what} after {:?}", String::from_utf8_lossy(&out));
        let allowed: Vec<u32> = mask.ones().filter(|&i| v.is_generable(i)).collect();
        if allowed.is_empty() {
            break;
        }
        let tok = allowed[c as usize % allowed.len()];
        assert!(p.feed(v.bytes(tok)).unwrap());
        out.extend_from_slice(v.bytes(tok));
    }
    out
}

fn small_vocabs() -> Vec<(String, Vocab)> {
    // Brute force feeds every token; keep to the smaller vocabularies.
    let mut out: Vec<(String, Vocab)> = common::real_tokenizers()
        .into_iter()
        .filter(|(n, _)| n == "gpt2" || n == "llama2")
        .map(|(n, d)| (n, Vocab::load(&d).unwrap().0))
        .collect();
    out.push(("trained".into(), Vocab::from_tokenizer(&common::trained_byte_level())));
    out
}

#[test]
fn json_grammar_masks_equal_brute_force_and_walks_end_in_json() {
    let t = grammar(JSON, "root");
    let mut runner = TestRunner::new(Config { cases: 6, ..Config::default() });
    for (name, v) in small_vocabs() {
        runner
            .run(&prop::collection::vec(any::<u32>(), 1..10), |choices| {
                let out = walk(&t, &v, &choices, &name);
                // Finish the value by closing brackets greedily is not needed:
                // every prefix the masks allowed is a JSON prefix.
                let text = String::from_utf8_lossy(&out).into_owned();
                let mut p = Parser::new(t.clone(), 100_000);
                assert!(p.feed(&out).unwrap(), "{name}: {text}");
                if p.is_accepting() {
                    // serde_json refuses numbers past f64 (`1e99999`), which
                    // are valid JSON text: only syntax errors count.
                    if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
                        assert!(e.to_string().contains("number out of range"), "{name}: {text}: {e}");
                    }
                }
                Ok(())
            })
            .unwrap();
    }
}

#[test]
fn regular_grammars_agree_with_the_dfa_engine() {
    let limits = Limits::default();
    let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
    let mut runner = TestRunner::new(Config { cases: 60, ..Config::default() });
    let atom = prop::sample::select(vec!["a", "b", "ab", " ", "[0-9]", "[a-z]", "[^a]", "\\.", "(x|yz)", "é"]);
    let quant = prop::sample::select(vec!["", "?", "*", "+", "{2}", "{1,3}"]);
    let regex = prop::collection::vec((atom, quant), 1..5).prop_map(|p| p.into_iter().map(|(a, q)| format!("(?:{a}){q}")).collect::<String>());
    runner
        .run(&(regex, prop::collection::vec(any::<u32>(), 1..5)), |(pattern, choices)| {
            let t = Arc::new(Tables::new(Cfg::from_regex(&pattern, &limits).unwrap()));
            let d = Dfa::regex(&pattern, &limits).unwrap();
            let mut p = Parser::new(t, 100_000);
            let mut s = d.start();
            let (mut a, mut b) = (TokenMask::new(vocab.len()), TokenMask::new(vocab.len()));
            for c in choices {
                p.mask(&vocab, &mut a).unwrap();
                d.mask(&vocab, s, &mut b);
                assert_eq!(a, b, "/{pattern}/");
                let allowed: Vec<u32> = a.ones().filter(|&i| vocab.is_generable(i)).collect();
                if allowed.is_empty() {
                    break;
                }
                let tok = allowed[c as usize % allowed.len()];
                assert!(p.feed(vocab.bytes(tok)).unwrap());
                s = d.feed(s, vocab.bytes(tok)).unwrap();
                assert_eq!(p.is_accepting(), d.is_accepting(s), "/{pattern}/");
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn forced_bytes_and_token_healing_on_both_engines() {
    use lmt::engine::Constraint;
    let limits = Limits::default();
    let vocab = Vocab::from_tokenizer(&common::trained_byte_level());
    let mut diags = Vec::new();
    let g = lmt::syntax::gbnf::parse("root ::= \"{\\\"name\\\": \" [a-z]+ \"}\"\n", 0, lmt::span::FileId(0), &mut diags);
    for c in [
        Constraint::regex("\\{\"name\": [a-z]+\\}", &limits).unwrap(),
        Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &limits).unwrap(),
    ] {
        let mut m = c.matcher(&limits);
        assert_eq!(m.forced_bytes(100).unwrap(), b"{\"name\": ", "forced text");
        assert_eq!(m.position(), 0, "forced_bytes consumes nothing");
    }
    // Healing: the prompt ended with `n` (backed out); the first token must
    // start with it, and the rest of it is the value's start.
    let g = lmt::syntax::gbnf::parse("root ::= [a-z]+ (\" \" [a-z]+)*\n", 0, lmt::span::FileId(0), &mut diags);
    for c in [Constraint::regex("[a-z]+( [a-z]+)*", &limits).unwrap(), Constraint::grammar(&lmt::engine::Grammar::from(&g), "root", &limits).unwrap()] {
        let mut m = c.matcher(&limits);
        let mut healed = TokenMask::new(vocab.len());
        m.mask_after_prefix(&vocab, b"n", &mut healed).unwrap();
        let want: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&t| {
                let b = vocab.bytes(t);
                vocab.is_generable(t) && b.starts_with(b"n") && m.clone().feed(&b[1..]).unwrap()
            })
            .collect();
        assert!(want.len() > 3, "{want:?}");
        assert_eq!(healed.ones().collect::<Vec<_>>(), want);
    }
}
