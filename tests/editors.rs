//! The VS Code extension in `editors/vscode`: its manifest is valid and
//! points at files that exist, its TextMate grammar's regexes compile and
//! give the expected scopes on a sample (run by a small TextMate
//! interpreter here), and its keywords are the language server's.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use fancy_regex::Regex;
use serde_json::Value;

fn ext_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("editors/vscode")
}

fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()))
}

#[test]
fn the_extension_manifest_is_valid_and_complete() {
    let dir = ext_dir();
    let pkg = read_json(&dir.join("package.json"));
    for key in ["name", "version", "publisher", "main"] {
        assert!(pkg[key].is_string(), "package.json needs `{key}`");
    }
    assert!(pkg["engines"]["vscode"].as_str().unwrap().starts_with('^'));
    assert!(dir.join(pkg["main"].as_str().unwrap()).is_file(), "main script exists");
    assert!(pkg["activationEvents"].as_array().unwrap().contains(&Value::from("onLanguage:lmt")));
    assert!(pkg["dependencies"]["vscode-languageclient"].is_string());
    let lang = &pkg["contributes"]["languages"][0];
    assert_eq!(lang["id"], "lmt");
    assert!(lang["extensions"].as_array().unwrap().contains(&Value::from(".lmt")));
    let conf = read_json(&dir.join(lang["configuration"].as_str().unwrap()));
    assert_eq!(conf["comments"]["blockComment"], serde_json::json!(["{#", "#}"]));
    let grammar = &pkg["contributes"]["grammars"][0];
    assert_eq!(grammar["language"], "lmt");
    let tm = read_json(&dir.join(grammar["path"].as_str().unwrap()));
    assert_eq!(tm["scopeName"], grammar["scopeName"]);
    // The client starts the server this binary provides.
    let js = std::fs::read_to_string(dir.join("extension.js")).unwrap();
    assert!(js.contains("args: [\"lsp\"]"));
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_lmt")).args(["lsp", "--help"]).output().unwrap();
    assert!(help.status.success());
}

/// A rule of a TextMate grammar.
struct Rule {
    name: Option<String>,
    matcher: Option<Regex>,
    begin: Option<Regex>,
    end: Option<String>,
    captures: HashMap<usize, String>,
    patterns: Vec<Value>,
}

struct Grammar {
    repo: HashMap<String, Value>,
    top: Vec<Value>,
}

fn captures(v: &Value) -> HashMap<usize, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, c)| (k.parse().unwrap(), c["name"].as_str().unwrap().to_string()))
        .collect()
}

impl Grammar {
    fn load() -> Grammar {
        let tm = read_json(&ext_dir().join("syntaxes/lmt.tmLanguage.json"));
        let repo = tm["repository"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Grammar { repo, top: tm["patterns"].as_array().unwrap().clone() }
    }

    /// Patterns with `include`s and pattern groups resolved, in order.
    fn flatten(&self, pats: &[Value]) -> Vec<Rule> {
        let mut out = Vec::new();
        for p in pats {
            if let Some(inc) = p["include"].as_str() {
                let target = self.repo.get(inc.trim_start_matches('#')).unwrap_or_else(|| panic!("unknown include {inc}"));
                out.extend(self.flatten(std::slice::from_ref(target)));
            } else if p["match"].is_null() && p["begin"].is_null() {
                out.extend(self.flatten(p["patterns"].as_array().unwrap()));
            } else {
                let re = |k: &str| p[k].as_str().map(|s| Regex::new(s).unwrap_or_else(|e| panic!("{k} {s:?}: {e}")));
                let mut caps = captures(&p["captures"]);
                caps.extend(captures(&p["beginCaptures"]));
                out.push(Rule {
                    name: p["name"].as_str().map(String::from),
                    matcher: re("match"),
                    begin: re("begin"),
                    end: p["end"].as_str().map(String::from),
                    captures: caps,
                    patterns: p["patterns"].as_array().cloned().unwrap_or_default(),
                });
            }
        }
        out
    }

    /// The scopes of every byte of `text`.
    fn scopes(&self, text: &str) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); text.len()];
        let top = self.flatten(&self.top);
        self.run(text, 0, &top, None, &[], &mut out);
        out
    }

    fn run(&self, text: &str, mut pos: usize, rules: &[Rule], end: Option<&Regex>, stack: &[String], out: &mut [Vec<String>]) -> usize {
        let paint = |out: &mut [Vec<String>], a: usize, b: usize, scopes: &[String]| {
            for s in &mut out[a..b] {
                *s = scopes.to_vec();
            }
        };
        while pos < text.len() {
            // The earliest match wins; the end pattern first on a tie.
            let mut best: Option<(usize, usize, Option<usize>)> = None;
            if let Some(e) = end {
                if let Ok(Some(m)) = e.find_from_pos(text, pos) {
                    best = Some((m.start(), m.end(), None));
                }
            }
            for (i, r) in rules.iter().enumerate() {
                let re = r.matcher.as_ref().or(r.begin.as_ref()).unwrap();
                if let Ok(Some(m)) = re.find_from_pos(text, pos) {
                    if best.is_none_or(|(s, _, _)| m.start() < s) {
                        best = Some((m.start(), m.end(), Some(i)));
                    }
                }
            }
            let Some((s, e, which)) = best else { break };
            paint(out, pos, s, stack);
            let Some(i) = which else {
                paint(out, s, e, stack);
                return e;
            };
            let r = &rules[i];
            let mut inner = stack.to_vec();
            inner.extend(r.name.clone());
            paint(out, s, e, &inner);
            let re = r.matcher.as_ref().or(r.begin.as_ref()).unwrap();
            if let Ok(Some(c)) = re.captures_from_pos(text, s) {
                for (g, name) in &r.captures {
                    if let Some(m) = c.get(*g) {
                        let mut sc = inner.clone();
                        sc.push(name.clone());
                        paint(out, m.start(), m.end(), &sc);
                    }
                }
            }
            pos = if r.begin.is_some() {
                let end = Regex::new(r.end.as_deref().unwrap()).unwrap();
                let children = self.flatten(&r.patterns);
                self.run(text, e, &children, Some(&end), &inner, out)
            } else {
                e.max(s + 1)
            };
        }
        paint(out, pos.min(text.len()), text.len(), stack);
        text.len()
    }
}

/// The scopes at the first occurrence of `needle` after `after`.
fn scope_of(text: &str, scopes: &[Vec<String>], needle: &str, after: usize) -> Vec<String> {
    let at = after + text[after..].find(needle).unwrap_or_else(|| panic!("{needle} not in sample"));
    scopes[at].clone()
}

#[test]
fn the_textmate_grammar_scopes_a_sample() {
    let g = Grammar::load();
    let text = "Say hi {# a note #}\n{% gen answer max_tokens=20 stop=\"\\n\" %} and {{ answer | upper }} {% if n == 3 or ok %}{% endif %}\n";
    let sc = g.scopes(text);
    let has = |needle: &str, after: usize, scope: &str| {
        let s = scope_of(text, &sc, needle, after);
        assert!(s.iter().any(|x| x == scope), "`{needle}` has {s:?}, not {scope}");
    };
    assert!(scope_of(text, &sc, "Say", 0).is_empty(), "prompt text has no scope");
    let expected = [
        ("a note", 0, "comment.block.lmt"),
        ("{%", 0, "punctuation.definition.tag.begin.lmt"),
        ("gen", 0, "keyword.control.lmt"),
        ("gen", 0, "meta.tag.statement.lmt"),
        ("max_tokens", 0, "variable.parameter.option.lmt"),
        ("20", 0, "constant.numeric.lmt"),
        ("\\n", 0, "constant.character.escape.lmt"),
        ("\"", 30, "string.quoted.double.lmt"),
        ("answer |", 50, "meta.tag.expression.lmt"),
        ("upper", 0, "entity.name.function.filter.lmt"),
        ("if", 60, "keyword.control.lmt"),
        // `or` in an expression is an operator, not select's separator.
        ("or ok", 0, "keyword.operator.word.lmt"),
        ("==", 0, "keyword.operator.lmt"),
        ("endif", 0, "keyword.control.lmt"),
    ];
    for (needle, after, scope) in expected {
        has(needle, after, scope);
    }
    let and = text.find("%} and").unwrap() + 3;
    assert!(sc[and].is_empty(), "text between tags has no scope: {:?}", sc[and]);
}

#[test]
fn grammar_keywords_are_the_language_servers() {
    let g = Grammar::load();
    // The statement keyword is the first word of a `{% … %}` tag, captured
    // by the tag's begin pattern (so `or` in an expression is an operator).
    let begin = g.repo["statement"]["begin"].as_str().unwrap();
    let start = begin.find("\\b(").unwrap() + 3;
    let len = begin[start..].find(")\\b").unwrap();
    let tm: BTreeSet<&str> = begin[start..start + len].split('|').collect();
    let server: BTreeSet<&str> = lmt::lsp::analysis::KEYWORDS.iter().map(|(k, _)| *k).collect();
    assert_eq!(tm, server, "syntaxes/lmt.tmLanguage.json and lsp::analysis::KEYWORDS differ");
    // Every keyword is one the parser knows: a tag starting with it is not
    // an unknown statement.
    let pest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("grammar/lmt.pest")).unwrap();
    for k in server {
        assert!(pest.contains(&format!("kw_{k} ")) || pest.contains(&format!("\"{k}\"")), "`{k}` is not in grammar/lmt.pest");
    }
}
