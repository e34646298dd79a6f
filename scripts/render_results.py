"""Write the benchmark tables into the docs, and draw the charts, from the data in
scripts/results/: no figure in the docs is typed by hand.

    python scripts/render_results.py            # tables into README.md and docs/performance.md,
                                                # charts into scripts/results/
    python scripts/render_results.py --check    # exit 1 if a checked-in table differs from the data

A table goes between a pair of markers, each on a line of its own, in any markdown file:

    <!-- results:models -->
    <!-- /results:models -->

Rendering replaces what is between them and keeps the markers. The tables (marker names):

    models         tflite / tvm_armq per model and ISA level, one thread (models.json)
    models_cycles  the estimated cycles of both sides per level (models.json)
    ceilings       per model and level: the ratio, its ceiling and tvm_armq / bound
                   (ceilings.json, made by scripts/mac_ceiling.py --json)
    targets        per model and level: the ratio against its target, min(1.25, 0.9 x
                   ceiling), met or not (ceilings.json)
    threads        tflite / tvm_armq on more threads (models_threads.json; until it
                   exists, a sentence saying there are none)
    batch_matmul   attention's products alone against their MAC floor (batch_matmul.json,
                   made by scripts/bench_batch_matmul.py --json)
    clib           the C library's sizes, arena and cycles beside TFLite's and the VM
                   library's (clib.json, made by scripts/bench_clib.py)

A file that does not exist or has no markers is left alone; a marker of another name is an
error, as is a table whose rows come from two armperf versions, or a ceilings.json made
from other figures than models.json holds. The charts, scripts/results/bench_models.png
(with each model's ceilings) and bench_threads.png (the most threads measured), need
matplotlib (``pip install -e .[bench]``); ``--check`` does not, and does not look at them.
Exit status: 0 done (or the check passed), 1 a table differs, 2 the data cannot be shown.

The data files, their row order and how new runs merge into them: scripts/results_data.py.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results_data as rd  # noqa: E402
from results_data import ResultsError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "docs" / "performance.md"]
MODELS_CHART = "bench_models.png"
THREADS_CHART = "bench_threads.png"

RATIO_DECIMALS = 3  # tflite / tvm_armq, ceilings, tvm_armq / bound
CYCLES_DIGITS = 4  # significant digits of an estimated cycle count
MISSING = "–"  # a (model, level) not measured

MARKER = re.compile(r"<!--\s*(/?)results:([\w.-]+)\s*-->")


class UnknownTableError(ResultsError):
    """A marker whose name is not one of TABLES."""


# ------------------------------------------------------------------ the data
@dataclass
class Data:
    """The rows of the files in a results folder (None: the file does not exist)."""

    folder: Path
    models: list[dict] | None
    threads: list[dict] | None
    ceilings: list[dict] | None
    batch_matmul: list[dict] | None = None
    layers: list[dict] | None = None
    clib: list[dict] | None = None

    @classmethod
    def load(cls, folder: Path = rd.RESULTS) -> Data:
        return cls(folder, rd.load(folder / rd.MODELS), rd.load(folder / rd.THREADS),
                   rd.load(folder / rd.CEILINGS), rd.load(folder / rd.BATCH_MATMUL),
                   rd.load(folder / rd.LAYERS), rd.load(folder / rd.CLIB))

    def need(self, name: str) -> list[dict]:
        rows = {rd.MODELS: self.models, rd.THREADS: self.threads,
                rd.CEILINGS: self.ceilings, rd.BATCH_MATMUL: self.batch_matmul,
                rd.LAYERS: self.layers, rd.CLIB: self.clib}[name]
        if rows is None:
            raise ResultsError(f"{shown(self.folder / name)} not found; "
                               "see scripts/results_data.py for how it is made")
        return rows


def by_model(rows: list[dict], key: str = "model") -> dict[str, dict[str, dict]]:
    """model (or another field, ``key``) -> level -> row, in the order of the rows (the
    files keep the zoo's)."""
    table: dict[str, dict[str, dict]] = {}
    for r in rows:
        table.setdefault(r[key], {})[r["isa"]] = r
    return table


def threads_words(n: int) -> str:
    return "one thread" if n == rd.ONE_THREAD else f"{n} threads"


def thread_count(rows: list[dict], table: str) -> int:
    """The threads every row of ``rows`` was measured on."""
    counts = {r.get("threads", rd.ONE_THREAD) for r in rows}
    if len(counts) != 1:
        raise ResultsError(f"table {table!r}: rows of {sorted(counts)} threads in one table")
    (n,) = counts
    return n


# ------------------------------------------------------------------ cells
def ratio(x: float | None) -> str:
    return MISSING if x is None else f"{x:.{RATIO_DECIMALS}f}"


def sci(x: float | None) -> str:
    """A count (estimated cycles, MACs) as 1.234e6."""
    if x is None:
        return MISSING
    mantissa, exponent = f"{x:.{CYCLES_DIGITS - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table, the first column left-aligned, the figures right-aligned."""
    align = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, align, *rows])


def field(rows: dict[str, dict], level: str, key: str) -> float | None:
    row = rows.get(level)
    return None if row is None else row.get(key)


# ------------------------------------------------------------------ the tables
def table_models(data: Data) -> str:
    rows = data.need(rd.MODELS)
    version = rd.armperf_version(rows, "models")
    threads = thread_count(rows, "models")
    levels = rd.levels()
    body = [[m] + [ratio(field(per, lv, "tflite_over_tvm_armq")) for lv in levels]
            for m, per in by_model(rows).items()]
    return (markdown_table(["model", *levels], body) + "\n\n"
            f"armperf version {version}, {threads_words(threads)}, est. cycles TFLite / "
            "tvm_armq; above 1 is faster than TFLite.")


def table_models_cycles(data: Data) -> str:
    rows = data.need(rd.MODELS)
    version = rd.armperf_version(rows, "models_cycles")
    threads = thread_count(rows, "models_cycles")
    levels = rd.levels()
    header = ["model"] + [f"{lv} {side}" for lv in levels for side in ("TFLite", "tvm_armq")]
    body = [[m] + [sci(field(per, lv, side)) for lv in levels
                   for side in ("tflite", "tvm_armq")]
            for m, per in by_model(rows).items()]
    return (markdown_table(header, body) + "\n\n"
            f"armperf version {version}, {threads_words(threads)}: estimated cycles per "
            "inference of TFLite (XNNPACK) and of tvm_armq on the same emulated CPU and core "
            "model (core-bound: every load an L1 hit).")


REMAKE_CEILINGS = ("run python scripts/mac_ceiling.py --bench scripts/results/models.json "
                   "--json scripts/results/ceilings.json")


def check_ceilings_current(ceilings: list[dict], models: list[dict] | None) -> None:
    """ceilings.json must be made from models.json as it is now: a row for each of its
    (model, level), with the same figures."""
    if models is None:
        return
    made_from = {(c["model"], c["isa"]): c for c in ceilings}
    for m in models:
        c = made_from.get((m["model"], m["isa"]))
        if c is None:
            raise ResultsError(f"ceilings.json has no row for {m['model']} {m['isa']}: "
                               f"{REMAKE_CEILINGS}")
        if any(c.get(k) != m.get(k) for k in ("tflite", "tvm_armq", "armperf")):
            raise ResultsError(f"ceilings.json is older than models.json ({m['model']} "
                               f"{m['isa']}): {REMAKE_CEILINGS}")


def level_peaks(rows: list[dict]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for r in rows:
        if peaks.setdefault(r["isa"], r["peak"]) != r["peak"]:
            raise ResultsError(f"ceilings.json: two peak rates at {r['isa']}; re-run "
                               "scripts/mac_ceiling.py")
    return peaks


def table_ceilings(data: Data) -> str:
    rows = data.need(rd.CEILINGS)
    check_ceilings_current(rows, data.models)
    version = rd.armperf_version(rows, "ceilings")
    threads = thread_count(rows, "ceilings")
    levels = rd.levels()
    header = ["model", "MACs"]
    for lv in levels:
        header += [f"{lv} ratio", f"{lv} ceiling", f"{lv} tvm_armq / bound"]
    body = []
    for m, per in by_model(rows).items():
        (macs,) = {r["macs"] for r in per.values()}
        cells = [m, sci(macs)]
        for lv in levels:
            cells += [ratio(field(per, lv, "tflite_over_tvm_armq")),
                      ratio(field(per, lv, "ceiling")), ratio(field(per, lv, "tvm_over_bound"))]
        body.append(cells)
    peaks = level_peaks(rows)
    rates = ", ".join(f"{lv} {peaks[lv]:.1f}" for lv in levels if lv in peaks)
    return (markdown_table(header, body) + "\n\n"
            f"armperf version {version}, {threads_words(threads)}. ratio: est. cycles TFLite / "
            "tvm_armq. bound: the model's multiply-accumulates (convolutions, dense layers, "
            "batch matmuls; taps on padding left out) at the core model's peak rate "
            f"(MACs per cycle: {rates}), a floor under any kernel's estimate. ceiling: "
            "TFLite / bound, the highest ratio anything can reach. tvm_armq / bound: 1 would "
            "be nothing but multiply-accumulates at the peak rate.")


def table_targets(data: Data) -> str:
    """Per model and level: tflite / tvm_armq against its target, min(1.25, 0.9 x
    ceiling), and whether it is met (ceilings.json)."""
    rows = data.need(rd.CEILINGS)
    check_ceilings_current(rows, data.models)
    version = rd.armperf_version(rows, "targets")
    levels = rd.levels()
    body, met, measured = [], 0, 0
    for m, per in by_model(rows).items():
        cells = [m]
        for lv in levels:
            got, ceiling = field(per, lv, "tflite_over_tvm_armq"), field(per, lv, "ceiling")
            if got is None or ceiling is None:
                cells.append(MISSING)
                continue
            goal = rd.target(ceiling)
            ok = got >= goal
            met, measured = met + ok, measured + 1
            cells.append(f"{ratio(got)} / {ratio(goal)} {'✓' if ok else '✗'}")
        body.append(cells)
    return (markdown_table(["model", *levels], body) + "\n\n"
            f"armperf version {version}, one thread: tflite / tvm_armq against its target, "
            f"min({rd.TARGET_RATIO}, {rd.CEILING_SHARE} x ceiling) (the ceilings table); "
            f"{met} of {measured} met.")


def table_threads(data: Data) -> str:
    if data.threads is None:  # optional: no run on more threads merged yet
        return (f"No figures on more than one thread yet ({rd.THREADS} not in "
                f"{data.folder.name}/: measure with bench_models.py --threads N, then merge).")
    rows = data.need(rd.THREADS)
    version = rd.armperf_version(rows, "threads")
    levels = rd.levels()
    body = []
    for n in sorted({r["threads"] for r in rows}):
        for m, per in by_model([r for r in rows if r["threads"] == n]).items():
            body.append([m, str(n)] + [_threaded_cell(per.get(lv)) for lv in levels])
    return (markdown_table(["model", "threads", *levels], body) + "\n\n"
            f"armperf version {version}: est. cycles TFLite / tvm_armq on the critical path "
            "(the busiest thread's work), both on the same threads; above 1 is faster than "
            "TFLite. In brackets, where measured: tvm_armq's busiest thread's work over the "
            "mean thread's (1.00: even), and where TFLite's work per thread was kept too, "
            "the ratio against TFLite's work spread evenly over its threads (its total over "
            "N: what a perfect split would give it); those pairs were measured twice and "
            "each side's lower figure kept (XNNPACK's threads take work as the emulator "
            "happens to run them: with more threads than the host's two cores, its split "
            "is the host's, so the even figure is the one to read).")


def _threaded_cell(row: dict | None) -> str:
    """A threaded row's ratio, and where its work per thread was kept, the busiest
    thread's over the mean."""
    if row is None:
        return MISSING
    cell = ratio(row["tflite_over_tvm_armq"])
    work, theirs = row.get("tvm_armq_work"), row.get("tflite_work")
    if work:
        even = (f", {ratio(sum(theirs) / len(theirs) / row['tvm_armq'])}" if theirs
                else "")
        cell += f" ({max(work) / (sum(work) / len(work)):.2f}{even})"
    return cell


def table_default_path(data: Data) -> str:
    """Per model and level measured with ``bench_models.py --plain``: plain ``tvm.compile``
    after ``import tvm_armq`` (the pool's size left to the runtime) beside
    ``compile_tflite(threads=1)``, both on one thread."""
    rows = [r for r in data.need(rd.MODELS) if "tvm_compile" in r]
    if not rows:
        return ("No default-path figures yet: measure with bench_models.py --plain, then "
                "merge.")
    version = rd.armperf_version(rows, "default_path")
    body = [[r["model"], r["isa"], sci(r["tvm_armq"]), sci(r["tvm_compile"]),
             ratio(r["tvm_compile"] / r["tvm_armq"]), ratio(r["tflite_over_tvm_compile"])]
            for r in rows]
    return (markdown_table(["model", "level", "threads=1 est. cycles",
                            "tvm.compile est. cycles", "tvm.compile / threads=1",
                            "tflite / tvm.compile"], body) + "\n\n"
            f"armperf version {version}, one thread: `compile_tflite(..., threads=1)` (loops "
            "compiled serial) against plain `tvm.compile` after `import tvm_armq`, which "
            "leaves the pool to the runtime and runs its kernels' serial twins on a pool of "
            "one thread.")


def table_batch_matmul(data: Data) -> str:
    rows = data.need(rd.BATCH_MATMUL)
    version = rd.armperf_version(rows, "batch_matmul")
    levels = rd.levels()
    body = [[case] + [f"{sci(field(per, lv, 'cycles'))} ({ratio(field(per, lv, 'over_floor'))})"
                      for lv in levels]
            for case, per in by_model(rows, "case").items()]
    return (markdown_table(["product", *levels], body) + "\n\n"
            f"armperf version {version}, one thread: estimated cycles of the kernel alone "
            "(scripts/bench_batch_matmul.py) and, in brackets, how many times its MAC floor "
            "(its multiply-accumulates at the level's peak rate) that is.")


def table_layers(data: Data) -> str:
    """One row per distinct layer: its shape and each level's tflite / tvm_armq, then per
    model and level the sum over its layers, each counted as often as the model uses it."""
    rows = data.need(rd.LAYERS)
    version = rd.armperf_version(rows, "layers")
    levels = rd.levels()
    body = [[f"`{name}`", next(iter(per.values()))["shape"]]
            + [ratio(field(per, lv, "tflite_over_tvm_armq")) for lv in levels]
            for name, per in by_model(rows, "layer").items()]
    models = sorted({m for r in rows for m in r["uses"]})
    totals = []
    for model in models:
        cells = []
        for lv in levels:
            used = [(r, r["uses"][model]) for r in rows if r["isa"] == lv and model in r["uses"]]
            tfl = sum(r["tflite"] * n for r, n in used)
            tvm = sum(r["tvm_armq"] * n for r, n in used)
            cells.append(ratio(tfl / tvm) if tvm else ratio(None))
        totals.append([f"all of `{model}`", ""] + cells)
    return (markdown_table(["layer", "shape", *levels], body + totals) + "\n\n"
            f"armperf version {version}, one thread: TFLite's (XNNPACK) estimated cycles over "
            "tvm_armq's for each distinct layer of the nets, alone "
            "(scripts/bench_layers.py); the last rows sum each net's layers, each counted "
            "as often as the net uses it.")


def table_clib(data: Data) -> str:
    """Per model and level: the C library's sizes and arena beside TFLite's, and armperf's
    cycles of the C library and of the VM library (scripts/bench_clib.py)."""
    rows = data.need(rd.CLIB)
    version = rd.armperf_version(rows, "clib")
    kb = lambda n: f"{n / 1024:,.0f} KB"  # noqa: E731
    body = [[r["model"], r["isa"], kb(r["so_bytes"]), kb(r["a_bytes"]), kb(r["arena"]),
             kb(r["model_bytes"]), kb(r["tflite_arena"]), sci(r["c_cycles"]),
             ratio(r["vm_cycles"] / r["c_cycles"])] for r in rows]
    runtime = {r["tflite_runtime_bytes"] for r in rows}
    return (markdown_table(["model", "level", "lib.so", "lib.a", "arena", "TFLite model",
                            "TFLite arena", "C est. cycles", "VM / C"], body) + "\n\n"
            f"`lib.so` and `lib.a` hold the weights; the arena is `ARENA_BYTES` (the tensors "
            "between layers and the GEMMs' packing buffers). TFLite needs the model file "
            f"and its runtime, {', '.join(kb(b) for b in sorted(runtime))} for LiteRT 2.1.6's "
            "aarch64 interpreter library (`libpywrap_litert_common.so`: the interpreter, its "
            "kernels and XNNPACK), and its tensor arena (the activations as its planner "
            "places them; XNNPACK's own buffers come on top). armperf version "
            f"{version}, one thread: estimated cycles of a run of the C library, and the VM "
            "library's (`compile --threads 1`) over it.")


TABLES = {"models": table_models, "models_cycles": table_models_cycles,
          "ceilings": table_ceilings, "threads": table_threads,
          "batch_matmul": table_batch_matmul, "layers": table_layers, "clib": table_clib,
          "targets": table_targets, "default_path": table_default_path}


# ------------------------------------------------------------------ markers
@dataclass
class Block:
    """The text between a pair of markers: ``text[start:end]``."""

    name: str
    start: int
    end: int


def blocks(text: str, source: str) -> list[Block]:
    """The marked blocks of ``text``, checked: every marker paired, none nested, every name
    a table's."""
    found, open_marker = [], None
    for m in MARKER.finditer(text):
        closing, name = m.group(1) == "/", m.group(2)
        if name not in TABLES:
            raise UnknownTableError(f"{source}: unknown results table {name!r} "
                                    f"(known: {', '.join(TABLES)})")
        if not closing:
            if open_marker is not None:
                raise ResultsError(f"{source}: results:{open_marker.group(2)} is not closed "
                                   f"before results:{name}")
            open_marker = m
        elif open_marker is None or open_marker.group(2) != name:
            raise ResultsError(f"{source}: /results:{name} closes no results:{name}")
        else:
            found.append(Block(name, open_marker.end(), m.start()))
            open_marker = None
    if open_marker is not None:
        raise ResultsError(f"{source}: results:{open_marker.group(2)} is never closed")
    return found


def render_text(text: str, data: Data, source: str = "text") -> str:
    """``text`` with every marked block holding its table as the data gives it."""
    out, pos = [], 0
    for b in blocks(text, source):
        out += [text[pos:b.start], f"\n\n{TABLES[b.name](data)}\n\n"]
        pos = b.end
    return "".join(out) + text[pos:]


def check_text(text: str, data: Data, source: str) -> list[str]:
    """What differs between the tables of ``text`` and the data, one message per table."""
    wanted = render_text(text, data, source)
    have_blocks, want_blocks = blocks(text, source), blocks(wanted, source)
    problems = []
    for have, want in zip(have_blocks, want_blocks):
        have_text, want_text = text[have.start:have.end], wanted[want.start:want.end]
        if have_text != want_text:
            diff = difflib.unified_diff(have_text.strip("\n").splitlines(),
                                        want_text.strip("\n").splitlines(),
                                        f"{source} (checked in)", "from the data", lineterm="")
            problems.append(f"{source}: table {have.name!r} differs from {shown(data.folder)}"
                            ":\n" + "\n".join(diff))
    return problems


def shown(path: Path) -> str:
    """``path`` relative to the repository if it is inside."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def doc_files(paths: list[Path]) -> list[Path]:
    """The files that exist and hold a marker."""
    return [p for p in paths if p.exists() and MARKER.search(p.read_text())]


def check_files(paths: list[Path], data: Data) -> list[str]:
    problems = []
    for p in doc_files(paths):
        problems += check_text(p.read_text(), data, shown(p))
    return problems


def render_files(paths: list[Path], data: Data) -> list[Path]:
    """Render the tables of every file; returns the files that changed."""
    changed = []
    for p in doc_files(paths):
        text = p.read_text()
        new = render_text(text, data, shown(p))
        if new != text:
            p.write_text(new)
            changed.append(p)
    return changed


# ------------------------------------------------------------------ charts
LEVEL_COLOURS = {"neon": "#4C72B0", "dotprod": "#DD8452", "i8mm": "#55A868"}
GROUP_HEIGHT = 0.8  # of one model's row, shared by its levels' bars
INCHES_PER_MODEL = 0.55
CHART_WIDTH = 9.0  # inches
CHART_MARGIN = 2.0  # inches: the title, the axis' label and the legend under it
LEGEND_HEIGHT = 0.35  # inches at the bottom of the figure, for the legend
DPI = 120
AXIS_HEADROOM = 1.12  # the x axis runs this far past the largest value shown
CEILING_VIEW = 2.0  # ceilings beyond this many times the largest ratio sit at the edge
LABEL_SIZE = 7  # points: the figures beside the bars
TICK_WIDTH = 1.5  # points: a ceiling's tick
GRID_ALPHA = 0.3
SEPARATOR_WIDTH = 0.6  # points: the line between two models
TFLITE = 1.0  # the ratio of a model as fast as TFLite
POINTS_PER_INCH = 72


def chart(rows: list[dict], ceilings: list[dict] | None, title: str, path: Path) -> None:
    """Horizontal bars of tflite / tvm_armq, models top to bottom, the levels side by side in
    fixed colours, each bar's figure at its end; the TFLite line at 1; each (model, level)'s
    ceiling a black tick (a ceiling too far out sits at the axis' edge, its figure beside
    it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = rd.levels()
    table = by_model(rows)
    ceiling_of = {(c["model"], c["isa"]): c["ceiling"] for c in ceilings or []}
    largest = max(r["tflite_over_tvm_armq"] for r in rows)
    shown_ceilings = [v for (m, _), v in ceiling_of.items() if m in table]
    right = max([largest] + [min(v, largest * CEILING_VIEW) for v in shown_ceilings])
    right *= AXIS_HEADROOM
    bar = GROUP_HEIGHT / len(levels)
    fig, ax = plt.subplots(figsize=(CHART_WIDTH,
                                    CHART_MARGIN + INCHES_PER_MODEL * len(table)))
    # a level's bars are as many points tall as this; a ceiling's tick as tall as its bar
    bar_points = bar * INCHES_PER_MODEL * POINTS_PER_INCH
    labelled: set[str] = set()  # the legend's entries drawn so far
    for i, (model, per) in enumerate(table.items()):
        for j, lv in enumerate(levels):
            if lv not in per:
                continue
            y = i - GROUP_HEIGHT / 2 + (j + 0.5) * bar
            value = per[lv]["tflite_over_tvm_armq"]
            ax.barh(y, value, bar, color=LEVEL_COLOURS[lv],
                    label=None if lv in labelled else lv)
            labelled.add(lv)
            ax.text(value, y, f" {value:.2f}", va="center", fontsize=LABEL_SIZE)
            c = ceiling_of.get((model, lv))
            if c is not None:
                inside = c <= right
                ax.plot(min(c, right), y, marker="|" if inside else ">", color="black",
                        markersize=bar_points, markeredgewidth=TICK_WIDTH, linestyle="none",
                        clip_on=False,
                        label=None if "ceiling" in labelled else "ceiling: TFLite / MAC bound")
                labelled.add("ceiling")
                if not inside:
                    ax.annotate(f"ceiling {c:.1f}", (right, y), xytext=(-bar_points, 0),
                                textcoords="offset points", va="center", ha="right",
                                fontsize=LABEL_SIZE)
    ax.axvline(TFLITE, color="black", linestyle="--", label=f"TFLite ({TFLITE:.1f})")
    ax.set_yticks(range(len(table)), list(table))
    ax.set_ylim(len(table) - 0.5, -0.5)  # the first model on top
    ax.set_xlim(0, right)
    ax.set_xlabel("est. cycles TFLite / tvm_armq (above 1: tvm_armq is faster)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=GRID_ALPHA)
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(lv) for lv in levels if lv in labels] + [
        k for k, lab in enumerate(labels) if lab not in levels]
    fig.legend([handles[k] for k in order], [labels[k] for k in order], loc="lower center",
               ncol=len(order), fontsize="small", frameon=False)
    for i in range(len(table) - 1):  # a thin line between two models' groups
        ax.axhline(i + 0.5, color="lightgrey", linewidth=SEPARATOR_WIDTH)
    fig.tight_layout(rect=(0, LEGEND_HEIGHT / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def draw_charts(data: Data) -> list[Path]:
    drawn = []
    if data.models:
        version = rd.armperf_version(data.models, "models chart")
        if data.ceilings:
            check_ceilings_current(data.ceilings, data.models)
        threads = thread_count(data.models, "models chart")
        path = data.folder / MODELS_CHART
        chart(data.models, data.ceilings,
              f"tvm_armq against TFLite (XNNPACK), whole models\n"
              f"armperf version {version}, {threads_words(threads)}", path)
        drawn.append(path)
    if data.threads:
        version = rd.armperf_version(data.threads, "threads chart")
        counts = sorted({r["threads"] for r in data.threads})
        path = data.folder / THREADS_CHART
        rows = [r for r in data.threads if r["threads"] == counts[-1]]
        chart(rows, None, f"tvm_armq against TFLite (XNNPACK), critical path\n"
              f"armperf version {version}, {threads_words(counts[-1])}", path)
        drawn.append(path)
    return drawn


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, default=DOCS,
                    help="markdown files to render (default: README.md, docs/performance.md)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a table differs from the data")
    ap.add_argument("--results", type=Path, default=rd.RESULTS,
                    help=f"the data folder (default {rd.RESULTS})")
    ap.add_argument("--no-charts", action="store_true", help="tables only")
    a = ap.parse_args(argv)
    data = Data.load(a.results)
    try:
        if a.check:
            problems = check_files(a.files, data)
            for p in problems:
                print(p, file=sys.stderr)
            checked = ", ".join(shown(p) for p in doc_files(a.files)) or "no file with markers"
            print(f"{len(problems)} table(s) differ from the data ({checked})"
                  + ("; re-render: python scripts/render_results.py" if problems else ""),
                  file=sys.stderr if problems else sys.stdout)
            return 1 if problems else 0
        for p in render_files(a.files, data):
            print(f"rendered {p}")
        if not a.no_charts:
            for p in draw_charts(data):
                print(f"wrote {p}")
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
