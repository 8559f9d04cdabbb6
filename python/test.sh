#!/usr/bin/env bash
# The Python bindings' tests (run by ../test.sh): the package built into a
# virtual environment with `maturin develop`, then pytest, then
# `mypy --strict` on the package, its tests and a typed usage example.
# The environment is cached in ~/.cache/lmt-python, keyed by the Python
# version and the pinned tools. Without python3 or PyPI the tests say
# SKIPPED (a failure under LMT_REQUIRE_ALL=1).
set -uo pipefail
cd "$(dirname "$0")"

. ../tests/skip.sh

py=${LMT_PYTHON:-python3}
command -v "$py" >/dev/null || skip "the Python bindings: no $py to test them with"
version=$("$py" -c 'import sys; assert sys.version_info >= (3, 9); print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || skip "the Python bindings: $py is older than 3.9"
venv=${LMT_PYTHON_VENV:-$HOME/.cache/lmt-python/venv-$version-$(sha256sum requirements-test.txt | cut -c1-12)}
if ! [ -x "$venv/bin/maturin" ] || ! [ -x "$venv/bin/pytest" ] || ! [ -x "$venv/bin/mypy" ]; then
    rm -rf "$venv"
    { "$py" -m venv "$venv" && "$venv/bin/pip" install -q -r requirements-test.txt; } >&2 \
        || { rm -rf "$venv"; skip "the Python bindings: cannot install maturin, pytest and mypy from PyPI"; }
fi
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
echo "python bindings: maturin develop, pytest, mypy --strict ($venv)"
maturin develop --locked --quiet || exit 1
pytest -q -p no:cacheprovider tests || exit 1
mypy --strict --cache-dir ../target/mypy-cache lmt tests examples/typed_usage.py benches/overhead.py || exit 1
