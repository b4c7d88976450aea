"""Peak memory and time of filtering one very long snippet: cut into pieces vs truncated whole.

Each variant runs in its own process (peak RSS is per process), on one query with one
snippet of ``--mb`` megabytes of text whose evidence sits at the end:

* ``cut`` -- the default: the text is cut into 500-character pieces, scored in batches,
  kept if any piece is kept;
* ``whole`` -- ``max_chars`` set above the text length: the model tokenises the whole text
  and reads only its first window (what ragsieve did before; the evidence is lost).

Usage: ``python benchmarks/bench_long_inputs.py [--mb 1]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CHILD = r"""
import json, resource, sys, time
from ragsieve import ConformalFilter, EmbeddingScorer
from ragsieve.calibration import SplitConformalCalibrator
mb, variant = float(sys.argv[1]), sys.argv[2]
evidence = ("The Denver Broncos defeated the Carolina Panthers 24-10 to earn their third "
            "Super Bowl title. The game was played on February 7, 2016, at Levi's Stadium.")
sentence = "Recipe step {}: stir the flour, butter and sugar slowly until the dough is smooth. "
n = int(mb * 1e6 / len(sentence))
text = "".join(sentence.format(i) for i in range(n)) + evidence  # no two pieces alike
cal = SplitConformalCalibrator(alpha=0.1).fit([0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.62, 0.65])
flt = ConformalFilter(EmbeddingScorer("minilm"), cal,
                      max_chars=None if variant == "cut" else len(text) + 1)
flt.filter("warm-up", ["warm-up"])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
res = flt.filter("Who won Super Bowl 50?", [text])
secs = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"variant": variant, "chars": len(text), "seconds": round(secs, 2),
                  "rss_before_mb": round(base), "peak_rss_mb": round(peak),
                  "kept": len(res.kept), "n_cut": res.n_cut,
                  "kept_spans": [list(s) for s in res.kept[0].spans] if res.kept else []}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--mb", type=float, default=1.0)
    args = ap.parse_args()
    for variant in ("whole", "cut"):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.mb), variant],
                             capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        row["process_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row))
    print(f"this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
