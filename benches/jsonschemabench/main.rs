//! `cargo bench --bench jsonschemabench -- DIR --tokenizer PATH [--json]`:
//! lmt's engine over every JSONSchemaBench-format file in `DIR` (`schema`,
//! `tests[].valid`, `tests[].data`; instances serialised compactly): one
//! summary — schemas compiled, compile and mask times (p50/p90/p99/max),
//! valid instances accepted, invalid ones rejected, compile errors by
//! reason, the slowest compiles and masks. With `--json`, one object with
//! exactly `schemas`, `compiled`, `compile_errors`, `compile_ms_p50`,
//! `compile_ms_p99`, `mask_count`, `mask_us_p50`, `mask_us_p90`,
//! `mask_us_p99`, `mask_us_max`, `valid_accepted`, `valid_total`,
//! `invalid_rejected`, `invalid_total`.

mod harness;

use std::path::PathBuf;

fn main() {
    // `cargo bench` adds `--bench`.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut dir = None;
    let mut tokenizer = None;
    let mut json = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tokenizer" => tokenizer = it.next().map(PathBuf::from),
            "--json" => json = true,
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let (Some(dir), Some(tokenizer)) = (dir, tokenizer) else {
        eprintln!("usage: cargo bench --bench jsonschemabench -- DIR --tokenizer PATH [--json]");
        std::process::exit(2);
    };
    match harness::bench(&dir, &tokenizer) {
        Ok((summary, _)) if json => println!("{summary}"),
        Ok((_, text)) => print!("{text}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}
