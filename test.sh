#!/usr/bin/env bash
# The test command (README): every test (the Rust crate's, then, when no
# cargo arguments narrow the run, the Python bindings' and the kernels' on
# aarch64 under qemu), then a summary of what was skipped for want of
# ../shared, the fetched SmolLM2 GGUF, Chromium, Python's test tools or the
# aarch64 cross tools. CI runs this
# same command with LMT_REQUIRE_ALL=1, under which a skip is a failure.
set -uo pipefail
cd "$(dirname "$0")"
export LMT_SKIP_LOG="$PWD/target/lmt-skipped.txt"
mkdir -p target && rm -f "$LMT_SKIP_LOG"
cargo test --locked "$@"
status=$?
if [ $# -eq 0 ]; then
    bash python/test.sh || status=1
    bash tests/aarch64.sh || status=1
fi
if [ -s "$LMT_SKIP_LOG" ]; then
    echo
    echo "SKIPPED ($(sort -u "$LMT_SKIP_LOG" | wc -l) kinds; run .ci/run for everything):"
    sort -u "$LMT_SKIP_LOG" | sed 's/^SKIPPED: /  /'
else
    echo
    echo "SKIPPED: nothing"
fi
exit $status
