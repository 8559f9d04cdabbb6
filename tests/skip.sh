# `skip REASON`, for the test scripts that test.sh runs (sourced): says
# SKIPPED on stderr and in $LMT_SKIP_LOG (test.sh's summary), then exits
# the script: 0, or 1 under LMT_REQUIRE_ALL=1, where a skip is a failure.
skip() {
    echo "SKIPPED: $1" >&2
    [ -n "${LMT_SKIP_LOG:-}" ] && echo "SKIPPED: $1" >> "$LMT_SKIP_LOG"
    if [ "${LMT_REQUIRE_ALL:-}" = 1 ]; then
        echo "LMT_REQUIRE_ALL=1, but $1" >&2
        exit 1
    fi
    exit 0
}
