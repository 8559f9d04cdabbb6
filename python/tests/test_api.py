"""The Python API beyond a single run: the event stream, errors as data,
dataset rows, searches, `check` and `match`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import lmt
from conftest import EXAMPLES, cli_json, without_timings


def test_stream_ends_with_done_and_done_is_the_record(tiny: lmt.Model) -> None:
    template = lmt.Template.from_file(EXAMPLES / "vehicles.lmt")
    events = list(template.stream(tiny, n=2, seed=5, temperature=0.7))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("done") == 1
    assert events[0]["inputs"] == {"n": 2} and events[0]["seed"] == 5
    assert kinds.count("capture") == 2 and "text" in kinds
    # The text events spell the run's text, and `done` carries its record.
    done = events[-1]
    assert "".join(e["text"] for e in events if e["event"] == "text") == done["text"]
    run = template.run(tiny, n=2, seed=5, temperature=0.7)
    record = without_timings(run.to_json())
    for k in ("text", "captures", "tokens", "messages", "finish_reason", "logprob"):
        assert without_timings(done[k]) == record[k], k


def test_stream_of_a_failing_run_has_an_error_then_done(tiny: lmt.Model) -> None:
    template = lmt.Template('Say:{% gen x max_tokens=3 %}{{ x | fromjson }}')
    events = list(template.stream(tiny))
    assert [e["event"] for e in events][-2:] == ["error", "done"]
    assert events[-2]["code"].startswith("E08") and events[-2]["line"] == 1
    assert events[-1]["finish_reason"] == "error"


def test_broken_template_raises_with_each_error_and_its_line() -> None:
    source = "Fine text.\n{% gen a max_tokens=\"many\" %}\nMore text.\n{% select b in [] %}\n{% if %}"
    with pytest.raises(lmt.TemplateError) as caught:
        lmt.Template(source, name="broken.lmt")
    e = caught.value
    errors = e.errors
    assert {d.line for d in errors} >= {2, 4, 5}, [(d.code, d.line, d.message) for d in errors]
    for d in errors:
        assert d.code.startswith("E") and d.severity == "error" and d.file == "broken.lmt"
        assert d.rendered and d.rendered in str(e)
    assert "max_tokens" in str(e) and "broken.lmt:2:" in str(e)
    # `check` gives the same diagnostics without raising.
    assert [(d.code, d.line) for d in lmt.check(source)] == [(d.code, d.line) for d in e.diagnostics]


def test_files_inputs_and_options_fail_clearly(tiny: lmt.Model, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.lmt"):
        lmt.Template.from_file(tmp_path / "nope.lmt")
    chat = lmt.Template.from_file(EXAMPLES / "chat.lmt")
    assert chat.inputs == [lmt.Input("question", required=True)]
    with pytest.raises(lmt.InputError, match="the input `question` was not given"):
        chat.run(tiny)
    with pytest.raises(lmt.InputError, match="no input `questoin`.*question"):
        chat.run(tiny, questoin="x")
    with pytest.raises(lmt.InputError, match="JSON values"):
        chat.run(tiny, question=object())
    with pytest.raises(ValueError, match="temperature"):
        chat.run(tiny, question="x", temperature=-1.0)
    with pytest.raises(ValueError, match="score"):
        chat.run(tiny, question="x", score="most")
    for bad in (-1, 2**64, True, 1.5):
        with pytest.raises(ValueError, match="seed=.*whole number"):
            chat.run(tiny, question="x", seed=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parallel=0"):
        chat.run_many(tiny, [], parallel=0)
    with pytest.raises(ValueError, match="beam=65"):
        chat.search(tiny, question="x", beam=65)
    with pytest.raises(lmt.ModelError, match="/nonexistent/model"):
        lmt.Model("/nonexistent/model")
    with pytest.raises(ValueError, match="threads"):
        lmt.Model(tmp_path, threads=0)
    with pytest.raises(ValueError, match="threads"):
        lmt.Model(tmp_path, threads=2**70)


def test_a_run_error_keeps_the_partial_record(tiny: lmt.Model, tiny_dir: Path, lmt_bin: Path, tmp_path: Path) -> None:
    path = tmp_path / "fails.lmt"
    path.write_text('Say:{% gen x max_tokens=3 %} then {{ x | fromjson }}')
    with pytest.raises(lmt.RunError) as caught:
        lmt.Template.from_file(path).run(tiny)
    e = caught.value
    assert e.diagnostic.code.startswith("E08") and e.diagnostic.line == 1 and e.diagnostic.column > 30
    assert e.run.finish_reason == "error" and e.run.error is not None and e.run.error.code == e.diagnostic.code
    assert e.run.text.startswith("Say:") and len(e.run.capture("x").tokens) == 3
    assert without_timings(e.run.to_json()) == without_timings(cli_json(lmt_bin, path, tiny_dir, {}, code=3))


def test_run_many_matches_the_cli_rows_in_order(tiny: lmt.Model, tiny_dir: Path, lmt_bin: Path, tmp_path: Path) -> None:
    import subprocess

    template = lmt.Template.from_file(EXAMPLES / "vehicles.lmt")
    rows: List[Dict[str, Any]] = [{"n": 1}, {"id": "two", "n": 2}, {"n": "x", "bogus": 1}, {"n": 3}]
    results = template.run_many(tiny, rows, parallel=3, seed=9, temperature=0.9)
    assert [r.id for r in results] == [1, "two", 3, 4]
    assert [r.ok for r in results] == [True, True, False, True]
    bad = results[2]
    assert bad.run is None and bad.error is not None and bad.error.kind == "input" and "bogus" in bad.error.message
    for r, n in zip([results[0], results[1], results[3]], [1, 2, 3]):
        assert r.run is not None and len(r.run.capture_list("vehicle")) == n
    # The same rows through `lmt run --inputs`: the same records.
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run(
        [str(lmt_bin), "run", str(EXAMPLES / "vehicles.lmt"), "--model", str(tiny_dir), "--inputs", str(tmp_path / "rows.jsonl"),
         "--parallel", "2", "--seed", "9", "--temperature", "0.9", "--quiet", "--threads", "1"],
        capture_output=True, text=True,
    )
    assert out.returncode == 1, out.stderr  # one row failed
    cli = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["line"])
    # (Usage aside: how much of the prompt rows share depends on the rows in flight.)
    def strip(r: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in r.items() if k != "usage"}

    assert [strip(r.to_json()) for r in results] == [strip(r) for r in cli]
    # Defaults fill what a row leaves out; a row's result does not depend on `parallel`.
    again = template.run_many(tiny, [{"id": "two"}], parallel=1, seed=9, temperature=0.9, defaults={"n": 2})
    assert again[0].run is not None and results[1].run is not None
    assert again[0].run.text == results[1].run.text


def test_search_ranks_runs_as_the_cli_does(tiny: lmt.Model, tiny_dir: Path, lmt_bin: Path) -> None:
    path = EXAMPLES / "article.lmt"
    found = lmt.Template.from_file(path).search(tiny, beam=3)
    assert [r.rank for r in found.runs] == [1, 2, 3] and found.info["kind"] == "beam"
    scores = [r.score for r in found.runs]
    assert all(s is not None for s in scores) and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert found.best["fruit"] in (" apple", " banana", " orange", " cherry")
    assert without_timings(found.to_json()) == without_timings(cli_json(lmt_bin, path, tiny_dir, {}, "--beam", "3"))
    sampled = lmt.Template.from_file(EXAMPLES / "hello.lmt").search(tiny, samples=3, seed=2)
    assert len(sampled.runs) == 3 and len({r["city"] for r in sampled.runs}) > 1
    with pytest.raises(ValueError, match="at most one"):
        lmt.Template.from_file(path).search(tiny, samples=2, beam=2)
    # Rows searched: each row's record is its best run, with the runs ranked.
    rows = lmt.Template.from_file(path).run_many(tiny, [{}, {}], beam=2, parallel=2)
    for row in rows:
        assert row.run is not None and [r["rank"] for r in row.to_json()["runs"]] == [1, 2]
        assert row.to_json()["search"]["kind"] == "beam"
        assert row.run.text == found.best.text


def test_check_files_and_text() -> None:
    assert lmt.check(EXAMPLES / "hello.lmt") == []
    assert lmt.check(str(EXAMPLES / "hello.lmt")) == []
    warnings = lmt.check("{% set x = 1 %}{% gen y stop=\"\" %}")
    assert warnings and all(isinstance(d, lmt.Diagnostic) for d in warnings)
    with pytest.raises(FileNotFoundError):
        lmt.check("missing.lmt")


def test_match_walks_the_real_tokenizer(tiny_dir: Path) -> None:
    ok = lmt.match(lmt.Regex(r"[0-9]{4}-[0-9]{2}"), "2024-05", tiny_dir)
    assert ok and ok.tokens >= 2 and ok.details["complete"] is True
    no = lmt.match(lmt.Regex(r"[0-9]+"), "12a4", tiny_dir)
    assert not no and no.details["reject"]["byte_offset"] == 2 and "expected [0-9]" in no.message
    assert lmt.match(lmt.Choices(["yes", "no"]), "no", tiny_dir)
    assert not lmt.match(lmt.Choices(["yes", "no"]), "nope", tiny_dir)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert lmt.match(lmt.JsonSchema(schema), '{"a": 3}', tiny_dir)
    assert not lmt.match(lmt.JsonSchema(schema), '{"a": 3, "b": 1}', tiny_dir)
    assert lmt.match(lmt.JsonSchema(schema, open=True), '{"a": 3, "b": 1}', tiny_dir)
    assert lmt.match(lmt.RegexFrom("std/regex#date"), "2024-02-29", tiny_dir)
    assert not lmt.match(lmt.RegexFrom("std/regex#date"), "2023-02-29", tiny_dir)
    assert lmt.match(lmt.Grammar("std/chess#san"), "Nf3+", tiny_dir)
    with pytest.raises(ValueError, match="regex"):
        lmt.match(lmt.Regex("(unclosed"), "x", tiny_dir)


def test_iter_many_reads_rows_as_they_start_and_stops_when_closed(tiny: lmt.Model) -> None:
    template = lmt.Template.from_file(EXAMPLES / "vehicles.lmt")
    pulled = 0

    def endless() -> Iterator[Dict[str, Any]]:
        nonlocal pulled
        while True:
            pulled += 1
            yield {"n": 1}

    with template.iter_many(tiny, endless(), parallel=2) as results:
        first = [next(results) for _ in range(3)]
    assert all(r.ok for r in first) and len({r.id for r in first}) == 3
    assert pulled <= 3 + 2 + 2, pulled  # the rows done, in flight, and one being read
    # A row that is not JSON, raised from the rows as they are read.
    with pytest.raises(lmt.InputError, match="row 2"):
        template.run_many(tiny, [{"n": 1}, {"n": object()}])
    # What the rows' own iterator raises reaches the caller.
    def broken() -> Iterator[Dict[str, Any]]:
        yield {"n": 1}
        raise OSError("the source went away")

    with pytest.raises(OSError, match="went away"):
        template.run_many(tiny, broken())
    stream = template.iter_many(tiny, [{"n": 1}, {"n": 2}], parallel=2)
    assert sorted(r.line for r in stream) == [1, 2] and stream.summary is not None and stream.summary["done"] == 2


def test_run_writes_the_html_report(tiny: lmt.Model, tmp_path: Path) -> None:
    path = tmp_path / "number.lmt"
    path.write_text('A number: {% gen n regex="[0-9]{3}" %}')
    report = tmp_path / "report.html"
    run = lmt.Template.from_file(path).run(tiny, html=report)
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and "<title>number.lmt" in html
    assert run["n"] in html and "A number:" in html


def test_a_slow_reader_holds_the_run_back_and_loses_nothing(tiny: lmt.Model) -> None:
    template = lmt.Template("{% input k %}Row {{ k }}:{% gen x max_tokens=2 %}")
    results = template.iter_many(tiny, [{"k": i} for i in range(150)], parallel=4)
    first = next(results)
    time.sleep(1.0)  # the run fills its queue and waits for this reader
    rest = list(results)
    assert sorted(r.line for r in [first, *rest]) == list(range(1, 151))
    assert results.summary is not None and results.summary["done"] == 150
