//! Model specs (`--model` / `LMT_MODEL`): a local directory, a `.gguf`
//! file, or a Hugging Face hub id `org/name[@revision]` found in the
//! Hugging Face cache (shared with Python tools) and downloaded into it when
//! absent. The cache directory, token and offline mode are resolved here, by
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
}

impl ModelSpec {
    /// Reads a spec: an existing path, a path ending in `.gguf`, or else
    /// something shaped like `org/name[@revision]`.
    pub fn parse(s: &str) -> Result<ModelSpec, ModelError> {
        let path = Path::new(s);
        if path.exists() || s.ends_with(".gguf") || s.starts_with('.') || s.starts_with('/') || s.starts_with('~') {
            return Ok(ModelSpec::Path(path.to_path_buf()));
        }
        let (repo, revision) = match s.split_once('@') {
            Some((r, v)) => (r, v),
            None => (s, "main"),
        };
        let ok_part = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() == 2 && parts.iter().all(|p| ok_part(p)) && !revision.is_empty() && !revision.contains("..") {
            return Ok(ModelSpec::Hub { repo: repo.to_string(), revision: revision.to_string() });
        }
        Err(ModelError::MissingFile {
            path: path.to_path_buf(),
            what: "a model directory, a .gguf file, or a hub id like `org/name[@revision]`".into(),
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
                None if env.offline => Err(ModelError::Hub(format!(
                    "model `{repo}@{revision}` is not in the Hugging Face cache at `{}`, and HF_HUB_OFFLINE is set, \
                     so it cannot be downloaded: set HF_HUB_CACHE (or HF_HOME) to a cache that holds it, \
                     or unset HF_HUB_OFFLINE to download it",
                    env.cache.display()
                ))),
                None => env.download(repo, revision),
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
        let dir = self.repo_dir(repo);
        let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
        let commit = if is_commit {
            revision.to_string()
        } else {
            std::fs::read_to_string(dir.join("refs").join(revision)).ok()?.trim().to_string()
        };
        let snap = dir.join("snapshots").join(commit);
        let complete = snap.join("config.json").is_file()
            && snap.join("tokenizer.json").is_file()
            && super::safetensors_files(&snap).is_ok();
        complete.then_some(snap)
    }

    /// Downloads the files a model needs into the cache, with a progress
    /// bar, and returns the snapshot directory.
    fn download(&self, repo: &str, revision: &str) -> Result<PathBuf, ModelError> {
        use hf_hub::api::sync::ApiBuilder;
        use hf_hub::{Cache, Repo, RepoType};
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            ModelError::Hub(format!(
                "cannot download `{repo}@{revision}` from {} ({what}): {e}. Without a network, set HF_HUB_OFFLINE=1 \
                 and point HF_HUB_CACHE (or HF_HOME) at a cache that holds the model, or pass a local directory",
                self.endpoint
            ))
        };
        let api = ApiBuilder::from_cache(Cache::new(self.cache.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(true)
            .build()
            .map_err(|e| fail("client", &e))?;
        let hub = api.repo(Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string()));
        let info = hub.info().map_err(|e| fail("repository info", &e))?;
        let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let has = |n: &str| names.iter().any(|s| s == n);
        let mut wanted: Vec<String> = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
            .into_iter()
            .filter(|n| has(n))
            .map(String::from)
            .collect();
        if has("model.safetensors.index.json") {
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
                 for GGUF, download the .gguf file and pass its path)"
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
