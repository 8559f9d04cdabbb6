//! `lmt match`: a dry run of a constraint over a text with no model, token
//! by token through the real tokenizer and the real masks. `walk` is shared
//! with the JSONSchemaBench harness (`benches/jsonschemabench/`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::engine::{Constraint, Grammar, Limits, Matcher, Semantics, TokenMask, Vocab};
use crate::syntax::ast::{ExprKind, Node};
use crate::model::tokenizer::TextEncoder;
use crate::workspace::{FsLoader, Workspace};

/// Arguments of `lmt match`.
#[derive(Debug, clap::Args)]
pub struct MatchArgs {
    /// `tokenizer.json`, or a directory holding it.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// The value must match this regex in full.
    #[arg(long)]
    pub regex: Option<String>,
    /// The value must be one of these comma-separated options.
    #[arg(long, value_delimiter = ',')]
    pub choices: Option<Vec<String>>,
    /// A grammar block, as `FILE.lmt#NAME` (or `FILE.lmt#NAME.rule`); FILE may be a stdlib module, `std/json`.
    #[arg(long)]
    pub grammar: Option<String>,
    /// A regex a template sets with `{% set NAME = "…" %}`, as `FILE.lmt#NAME`, e.g. `std/regex#date`.
    #[arg(long = "regex-from", value_name = "FILE.lmt#NAME")]
    pub regex_from: Option<String>,
    /// A JSON Schema file (objects that list their properties are closed
    /// unless the schema opens them, as for `json=` in a template).
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
    /// With --json-schema: JSON Schema's validation semantics (an object
    /// takes keys it does not list unless `additionalProperties` is false),
    /// as `json_open=true` in a template.
    #[arg(long = "json-open", requires = "json_schema")]
    pub json_open: bool,
    /// The text to check.
    #[arg(long)]
    pub text: Option<String>,
    /// A file holding the text to check.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Print one JSON object instead of sentences.
    #[arg(long)]
    pub json: bool,
}

/// Runs `lmt match`: 0 accepted, 1 rejected, 2 for bad arguments or files.
pub fn run(args: &MatchArgs) -> i32 {
    match check(args) {
        Ok(outcome) => {
            if args.json {
                super::out(format_args!("{}\n", outcome.json));
            } else {
                super::out(format_args!("{}\n", outcome.message));
            }
            if outcome.accepted {
                0
            } else {
                1
            }
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            super::EXIT_USAGE
        }
    }
}

/// What `lmt match` found: accepted or not, in words and as JSON.
pub struct MatchOutcome {
    /// Every token was allowed and the constraint accepts.
    pub accepted: bool,
    /// The verdict in a sentence (where a refused text went wrong).
    pub message: String,
    /// The `--json` object.
    pub json: serde_json::Value,
}

/// A constraint as `lmt match` (and `lmt.match` in Python) names it.
#[derive(Debug, Clone)]
pub enum ConstraintSpec {
    /// A regex the whole value must match.
    Regex(String),
    /// A regex a template sets with `{% set NAME = "…" %}`: `FILE.lmt#NAME`.
    RegexFrom(String),
    /// One of these options.
    Choices(Vec<String>),
    /// A grammar block: `FILE.lmt#NAME` or `FILE.lmt#NAME.rule`.
    Grammar(String),
    /// A JSON Schema; `open`: validation semantics (`json_open=true`).
    JsonSchema {
        /// The schema.
        schema: serde_json::Value,
        /// Objects take keys they do not list unless the schema closes them.
        open: bool,
    },
}

impl ConstraintSpec {
    /// The one constraint the arguments name (a schema file is read here).
    fn from_args(args: &MatchArgs) -> Result<ConstraintSpec, String> {
        let given =
            [args.regex.is_some(), args.regex_from.is_some(), args.choices.is_some(), args.grammar.is_some(), args.json_schema.is_some()];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err("give exactly one constraint: --regex, --regex-from, --choices, --grammar or --json-schema".into());
        }
        if let Some(path) = &args.json_schema {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
            let schema = serde_json::from_str(&text).map_err(|e| format!("`{}` is not JSON: {e}", path.display()))?;
            return Ok(ConstraintSpec::JsonSchema { schema, open: args.json_open });
        }
        Ok(match (&args.regex, &args.regex_from, &args.choices, &args.grammar) {
            (Some(r), ..) => ConstraintSpec::Regex(r.clone()),
            (_, Some(r), ..) => ConstraintSpec::RegexFrom(r.clone()),
            (_, _, Some(c), _) => ConstraintSpec::Choices(c.clone()),
            (.., Some(g)) => ConstraintSpec::Grammar(g.clone()),
            _ => unreachable!("one constraint is given"),
        })
    }

    /// The engine's constraint.
    pub fn build(&self, limits: &Limits) -> Result<Constraint, String> {
        match self {
            ConstraintSpec::Regex(r) => Constraint::regex(r, limits).map_err(|e| e.to_string()),
            ConstraintSpec::Choices(c) => Constraint::choices(c, limits).map_err(|e| e.to_string()),
            ConstraintSpec::JsonSchema { schema, open } => {
                let semantics = if *open { Semantics::Validation } else { Semantics::Generation };
                // The white space and objects of `json=` in a template.
                Constraint::json_schema(schema, crate::options::JSON_WHITESPACE, semantics, limits).map_err(|e| e.to_string())
            }
            ConstraintSpec::RegexFrom(spec) => {
                let (file, name) = spec.split_once('#').ok_or("--regex-from takes FILE.lmt#NAME")?;
                let ws = load_module(file)?;
                let regex = ws.module(ws.root).template.body.iter().find_map(|n| match n {
                    Node::Set { target, value, .. } if target.name.name == name && !target.append => match &value.kind {
                        ExprKind::Str(r) => Some(r.clone()),
                        _ => None,
                    },
                    _ => None,
                });
                let regex = regex.ok_or_else(|| format!("`{file}` sets no `{name}` to a string at its top level"))?;
                Constraint::regex(&regex, limits).map_err(|e| e.to_string())
            }
            ConstraintSpec::Grammar(spec) => grammar_constraint(spec, limits),
        }
    }
}

/// The grammar block `FILE.lmt#NAME[.rule]` names.
fn grammar_constraint(spec: &str, limits: &Limits) -> Result<Constraint, String> {
    let (file, name) = spec.split_once('#').ok_or("--grammar takes FILE.lmt#NAME")?;
    let ws = load_module(file)?;
    let (block, rule) = name.split_once('.').map_or((name, None), |(b, r)| (b, Some(r)));
    let g = ws
        .module(ws.root)
        .template
        .body
        .iter()
        .find_map(|n| match n {
            Node::Grammar(g) if g.name.name == block => Some(g),
            _ => None,
        })
        .ok_or_else(|| format!("`{file}` has no `{{% grammar {block} %}}`"))?;
    let start = match rule {
        Some(r) => r.to_string(),
        None => crate::check::start_rule(block, &g.grammar).ok_or_else(|| format!("grammar `{block}` has no start rule"))?,
    };
    Constraint::grammar(&Grammar::from(&g.grammar), &start, limits).map_err(|e| e.to_string())
}

/// A template file, or a stdlib module (`std/NAME`), loaded and checked.
fn load_module(file: &str) -> Result<Workspace, String> {
    let loader = FsLoader::default();
    let ws = if file.starts_with("std/") {
        let (name, text) = crate::stdlib::resolve(file).map_err(|(msg, help)| format!("{msg} ({help})"))?;
        Workspace::load_text(&name, text, None, &loader)
    } else {
        Workspace::load_file(Path::new(file), &loader).map_err(|e| format!("cannot read `{file}`: {e}"))?
    };
    if ws.has_errors() {
        return Err(format!("`{file}` has errors; `lmt check {file}` shows them"));
    }
    Ok(ws)
}

/// How a text fared: accepted, or refused at a token.
pub enum Walk {
    /// Every token was allowed and the constraint accepts (`complete`:
    /// nothing may follow).
    Accepted {
        /// Nothing may follow.
        complete: bool,
    },
    /// A token the masks refused.
    Refused {
        /// Its index.
        token_index: usize,
        /// The first byte of it the constraint refuses.
        byte_offset: usize,
        /// What the constraint would take there.
        expected: String,
    },
    /// Every token was allowed but the value is not finished.
    Incomplete {
        /// What the constraint would take next.
        expected: String,
    },
}

/// Walks `ids` through `m`, timing each mask into `times` (µs).
pub fn walk(m: &mut Matcher, vocab: &Vocab, ids: &[u32], times: &mut Vec<f64>) -> Result<Walk, String> {
    let mut mask = TokenMask::new(vocab.len());
    let mut offset = 0;
    for (i, &id) in ids.iter().enumerate() {
        let t0 = Instant::now();
        m.mask(vocab, &mut mask).map_err(|e| e.to_string())?;
        times.push(t0.elapsed().as_secs_f64() * 1e6);
        let bytes = vocab.bytes(id);
        if !mask.get(id) {
            // The first byte of the token the constraint refuses.
            let mut at = 0;
            while at < bytes.len() && m.feed(&bytes[at..at + 1]).map_err(|e| e.to_string())? {
                at += 1;
            }
            return Ok(Walk::Refused { token_index: i, byte_offset: offset + at, expected: expected_bytes(m) });
        }
        if !m.feed(bytes).map_err(|e| e.to_string())? {
            return Err("internal: an allowed token was refused".into());
        }
        offset += bytes.len();
    }
    if m.is_accepting() {
        Ok(Walk::Accepted { complete: m.is_complete() })
    } else {
        Ok(Walk::Incomplete { expected: expected_bytes(m) })
    }
}

fn check(args: &MatchArgs) -> Result<MatchOutcome, String> {
    let text = match (&args.text, &args.input) {
        (Some(t), None) => t.clone(),
        (None, Some(p)) => std::fs::read_to_string(p).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?,
        _ => return Err("give the text with exactly one of --text or --input".into()),
    };
    match_text(&ConstraintSpec::from_args(args)?, &text, &args.tokenizer)
}

/// Walks `text`, tokenized by the tokenizer at `tokenizer` (a
/// `tokenizer.json` or a directory holding one), through the constraint.
pub fn match_text(spec: &ConstraintSpec, text: &str, tokenizer: &Path) -> Result<MatchOutcome, String> {
    let limits = Limits::default();
    let c = spec.build(&limits)?;
    let (vocab, tok) = Vocab::load(tokenizer).map_err(|e| e.to_string())?;
    let ids = TextEncoder::new(&tok).encode(text)?;
    let mut m = c.matcher(&limits);
    let n = ids.len();
    let outcome = match walk(&mut m, &vocab, &ids, &mut Vec::new())? {
        Walk::Accepted { complete } => MatchOutcome {
            accepted: true,
            message: format!(
                "accepted: {} bytes in {n} tokens; {}",
                text.len(),
                if complete { "nothing more can follow" } else { "more could follow" }
            ),
            json: serde_json::json!({"accepted": true, "tokens": n, "bytes": text.len(), "complete": complete}),
        },
        Walk::Refused { token_index, byte_offset, expected } => {
            let id = ids[token_index];
            let shown = String::from_utf8_lossy(vocab.bytes(id)).into_owned();
            let bad =
                String::from_utf8_lossy(&text.as_bytes()[byte_offset.min(text.len())..(byte_offset + 1).min(text.len())]).into_owned();
            let before = String::from_utf8_lossy(&text.as_bytes()[..byte_offset.min(text.len())]).into_owned();
            MatchOutcome {
                accepted: false,
                message: format!("rejected at byte {byte_offset} (token {token_index}, id {id}, {shown:?}): {bad:?} cannot come after {before:?}; expected {expected}"),
                json: serde_json::json!({
                    "accepted": false, "tokens": n, "bytes": text.len(),
                    "reject": {"byte_offset": byte_offset, "token_index": token_index, "token_id": id, "token": shown, "expected": expected},
                }),
            }
        }
        Walk::Incomplete { expected } => MatchOutcome {
            accepted: false,
            message: format!("rejected: the text ends before the constraint is satisfied; it could continue with {expected}"),
            json: serde_json::json!({
                "accepted": false, "tokens": n, "bytes": text.len(),
                "reject": {"byte_offset": text.len(), "token_index": n, "expected": expected},
            }),
        },
    };
    Ok(outcome)
}

/// The bytes that may come next, as character ranges: `[0-9] or "-"`.
fn expected_bytes(m: &mut Matcher) -> String {
    let pos = m.position();
    let mut ok = Vec::new();
    for b in 0..=255u8 {
        if m.feed(&[b]).unwrap_or(false) {
            ok.push(b);
            m.rewind(pos);
        }
    }
    let show = |b: u8| match b {
        b' '..=b'~' => (b as char).to_string(),
        b'\n' => "\\n".into(),
        b'\t' => "\\t".into(),
        _ => format!("\\x{b:02X}"),
    };
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ok.len() {
        let mut j = i;
        while j + 1 < ok.len() && ok[j + 1] == ok[j] + 1 {
            j += 1;
        }
        parts.push(if j - i >= 2 {
            format!("[{}-{}]", show(ok[i]), show(ok[j]))
        } else if j > i {
            format!("{:?} or {:?}", show(ok[i]), show(ok[j]))
        } else {
            format!("{:?}", show(ok[i]))
        });
        i = j + 1;
    }
    if m.is_accepting() {
        parts.push("the end".into());
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}
