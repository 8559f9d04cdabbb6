//! Model specs (`--model` / `LMT_MODEL`): a local directory, a `.gguf`
//! file, a Hugging Face hub id `org/name[@revision]`, or one GGUF file of a
//! hub repository (`org/name:QUANT` as llama.cpp's `-hf`, or
//! `org/name/file.gguf`), found in the Hugging Face cache (shared with
//! Python tools) and downloaded into it when absent. The cache directory, token and offline mode are resolved here, by
//! the rules `huggingface_hub` uses, not by the download crate.

use std::path::{Path, PathBuf};

use super::ModelError;

/// The model used when none is given: small, instruct-tuned, with a chat
/// template, downloaded once and then cached.
pub const DEFAULT_MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// What `--model` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A local model directory or `.gguf` file.
    Path(PathBuf),
    /// A hub repository at a revision (branch, tag or commit).
    Hub {
        /// `org/name`.
        repo: String,
        /// `main` unless given after `@`.
        revision: String,
    },
    /// One GGUF file of a hub repository.
    HubGguf {
        /// `org/name`.
        repo: String,
        /// `main` unless given after `@`.
        revision: String,
        /// Which file.
        file: GgufPick,
    },
}

/// How a GGUF file of a repository is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GgufPick {
    /// By its quantization tag (`Q4_K_M`), as llama.cpp's `-hf org/name:QUANT`.
    Quant(String),
    /// By its path in the repository.
    File(String),
}

impl GgufPick {
    /// The file among a repository's `names` that this pick means: the path
    /// itself, or the `.gguf` whose name holds the tag (case-insensitive;
    /// projector files left out). Split files (`-00001-of-00003`) are refused.
    pub fn choose(&self, names: &[String]) -> Result<String, String> {
        let quant = match self {
            GgufPick::File(f) => {
                return names.iter().find(|n| *n == f).cloned().ok_or_else(|| format!("has no file `{f}`"));
            }
            GgufPick::Quant(q) => q.to_ascii_lowercase(),
        };
        let mut hits: Vec<&String> = names
            .iter()
            .filter(|n| {
                let l = n.to_ascii_lowercase();
                let base = l.rsplit('/').next().unwrap_or(&l);
                l.ends_with(".gguf") && !base.starts_with("mmproj") && base.contains(&quant)
            })
            .collect();
        hits.sort();
        match hits.first() {
            Some(n) if n.contains("-of-") => Err(format!("stores `{n}` in parts, which lmt cannot load")),
            Some(n) => Ok((*n).clone()),
            None => {
                let ggufs: Vec<&str> = names.iter().filter(|n| n.ends_with(".gguf")).map(String::as_str).collect();
                Err(format!("has no .gguf file tagged `{}` (its GGUF files: {})", quant.to_ascii_uppercase(), if ggufs.is_empty() { "none".into() } else { ggufs.join(", ") }))
            }
        }
    }
}

impl ModelSpec {
    /// Reads a spec: an existing path, a path ending in `.gguf`, or else
    /// something shaped like `org/name[@revision]`.
    pub fn parse(s: &str) -> Result<ModelSpec, ModelError> {
        let path = Path::new(s);
        let ok_part = |p: &str| !p.is_empty() && p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let parts: Vec<&str> = s.split('/').collect();
        // `org/name/file.gguf` (or deeper): a file of a hub repository,
        // unless such a local file exists.
        let hub_file = parts.len() >= 3 && s.ends_with(".gguf") && parts.iter().all(|p| ok_part(p)) && !path.exists();
        if !hub_file && (path.exists() || s.ends_with(".gguf") || s.starts_with('.') || s.starts_with('/') || s.starts_with('~')) {
            return Ok(ModelSpec::Path(path.to_path_buf()));
        }
        if hub_file {
            return Ok(ModelSpec::HubGguf {
                repo: parts[..2].join("/"),
                revision: "main".into(),
                file: GgufPick::File(parts[2..].join("/")),
            });
        }
        let (rest, quant) = match s.rsplit_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((r, v)) => (r, v),
            None => (rest, "main"),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let ok_quant = quant.is_none_or(|q| !q.is_empty() && q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        if parts.len() == 2 && parts.iter().all(|p| ok_part(p)) && !revision.is_empty() && !revision.contains("..") && ok_quant {
            let (repo, revision) = (repo.to_string(), revision.to_string());
            return Ok(match quant {
                Some(q) => ModelSpec::HubGguf { repo, revision, file: GgufPick::Quant(q.to_string()) },
                None => ModelSpec::Hub { repo, revision },
            });
        }
        Err(ModelError::MissingFile {
            path: path.to_path_buf(),
            what: "a model directory, a .gguf file, a hub id like `org/name[@revision]`, or a hub GGUF like \
                   `org/name:Q4_K_M` or `org/name/file.gguf`"
                .into(),
        })
    }

    /// The local path to load: the spec's own path, or the hub snapshot in
    /// the cache (downloading it when absent and allowed).
    pub fn local_path(&self, env: &HubEnv) -> Result<PathBuf, ModelError> {
        match self {
            ModelSpec::Path(p) => {
                if p.exists() {
                    Ok(p.clone())
                } else {
                    Err(ModelError::MissingFile { path: p.clone(), what: "a model directory or .gguf file".into() })
                }
            }
            ModelSpec::Hub { repo, revision } => match env.cached(repo, revision) {
                Some(dir) => Ok(dir),
                None if env.offline => Err(env.not_cached(repo, revision)),
                None => env.download(repo, revision, true),
            },
            ModelSpec::HubGguf { repo, revision, file } => match env.cached_gguf(repo, revision, file) {
                Some(path) => Ok(path),
                None if env.offline => Err(env.not_cached(repo, revision)),
                None => env.download_gguf(repo, revision, file),
            },
        }
    }
}

/// The Hugging Face settings from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEnv {
    /// The hub cache (`…/huggingface/hub`).
    pub cache: PathBuf,
    /// The access token, if any.
    pub token: Option<String>,
    /// Never touch the network.
    pub offline: bool,
    /// The hub's address.
    pub endpoint: String,
}

impl HubEnv {
    /// The settings of this process's environment.
    pub fn from_process() -> HubEnv {
        HubEnv::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// The settings given a variable lookup, by `huggingface_hub`'s rules:
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    /// `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`;
    /// the token from `HF_TOKEN`, else the `token` file in `HF_HOME`
    /// (or `HF_TOKEN_PATH`); offline when `HF_HUB_OFFLINE` is true.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> HubEnv {
        let home = get("HOME").or_else(|| get("USERPROFILE")).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        let hf_home = get("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            get("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home.join(".cache")).join("huggingface")
        });
        let cache = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = get("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
        let token = get("HF_TOKEN")
            .or_else(|| get("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(token_path).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let truthy = |k: &str| get(k).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true"));
        HubEnv {
            cache,
            token,
            offline: truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE"),
            endpoint: get("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()).trim_end_matches('/').to_string(),
        }
    }

    /// `models--org--name` in the cache.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache.join(format!("models--{}", repo.replace('/', "--")))
    }

    /// The cached snapshot of `repo` at `revision`, if it holds a complete
    /// model (config, weights, tokenizer).
    pub fn cached(&self, repo: &str, revision: &str) -> Option<PathBuf> {
        let snap = self.snapshot(repo, revision)?;
        let complete = snap.join("config.json").is_file()
            && snap.join("tokenizer.json").is_file()
            && super::safetensors_files(&snap).is_ok();
        complete.then_some(snap)
    }

    /// The snapshot of `repo` at `revision` with the model's tokenizer
    /// (`config.json`, `tokenizer.json` and what lies beside them), from
    /// the cache, else downloading those files alone when allowed: what a
    /// remote engine's prompts need, without the weights.
    pub fn tokenizer_dir(&self, repo: &str, revision: &str) -> Result<PathBuf, ModelError> {
        let snap = self.snapshot(repo, revision).filter(|s| s.join("config.json").is_file() && s.join("tokenizer.json").is_file());
        match snap {
            Some(dir) => Ok(dir),
            None if self.offline => Err(self.not_cached(repo, revision)),
            None => self.download(repo, revision, false),
        }
    }

    /// The error for a model that is not cached while offline.
    fn not_cached(&self, repo: &str, revision: &str) -> ModelError {
        ModelError::Hub(format!(
            "model `{repo}@{revision}` is not in the Hugging Face cache at `{}`, and HF_HUB_OFFLINE is set, \
             so it cannot be downloaded: set HF_HUB_CACHE (or HF_HOME) to a cache that holds it, \
             or unset HF_HUB_OFFLINE to download it",
            self.cache.display()
        ))
    }

    /// The snapshot directory of `repo` at `revision`, if the cache has it.
    fn snapshot(&self, repo: &str, revision: &str) -> Option<PathBuf> {
        let dir = self.repo_dir(repo);
        let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
        let commit = if is_commit {
            revision.to_string()
        } else {
            std::fs::read_to_string(dir.join("refs").join(revision)).ok()?.trim().to_string()
        };
        let snap = dir.join("snapshots").join(commit);
        snap.is_dir().then_some(snap)
    }

    /// The cached GGUF file of `repo` at `revision` that `pick` names.
    pub fn cached_gguf(&self, repo: &str, revision: &str, pick: &GgufPick) -> Option<PathBuf> {
        let snap = self.snapshot(repo, revision)?;
        let mut names = Vec::new();
        list_files(&snap, "", 2, &mut names);
        let name = pick.choose(&names).ok()?;
        Some(snap.join(name)).filter(|p| p.is_file())
    }

    /// A hub client on this environment's cache, endpoint and token.
    fn api(&self, fail: &dyn Fn(&str, &dyn std::fmt::Display) -> ModelError) -> Result<hf_hub::api::sync::Api, ModelError> {
        hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(self.cache.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(true)
            .build()
            .map_err(|e| fail("client", &e))
    }

    /// The error for a failed download, saying how to work offline.
    fn download_error(&self, repo: &str, revision: &str, what: &str, e: &dyn std::fmt::Display) -> ModelError {
        ModelError::Hub(format!(
            "cannot download `{repo}@{revision}` from {} ({what}): {e}. Without a network, set HF_HUB_OFFLINE=1 \
             and point HF_HUB_CACHE (or HF_HOME) at a cache that holds the model, or pass a local directory",
            self.endpoint
        ))
    }

    /// Downloads one GGUF file of a repository into the cache.
    fn download_gguf(&self, repo: &str, revision: &str, pick: &GgufPick) -> Result<PathBuf, ModelError> {
        use hf_hub::{Repo, RepoType};
        let fail = |what: &str, e: &dyn std::fmt::Display| self.download_error(repo, revision, what, e);
        let hub = self.api(&fail)?.repo(Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string()));
        let info = hub.info().map_err(|e| fail("repository info", &e))?;
        let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let file = pick.choose(&names).map_err(|e| ModelError::Hub(format!("`{repo}@{revision}` {e}")))?;
        hub.get(&file).map_err(|e| fail(&file, &e))
    }

    /// Downloads the files a model needs into the cache (the weights only
    /// `with_weights`), with a progress bar, and returns the snapshot
    /// directory.
    fn download(&self, repo: &str, revision: &str, with_weights: bool) -> Result<PathBuf, ModelError> {
        use hf_hub::{Repo, RepoType};
        let fail = |what: &str, e: &dyn std::fmt::Display| self.download_error(repo, revision, what, e);
        let hub = self.api(&fail)?.repo(Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string()));
        let info = hub.info().map_err(|e| fail("repository info", &e))?;
        let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let has = |n: &str| names.iter().any(|s| s == n);
        let mut wanted: Vec<String> = [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "chat_template.jinja",
            "chat_template.json",
        ]
            .into_iter()
            .filter(|n| has(n))
            .map(String::from)
            .collect();
        if !with_weights {
            // The tokenizer's files only.
        } else if has("model.safetensors.index.json") {
            wanted.push("model.safetensors.index.json".into());
            let index = hub.get("model.safetensors.index.json").map_err(|e| fail("weight index", &e))?;
            let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ModelError::Hub(format!("bad weight index: {e}")))?;
            let mut shards: Vec<String> = json["weight_map"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, v)| v.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            wanted.extend(shards);
        } else if has("model.safetensors") {
            wanted.push("model.safetensors".into());
        } else {
            return Err(ModelError::Hub(format!(
                "`{repo}@{revision}` has no safetensors weights (lmt loads model.safetensors or a sharded index; \
                 for a GGUF repository, name the file: `{repo}:Q4_K_M` or `{repo}/FILE.gguf`)"
            )));
        }
        for needed in ["config.json", "tokenizer.json"] {
            if !has(needed) {
                return Err(ModelError::Hub(format!("`{repo}@{revision}` has no {needed}")));
            }
        }
        let mut dir = None;
        for f in &wanted {
            let p = hub.get(f).map_err(|e| fail(f, &e))?;
            if f == "config.json" {
                dir = p.parent().map(Path::to_path_buf);
            }
        }
        dir.ok_or_else(|| ModelError::Hub(format!("`{repo}@{revision}`: nothing downloaded")))
    }
}

/// Files under `dir` (relative, `/`-separated), at most `depth` levels down.
fn list_files(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let p = e.path();
        if p.is_dir() {
            if depth > 1 {
                list_files(&p, &rel, depth - 1, out);
            }
        } else {
            out.push(rel);
        }
    }
}
