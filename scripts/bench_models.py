"""Estimated aarch64 cycles of whole models: tvm_armq and stock TVM against TFLite (XNNPACK).

For each model and ISA level: compile the model twice for that level, with tvm_armq
(``compile_tflite``) and with stock TVM 0.27 (its own default pipeline, QDQ in float),
then let ``../shared/armperf`` run TFLite and each TVM module on the same emulated CPU
and price their hot blocks on the level's llvm-mca core model. Prints a table of
estimated cycles per inference and the ratios tflite/tvm (above 1: TVM is faster), and
with ``--png`` draws them as a bar chart (needs matplotlib: ``pip install -e .[bench]``).

The figure is armperf's own, taken as it is (version 2 and later price sdot / smmla /
bfmmla and straight-line code that qemu cut into pieces by themselves); the armperf version
that produced it is printed and stored with the figures. The library is compiled for the
threads it is measured on (``compile_tflite(threads=N)``: serial loops on one). With
``--threads N`` (armperf 3) both sides run on N threads and the figure is the critical
path: the busiest thread's work. A threaded pair is measured ``--repeat`` times (twice by
default, as armperf's README asks: XNNPACK's threads take work as the host happens to run
them, so its split varies from run to run) and each side's lowest critical path is kept,
with every run's figure and the kept run's work per thread (``<side>_work``). With
``--plain`` a third build is measured beside them: the model through plain ``tvm.compile``
after ``import tvm_armq`` (``compile_plain``), which leaves the pool's size to the runtime;
its rows carry ``tvm_compile`` and the docs' default-path table compares it with the
``threads=N`` build.

    python scripts/bench_models.py [--models mobilenet_v1_0.25 ...] [--isa dotprod ...]
                                   [--threads N] [--no-stock] [--plain] [--json out.json]
                                   [--png out.png] [--armperf PATH/armperf.py]

The figures the docs show are the checked-in data in ``scripts/results/`` (see
``scripts/results_data.py``). ``--merge`` puts ``--json`` files of earlier runs there,
measuring nothing: one-thread rows into models.json, the others into models_threads.json,
each row replacing the row of its (model, isa, threads), in the zoo's order. Then the
ceilings and the docs:

    python scripts/bench_models.py --models vit --no-stock --json /tmp/bench/vit.json
    python scripts/bench_models.py --merge /tmp/bench/*.json
    python scripts/mac_ceiling.py --bench scripts/results/models.json \\
                                  --json scripts/results/ceilings.json
    python scripts/render_results.py

The figures are core-bound estimates (every load an L1 hit), for comparing two
builds of the same model on the same core model; they are not milliseconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import armperf_tool
import results_data
from tvm_armq import build, export, hooks, targets, zoo
from tvm_armq.frontend import importer
from tvm_armq.targets import LEVELS
from tvm_armq.frontend.model import TFLiteModel

DEFAULT_MODELS = ["mobilenet_v1_0.25", "resnet_block", "inception_block", "mobilenet_v1_1.0",
                  "mobilenet_v2_1.0", "mobilenet_v3_small", "efficientnet_b1", "densenet121"]


def compile_stock(model: TFLiteModel, level: str):
    """The model as stock TVM 0.27 compiles it (tvm_armq's hook bypassed)."""
    import tvm

    return tvm.compile(importer.import_tflite(model), target=targets.resolve(level),
                       relax_pipeline=hooks.stock_pipeline())


def compile_plain(model: TFLiteModel, level: str):
    """The model as a user of ``import tvm_armq`` compiles it: plain ``tvm.compile``, the
    pool's size left to the runtime."""
    import tvm

    return tvm.compile(importer.import_tflite(model), target=targets.resolve(level))


def input_specs(model: TFLiteModel) -> list[str]:
    return [",".join(map(str, t.shape)) + ":" + t.dtype for t in model.signature()[0]]


def compare(armperf: Path, model: TFLiteModel, lib: Path, level: str, runs: int,
            threads: int = 1) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(armperf), "compare", str(model.path), str(lib),
               "--isa", level, "--runs", str(runs), "--json", out.name]
        if threads > 1:
            cmd += ["--threads", str(threads)]
        for spec in input_specs(model):
            cmd += ["--input", spec]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"armperf failed on {model.path} at {level}:\n{res.stderr[-2000:]}")
        return json.load(open(out.name))


def figure(side: dict) -> float:
    """armperf's estimated cycles per run of one side: the critical path when threaded."""
    return side["threads"]["critical_cycles"] if side.get("threads") else side["cycles_per_run"]


def best_of(runs: list[dict], side: str) -> dict:
    """Of armperf's results of repeated runs, the one whose ``side`` ("tflite" or "tvm")
    has the lowest figure."""
    return min(runs, key=lambda r: figure(r[side]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="threads on both sides (armperf 3)")
    ap.add_argument("--repeat", type=int,
                    help="armperf runs per pair, the lowest figure of each side kept "
                         "(default: 2 on more than one thread, else 1)")
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path, help="write all figures here")
    ap.add_argument("--png", type=Path, help="bar chart of the ratios (needs matplotlib)")
    ap.add_argument("--no-stock", action="store_true", help="tvm_armq against TFLite only")
    ap.add_argument("--plain", action="store_true",
                    help="also plain tvm.compile after import tvm_armq (tvm_compile)")
    ap.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                    help="merge these --json files into scripts/results/ and measure nothing")
    a = ap.parse_args()
    if a.merge:
        for name, count in results_data.merge_files(a.merge).items():
            print(f"merged {count} rows into {results_data.RESULTS / name}")
        return 0
    armperf_tool.require(ap, a.armperf)
    repeat = a.repeat or (2 if a.threads > 1 else 1)

    # the library asks for the pool it is measured on (``compile_tflite(threads=N)``), as
    # TFLite is given num_threads=N; on one thread its loops are compiled serial
    pool = a.threads
    builders = {"tvm_armq": lambda m, lvl: build.compile_tflite(m, lvl, threads=pool)}
    if a.plain:
        builders["tvm_compile"] = compile_plain
    if not a.no_stock:
        builders["stock_tvm"] = compile_stock
    rows = []
    head = f"{'model':18s} {'isa':8s} {'tflite cyc':>11s}"
    for b in builders:
        head += f" {b + ' cyc':>14s} {'tflite/' + b:>17s}"
    versions = set()
    print(head, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            model = TFLiteModel.load(zoo.build(name))
            for level in a.isa:
                row = {"model": name, "isa": level}
                line = f"{name:18s} {level:8s}"
                for b, make in builders.items():
                    lib = export.export_aarch64(make(model, level),
                                               Path(tmp) / f"{name}-{level}-{b}.so")
                    runs = [compare(a.armperf, model, lib, level, a.runs, a.threads)
                            for _ in range(repeat)]
                    theirs, ours = best_of(runs, "tflite")["tflite"], best_of(runs, "tvm")["tvm"]
                    row["tflite"], row[b] = figure(theirs), figure(ours)
                    row[f"tflite_over_{b}"] = row["tflite"] / row[b]
                    if repeat > 1:
                        row["tflite_runs"] = [figure(r["tflite"]) for r in runs]
                        row[f"{b}_runs"] = [figure(r["tvm"]) for r in runs]
                    for side, result in (("tflite", theirs), (b, ours)):
                        if result.get("threads"):
                            row[f"{side}_work"] = result["threads"]["work_cycles"]
                    row["armperf"] = ours.get("armperf", 1)
                    row["threads"] = a.threads
                    versions.add(row["armperf"])
                line += f" {row['tflite']:11.4g}"
                for b in builders:
                    line += f" {row[b]:14.4g} {row['tflite_over_' + b]:17.3f}"
                rows.append(row)
                print(line, flush=True)
    print(f"(armperf version {', '.join(map(str, sorted(versions)))}, {a.threads} thread(s))")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    if a.png:
        chart(rows, list(builders), a.png)
    return 0


def chart(rows: list[dict], builders: list[str], path: Path) -> None:
    """Bars of tflite/tvm per model and ISA level, one colour per build; 1.0 marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']} {r['isa']}" for r in rows]
    width = 0.8 / len(builders)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows)), 5.0))
    for i, b in enumerate(builders):
        ax.bar([x + i * width for x in range(len(rows))],
               [r[f"tflite_over_{b}"] for r in rows], width, label=b)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * (len(builders) - 1) / 2 for x in range(len(rows))], labels,
                  fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("TFLite est. cycles / TVM est. cycles (above 1: TVM faster)")
    threads = rows[0].get("threads", 1) if rows else 1
    ax.set_title(f"Whole models, armperf estimated cycles, {threads} thread(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
