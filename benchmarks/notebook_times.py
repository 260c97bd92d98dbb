"""Benchmark (hand-written): each notebook's run time, top to bottom in a fresh kernel, against
its 60 s budget (and all of them against 6 min). Prints a table; asserts nothing about time.

    python benchmarks/notebook_times.py [--repeats N]
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from build_course import print_table, run_notebook  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per notebook; the slowest is reported")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as outdir:
        for path in sorted((ROOT / "notebooks").glob("week*.ipynb")):
            runs = [run_notebook(path, outdir) for _ in range(args.repeats)]
            results.append(max(runs, key=lambda r: r["seconds"]))
    print_table(results)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
