//! Reading the files a run touches: the template itself, the modules it
//! imports and the schema files it names. The rules live here so the
//! workspace, the checker and the interpreter apply the same ones:
//!
//! - only regular files are read (no devices, FIFOs or terminals, which
//!   never end or block), at most [`MAX_FILE_BYTES`], as UTF-8;
//! - a path a *template* names is relative and, once symlinks are resolved,
//!   must lie under the root folder (by default the entry template's
//!   folder), so a template cannot read `/proc/self/environ`,
//!   `../../.ssh/…` or `/dev/stdin` and show it in a diagnostic.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Largest template, module or schema file read.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads files for the workspace. The language server lays unsaved editor
/// buffers over the disk with [`FsLoader::overlay`].
pub trait Loader {
    /// The text of the file at `path`.
    fn read(&self, path: &Path) -> io::Result<String>;

    /// The folder that paths named by templates must stay under; `None`:
    /// the entry template's folder (or the working directory for text that
    /// has no file).
    fn root(&self) -> Option<&Path> {
        None
    }
}

/// Reads from the file system under [`read_file`]'s rules, preferring
/// overlaid texts.
#[derive(Debug, Default, Clone)]
pub struct FsLoader {
    /// Texts that replace what is on disk, by path.
    pub overlay: HashMap<PathBuf, String>,
    /// The folder imports and schema files must stay under (`--root`).
    pub root: Option<PathBuf>,
}

impl Loader for FsLoader {
    fn read(&self, path: &Path) -> io::Result<String> {
        if let Some(t) = self.overlay.get(path) {
            return Ok(t.clone());
        }
        let canon = std::fs::canonicalize(path).ok();
        if let Some(t) = canon.as_ref().and_then(|c| self.overlay.get(c)) {
            return Ok(t.clone());
        }
        read_file(path)
    }

    fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }
}

/// Reads a regular file of at most [`MAX_FILE_BYTES`] as UTF-8.
pub fn read_file(path: &Path) -> io::Result<String> {
    // Checked before opening: opening a FIFO for reading blocks.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let file = std::fs::File::open(path)?;
    read_bounded(file, "the file")
}

/// Reads all of `r` as UTF-8, refusing more than [`MAX_FILE_BYTES`]
/// (standard input, a file that grows while read).
pub fn read_bounded(r: impl Read, what: &str) -> io::Result<String> {
    let mut bytes = Vec::new();
    r.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        let msg = format!("{what} is larger than {} MiB", MAX_FILE_BYTES >> 20);
        return Err(io::Error::new(io::ErrorKind::InvalidData, msg));
    }
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Why a path a template names is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// An absolute path.
    Absolute,
    /// Outside the root folder (after `..` and symlinks are resolved).
    OutsideRoot(PathBuf),
}

impl Refused {
    /// The message, naming `path` as written.
    pub fn message(&self, path: &str) -> String {
        match self {
            Refused::Absolute => format!("`{path}` is an absolute path"),
            Refused::OutsideRoot(root) => format!("`{path}` is outside the template's root folder `{}`", root.display()),
        }
    }

    /// What to do about it.
    pub fn help(&self) -> &'static str {
        "templates may name files under their root folder only (the entry template's folder, or `--root DIR`), by relative paths; stdlib modules start with `std/`"
    }
}

/// Where `path`, named by a template in folder `base`, resolves: refused
/// when absolute or when it leaves `root`. A path that does not exist is
/// returned as joined, for the read to report.
pub fn resolve_named(path: &str, base: Option<&Path>, root: Option<&Path>) -> Result<PathBuf, Refused> {
    let p = Path::new(path);
    if p.is_absolute() || p.has_root() {
        return Err(Refused::Absolute);
    }
    let full = match base {
        Some(dir) => dir.join(p),
        None => p.to_path_buf(),
    };
    let Some(root) = root else { return Ok(full) };
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    // Resolve symlinks and `..`; for a file that does not exist, resolve
    // its folder so `../../x` cannot pass by being missing.
    let canon = std::fs::canonicalize(&full).or_else(|_| {
        let parent = full.parent().map(std::fs::canonicalize).unwrap_or_else(|| Ok(PathBuf::new()))?;
        Ok::<_, io::Error>(parent.join(full.file_name().unwrap_or_default()))
    });
    match canon {
        Ok(c) if c.starts_with(&root) => Ok(full),
        Ok(_) => Err(Refused::OutsideRoot(root)),
        // Neither the file nor its folder exists: the read reports it.
        Err(_) if !full.components().any(|c| c == std::path::Component::ParentDir) => Ok(full),
        Err(_) => Err(Refused::OutsideRoot(root)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_fifos_are_not_read() {
        let e = read_file(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(read_file(Path::new("/")).is_err());
    }

    #[test]
    fn input_past_the_limit_is_refused() {
        let e = read_bounded(io::repeat(b'a'), "standard input").unwrap_err();
        assert!(e.to_string().contains("larger than 16 MiB"), "{e}");
        assert_eq!(read_bounded(&b"abc"[..], "x").unwrap(), "abc");
        assert!(read_bounded(&[0xffu8][..], "x").is_err());
    }

    #[test]
    fn named_paths_stay_under_the_root() {
        let root = std::env::temp_dir().join(format!("lmt-files-{}", std::process::id()));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.lmt"), "a").unwrap();
        std::fs::write(root.join("b.lmt"), "b").unwrap();
        let sub = root.join("sub");
        assert!(resolve_named("a.lmt", Some(&sub), Some(&root)).is_ok());
        assert!(resolve_named("../b.lmt", Some(&sub), Some(&root)).is_ok());
        assert!(resolve_named("missing.lmt", Some(&sub), Some(&root)).is_ok(), "left for the read to report");
        assert_eq!(resolve_named("/etc/passwd", Some(&sub), Some(&root)), Err(Refused::Absolute));
        let out = |p: &str| matches!(resolve_named(p, Some(&sub), Some(&root)), Err(Refused::OutsideRoot(_)));
        assert!(out("../../b.lmt") && out("../../../../../../etc/passwd") && out("../../nowhere/x.lmt"));
        #[cfg(unix)]
        {
            let _ = std::fs::remove_file(sub.join("link.lmt"));
            std::os::unix::fs::symlink("/etc/hostname", sub.join("link.lmt")).unwrap();
            assert!(out("link.lmt"), "a symlink out of the root is refused");
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
