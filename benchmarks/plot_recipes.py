"""Held-out MLM and SOP accuracy against steps, one line per arm, from `bench_recipes.py --out` files.

python benchmarks/plot_recipes.py benchmarks/results/recipes_zh_manpages_16x64_2600.json --out curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench_recipes.py --out files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--arm", action="append", help="plot only these arms (default: all)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [
        arm for path in args.results for arm in json.loads(path.read_text()) if not args.arm or arm["arm"] in args.arm
    ]
    fig, (mlm, sop) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in arms:
        steps = [point["step"] for point in arm["curve"]]
        (line,) = mlm.plot(steps, [point["eval_mlm_accuracy"] for point in arm["curve"]], marker="o", label=arm["arm"])
        mlm.plot(steps, [point["eval_mlm_unigram_baseline"] for point in arm["curve"]], ls=":", color=line.get_color())
        sop.plot(steps, [point["eval_sop_accuracy"] for point in arm["curve"]], marker="o", label=arm["arm"])
    mlm.set(xlabel="step", ylabel="held-out MLM accuracy (dotted: unigram baseline)")
    sop.set(xlabel="step", ylabel="held-out SOP accuracy")
    sop.axhline(0.5, ls=":", color="grey")
    mlm.legend(fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
