//! `lmt model info`: what a model is, from its metadata (no weights read).

use std::fmt::Write as _;

use super::complete::{model_spec, EXIT_MODEL_ERROR};
use super::run::ModelArgs;
use crate::model::{HubEnv, ModelInfo, ModelSpec};

/// The `lmt model` commands.
#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Architecture, size, weight types, context, vocabulary, special tokens
    /// and chat template of a model, and where its files were found.
    Info(InfoArgs),
}

/// Arguments of `lmt model info`.
#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// Which model.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Runs an `lmt model` command: 0, or 3 when the model cannot be read.
pub fn run(cmd: &ModelCommand) -> i32 {
    match cmd {
        ModelCommand::Info(args) => {
            let spec_text = model_spec(args.model.model.as_deref());
            let info = ModelSpec::parse(&spec_text)
                .and_then(|spec| spec.local_path(&HubEnv::from_process()))
                .and_then(|path| ModelInfo::read(&path, &args.model.load_options()));
            match info {
                Ok(info) => {
                    super::out(format_args!("{}", describe(&spec_text, &info)));
                    0
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    EXIT_MODEL_ERROR
                }
            }
        }
    }
}

/// The report `lmt model info` prints.
pub fn describe(spec: &str, info: &ModelInfo) -> String {
    let c = &info.config;
    let t = &info.tokenizer;
    let mut out = String::new();
    let tok_text = |id: u32| format!("{id} {:?}", String::from_utf8_lossy(t.vocab.bytes(id)));
    let list = |ids: &[u32]| if ids.is_empty() { "none".to_string() } else { ids.iter().map(|&i| tok_text(i)).collect::<Vec<_>>().join(", ") };
    let _ = writeln!(out, "model         {spec}");
    let _ = writeln!(out, "weights       {}", info.weights.display());
    let _ = writeln!(out, "architecture  {} · {} layers · hidden {} · {} heads ({} kv) · head dim {}", c.arch.name(), c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim);
    let _ = writeln!(out, "parameters    {} ({:.1} M)", info.parameters, info.parameters as f64 / 1e6);
    let types: Vec<String> =
        info.weight_types.iter().map(|w| format!("{} ×{} ({:.1} MB)", w.name, w.tensors, w.bytes as f64 / 1e6)).collect();
    let _ = writeln!(out, "weight types  {}", types.join(", "));
    let _ = writeln!(out, "context       {} tokens", c.max_position_embeddings);
    let _ = writeln!(out, "vocabulary    {} tokens ({} logits)", t.vocab.len(), c.vocab_size);
    let _ = writeln!(out, "tokenizer     {}", t.origin);
    let _ = writeln!(out, "BOS           {}", match t.bos {
        Some(id) => format!("{} (starts every prompt)", tok_text(id)),
        None => match t.bos_token {
            Some(id) => format!("none added (the named BOS is {})", tok_text(id)),
            None => "none".into(),
        },
    });
    let _ = writeln!(out, "EOS           {}", list(&t.eos));
    let _ = writeln!(out, "end of turn   {}", list(&t.eot));
    match &t.chat_template {
        Some(ct) => {
            let _ = writeln!(out, "chat template {} ({} lines)", ct.origin, ct.text.lines().count());
            for line in ct.text.lines().take(4) {
                let shown: String = line.chars().take(100).collect();
                let _ = writeln!(out, "              │ {shown}");
            }
        }
        None => {
            let _ = writeln!(out, "chat template none (role blocks need --chat-template FILE)");
        }
    }
    if !t.named_templates.is_empty() {
        let names: Vec<&str> = t.named_templates.iter().map(|(n, _)| n.as_str()).collect();
        let _ = writeln!(out, "named         {} (--chat-template NAME)", names.join(", "));
    }
    out
}
