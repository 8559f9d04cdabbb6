"""Ctrl-C reaches a run, which stops at its next token and keeps its record;
the GIL is released while a model runs, so runs on two models in two
threads go on at once (and give what they give alone)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

import lmt

# Far more work than a test waits for: only Ctrl-C ends it early.
LONG = "{% for i in range(2000) %}Line {{ i }}:{% gen xs[] max_tokens=40 %}\n{% end %}"


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """Python's own Ctrl-C handler for each test, even where this process
    started with SIGINT ignored (as a background job of a non-interactive
    shell starts it): then Python installs none, a SIGINT is dropped, and a
    run that only Ctrl-C ends would not end."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def press_ctrl_c_after(seconds: float) -> threading.Timer:
    """SIGINT to this process from another thread, as a terminal's Ctrl-C sends it."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_stops_a_run_and_keeps_its_record(tiny: lmt.Model) -> None:
    template = lmt.Template(LONG)
    press_ctrl_c_after(0.5)
    with pytest.raises(KeyboardInterrupt) as caught:
        template.run(tiny)
    e = caught.value
    assert isinstance(e, lmt.RunInterrupted) and e.run is not None
    assert e.run.finish_reason == "cancelled"
    made = e.run.capture_list("xs")
    assert 0 < len(made) < 2000 and e.run.text.startswith("Line 0:")
    assert e.run.usage.generated_tokens > 0


def test_ctrl_c_stops_a_stream_whose_events_still_end_with_done(tiny: lmt.Model) -> None:
    seen: List[lmt.Event] = []
    press_ctrl_c_after(0.5)
    # Ctrl-C may land in this loop's own code rather than in `next()`:
    # leaving the `with` block stops the run either way.
    with pytest.raises(KeyboardInterrupt):
        with lmt.Template(LONG).stream(tiny) as events:
            for e in events:
                seen.append(e)
    rest = list(events)
    assert seen[0]["event"] == "start" and rest and rest[-1]["event"] == "done"
    assert rest[-1]["finish_reason"] == "cancelled"


def test_ctrl_c_stops_rows_and_keeps_those_done(tiny: lmt.Model) -> None:
    template = lmt.Template("{% input k %}Row {{ k }}:{% gen x max_tokens=20 %}")
    press_ctrl_c_after(1.5)
    with pytest.raises(lmt.RunInterrupted) as caught:
        template.run_many(tiny, [{"k": i} for i in range(5000)], parallel=2)
    rows = caught.value.rows
    assert rows is not None and 0 < len(rows) < 5000
    assert all(r.ok and r.run is not None and r.run.finish_reason == "done" for r in rows)


def test_a_run_in_a_thread_stops_when_ctrl_c_reaches_the_main_thread(tiny: lmt.Model) -> None:
    # Python delivers Ctrl-C to the main thread: there, set the run's cancel event.
    template = lmt.Template(LONG)
    stop = threading.Event()
    runs: List[lmt.Run] = []
    finished = threading.Event()

    def work() -> None:
        runs.append(template.run(tiny, cancel=stop))
        finished.set()

    threading.Thread(target=work).start()
    press_ctrl_c_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        while not finished.wait(0.05):
            pass
    stop.set()
    # (Not `join()`: on CPython 3.11 a join that Ctrl-C interrupted may return at once after.)
    assert finished.wait(60), "the run did not stop"
    assert runs[0].finish_reason == "cancelled"
    assert 0 < len(runs[0].capture_list("xs")) < 2000


def test_two_models_in_two_threads_at_once(tiny_dir: Path) -> None:
    shared = tiny_dir.parent
    a = lmt.Model(tiny_dir, threads=1)
    b = lmt.Model(shared / "qwen2-tiny", threads=1)
    long = lmt.Template("Story:{% gen s max_tokens=300 %}")
    short = lmt.Template.from_file(Path(__file__).resolve().parents[2] / "examples" / "vehicles.lmt")
    alone_b = long.run(b, seed=1, temperature=0.9).text
    alone_a = [short.run(a, n=2, seed=s, temperature=0.9).text for s in range(3)]

    # B runs a long generation on a thread; meanwhile this thread streams A.
    results: Dict[str, str] = {}
    in_run = threading.Event()

    def run_b() -> None:
        in_run.set()
        results["b"] = long.run(b, seed=1, temperature=0.9).text
        in_run.clear()

    worker = threading.Thread(target=run_b)
    worker.start()
    in_run.wait()
    during, texts = 0, []
    for s in range(3):
        text = ""
        for e in short.stream(a, n=2, seed=s, temperature=0.9):
            during += in_run.is_set() and worker.is_alive()
            if e["event"] == "done":
                text = e["text"]
        texts.append(text)
    worker.join()
    # Each model gave what it gives alone…
    assert results["b"] == alone_b and texts == alone_a
    # …and A's events kept coming while B's run held no GIL.
    assert during >= 5, during


def test_one_model_shared_by_threads(tiny: lmt.Model) -> None:
    template = lmt.Template.from_file(Path(__file__).resolve().parents[2] / "examples" / "vehicles.lmt")
    alone = [template.run(tiny, n=2, seed=s, temperature=0.9).text for s in range(4)]
    together: Dict[int, str] = {}

    def run(seed: int) -> None:
        together[seed] = template.run(tiny, n=2, seed=seed, temperature=0.9).text

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [together[s] for s in range(4)] == alone
