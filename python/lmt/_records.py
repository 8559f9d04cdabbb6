"""What runs produce, as typed objects over the command line's JSON documents.

Each object keeps the document it was read from: ``to_json()`` gives back
exactly what ``lmt run --json`` (or a dataset record, or a search document)
holds, so records can be stored, compared and diffed as JSON.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

JSON = Dict[str, Any]


@dataclass(frozen=True)
class Diagnostic:
    """An error or warning about a template, or the error that stopped a run."""

    code: str
    """Its code, such as ``E0302`` (``lmt explain CODE`` says more)."""
    name: str
    """The code's kebab-case name."""
    severity: str
    """``error`` or ``warning``."""
    message: str
    file: str
    line: int
    """1-based line of the start."""
    column: int
    """1-based column of the start, in characters."""
    end_line: int
    end_column: int
    help: Optional[str]
    """How to fix it, when lmt knows."""
    rendered: str = ""
    """The diagnostic as ``lmt check`` prints it, source excerpt included."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Diagnostic":
        return cls(
            code=str(d.get("code", "")),
            name=str(d.get("name", "")),
            severity=str(d.get("severity", "error")),
            message=str(d.get("message", "")),
            file=str(d.get("file", "")),
            line=int(d.get("line", 0)),
            column=int(d.get("column", 0)),
            end_line=int(d.get("end_line", 0)),
            end_column=int(d.get("end_column", 0)),
            help=d.get("help"),
            rendered=str(d.get("rendered", "")),
        )

    def __str__(self) -> str:
        if self.rendered:
            return self.rendered
        return f"{self.file}:{self.line}:{self.column}: {self.severity}[{self.code}]: {self.message}"


@dataclass(frozen=True)
class Choice:
    """One option of a ``select``, with its score."""

    text: str
    logprob: float
    probability: float
    """Its share of the options' probability."""


@dataclass(frozen=True)
class Capture:
    """A captured value and its metadata (``run.captures["name"]``)."""

    name: str
    value: str
    logprob: float
    """Sum of the log-probabilities of its sampled tokens (a select: its option's score)."""
    tokens: List[int]
    """Token ids generated for it."""
    finish_reason: Optional[str]
    """``stop``, ``eos``, ``max_tokens``, ``constraint_complete``… (None for a plain capture)."""
    stop: Optional[str]
    """The stop text or regex match that ended it."""
    choices: List[Choice]
    """For a select: every option, most likely first."""

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any]) -> "Capture":
        return cls(
            name=name,
            value=str(d["value"]),
            logprob=float(d.get("logprob") or 0.0),
            tokens=list(d.get("tokens") or []),
            finish_reason=d.get("finish_reason"),
            stop=d.get("stop"),
            choices=[Choice(str(c["text"]), float(c["logprob"]), float(c["probability"])) for c in d.get("choices") or []],
        )


@dataclass(frozen=True)
class Token:
    """One token of the run: its id and text, where it came from and how it was chosen."""

    id: int
    text: str
    origin: str
    """``template``, ``variable``, ``generated``, ``role`` or ``bos``."""
    kind: str
    """``prompt``, ``sampled``, ``forced`` or ``healed``."""
    logprob: Optional[float]


@dataclass(frozen=True)
class Message:
    """A chat turn: its role and text."""

    role: str
    content: str


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of a run (``raw`` holds every field the document has)."""

    prompt_tokens: int
    generated_tokens: int
    forced_tokens: int
    forward_passes: int
    forward_tokens: int
    reused_tokens: int
    tokens_per_second: float
    total_ms: float
    raw: JSON = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Usage":
        return cls(
            prompt_tokens=int(d.get("prompt_tokens", 0)),
            generated_tokens=int(d.get("generated_tokens", 0)),
            forced_tokens=int(d.get("forced_tokens", 0)),
            forward_passes=int(d.get("forward_passes", 0)),
            forward_tokens=int(d.get("forward_tokens", 0)),
            reused_tokens=int(d.get("reused_tokens", 0)),
            tokens_per_second=float(d.get("tokens_per_second", 0.0)),
            total_ms=float(d.get("total_ms", 0.0)),
            raw=dict(d),
        )


CaptureEntry = Union[Capture, List[Capture]]
"""A capture assigned once is one Capture; one appended to (``gen xs[]``) is a list."""


class Run:
    """A run's record: its text, captures, chat messages, tokens, usage and
    how it ended. ``run["name"]`` is a captured value's text."""

    text: str
    captures: Dict[str, CaptureEntry]
    messages: List[Message]
    tokens: List[Token]
    """Every token (empty for a dataset row's record, which leaves them out)."""
    usage: Usage
    finish_reason: str
    """``done``, ``error`` or ``cancelled``."""
    logprob: Optional[float]
    logprob_all: Optional[float]
    """Log-prob of every token, template text included (``score="all"``)."""
    error: Optional["Failure"]
    """What stopped it, when something did."""
    rank: Optional[int]
    """Its rank in a search (1 = best)."""
    score: Optional[float]
    """What a search ranked it by."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc: JSON = dict(doc)
        self.text = str(doc.get("text", ""))
        self.captures = {}
        for name, c in (doc.get("captures") or {}).items():
            self.captures[name] = [Capture.from_json(name, x) for x in c] if isinstance(c, list) else Capture.from_json(name, c)
        self.messages = [Message(str(m["role"]), str(m["content"])) for m in doc.get("messages") or []]
        self.tokens = [
            Token(int(t["id"]), str(t["text"]), str(t["origin"]), str(t["kind"]), t.get("logprob")) for t in doc.get("tokens") or []
        ]
        self.usage = Usage.from_json(doc.get("usage") or {})
        self.finish_reason = str(doc.get("finish_reason", ""))
        self.logprob = doc.get("logprob")
        self.logprob_all = doc.get("logprob_all")
        error = doc.get("error")
        self.error = Failure.from_json(error) if isinstance(error, dict) else None
        self.rank = doc.get("rank")
        self.score = doc.get("score")

    def __getitem__(self, name: str) -> str:
        """The text of the capture ``name`` (the last one, for a list)."""
        c = self.captures[name]
        return c[-1].value if isinstance(c, list) else c.value

    def capture(self, name: str) -> Capture:
        """The capture ``name``, assigned once (a TypeError for a list capture)."""
        c = self.captures[name]
        if isinstance(c, list):
            raise TypeError(f"`{name}` is a list capture (`gen {name}[]`): use capture_list({name!r})")
        return c

    def capture_list(self, name: str) -> List[Capture]:
        """The captures appended to ``name`` (one assigned once is a list of one)."""
        c = self.captures.get(name, [])
        return c if isinstance(c, list) else [c]

    def to_json(self) -> JSON:
        """The document this run was read from (a copy): ``lmt run --json``'s for a single run."""
        return copy.deepcopy(self._doc)

    def __repr__(self) -> str:
        return f"<lmt.Run finish_reason={self.finish_reason!r} text={self.text[:40]!r}…>"


class Search:
    """A search over whole runs: every run kept, most likely first."""

    runs: List[Run]
    info: JSON
    """``kind``, ``size``, ``runs_started``, ``forward_tokens``, ``shared_tokens``, ``greedy_logprob``…"""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self._doc: JSON = dict(doc)
        self.runs = [Run(r) for r in doc.get("runs") or []]
        self.info = dict(doc.get("search") or {})

    @property
    def best(self) -> Run:
        """The most likely run."""
        if not self.runs:
            raise LookupError("the search has no run")
        return self.runs[0]

    def to_json(self) -> JSON:
        """``lmt run --samples/--best-of/--beam --json``'s document (a copy)."""
        return copy.deepcopy(self._doc)


@dataclass(frozen=True)
class Failure:
    """What stopped a run, or a dataset row: its kind (``input`` for a row's
    bad input; ``value``, ``limit``, ``model``… for a run's error), message and
    code, and for a row's run error the line and column in the template."""

    kind: str
    message: str
    code: Optional[str]
    line: Optional[int]
    column: Optional[int]

    @classmethod
    def from_json(cls, e: Mapping[str, Any]) -> "Failure":
        return cls(str(e.get("kind", "")), str(e.get("message", "")), e.get("code"), e.get("line"), e.get("column"))


class RowResult:
    """One row of ``Template.run_many``: its id, inputs, run and error."""

    id: Any
    """The row's ``id``, else its 1-based position."""
    line: int
    inputs: JSON
    run: Optional[Run]
    """Its run (without the token list); None when it never ran (a bad input)."""
    error: Optional[Failure]

    def __init__(self, record: Mapping[str, Any]) -> None:
        self._record: JSON = dict(record)
        self.id = record.get("id")
        self.line = int(record.get("line", 0))
        self.inputs = dict(record.get("inputs") or {})
        self.run = Run(record) if "text" in record else None
        e = record.get("error")
        self.error = Failure.from_json(e) if isinstance(e, dict) else None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> JSON:
        """The row's record, as ``lmt run --inputs`` writes it (a copy)."""
        return copy.deepcopy(self._record)

    def __repr__(self) -> str:
        return f"<lmt.RowResult id={self.id!r} ok={self.ok}>"


@dataclass(frozen=True)
class MatchResult:
    """What ``lmt.match`` found: accepted or not, and where a refused text went wrong."""

    accepted: bool
    message: str
    tokens: int
    """Tokens the text is made of."""
    details: JSON
    """``lmt match --json``'s object."""

    def __bool__(self) -> bool:
        return self.accepted
