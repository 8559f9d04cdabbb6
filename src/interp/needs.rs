//! What a program needs of its model that a remote engine may lack, read
//! from the compiled program before any request: a template that cannot
//! run on the engine is refused with the construct and the engine named.

use crate::diagnostic::{Code, Diagnostic};
use crate::ir::{Instr, Program};
use crate::model::remote::EngineKind;

/// The diagnostics of running `program` on `engine`: errors for what it
/// cannot do, warnings for what it does differently.
pub fn engine_needs(program: &Program, engine: EngineKind) -> Vec<Diagnostic> {
    let caps = engine.capabilities();
    let name = engine.name();
    let mut out = Vec::new();
    for m in &program.modules {
        let opts = |set: u32| m.option_sets[set as usize].iter().map(|&s| m.names[s as usize].as_str()).collect::<Vec<_>>();
        for (pc, instr) in m.code.iter().enumerate() {
            let at = |code: Code, message: String| Diagnostic::new(code, m.file, m.spans[pc], message);
            match instr {
                Instr::Gen { .. } | Instr::SelectIn { .. } | Instr::SelectBegin { .. } if !caps.generate => {
                    out.push(at(Code::EngineLacks, format!("lmt cannot generate through {name}: it takes no prompt of token ids or gives no ids back"))
                        .with_help("use llama-server, vLLM or SGLang (`--engine`)"));
                }
                Instr::Gen { opts: set, .. } => {
                    let given = opts(*set);
                    if given.contains(&"bias") && !caps.token_logits {
                        out.push(at(Code::EngineLacks, format!("`bias` needs the model's logits at every token, which {name} does not give"))
                            .with_help("drop `bias`, or run this template on a local model"));
                    }
                    if let Some(c) = given.iter().find(|o| ["regex", "grammar", "json"].contains(o)).filter(|_| !caps.constraints) {
                        out.push(at(Code::EngineLacks, format!("`{c}` needs a server-side constraint, which lmt cannot yet send to {name}")));
                    }
                }
                Instr::SelectBegin { branches, .. } if !caps.token_logits && !m.select_branches(*branches).0.iter().all(|b| b.2) => {
                    out.push(
                        at(Code::EngineLacks, format!("a select whose branches generate is scored with the model's next-token logits, which {name} does not give"))
                            .with_help("make every branch plain text, or run this template on a local model"),
                    );
                }
                Instr::SelectIn { .. } | Instr::SelectBegin { .. } if !caps.prompt_scoring => out.push(at(
                    Code::SelectByGeneration,
                    format!("{name} gives no log-probs of given text: this select is chosen by generation constrained to its options, not scored in full (`score` is not applied)"),
                )),
                _ => {}
            }
        }
    }
    out
}
