//! `cargo fuzz run check`: any bytes, read as a template, go through the
//! parser, the checker, the compiler and both diagnostic renderers without
//! panicking, and every span stays inside the text on char boundaries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmt::workspace::{FsLoader, Workspace};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let ws = Workspace::load_text("fuzz.lmt", text, None, &FsLoader::default());
    for d in &ws.diagnostics {
        let f = ws.sources.get(d.file);
        assert!(d.span.start <= d.span.end && d.span.end as usize <= f.text.len());
        assert!(f.text.is_char_boundary(d.span.start as usize) && f.text.is_char_boundary(d.span.end as usize));
        let _ = lmt::cli::report::render(d, &ws.sources, false, 80);
        let _ = lmt::cli::report::render_json(d, &ws.sources);
    }
    let program = lmt::ir::compile(&ws);
    let _ = lmt::ir::disasm::disassemble(&program, &ws.sources);
});
