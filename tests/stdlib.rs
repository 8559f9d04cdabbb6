//! The stdlib's regexes and grammars, run through the engine with inputs
//! that must match and inputs that must not.

use lmt::engine::{Constraint, Limits};
use lmt::syntax::ast::{ExprKind, Node};
use lmt::workspace::{FsLoader, Workspace};

fn module(name: &str) -> Workspace {
    let ws = Workspace::load_text("t.lmt", &format!("{{% import \"{name}\" as m %}}"), None, &FsLoader::default());
    assert!(ws.diagnostics.is_empty(), "{:?}", ws.diagnostics);
    ws
}

fn accepts(c: &Constraint, text: &str) -> bool {
    let mut m = c.matcher(&Limits::default());
    m.feed(text.as_bytes()).unwrap() && m.is_accepting()
}

/// The constraint of `{% set name = "regex" %}` or `{% grammar name %}` in a stdlib module.
fn constraint(ws: &Workspace, name: &str, rule: Option<&str>) -> Constraint {
    let m = ws.modules.iter().find(|m| ws.sources.get(m.file).name.starts_with("std/")).unwrap();
    for n in &m.template.body {
        match n {
            Node::Set { target, value, .. } if target.name.name == name => {
                if let ExprKind::Str(r) = &value.kind {
                    return Constraint::regex(r, &Limits::default()).unwrap();
                }
            }
            Node::Grammar(g) if g.name.name == name => {
                let start = rule.map(str::to_string).unwrap_or_else(|| lmt::check::start_rule(name, &g.grammar).unwrap());
                return Constraint::grammar(&g.grammar, &start, &Limits::default()).unwrap();
            }
            _ => {}
        }
    }
    panic!("no {name}");
}

#[test]
fn regexes() {
    let ws = module("std/regex");
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("integer", &["0", "-7", "2024"], &["", "01", "-", "1.5", "+3"]),
        ("number", &["0", "-1.25", "3e8", "6.02E-23"], &["1.", ".5", "01", "1e"]),
        ("date", &["2024-02-29", "1999-12-31"], &["2024-13-01", "2024-1-01", "24-01-01"]),
        ("time", &["23:59", "00:00:59"], &["24:00", "12:60", "1:00"]),
        ("email", &["ada@example.com", "a.b+c@x-y.co.uk"], &["ada@", "@x.com", "ada@example", "a b@x.com"]),
        ("url", &["https://example.com", "http://x.org:8080/a/b?c=d"], &["example.com", "ftp://x.org", "https://"]),
        ("uuid", &["123e4567-e89b-12d3-a456-426655440000"], &["123e4567e89b12d3a456426655440000", "XYZe4567-e89b-12d3-a456-426655440000"]),
        ("identifier", &["_x", "abc123"], &["1abc", "a-b", ""]),
        ("quoted", &["\"\"", "\"a \\\"b\\\"\""], &["\"a", "\"a\"b\""]),
        ("word", &["Hello"], &["two words", ""]),
        ("line", &["", "anything at all"], &["two\nlines"]),
    ];
    for (name, good, bad) in cases {
        let c = constraint(&ws, name, None);
        for g in *good {
            assert!(accepts(&c, g), "std/regex {name} should accept {g:?}");
        }
        for b in *bad {
            assert!(!accepts(&c, b), "std/regex {name} should refuse {b:?}");
        }
    }
}

#[test]
fn grammars() {
    let json = module("std/json");
    let value = constraint(&json, "json", None);
    for ok in ["{}", "[1, -2.5e3, true, null]", "{\"a\": {\"b\": [\"c\"]}}", "\"\\u00e9\""] {
        assert!(accepts(&value, ok), "std/json {ok}");
    }
    for bad in ["{", "[1,]", "01", "{'a': 1}", "nul"] {
        assert!(!accepts(&value, bad), "std/json {bad}");
    }
    let object = constraint(&json, "json", Some("object"));
    assert!(accepts(&object, "{\"k\": 1}") && !accepts(&object, "[1]"));

    let chess = module("std/chess");
    let san = constraint(&chess, "san", None);
    for ok in ["e4", "Nf3", "exd5", "O-O", "O-O-O", "Qh4#", "e8=Q+", "Nbd7", "R1a3"] {
        assert!(accepts(&san, ok), "std/chess {ok}");
    }
    for bad in ["e9", "Ni3", "O-O-O-O", "xe4", "e8=K", ""] {
        assert!(!accepts(&san, bad), "std/chess {bad}");
    }

    let chat = module("std/chat");
    let call = constraint(&chat, "tool_call", None);
    assert!(accepts(&call, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}"));
    assert!(accepts(&call, "{\"name\": \"now\", \"arguments\": {}}"));
    assert!(!accepts(&call, "{\"name\": \"9bad\", \"arguments\": {}}"));
    assert!(!accepts(&call, "{\"arguments\": {}, \"name\": \"x\"}"));
}
