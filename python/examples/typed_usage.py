"""A typed use of `lmt`, checked by `mypy --strict` in CI (and runnable:
`python examples/typed_usage.py MODEL`)."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List

import lmt

REVIEWS = """{% input review %}
Review: {{ review }}
Sentiment: {% select sentiment in ["positive", "negative", "mixed"] %}
Product: {% gen product regex="[A-Za-z ]{1,30}" %}"""


def sentiments(model: lmt.Model, reviews: List[str]) -> List[Dict[str, Any]]:
    """One record per review, in order: its sentiment, product and score."""
    template = lmt.Template(REVIEWS, name="reviews.lmt")
    records: List[Dict[str, Any]] = []
    for row in template.run_many(model, [{"review": r} for r in reviews], parallel=4):
        if row.run is None or row.error is not None:
            records.append({"id": row.id, "error": row.error.message if row.error else "no run"})
            continue
        choice: lmt.Capture = row.run.capture("sentiment")
        records.append({"id": row.id, "sentiment": choice.value, "product": row.run["product"], "p": choice.choices[0].probability})
    return records


def main(spec: str) -> int:
    try:
        model = lmt.Model(spec)
    except lmt.ModelError as e:
        print(f"cannot load {spec}: {e}", file=sys.stderr)
        return 3
    hello = lmt.Template("The capital of France is{% gen city stop='\\n' max_tokens=10 %}")
    try:
        run: lmt.Run = hello.run(model, temperature=0.0)
    except lmt.RunError as e:
        print(e.diagnostic, file=sys.stderr)
        return 3
    city: str = run["city"]
    usage: lmt.Usage = run.usage
    print(city, usage.generated_tokens, run.finish_reason)
    for event in hello.stream(model):
        if event["event"] == "text":
            print(event["text"], end="")
    print(json.dumps(sentiments(model, ["Loud but fast blender.", "The lamp broke."]), indent=2))
    verdict: lmt.MatchResult = lmt.match(lmt.Regex("[0-9]+"), "2024", spec)
    problems: List[lmt.Diagnostic] = lmt.check("{% gen x max_tokens=0 %}")
    print(bool(verdict), [d.code for d in problems])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "HuggingFaceTB/SmolLM2-135M-Instruct"))
