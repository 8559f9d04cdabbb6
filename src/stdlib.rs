//! The standard library: `stdlib/*.lmt`, embedded at build time and imported
//! as `std/NAME`.

include!(concat!(env!("OUT_DIR"), "/stdlib.rs"));

/// The source of stdlib module `name` (`std/json`).
pub fn get(name: &str) -> Option<&'static str> {
    MODULES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The names of all stdlib modules.
pub fn names() -> impl Iterator<Item = &'static str> {
    MODULES.iter().map(|(n, _)| *n)
}

/// Resolves an import path `std/NAME[.lmt]`: the module's name and source,
/// or a message and a help line (the closest name, or the list).
pub fn resolve(path: &str) -> Result<(String, &'static str), (String, String)> {
    let name = format!("std/{}", path.strip_prefix("std/").unwrap_or(path).trim_end_matches(".lmt"));
    match get(&name) {
        Some(text) => Ok((name, text)),
        None => {
            let all: Vec<&str> = names().collect();
            let help = match crate::diagnostic::suggest(&name, all.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => format!("stdlib modules are: {}", all.join(", ")),
            };
            Err((format!("there is no stdlib module `{name}`"), help))
        }
    }
}
