"""Every example template runs through `Template.run` on the tiny model: each
value is checked in Python against its constraint (with `re`, `json`,
`datetime`, `ast`: not lmt's engine), and the record equals what
`lmt run --json` prints for the same seed."""

from __future__ import annotations

import ast
import datetime
import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

import pytest

import lmt
from conftest import EXAMPLES, cli_json, without_timings

SAN = re.compile(r"(O-O-O|O-O|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|([a-h]x)?[a-h][1-8](=[QRBN])?)[+#]?")
TRIPLE = r"\([^,()]+, [^,()]+, [^,()]+\)"
AGENT_CALL = re.compile(
    r'\{"name": "weather", "arguments": \{"city": "(Paris|Oslo|Lima)"\}\}'
    r'|\{"name": "answer", "arguments": \{"text": "[A-Za-z0-9 .,%-]{1,60}"\}\}'
)


def one_line(v: str) -> None:
    assert "\n" not in v, repr(v)


def check_agent(run: lmt.Run) -> None:
    calls = run.capture_list("calls")
    assert 1 <= len(calls) <= 3
    for c in calls:
        assert AGENT_CALL.fullmatch(c.value), c.value
        assert json.loads(c.value)["name"] in ("weather", "answer")


def check_article(run: lmt.Run) -> None:
    assert run["article"] in (" a", " the", " an")
    assert run["fruit"] in (" apple", " banana", " orange", " cherry")
    assert [c.text for c in run.capture("fruit").choices][0] == run["fruit"]


def check_capture(run: lmt.Run) -> None:
    one_line(run["value"])
    assert run["letter"] in run.text


def check_chat(run: lmt.Run) -> None:
    assert run["feeling"] in ("helpful", "confusing")
    assert [m.role for m in run.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert run.messages[1].content.startswith("What is a KV cache?<|im_end|>")
    assert run.capture("reply").finish_reason in ("eos", "max_tokens")


def check_chess(run: lmt.Run) -> None:
    assert SAN.fullmatch(run["first"]), run["first"]
    assert run["best"] in ("e4", "d4", "Nf3", "c4")


def check_dialogue(run: lmt.Run) -> None:
    for name in ("answer", "second"):
        assert "\nUser:" not in run[name]
        c = run.capture(name)
        assert c.finish_reason in ("stop", "max_tokens", "eos")
        if c.finish_reason == "stop":
            assert c.stop == "\nUser:"


def check_extract(run: lmt.Run) -> None:
    assert re.fullmatch(rf"NONE|{TRIPLE}(<\|>{TRIPLE})*", run["triples"]), run["triples"]


def check_grammar(run: lmt.Run) -> None:
    e = run["e"]
    assert re.fullmatch(r"[0-9.+\-*/() ]+", e), e
    ast.parse(e, mode="eval")  # a subset of Python's expressions
    assert re.fullmatch(r"[0-9]+(\.[0-9]+)?", run["n"]), run["n"]


def check_hello(run: lmt.Run) -> None:
    one_line(run["city"])
    assert run.text.startswith("The capital of France is")


def check_json(run: lmt.Run) -> None:
    p = json.loads(run["p"])
    assert set(p) == {"x", "y"} and all(type(v) is int and -100 <= v <= 100 for v in p.values()), p
    person = json.loads(run["person"])
    assert {"name", "age"} <= set(person) <= {"name", "age", "born"}, person
    assert isinstance(person["name"], str) and len(person["name"]) <= 40
    assert type(person["age"]) is int and 0 <= person["age"] <= 150
    if "born" in person:
        datetime.date.fromisoformat(person["born"])


def check_reviews(run: lmt.Run) -> None:
    info = json.loads(run["info"])
    assert set(info) == {"product", "sentiment", "problem"}, info
    assert isinstance(info["product"], str) and len(info["product"]) <= 30
    assert info["sentiment"] in ("positive", "negative", "mixed")
    assert info["problem"] is None or (isinstance(info["problem"], str) and len(info["problem"]) <= 60)


def check_select(run: lmt.Run) -> None:
    assert run["answer"] in ("yes", "no", "maybe")
    probabilities = [c.probability for c in run.capture("answer").choices]
    assert abs(sum(probabilities) - 1.0) < 1e-6 and probabilities == sorted(probabilities, reverse=True)
    assert run["mood"] in ("sunny", "rainy") or run["mood"] == run["other"]


def check_speakers(run: lmt.Run) -> None:
    assert run["speaker"] in ("Einstein", "Socrates")
    lines = run.capture_list("line")
    assert len(lines) == 3
    for line in lines:
        one_line(line.value)


def check_trip(run: lmt.Run) -> None:
    plan = json.loads(run["plan"])
    assert set(plan) == {"city", "days"} and plan["city"] in ("Paris", "Oslo", "Lima"), plan
    assert type(plan["days"]) is int and 1 <= plan["days"] <= 14
    datetime.date.fromisoformat(run["date"])  # a real date, leap years included
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", run["date"])
    assert run["umbrella"] in ("yes", "no")


def check_usage(run: lmt.Run) -> None:
    one_line(run["colour"])
    count = run.capture("count")
    if count.finish_reason == "stop":
        assert count.stop is not None and re.fullmatch(r"[.!]", count.stop)


def check_vehicles(run: lmt.Run) -> None:
    vehicles = run.capture_list("vehicle")
    assert len(vehicles) == 6
    for v in vehicles:
        assert "\n" not in v.value and " (" not in v.value


def partial_grammar(value: str) -> None:
    """An unfinished arithmetic expression: its characters, and no `)` before its `(`."""
    assert re.fullmatch(r"[0-9.+\-*/() ]*", value), value
    depth = 0
    for ch in value:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth >= 0, value


def partial_extract(value: str) -> None:
    """Unfinished triples: `NONE` begun, or whole triples then one begun."""
    if value and value[0] == "N":
        assert "NONE".startswith(value)
        return
    *whole, last = value.split("<|>")
    for t in whole:
        assert re.fullmatch(TRIPLE, t), t
    assert re.fullmatch(r"\((?:[^,()]*(?:, [^,()]*(?:, [^,()]*)?)?)?", last) or "<|>".startswith(last), last


# Examples whose values a random model can leave unfinished (`max_tokens`
# runs out first): the run stops with E0805, and the value it was making
# must still be the start of one its constraint takes.
PARTIAL: Dict[str, Tuple[str, Callable[[str], None]]] = {
    "grammar": ("An arithmetic expression that equals 10: ", partial_grammar),
    "extract": ("Triples: ", partial_extract),
}

# example → (inputs, checks)
EXAMPLES_RUN: Dict[str, Tuple[Dict[str, Any], Callable[[lmt.Run], None]]] = {
    "agent": ({}, check_agent),
    "article": ({}, check_article),
    "capture": ({}, check_capture),
    "chat": ({"question": "What is a KV cache?<|im_end|>"}, check_chat),
    "chess": ({}, check_chess),
    "dialogue": ({}, check_dialogue),
    "extract": ({}, check_extract),
    "grammar": ({}, check_grammar),
    "hello": ({}, check_hello),
    "json": ({}, check_json),
    "reviews": ({"review": "The kettle boils fast but the lid broke."}, check_reviews),
    "select": ({}, check_select),
    "speakers": ({}, check_speakers),
    "trip": ({}, check_trip),
    "usage": ({}, check_usage),
    "vehicles": ({}, check_vehicles),
}


def test_every_example_is_covered() -> None:
    on_disk = {p.stem for p in EXAMPLES.glob("*.lmt")}
    assert on_disk == set(EXAMPLES_RUN), "an example without Python checks, or checks for one that is gone"


@pytest.mark.parametrize("name", sorted(EXAMPLES_RUN))
def test_example_runs_with_its_constraints_kept(name: str, tiny: lmt.Model, tiny_dir: Path, lmt_bin: Path) -> None:
    inputs, check = EXAMPLES_RUN[name]
    template = lmt.Template.from_file(EXAMPLES / f"{name}.lmt")
    for seed, temperature in ((0, 0.0), (11, 0.8)):
        try:
            run = template.run(tiny, seed=seed, temperature=temperature, inputs=inputs)
            assert run.finish_reason == "done"
            check(run)
            code = 0
        except lmt.RunError as e:
            assert name in PARTIAL and e.diagnostic.code == "E0805", e
            run = e.run
            assert run.finish_reason == "error" and run.error is not None and run.error.code == e.diagnostic.code
            # The unfinished value: what the text holds after the template text before it.
            before, partial = PARTIAL[name]
            unfinished = run.text.split(before, 1)[1]
            assert unfinished and f'"{unfinished[:20]}' in e.diagnostic.message
            partial(unfinished)
            code = 3
        cli = cli_json(lmt_bin, EXAMPLES / f"{name}.lmt", tiny_dir, inputs, "--seed", str(seed), "--temperature", str(temperature), code=code)
        assert without_timings(run.to_json()) == without_timings(cli)
