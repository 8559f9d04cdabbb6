"""The real SmolLM2-135M-Instruct GGUF, as users have it: loaded here, and
served by a real llama-server (`Model("http://…")`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

import lmt
from conftest import EXAMPLES, cli_json, skip, without_timings


@pytest.fixture(scope="module")
def gguf() -> Path:
    d = Path(os.environ.get("LMT_TEST_MODELS", Path.home() / ".cache" / "lmt-test-models"))
    path = d / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        skip("the SmolLM2 GGUF is not fetched (run ../shared/scripts/fetch-smollm2.sh)")
    return path


@pytest.fixture(scope="module")
def server(gguf: Path) -> Iterator[str]:
    """llama-server on the GGUF, on a free port, until the module's tests end."""
    default = Path.home() / ".cache" / "lmt-llama-server" / "build" / "bin" / "llama-server"
    binary = Path(os.environ.get("LMT_LLAMA_SERVER", default))
    if not binary.is_file():
        skip("llama-server is not built (run ../shared/scripts/llama-cpp/build-server.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen(
        [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", "2", "-c", "4096"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:  # a hang guard, not a timing
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() - started < 120, "llama-server did not start"
                time.sleep(0.2)
        yield url
    finally:
        child.kill()
        child.wait()


def test_gguf_runs_as_the_cli_runs_it(gguf: Path, lmt_bin: Path) -> None:
    model = lmt.Model(gguf)
    assert "llama" in model.describe() and not model.is_remote
    template = lmt.Template.from_file(EXAMPLES / "trip.lmt")
    run = template.run(model)
    plan = json.loads(run["plan"])
    assert plan["city"] in ("Paris", "Oslo", "Lima") and 1 <= plan["days"] <= 14
    assert [m.role for m in run.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert without_timings(run.to_json()) == without_timings(cli_json(lmt_bin, EXAMPLES / "trip.lmt", gguf, {}))


def test_a_remote_engine_is_a_model_too(server: str, gguf: Path) -> None:
    model = lmt.Model(server, tokenizer=gguf, timeout=60)
    assert model.is_remote and "llama-server" in model.describe()
    run = lmt.Template.from_file(EXAMPLES / "json.lmt").run(model)
    p = json.loads(run["p"])
    assert set(p) == {"x", "y"} and all(-100 <= v <= 100 for v in p.values())
    assert run.usage.generated_tokens > 0
    # What the engine cannot do is refused before any request, as data.
    with pytest.raises(lmt.TemplateError) as caught:
        lmt.Template('Go:{% gen x regex="[a-z]+" bias={"a": -1.0} %}').run(model)
    assert caught.value.errors and caught.value.errors[0].code == "E0901"
    # What it does differently is a warning; a beam needs what it lacks.
    with pytest.warns(UserWarning, match="W0902"), pytest.raises(ValueError, match="beam"):
        lmt.Template.from_file(EXAMPLES / "article.lmt").search(model, beam=2)
