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
