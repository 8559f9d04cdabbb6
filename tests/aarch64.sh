#!/usr/bin/env bash
# The kernels' tests on aarch64 (run by ../test.sh): the library's unit
# tests cross-built for aarch64-unknown-linux-gnu and run under qemu-user,
# whose default CPU has NEON and the dot-product extension, so every NEON
# build is checked bit for bit against the portable kernels as on x86-64.
# Needs the Rust target, a cross linker and qemu (.ci/run installs them:
# `rustup target add aarch64-unknown-linux-gnu`, Debian's
# gcc-aarch64-linux-gnu and qemu-user-static); without them the tests say
# SKIPPED (a failure under LMT_REQUIRE_ALL=1).
set -uo pipefail
cd "$(dirname "$0")/.."

. tests/skip.sh

target=aarch64-unknown-linux-gnu
rustup target list --installed 2>/dev/null | grep -qx "$target" \
    || skip "the aarch64 kernels: no Rust target $target (rustup target add $target)"
command -v aarch64-linux-gnu-gcc >/dev/null || skip "the aarch64 kernels: no cross linker aarch64-linux-gnu-gcc"
command -v qemu-aarch64-static >/dev/null || skip "the aarch64 kernels: no qemu-aarch64-static to run them"

echo "aarch64 kernels: cargo test --target $target --lib model::kernels (under qemu-user)"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
# The unit tests need none of the dev-dependencies (Cargo.toml) nor debug
# information; without them this cross build took 6.5 minutes instead of 14.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="--cfg lmt_kernels_only"
export CARGO_PROFILE_DEV_DEBUG=0
cargo test --locked --target "$target" --lib model::kernels
