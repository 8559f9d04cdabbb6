//! `lmt match`: a dry run of a constraint over a text with no model, token
//! by token through the real tokenizer and the real masks.

use std::path::PathBuf;

use crate::engine::{Dfa, Limits, TokenMask, Vocab};
use crate::tokenizer::TextEncoder;

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
    /// A grammar block, as `FILE.lmt#NAME`.
    #[arg(long)]
    pub grammar: Option<String>,
    /// A JSON Schema file.
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
    /// The text to check.
    #[arg(long)]
    pub text: Option<String>,
    /// A file holding the text to check.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Runs `lmt match`: 0 accepted, 1 rejected, 2 for bad arguments or files.
pub fn run(args: &MatchArgs) -> i32 {
    match check(args) {
        Ok(outcome) => {
            if args.json {
                println!("{}", outcome.json);
            } else {
                println!("{}", outcome.message);
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

struct Outcome {
    accepted: bool,
    message: String,
    json: serde_json::Value,
}

fn check(args: &MatchArgs) -> Result<Outcome, String> {
    let text = match (&args.text, &args.input) {
        (Some(t), None) => t.clone(),
        (None, Some(p)) => std::fs::read_to_string(p).map_err(|e| format!("cannot read `{}`: {e}", p.display()))?,
        _ => return Err("give the text with exactly one of --text or --input".into()),
    };
    let limits = Limits::default();
    let given = [args.regex.is_some(), args.choices.is_some(), args.grammar.is_some(), args.json_schema.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err("give exactly one constraint: --regex, --choices, --grammar or --json-schema".into());
    }
    let dfa = if let Some(r) = &args.regex {
        Dfa::regex(r, &limits).map_err(|e| e.to_string())?
    } else if let Some(c) = &args.choices {
        Dfa::choices(c, &limits).map_err(|e| e.to_string())?
    } else {
        return Err("--grammar and --json-schema are not supported by the engine yet; use --regex or --choices".into());
    };
    let (vocab, tok) = Vocab::load(&args.tokenizer).map_err(|e| e.to_string())?;
    let ids = TextEncoder::new(&tok).encode(&text)?;
    let mut mask = TokenMask::new(vocab.len());
    let mut state = dfa.start();
    let mut offset = 0usize;
    for (i, &id) in ids.iter().enumerate() {
        dfa.mask(&vocab, state, &mut mask);
        let bytes = vocab.bytes(id);
        if mask.get(id) {
            state = dfa.feed(state, bytes).ok_or("internal: an allowed token did not advance the automaton")?;
            offset += bytes.len();
            continue;
        }
        // Find the first byte of the token the automaton refuses.
        let mut s = state;
        let mut at = 0;
        while let Some(n) = dfa.step(s, bytes[at]) {
            s = n;
            at += 1;
        }
        let byte_offset = offset + at;
        let expected = expected_bytes(&dfa, s);
        let shown = String::from_utf8_lossy(bytes);
        let message = format!(
            "rejected at byte {byte_offset} (token {i}, id {id}, {shown:?}): {:?} cannot come after {:?}; expected {expected}",
            String::from_utf8_lossy(&bytes[at..at + 1]),
            String::from_utf8_lossy(&text.as_bytes()[..byte_offset.min(text.len())]),
        );
        let json = serde_json::json!({
            "accepted": false, "tokens": ids.len(), "bytes": text.len(),
            "reject": {"byte_offset": byte_offset, "token_index": i, "token_id": id, "token": shown, "expected": expected},
        });
        return Ok(Outcome { accepted: false, message, json });
    }
    if !dfa.is_accepting(state) {
        let expected = expected_bytes(&dfa, state);
        let message = format!("rejected: the text ends before the constraint is satisfied; it could continue with {expected}");
        let json = serde_json::json!({
            "accepted": false, "tokens": ids.len(), "bytes": text.len(),
            "reject": {"byte_offset": text.len(), "token_index": ids.len(), "expected": expected},
        });
        return Ok(Outcome { accepted: false, message, json });
    }
    let complete = dfa.is_complete(state);
    let message = format!(
        "accepted: {} bytes in {} tokens; {}",
        text.len(),
        ids.len(),
        if complete { "nothing more can follow" } else { "more could follow" }
    );
    let json = serde_json::json!({"accepted": true, "tokens": ids.len(), "bytes": text.len(), "complete": complete});
    Ok(Outcome { accepted: true, message, json })
}

/// The bytes that may come next, as character ranges: `[0-9] or "-"`.
fn expected_bytes(dfa: &Dfa, s: crate::engine::DfaState) -> String {
    let ok: Vec<u8> = (0..=255u8).filter(|b| dfa.step(s, *b).is_some()).collect();
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
        parts.push(if j - i >= 2 { format!("[{}-{}]", show(ok[i]), show(ok[j])) } else if j > i {
            format!("{:?} or {:?}", show(ok[i]), show(ok[j]))
        } else {
            format!("{:?}", show(ok[i]))
        });
        i = j + 1;
    }
    if dfa.is_accepting(s) {
        parts.push("the end".into());
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join(", ")
    }
}
