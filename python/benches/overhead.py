"""What a run through `import lmt` costs: one Model loaded once, then five
timed `Template.run` calls of each example after a warm-up (median), beside
the run's own `total_ms`. BENCHMARKS.md ("Python bindings") has the command
and the figures. Usage: python python/benches/overhead.py MODEL.gguf"""

from __future__ import annotations

import sys
import time

import lmt


def main(spec: str) -> None:
    t0 = time.perf_counter()
    model = lmt.Model(spec, threads=2)
    print(f"load {1000 * (time.perf_counter() - t0):.0f} ms")
    for name in ("trip", "vehicles"):
        template = lmt.Template.from_file(f"examples/{name}.lmt")
        template.run(model)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            run = template.run(model)
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        print(f"{name}: run median {1000 * median:.0f} ms, its total_ms {run.usage.total_ms:.0f}, {run.usage.tokens_per_second:.1f} tok/s")


if __name__ == "__main__":
    main(sys.argv[1])
