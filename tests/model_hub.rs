//! Model specs, the Hugging Face cache layout, offline mode and the errors a
//! user sees for a bad `--model`, tested up to the network boundary.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::tiny::{temp_dir, Spec};
use lmt::model::{HubEnv, LoadOptions, Model, ModelSpec};

fn env(vars: &[(&str, &str)]) -> HubEnv {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    HubEnv::from_vars(|k| map.get(k).cloned())
}

#[test]
fn specs_parse_into_paths_and_hub_ids() {
    let hub = |r: &str, v: &str| ModelSpec::Hub { repo: r.into(), revision: v.into() };
    assert_eq!(ModelSpec::parse("Qwen/Qwen2.5-0.5B-Instruct").unwrap(), hub("Qwen/Qwen2.5-0.5B-Instruct", "main"));
    assert_eq!(ModelSpec::parse("org/name@v1.2").unwrap(), hub("org/name", "v1.2"));
    assert_eq!(ModelSpec::parse("models/tiny.gguf").unwrap(), ModelSpec::Path("models/tiny.gguf".into()));
    assert_eq!(ModelSpec::parse("./org/name").unwrap(), ModelSpec::Path("./org/name".into()));
    let here = env!("CARGO_MANIFEST_DIR");
    assert_eq!(ModelSpec::parse(here).unwrap(), ModelSpec::Path(here.into()));
    for bad in ["a/b/c", "justaname", "org/", "org/na me", "org/name@"] {
        let e = ModelSpec::parse(bad).unwrap_err().to_string();
        assert!(e.contains("hub id"), "{bad}: {e}");
    }
}

#[test]
fn the_cache_directory_token_and_offline_mode_follow_huggingface_hub() {
    let e = env(&[("HOME", "/home/u")]);
    assert_eq!(e.cache, Path::new("/home/u/.cache/huggingface/hub"));
    assert!(!e.offline && e.token.is_none());
    assert_eq!(e.endpoint, "https://huggingface.co");
    let e = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]);
    assert_eq!(e.cache, Path::new("/xdg/huggingface/hub"));
    let e = env(&[("HOME", "/home/u"), ("HF_HOME", "/hf")]);
    assert_eq!(e.cache, Path::new("/hf/hub"));
    let e = env(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "/cache")]);
    assert_eq!(e.cache, Path::new("/cache"));
    for (v, off) in [("1", true), ("TRUE", true), ("yes", true), ("0", false), ("false", false)] {
        assert_eq!(env(&[("HF_HUB_OFFLINE", v)]).offline, off, "HF_HUB_OFFLINE={v}");
    }
    assert_eq!(env(&[("HF_TOKEN", " hf_abc\n")]).token.as_deref(), Some("hf_abc"));
    let home = temp_dir("hf-home");
    std::fs::write(home.join("token"), "hf_from_file\n").unwrap();
    let e = env(&[("HF_HOME", home.to_str().unwrap())]);
    assert_eq!(e.token.as_deref(), Some("hf_from_file"));
    assert_eq!(env(&[("HF_ENDPOINT", "https://mirror.example/")]).endpoint, "https://mirror.example");
}

/// A cache holding `org/tiny` at commit `c0ffee…` under `refs/main`.
fn fake_cache(root: &Path) -> (String, std::path::PathBuf) {
    let commit = "c0ffee0000000000000000000000000000000001".to_string();
    let repo = root.join("models--org--tiny");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), &commit).unwrap();
    let snap = repo.join("snapshots").join(&commit);
    let tok = common::trained_byte_level();
    let spec = Spec::small("qwen2").with_tokenizer(&tok);
    spec.write_hf(&snap);
    tok.save(snap.join("tokenizer.json"), false).unwrap();
    (commit, snap)
}

#[test]
fn hub_ids_resolve_to_snapshots_in_the_cache_without_network() {
    let root = temp_dir("hf-cache");
    let (commit, snap) = fake_cache(&root);
    // Offline, and an endpoint that refuses connections: nothing may be
    // downloaded, so success proves the cache was used.
    let e = env(&[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1"), ("HF_ENDPOINT", "http://127.0.0.1:9")]);
    let spec = ModelSpec::parse("org/tiny").unwrap();
    assert_eq!(spec.local_path(&e).unwrap(), snap);
    let by_commit = ModelSpec::parse(&format!("org/tiny@{commit}")).unwrap();
    assert_eq!(by_commit.local_path(&e).unwrap(), snap);
    let model = Model::load_path(&spec.local_path(&e).unwrap(), &LoadOptions::default()).unwrap();
    assert_eq!(model.decoder.config.arch, lmt::model::Arch::Qwen2);
    // A snapshot without its tokenizer is not a cached model.
    std::fs::remove_file(snap.join("tokenizer.json")).unwrap();
    let err = spec.local_path(&e).unwrap_err().to_string();
    assert!(err.contains("not in the Hugging Face cache"), "{err}");
}

#[test]
fn offline_with_an_empty_cache_names_the_variables_to_set() {
    let root = temp_dir("hf-empty");
    let e = env(&[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")]);
    let err = ModelSpec::parse("org/absent").unwrap().local_path(&e).unwrap_err().to_string();
    for needle in ["org/absent@main", "HF_HUB_OFFLINE", "HF_HUB_CACHE", root.to_str().unwrap()] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
}

#[test]
fn a_failed_download_says_how_to_work_offline() {
    let root = temp_dir("hf-refused");
    // Port 9 (discard) on loopback refuses at once: the real download code
    // runs up to the network and fails there.
    let e = env(&[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_ENDPOINT", "http://127.0.0.1:9")]);
    let err = ModelSpec::parse("org/absent").unwrap().local_path(&e).unwrap_err().to_string();
    for needle in ["cannot download `org/absent@main`", "http://127.0.0.1:9", "HF_HUB_OFFLINE=1", "HF_HUB_CACHE"] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
}

#[test]
fn bad_models_get_clear_errors() {
    let load = |p: &Path| Model::load_path(p, &LoadOptions::default()).unwrap_err().to_string();
    let dir = temp_dir("bad-models");
    // Missing path.
    let err = load(&dir.join("nope"));
    assert!(err.contains("nope") && err.contains("not found"), "{err}");
    // Unsupported architecture, named.
    let gptneox = dir.join("neox");
    std::fs::create_dir_all(&gptneox).unwrap();
    std::fs::write(gptneox.join("config.json"), r#"{"model_type": "gpt_neox", "hidden_size": 8}"#).unwrap();
    let err = load(&gptneox);
    assert!(err.contains("`gpt_neox` is not supported") && err.contains("llama"), "{err}");
    // A config without weights.
    let spec = Spec::small("llama");
    let noweights = dir.join("noweights");
    spec.write_hf(&noweights);
    std::fs::remove_file(noweights.join("model.safetensors")).unwrap();
    let err = load(&noweights);
    assert!(err.contains("model.safetensors"), "{err}");
    // Weights that disagree with the config.
    let mut wrong = spec.clone();
    wrong.hidden = 32;
    let mismatch = dir.join("mismatch");
    wrong.write_hf(&mismatch);
    std::fs::write(mismatch.join("config.json"), serde_json::to_string(&spec.config_json()).unwrap()).unwrap();
    let err = load(&mismatch);
    assert!(err.contains("shape") && err.contains("embed_tokens"), "{err}");
    // Weights but no tokenizer.
    let notok = dir.join("notok");
    spec.write_hf(&notok);
    let err = load(&notok);
    assert!(err.contains("tokenizer.json"), "{err}");
    // A file that is not GGUF.
    let fake = dir.join("fake.gguf");
    std::fs::write(&fake, b"not a gguf file at all").unwrap();
    let err = load(&fake);
    assert!(err.contains("not a readable GGUF"), "{err}");
    // A GGUF of a tensor type lmt does not read (IQ4_XS), named.
    let iq4 = dir.join("iq4_xs.gguf");
    spec.write_gguf(&iq4, candle_core::quantized::GgmlDType::F32);
    set_tensor_type(&iq4, "token_embd.weight", 23);
    let err = load(&iq4);
    assert!(err.contains("IQ4_XS (GGML type 23)") && err.contains("Q4_K_M"), "{err}");
    // A later layer's matrix whose header claims 2⁴⁰ rows: a named error,
    // not an abort on memory sized from the header before the tensor is read.
    let huge = dir.join("huge_rows.gguf");
    spec.write_gguf(&huge, candle_core::quantized::GgmlDType::F32);
    set_tensor_dim(&huge, "blk.1.ffn_down.weight", 1, 1 << 40);
    let err = load(&huge);
    assert!(err.contains("blk.1.ffn_down.weight") && err.contains("past the end"), "{err}");
    // A config with heads that cannot share key/value heads.
    let mut bad = spec.config_json();
    bad["num_key_value_heads"] = serde_json::json!(3);
    std::fs::write(notok.join("config.json"), bad.to_string()).unwrap();
    let err = load(&notok);
    assert!(err.contains("key/value heads"), "{err}");
}

/// Rewrites the GGML type of tensor `name` in the GGUF at `path` (its
/// description: name as u64 length and bytes, u32 dimensions, u64 sizes,
/// then the u32 type).
/// Where tensor `name`'s description in a GGUF file's header continues
/// after its name (its dimension count, then the dimensions and the type).
fn tensor_description(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    bytes.windows(key.len()).position(|w| w == key.as_slice()).expect("the tensor's description") + key.len()
}

/// Sets dimension `d` of tensor `name` in the header of the GGUF at `path`.
fn set_tensor_dim(path: &Path, name: &str, d: usize, value: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = tensor_description(&bytes, name) + 4 + 8 * d;
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn set_tensor_type(path: &Path, name: &str, ty: u32) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = tensor_description(&bytes, name);
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let t = at + 4 + 8 * dims;
    assert!(u32::from_le_bytes(bytes[t..t + 4].try_into().unwrap()) == 0, "an F32 tensor");
    bytes[t..t + 4].copy_from_slice(&ty.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn lmt_complete(args: &[&str], vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lmt"));
    cmd.arg("complete").args(args).env_remove("LMT_MODEL").env("NO_COLOR", "1");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn lmt_complete_loads_a_model_and_generates_reproducibly() {
    let root = temp_dir("cli-complete");
    let (_, snap) = fake_cache(&root);
    let model = snap.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["--model", model, "The quick brown", "--max-tokens", "8"];
        args.extend_from_slice(extra);
        let out = lmt_complete(&args, &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        assert!(err.contains("qwen2 · 2 layers"), "{err}");
        (String::from_utf8(out.stdout).unwrap(), err)
    };
    let (a, err) = run(&[]);
    assert!(a.starts_with("The quick brown"), "{a}");
    assert!(err.contains("generated") && err.contains("finish:"), "{err}");
    assert_eq!(a, run(&[]).0, "greedy is deterministic");
    let (s1, _) = run(&["--temperature", "1.0", "--seed", "5"]);
    assert_eq!(s1, run(&["--temperature", "1.0", "--seed", "5"]).0, "seeded sampling is reproducible");
    // The same model through the hub cache, offline.
    let out = lmt_complete(&["--model", "org/tiny", "--max-tokens", "8", "The quick brown"], &[
        ("HF_HUB_CACHE", root.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "1"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), a);
}

#[test]
fn lmt_complete_reports_model_errors_with_exit_code_3() {
    let root = temp_dir("cli-errors");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", "/no/such/model"], "/no/such/model"),
        (vec!["--model", "org/absent"], "HF_HUB_OFFLINE"),
        (vec!["--model", "not a model"], "hub id"),
    ];
    for (args, needle) in cases {
        let out = lmt_complete(&args, &[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle} missing from {err}");
    }
    // Bad usage is refused before any model is looked for: exit 2.
    let out = lmt_complete(&["--temperature=-1", "--model", "org/absent"], &[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("temperature") && !err.contains("org/absent"), "{err}");
    // The default model comes from LMT_MODEL when no --model is given.
    let out = lmt_complete(&[], &[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1"), ("LMT_MODEL", "org/from-env")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("org/from-env"));
}

#[test]
fn gguf_specs_name_a_quantization_or_a_file() {
    use lmt::model::GgufPick;
    let gguf = |r: &str, v: &str, f: GgufPick| ModelSpec::HubGguf { repo: r.into(), revision: v.into(), file: f };
    assert_eq!(
        ModelSpec::parse("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M").unwrap(),
        gguf("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "main", GgufPick::Quant("Q4_K_M".into()))
    );
    assert_eq!(ModelSpec::parse("org/name@v2:q8_0").unwrap(), gguf("org/name", "v2", GgufPick::Quant("q8_0".into())));
    assert_eq!(ModelSpec::parse("org/name/sub/model-f16.gguf").unwrap(), gguf("org/name", "main", GgufPick::File("sub/model-f16.gguf".into())));
    for bad in ["org/name:", "org/name:Q4 K", "org/../x.gguf:Q4"] {
        let e = ModelSpec::parse(bad);
        assert!(!matches!(e, Ok(ModelSpec::HubGguf { .. })), "{bad}: {e:?}");
    }
    // Which file a tag names: case-insensitive, projectors left out, parts refused.
    let names: Vec<String> = ["README.md", "mmproj-q4_k_m.gguf", "qwen-q4_k_m.gguf", "qwen-q8_0.gguf", "big-Q6_K-00001-of-00002.gguf"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(GgufPick::Quant("Q4_K_M".into()).choose(&names).unwrap(), "qwen-q4_k_m.gguf");
    assert_eq!(GgufPick::File("qwen-q8_0.gguf".into()).choose(&names).unwrap(), "qwen-q8_0.gguf");
    assert!(GgufPick::Quant("Q6_K".into()).choose(&names).unwrap_err().contains("in parts"));
    let err = GgufPick::Quant("IQ2_XS".into()).choose(&names).unwrap_err();
    assert!(err.contains("IQ2_XS") && err.contains("qwen-q8_0.gguf"), "{err}");
}

#[test]
fn a_self_contained_gguf_resolves_from_the_cache_and_loads_with_its_own_tokenizer() {
    use candle_core::quantized::GgmlDType;
    let root = temp_dir("hf-gguf-cache");
    let commit = "feed000000000000000000000000000000000002";
    let repo = root.join("models--org--tiny-GGUF");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    // The tokenizer lives only in the GGUF's metadata, as a converter writes it.
    let tok = common::trained_byte_level();
    let tok_dir = root.join("tokenizer-source");
    std::fs::create_dir_all(&tok_dir).unwrap();
    tok.save(tok_dir.join("tokenizer.json"), false).unwrap();
    std::fs::write(tok_dir.join("tokenizer_config.json"), r#"{"eos_token": "</s>", "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"}"#).unwrap();
    let spec = Spec::small("llama").with_tokenizer(&tok);
    let mut md = common::gguf_vocab::metadata(&tok_dir, common::gguf_vocab::Kind::Bpe("gpt-2"));
    md.push(("tokenizer.chat_template.tool_use".into(), candle_core::quantized::gguf_file::Value::String("TOOLS {{ messages }}".into())));
    spec.write_gguf_with(&snap.join("tiny-Q8_0.gguf"), GgmlDType::Q8_0, md);
    let e = env(&[("HF_HUB_CACHE", root.to_str().unwrap()), ("HF_HUB_OFFLINE", "1"), ("HF_ENDPOINT", "http://127.0.0.1:9")]);
    let path = ModelSpec::parse("org/tiny-GGUF:q8_0").unwrap().local_path(&e).unwrap();
    assert_eq!(path, snap.join("tiny-Q8_0.gguf"));
    assert_eq!(ModelSpec::parse("org/tiny-GGUF/tiny-Q8_0.gguf").unwrap().local_path(&e).unwrap(), path);
    let err = ModelSpec::parse("org/tiny-GGUF:Q4_0").unwrap().local_path(&e).unwrap_err().to_string();
    assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
    let model = Model::load_path(&path, &LoadOptions::default()).unwrap();
    let t = &model.tokenizer;
    let reference = lmt::model::tokenizer::TextEncoder::new(&tok);
    for text in ["The quick brown fox", "{\"name\": \"Ada\", \"age\": 36}", "日本語, café 😀"] {
        assert_eq!(t.encoder.encode(text).unwrap(), reference.encode(text).unwrap(), "{text}");
    }
    assert_eq!(t.eos, [tok.token_to_id("</s>").unwrap()]);
    assert!(t.chat_template.as_ref().unwrap().origin.contains("tokenizer.chat_template"));
    assert!(t.origin.contains("GGUF"), "{}", t.origin);
    // A named template of the file, chosen by name; an unknown name lists them.
    let opts = |c: &str| LoadOptions { chat_template: Some(c.into()), ..LoadOptions::default() };
    let tools = Model::load_path(&path, &opts("tool_use")).unwrap();
    assert_eq!(tools.tokenizer.chat_template.as_ref().unwrap().text, "TOOLS {{ messages }}");
    let err = Model::load_path(&path, &opts("rag")).unwrap_err().to_string();
    assert!(err.contains("rag") && err.contains("tool_use"), "{err}");
}

#[test]
fn a_broken_gguf_tokenizer_exits_3_naming_the_key() {
    use candle_core::quantized::{gguf_file::Value as V, GgmlDType};
    let root = temp_dir("bad-gguf-tokenizer");
    let tok = common::trained_byte_level();
    let tok_dir = root.join("tok");
    std::fs::create_dir_all(&tok_dir).unwrap();
    tok.save(tok_dir.join("tokenizer.json"), false).unwrap();
    let spec = Spec::small("llama").with_tokenizer(&tok);
    let cases: Vec<(&str, V)> = vec![
        ("tokenizer.ggml.pre", V::String("mystery-pre".into())),
        ("tokenizer.ggml.model", V::String("bert".into())),
        ("tokenizer.ggml.tokens", V::Array(vec![V::U32(3)])),
    ];
    for (key, value) in cases {
        let mut md = common::gguf_vocab::metadata(&tok_dir, common::gguf_vocab::Kind::Bpe("gpt-2"));
        md.retain(|(k, _)| k != key);
        md.push((key.to_string(), value));
        let path = root.join("bad.gguf");
        spec.write_gguf_with(&path, GgmlDType::F32, md);
        let out = lmt_complete(&["--model", path.to_str().unwrap(), "hi"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{key}: {err}");
        assert!(err.contains(key) && err.contains("--tokenizer") && !err.contains("panicked"), "{key}: {err}");
    }
}
