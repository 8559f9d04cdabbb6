//! The `lmt` binary: see [`lmt::cli`].

fn main() {
    std::process::exit(lmt::cli::main());
}
