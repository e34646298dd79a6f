"""The benchmark figures the docs show, kept as data: where the files are, how the rows of
separate benchmark runs merge into them, and the one rule for reading them together.

``scripts/results/`` holds

    models.json          bench_models.py rows measured on one thread, every zoo net measured
    models_threads.json  bench_models.py rows measured on more than one thread (optional)
    ceilings.json        mac_ceiling.py rows: each model's MAC bound and ceiling per level
    batch_matmul.json    bench_batch_matmul.py rows: attention's products against their floor
    layers.json          bench_layers.py rows (without the hot blocks): each distinct layer
                         of MobileNetV1 / V2 1.0 at 224 per level, tvm_armq against TFLite

Rows are replaced by their key, (model, isa, threads), and kept in one order: the zoo's
(``tvm_armq.zoo.names()``, nets in the order the zoo lists them), then the ISA level
(neon, dotprod, i8mm), then threads. A model the zoo does not know goes last, by name.

Every row names the armperf version that measured it; figures of two versions are not
comparable, so a table never holds both (``armperf_version``).

Update the data and the docs:

    python scripts/bench_models.py --merge /tmp/bench/*.json        # per-net runs -> models*.json
    python scripts/mac_ceiling.py --bench scripts/results/models.json \\
                                  --json scripts/results/ceilings.json
    python scripts/bench_layers.py --models mobilenet_v1_1.0 mobilenet_v2_1.0 \
                                   --results scripts/results/layers.json   # per layer
    python scripts/render_results.py                                 # tables and charts
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = "models.json"
THREADS = "models_threads.json"
CEILINGS = "ceilings.json"
BATCH_MATMUL = "batch_matmul.json"  # scripts/bench_batch_matmul.py --json
CLIB = "clib.json"  # scripts/bench_clib.py: the C library's sizes, arena and cycles
LAYERS = "layers.json"  # scripts/bench_layers.py --json, its "rows" less the hot blocks

ONE_THREAD = 1
KEY = ("model", "isa", "threads")
# what every bench_models.py row must hold to be merged
BENCH_FIELDS = ("model", "isa", "threads", "armperf", "tflite", "tvm_armq",
                "tflite_over_tvm_armq")


class ResultsError(ValueError):
    """Data that cannot be rendered or merged as it is; the message says what to do."""


class MixedVersionsError(ResultsError):
    """Rows of different armperf versions asked to share one table."""


def levels() -> list[str]:
    """The ISA levels, in the order the tables and charts show them."""
    from tvm_armq.targets import LEVELS

    return list(LEVELS)


def load(path: Path) -> list[dict] | None:
    """The rows of a results file; None if there is no such file."""
    if not path.exists():
        return None
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ResultsError(f"{path}: expected a JSON list of rows")
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")


def sort_rows(rows: list[dict]) -> list[dict]:
    """The rows in the documented order: zoo order, then level, then threads."""
    from tvm_armq import zoo

    model_rank = {name: i for i, name in enumerate(zoo.names())}
    level_rank = {name: i for i, name in enumerate(levels())}
    unknown = len(model_rank)

    def key(r: dict):
        return (model_rank.get(r["model"], unknown), r["model"],
                level_rank.get(r["isa"], len(level_rank)), r["isa"],
                r.get("threads", ONE_THREAD))

    return sorted(rows, key=key)


def row_key(row: dict) -> tuple:
    return tuple(row.get(k, ONE_THREAD) if k == "threads" else row[k] for k in KEY)


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with every row of ``new`` in place of the old row of its key, sorted."""
    by_key = {row_key(r): r for r in old}
    by_key.update((row_key(r), r) for r in new)
    return sort_rows(list(by_key.values()))


def check_bench_row(row: dict, source: str) -> None:
    missing = [f for f in BENCH_FIELDS if f not in row]
    if missing:
        raise ResultsError(f"{source}: a row ({row.get('model')}, {row.get('isa')}) lacks "
                           f"{', '.join(missing)}: re-measure it with "
                           f"scripts/bench_models.py --no-stock --json")


def merge_files(paths: list[Path], results: Path = RESULTS) -> dict[str, int]:
    """Merge bench_models.py ``--json`` files into ``results``: one-thread rows into
    models.json, the others into models_threads.json. Returns the rows merged per file
    written."""
    new: dict[str, list[dict]] = {MODELS: [], THREADS: []}
    for p in paths:
        for row in load(Path(p)) or []:
            check_bench_row(row, str(p))
            new[MODELS if row["threads"] == ONE_THREAD else THREADS].append(row)
    merged = {}
    for name, rows in new.items():
        if rows:
            path = results / name
            write(path, merge(load(path) or [], rows))
            merged[name] = len(rows)
    return merged


# Issue 42's goal per model and level: tflite / tvm_armq at least min(TARGET_RATIO,
# CEILING_SHARE x ceiling): 1.25 where the core leaves room, else 90% of what any
# implementation could reach (the ceiling: TFLite's cycles over the MAC floor,
# scripts/mac_ceiling.py)
TARGET_RATIO = 1.25
CEILING_SHARE = 0.9


def target(ceiling: float) -> float:
    """The tflite / tvm_armq a model and level must reach, given its ceiling."""
    return min(TARGET_RATIO, CEILING_SHARE * ceiling)


def armperf_version(rows: list[dict], table: str) -> int:
    """The one armperf version of ``rows``; MixedVersionsError naming ``table`` if they hold
    several (or a row holds none)."""
    if not rows:
        raise ResultsError(f"table {table!r}: no rows to show")
    versions = {r.get("armperf") for r in rows}
    if None in versions:
        raise MixedVersionsError(f"table {table!r}: a row carries no armperf version; "
                                 "re-measure it")
    if len(versions) != 1:
        by_version: dict[int, list[str]] = {}
        for r in rows:
            name = r.get("model", r.get("case"))
            by_version.setdefault(r["armperf"], []).append(f"{name} {r['isa']}")
        detail = "; ".join(f"version {v}: {', '.join(sorted(set(ms)))}"
                           for v, ms in sorted(by_version.items()))
        raise MixedVersionsError(f"table {table!r} would mix armperf versions ({detail}); "
                                 "re-measure the older rows")
    (version,) = versions
    return version
