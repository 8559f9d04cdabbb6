"""Shared fixtures: the tiny model every test runs on, the `lmt` binary the
records are compared with, and skips that say so where a person sees them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

import lmt

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def skip(what: str) -> None:
    """Skips the test because `what` is missing: a failure under
    LMT_REQUIRE_ALL=1 (CI), else a line in test.sh's SKIPPED summary."""
    if os.environ.get("LMT_REQUIRE_ALL") == "1":
        pytest.fail(f"LMT_REQUIRE_ALL=1, but {what}")
    log = os.environ.get("LMT_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"SKIPPED: {what}\n")
    pytest.skip(what)


def shared_data() -> Path:
    d = Path(os.environ.get("LMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
    if not d.is_dir():
        skip(f"shared test data not found at {d} (set LMT_SHARED_DATA)")
    return d


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The tiny random Llama 3 model (real safetensors, real tokenizer and chat template)."""
    return shared_data() / "tiny_models" / "llama3-tiny"


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> lmt.Model:
    return lmt.Model(tiny_dir, threads=1)


@pytest.fixture(scope="session")
def lmt_bin() -> Path:
    """The `lmt` binary `cargo test` built (test.sh runs it first)."""
    path = Path(os.environ.get("LMT_BIN", ROOT / "target" / "debug" / "lmt"))
    if not path.is_file():
        pytest.fail(f"no lmt binary at {path}: build it with `cargo build` (test.sh does)")
    return path


# Wall-clock fields, and how many batched passes the threads of a search
# happened to make: they differ between any two runs.
TIMINGS = {"tokens_per_second", "total_ms", "mask_ms", "time_to_first_token_ms", "batches"}


def without_timings(doc: Any) -> Any:
    """The document less the fields that differ between any two runs."""
    if isinstance(doc, dict):
        return {k: without_timings(v) for k, v in doc.items() if k not in TIMINGS}
    if isinstance(doc, list):
        return [without_timings(v) for v in doc]
    return doc


def cli_json(lmt_bin: Path, template: Path, model: Path, inputs: Dict[str, Any], *extra: str, code: int = 0) -> Dict[str, Any]:
    """`lmt run --json` of the same template, model and inputs (exiting with `code`)."""
    import json

    args: List[str] = [str(lmt_bin), "run", str(template), "--model", str(model), "--json", "--quiet", "--threads", "1"]
    for k, v in inputs.items():
        args += ["--var", f"{k}={json.dumps(v)}"]
    out = subprocess.run(args + list(extra), capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == code, out.stderr
    doc: Dict[str, Any] = json.loads(out.stdout)
    return doc
