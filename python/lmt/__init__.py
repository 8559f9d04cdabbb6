"""lmt from Python: templates that interleave fixed text with language-model
generation, every generated value checked against its regex, grammar, JSON
Schema or choice list.

    import lmt
    model = lmt.Model("HuggingFaceTB/SmolLM2-135M-Instruct")
    template = lmt.Template.from_file("examples/hello.lmt")
    run = template.run(model)
    print(run.text, run["city"])

The work is done by the Rust library the ``lmt`` command uses (``lmt._lmt``);
records are the command line's JSON documents, read into typed objects.
The GIL is released while a model runs, and Ctrl-C stops a run at its next
token: ``RunInterrupted`` (a KeyboardInterrupt) carries what it made.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from . import _lmt
from ._lmt import InputError, ModelError, __version__
from ._records import (
    Capture,
    CaptureEntry,
    Choice,
    Diagnostic,
    Message,
    MatchResult,
    Failure,
    RowResult,
    Run,
    Search,
    Token,
    Usage,
)

__all__ = [
    "Capture",
    "CaptureEntry",
    "Choice",
    "Choices",
    "Constraint",
    "Diagnostic",
    "Event",
    "Failure",
    "Events",
    "Grammar",
    "Input",
    "InputError",
    "JsonSchema",
    "Message",
    "MatchResult",
    "Model",
    "ModelError",
    "Regex",
    "RegexFrom",
    "RowResult",
    "RowResults",
    "Run",
    "RunError",
    "RunInterrupted",
    "Search",
    "Template",
    "TemplateError",
    "Token",
    "Usage",
    "__version__",
    "check",
    "match",
]

PathLike = Union[str, "os.PathLike[str]"]
Event = Dict[str, Any]
"""One object of ``lmt run --events``: its ``event`` field says which."""


class TemplateError(ValueError):
    """A template has errors (or needs what a remote engine lacks).
    ``diagnostics`` holds them as data; ``str()`` is the rendered report."""

    def __init__(self, name: str, diagnostics: List[Diagnostic], report: str) -> None:
        self.name = name
        self.diagnostics = diagnostics
        self.report = report
        super().__init__(report)

    @property
    def errors(self) -> List[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def __str__(self) -> str:
        return self.report


class RunError(RuntimeError):
    """An error stopped a run (an unsatisfiable constraint, a limit, the model
    failing). ``run`` is the record up to there; ``diagnostic`` says where."""

    def __init__(self, run: Run, diagnostic: Diagnostic, kind: str) -> None:
        self.run = run
        self.diagnostic = diagnostic
        self.kind = kind
        super().__init__(f"{diagnostic.code}: {diagnostic.message} ({diagnostic.file}:{diagnostic.line}:{diagnostic.column})")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or another signal handler that raised) stopped the work at its
    next token. What it made so far is kept: ``run`` (a run or the best run of
    a search, finish reason ``cancelled``), ``search``, or ``rows`` (the rows
    finished before it; rows in flight are left out)."""

    def __init__(
        self, run: Optional[Run] = None, rows: Optional[List[RowResult]] = None, search: Optional[Search] = None
    ) -> None:
        self.run = run
        self.rows = rows
        self.search = search
        super().__init__("interrupted: partial result kept")


def _diagnostics(text: str) -> List[Diagnostic]:
    return [Diagnostic.from_json(d) for d in json.loads(text)]


def _interrupted(raised: Optional[BaseException], **partial: Any) -> None:
    """Raises what a signal handler raised while the work ran, with the partial result."""
    if raised is None:
        return
    if isinstance(raised, KeyboardInterrupt):
        raise RunInterrupted(**partial) from raised
    for k, v in partial.items():
        setattr(raised, k, v)
    raise raised


def _inputs_json(inputs: Optional[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> str:
    values = dict(inputs or {})
    values.update(kwargs)
    try:
        return json.dumps(values, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InputError(f"input values must be JSON values (str, int, float, bool, None, lists, dicts): {e}") from None


def _whole(name: str, value: object, lo: int, hi: int) -> int:
    """`value` as a whole number from `lo` to `hi`, else a ValueError that says so."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r}: give a whole number from {lo} to {hi}")
    return value


_SEED_MAX = 2**64 - 1


def _score_all(score: str) -> bool:
    if score not in ("chosen", "all"):
        raise ValueError(f"score={score!r}: give 'chosen' (the tokens the model chose) or 'all' (every token)")
    return score == "all"


class Model:
    """A model, loaded once and shared by any number of runs and threads.

    ``spec`` is what ``lmt run --model`` takes: a model directory, a ``.gguf``
    file, a hub id (``org/name[@revision]``, ``org/name:Q4_K_M``), or a
    serving engine's URL (``http://host:port``, with ``engine=`` and
    ``timeout=``). ``tokenizer`` and ``chat_template`` replace the model's
    own; ``threads`` is how many CPU threads compute (default: the cores).
    """

    def __init__(
        self,
        spec: PathLike,
        *,
        tokenizer: Optional[PathLike] = None,
        chat_template: Optional[PathLike] = None,
        threads: Optional[int] = None,
        engine: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._model = _lmt.Model(
            os.fspath(spec),
            tokenizer=None if tokenizer is None else os.fspath(tokenizer),
            chat_template=None if chat_template is None else os.fspath(chat_template),
            threads=None if threads is None else _whole("threads", threads, 1, 1024),
            engine=engine,
            timeout=timeout,
        )

    @property
    def spec(self) -> str:
        return self._model.spec

    @property
    def is_remote(self) -> bool:
        return self._model.is_remote

    def describe(self) -> str:
        """What it is, in words."""
        return self._model.describe()

    def __repr__(self) -> str:
        return f"lmt.Model({self.spec!r})"


@dataclass(frozen=True)
class Input:
    """An input a template declares with ``{% input %}``."""

    name: str
    required: bool
    """True when it has no default value."""


_C = TypeVar("_C", bound="_Closing")


class _Closing:
    """An iterator over work on a thread of its own: closing it (or leaving a
    ``with`` block) stops the work; what it already made can still be read."""

    _inner: Union[_lmt.Events, _lmt.RowStream]

    def __iter__(self: _C) -> _C:
        return self

    def close(self) -> None:
        """Stops the work (a run at its next token; rows: none starts, those in flight end)."""
        self._inner.close()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Events(_Closing):
    """A run's events as they happen (``lmt run --events``' objects): ``start``,
    ``text``, ``role``, ``capture``, ``error`` when one stopped it, and a last
    ``done`` with the whole record. Closing it (or leaving a ``with`` block)
    stops the run; its remaining events can still be read."""

    _inner: _lmt.Events

    def __init__(self, inner: _lmt.Events) -> None:
        self._inner = inner

    def __next__(self) -> Event:
        event: Event = json.loads(next(self._inner))  # StopIteration after `done`
        return event


class Template:
    """A template, checked when it is made: one with errors raises
    ``TemplateError``. Its warnings are in ``diagnostics``."""

    def __init__(
        self, source: str, *, name: str = "<template>", path: Optional[PathLike] = None, root: Optional[PathLike] = None
    ) -> None:
        """``path`` places the text for relative imports and schema files
        (default: ``name`` in the working folder); ``root`` is the folder
        those must stay under."""
        self._init(
            _lmt.Template(
                source,
                name=name,
                path=None if path is None else os.fspath(path),
                root=None if root is None else os.fspath(root),
            )
        )

    def _init(self, inner: _lmt.Template) -> None:
        self._t = inner
        self.diagnostics: List[Diagnostic] = _diagnostics(inner.diagnostics_json)
        if inner.has_errors:
            raise TemplateError(inner.name, self.diagnostics, inner.report)

    @classmethod
    def from_file(cls, path: PathLike, *, root: Optional[PathLike] = None) -> "Template":
        """Reads and checks a template file (FileNotFoundError when there is none)."""
        t = cls.__new__(cls)
        t._init(_lmt.Template.from_file(os.fspath(path), root=None if root is None else os.fspath(root)))
        return t

    @property
    def name(self) -> str:
        return self._t.name

    @property
    def inputs(self) -> List[Input]:
        """The inputs it declares, in order."""
        return [Input(name, not has_default) for name, has_default in self._t.inputs()]

    def _engine_check(self, model: Model) -> None:
        """On a remote engine: raises for what it cannot do, warns of what it does differently."""
        if not model.is_remote:
            return
        problems = _diagnostics(self._t.engine_problems_json(model._model))
        if any(d.severity == "error" for d in problems):
            raise TemplateError(self.name, problems, "".join(d.rendered for d in problems))
        for d in problems:
            warnings.warn(d.rendered or d.message, stacklevel=3)

    def run(
        self,
        model: Model,
        *,
        seed: int = 0,
        temperature: float = 0.0,
        score: str = "chosen",
        html: Optional[PathLike] = None,
        cancel: Optional[threading.Event] = None,
        inputs: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> Run:
        """Runs it once. Input values come as keyword arguments (or in
        ``inputs=``, for names that clash with these parameters).
        ``temperature`` is the default of every ``gen`` (0: greedy);
        ``score="all"`` also scores the template's own text (``logprob_all``);
        ``html=PATH`` writes the self-contained HTML report there, as
        ``lmt run --html`` does (a failed or interrupted run's too).
        ``cancel`` (a ``threading.Event``) stops the run at its next token
        once set, from any thread: the run returns, finish reason
        ``cancelled`` (the way to stop a run on a thread other than the main
        one, where Python delivers no Ctrl-C).

        Raises ``RunError`` (with ``.run``, the partial record) when an error
        stops the run, ``RunInterrupted`` on Ctrl-C."""
        self._engine_check(model)
        doc, raised = self._t.run(
            model._model,
            _inputs_json(inputs, kwargs),
            seed=_whole("seed", seed, 0, _SEED_MAX),
            temperature=temperature,
            score_all=_score_all(score),
            html=html is not None,
            cancel=cancel,
        )
        result = json.loads(doc)
        run = Run(result["record"])
        if html is not None:
            with open(html, "w", encoding="utf-8") as f:
                f.write(result["html"])
        _interrupted(raised, run=run)
        if result["error"] is not None:
            raise RunError(run, Diagnostic.from_json(result["error"]), str(result["error"].get("kind", "")))
        return run

    def stream(
        self,
        model: Model,
        *,
        seed: int = 0,
        temperature: float = 0.0,
        score: str = "chosen",
        inputs: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> Events:
        """Runs it on a thread of its own and returns its events as they
        happen, ending with ``done`` (whose fields are the run's record)."""
        self._engine_check(model)
        return Events(
            self._t.stream(
                model._model,
                _inputs_json(inputs, kwargs),
                seed=_whole("seed", seed, 0, _SEED_MAX),
                temperature=temperature,
                score_all=_score_all(score),
            )
        )

    def search(
        self,
        model: Model,
        *,
        samples: Optional[int] = None,
        best_of: Optional[int] = None,
        beam: Optional[int] = None,
        length_penalty: float = 0.0,
        seed: int = 0,
        temperature: Optional[float] = None,
        score: str = "chosen",
        cancel: Optional[threading.Event] = None,
        inputs: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> Search:
        """A search over whole runs, as ``lmt run --samples N | --best-of N |
        --beam K``: give exactly one. Samples are drawn at temperature 1
        unless ``temperature`` says otherwise; runs are ranked by log-prob
        (``length_penalty`` α ranks by ``logprob / decisions^α``)."""
        kind, n = _search_mode(samples, best_of, beam)
        if kind is None:
            raise ValueError("give one of samples=, best_of= or beam=")
        self._engine_check(model)
        t = _default_temperature(temperature, kind)
        doc, raised = self._t.search(
            model._model,
            _inputs_json(inputs, kwargs),
            kind,
            n,
            seed=_whole("seed", seed, 0, _SEED_MAX),
            temperature=t,
            score_all=_score_all(score),
            length_penalty=length_penalty,
            cancel=cancel,
        )
        found = Search(json.loads(doc))
        _interrupted(raised, search=found, run=found.runs[0] if found.runs else None)
        return found

    def iter_many(
        self,
        model: Model,
        rows: Iterable[Mapping[str, Any]],
        *,
        parallel: int = 8,
        seed: int = 0,
        temperature: Optional[float] = None,
        score: str = "chosen",
        samples: Optional[int] = None,
        best_of: Optional[int] = None,
        beam: Optional[int] = None,
        length_penalty: float = 0.0,
        defaults: Optional[Mapping[str, Any]] = None,
    ) -> "RowResults":
        """Runs it once per row, as ``lmt run --inputs``, and returns the rows'
        results as they complete (in completion order). Rows are read from
        ``rows`` only as they start, so a generator over a large file is never
        held in memory whole. Each row is a mapping of input values with an
        optional ``id``; ``parallel`` rows are in flight at once, their
        forward passes batched and their shared prompt prefix computed once.
        Each row's seed comes from ``seed`` and its id, so its result does not
        depend on ``parallel``. ``defaults`` are values every row gets unless
        it gives its own; ``samples=``, ``best_of=`` or ``beam=`` search each
        row. A row that fails has its ``error`` set; the others still run."""
        kind, n = _search_mode(samples, best_of, beam)
        self._engine_check(model)
        t = _default_temperature(temperature, kind)
        inner = self._t.iter_many(
            model._model,
            _row_lines(rows),
            _inputs_json(defaults, {}),
            parallel=_whole("parallel", parallel, 1, 256),
            seed=_whole("seed", seed, 0, _SEED_MAX),
            temperature=t,
            score_all=_score_all(score),
            search=None if kind is None else (kind, n),
            length_penalty=length_penalty,
        )
        return RowResults(inner)

    def run_many(
        self,
        model: Model,
        rows: Iterable[Mapping[str, Any]],
        *,
        parallel: int = 8,
        seed: int = 0,
        temperature: Optional[float] = None,
        score: str = "chosen",
        samples: Optional[int] = None,
        best_of: Optional[int] = None,
        beam: Optional[int] = None,
        length_penalty: float = 0.0,
        defaults: Optional[Mapping[str, Any]] = None,
    ) -> List[RowResult]:
        """``iter_many``'s results, all of them, in row order. On Ctrl-C the
        rows in flight stop and ``RunInterrupted.rows`` holds those finished."""
        results: List[RowResult] = []
        with self.iter_many(
            model, rows, parallel=parallel, seed=seed, temperature=temperature, score=score, samples=samples,
            best_of=best_of, beam=beam, length_penalty=length_penalty, defaults=defaults,
        ) as stream:
            try:
                results.extend(stream)
            except KeyboardInterrupt as e:
                stream.close()
                results.extend(stream)
                results.sort(key=lambda r: r.line)
                raise RunInterrupted(rows=results) from e
        results.sort(key=lambda r: r.line)
        return results

    def __repr__(self) -> str:
        return f"lmt.Template({self.name!r})"


def _row_lines(rows: Iterable[Mapping[str, Any]]) -> Iterator[str]:
    """Each row as one JSON line, made as the run asks for it."""
    for i, row in enumerate(rows):
        try:
            yield json.dumps(dict(row), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InputError(f"row {i + 1}: input values must be JSON values: {e}") from None


class RowResults(_Closing):
    """The results of ``Template.iter_many``, as rows complete. ``summary``
    holds the totals once the last one is read. Closing it (or leaving a
    ``with`` block) stops the run: rows in flight end and are left out."""

    _inner: _lmt.RowStream
    summary: Optional[Dict[str, Any]]
    """``done``, ``failed``, ``cancelled``, ``generated_tokens``, ``forward_tokens``, ``shared_prefix_tokens``…"""

    def __init__(self, inner: _lmt.RowStream) -> None:
        self._inner = inner
        self.summary = None

    def __next__(self) -> RowResult:
        item: Dict[str, Any] = json.loads(next(self._inner))
        if "summary" in item:
            self.summary = item["summary"]
            raise StopIteration
        if "error" in item and "line" not in item:
            # The rows could not be read: what the iterator raised, else why.
            raised = self._inner.take_raised()
            if raised is not None:
                raise raised
            raise InputError(str(item["error"]))
        return RowResult(item)


def _default_temperature(temperature: Optional[float], kind: Optional[str]) -> float:
    """The temperature asked for, else 1 for samples (N greedy runs would be one run N times) and 0 (greedy)."""
    if temperature is not None:
        return temperature
    return 1.0 if kind in ("samples", "best_of") else 0.0


def _search_mode(samples: Optional[int], best_of: Optional[int], beam: Optional[int]) -> Tuple[Optional[str], int]:
    given = [(k, v) for k, v in (("samples", samples), ("best_of", best_of), ("beam", beam)) if v is not None]
    if len(given) > 1:
        raise ValueError("give at most one of samples=, best_of= or beam=")
    if not given:
        return None, 0
    kind, n = given[0]
    return kind, _whole(kind, n, 1, 64 if kind == "beam" else 1024)


def check(source_or_path: Union[str, "os.PathLike[str]"], *, root: Optional[PathLike] = None) -> List[Diagnostic]:
    """The diagnostics of a template (errors and warnings; empty when clean).
    A path object, or a one-line string ending in ``.lmt``, names a file;
    any other string is template text."""
    if isinstance(source_or_path, os.PathLike) or ("\n" not in source_or_path and source_or_path.endswith(".lmt")):
        inner = _lmt.Template.from_file(os.fspath(source_or_path), root=None if root is None else os.fspath(root))
    else:
        inner = _lmt.Template(source_or_path, root=None if root is None else os.fspath(root))
    return _diagnostics(inner.diagnostics_json)


@dataclass(frozen=True)
class Regex:
    """The whole value matches this regex."""

    pattern: str


@dataclass(frozen=True)
class RegexFrom:
    """A regex a template sets with ``{% set NAME = "…" %}``: ``"FILE.lmt#NAME"`` (``"std/regex#date"``)."""

    spec: str


@dataclass(frozen=True)
class Choices:
    """The value is one of these options."""

    options: Sequence[str]


@dataclass(frozen=True)
class Grammar:
    """A grammar block: ``"FILE.lmt#NAME"`` or ``"FILE.lmt#NAME.rule"`` (FILE may be ``std/json``)."""

    spec: str


@dataclass(frozen=True)
class JsonSchema:
    """A JSON Schema, closed as ``json=`` closes it unless ``open`` (JSON Schema's validation semantics)."""

    schema: Mapping[str, Any]
    open: bool = False


Constraint = Union[Regex, RegexFrom, Choices, Grammar, JsonSchema]


def match(constraint: Constraint, text: str, tokenizer: PathLike) -> MatchResult:
    """Walks ``text``, token by token through the real tokenizer (a
    ``tokenizer.json`` or a folder holding one), through the constraint's
    masks, with no model: as ``lmt match``."""
    open_ = False
    if isinstance(constraint, Regex):
        kind, value = "regex", constraint.pattern
    elif isinstance(constraint, RegexFrom):
        kind, value = "regex_from", constraint.spec
    elif isinstance(constraint, Choices):
        kind, value = "choices", json.dumps(list(constraint.options))
    elif isinstance(constraint, Grammar):
        kind, value = "grammar", constraint.spec
    elif isinstance(constraint, JsonSchema):
        kind, value, open_ = "json_schema", json.dumps(dict(constraint.schema)), constraint.open
    else:
        raise TypeError(f"not a constraint: {constraint!r} (give lmt.Regex, lmt.Choices, lmt.Grammar, lmt.RegexFrom or lmt.JsonSchema)")
    details = json.loads(_lmt.match_text(kind, value, text, os.fspath(tokenizer), json_open=open_))
    return MatchResult(bool(details["accepted"]), str(details.pop("message")), int(details.get("tokens", 0)), details)
