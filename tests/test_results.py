"""The benchmark tables in the docs are the checked-in data, rendered (scripts/render_results.py).

The repository's README.md and docs/performance.md: every table between
``<!-- results:NAME -->`` markers must be what ``render_results.py`` makes of
scripts/results/*.json now; a table edited by hand, or data re-measured without re-rendering,
fails here naming the file and the table. The renderer itself is tested on a markdown file
and data made up here: the cells it writes, ``--check`` before and after a hand edit, its
refusals (two armperf versions in one table, an unknown marker, stale ceilings), and the
merge of benchmark runs into the data files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import render_results as rr  # noqa: E402
import results_data as rd  # noqa: E402

MODELS_MARKER = "<!-- results:models -->"


# ------------------------------------------------------------------ the repository's docs
def test_checked_in_tables_match_the_data():
    problems = rr.check_files(rr.DOCS, rr.Data.load())
    assert not problems, "re-render with python scripts/render_results.py:\n" + "\n".join(
        problems)


def test_the_readme_shows_the_models_table():
    assert MODELS_MARKER in (rr.REPO / "README.md").read_text()


def test_checked_in_data_is_one_armperf_version_per_file():
    data = rr.Data.load()
    assert data.models, "scripts/results/models.json is missing or empty"
    for name in (rd.MODELS, rd.THREADS, rd.CEILINGS):
        rows = rd.load(rd.RESULTS / name)
        if rows is not None:
            rd.armperf_version(rows, name)
            assert rows == rd.sort_rows(rows), f"{name} is not in the zoo's order"
    rd.armperf_version(rd.load(rd.RESULTS / rd.BATCH_MATMUL) or [{}], rd.BATCH_MATMUL)


def test_renders_attentions_products_against_their_floor(tmp_path):
    rows = [{"case": "vit_qk", "isa": isa, "cycles": cycles, "over_floor": over,
             "armperf": 4} for isa, cycles, over in
            (("neon", 93290.0, 2.756), ("dotprod", 47370.0, 5.597), ("i8mm", 37200.0, 8.786))]
    rd.write(tmp_path / rd.BATCH_MATMUL, rows)
    table = rr.TABLES["batch_matmul"](rr.Data.load(tmp_path))
    assert "| vit_qk | 9.329e4 (2.756) | 4.737e4 (5.597) | 3.720e4 (8.786) |" in table
    rows[0]["armperf"] = 3
    rd.write(tmp_path / rd.BATCH_MATMUL, rows)
    with pytest.raises(rd.MixedVersionsError, match="vit_qk neon"):
        rr.TABLES["batch_matmul"](rr.Data.load(tmp_path))


def test_renders_the_c_librarys_sizes_beside_tflites(tmp_path):
    """A clib.json row: sizes in KB, the VM library's cycles over the C library's, the
    TFLite runtime's size and the armperf version in the note."""
    rd.write(tmp_path / rd.CLIB, [{"model": "net_a", "isa": "dotprod", "armperf": 4,
                                   "so_bytes": 2048, "a_bytes": 3072, "arena": 1024,
                                   "weights": 512, "model_bytes": 4096,
                                   "tflite_arena": 5120, "tflite_runtime_bytes": 10240,
                                   "c_cycles": 1.0e6, "vm_cycles": 1.02e6}])
    text = rr.TABLES["clib"](rr.Data.load(tmp_path))
    assert "| net_a | dotprod | 2 KB | 3 KB | 1 KB | 4 KB | 5 KB | 1.000e6 | 1.020 |" in text
    assert "10 KB for LiteRT 2.1.6" in text and "armperf version 4" in text


# ------------------------------------------------------------------ made-up data
def bench_row(model, isa, tflite, tvm, version=4, threads=1):
    return {"model": model, "isa": isa, "tflite": tflite, "tvm_armq": tvm,
            "tflite_over_tvm_armq": tflite / tvm, "armperf": version, "threads": threads}


def ceiling_row(row, macs, peak):
    bound = macs / peak
    return {**row, "macs": macs, "peak": peak, "bound": bound,
            "ceiling": row["tflite"] / bound, "tvm_over_bound": row["tvm_armq"] / bound}


PEAK = {"neon": 8.0, "dotprod": 32.0, "i8mm": 64.0}
DOC = f"""# Speed

Before.

{MODELS_MARKER}
stale text
<!-- /results:models -->

Between.

<!-- results:models_cycles -->
<!-- /results:models_cycles -->

<!-- results:ceilings -->
<!-- /results:ceilings -->

After.
"""


@pytest.fixture
def made_up(tmp_path):
    """A results folder and a markdown file with markers: net_a at every level, net_b
    without i8mm."""
    models = [bench_row("net_a", "neon", 1.0e6, 8.0e5),
              bench_row("net_a", "dotprod", 6.0e5, 3.0e5),
              bench_row("net_a", "i8mm", 5.0e5, 2.0e5),
              bench_row("net_b", "neon", 2.0e4, 2.5e4),
              bench_row("net_b", "dotprod", 1.5e4, 1.2e4)]
    macs = {"net_a": 4_000_000, "net_b": 80_000}
    ceilings = [ceiling_row(r, macs[r["model"]], PEAK[r["isa"]]) for r in models]
    results = tmp_path / "results"
    rd.write(results / rd.MODELS, models)
    rd.write(results / rd.CEILINGS, ceilings)
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)
    return results, doc


def test_renders_the_tables(made_up):
    results, doc = made_up
    assert rr.main(["--no-charts", "--results", str(results), str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Speed\n\nBefore.\n\n") and text.endswith("\n\nAfter.\n")
    assert "stale text" not in text
    assert text.count(MODELS_MARKER) == 1 and text.count("<!-- /results:models -->") == 1
    # 1e6 / 8e5 = 1.25, 6e5 / 3e5 = 2, 5e5 / 2e5 = 2.5; 2e4 / 2.5e4 = 0.8, 1.5e4 / 1.2e4
    assert "| model | neon | dotprod | i8mm |" in text
    assert "| net_a | 1.250 | 2.000 | 2.500 |" in text
    assert f"| net_b | 0.800 | 1.250 | {rr.MISSING} |" in text
    assert ("armperf version 4, one thread, est. cycles TFLite / tvm_armq; above 1 is "
            "faster than TFLite.") in text
    assert "| net_a | 1.000e6 | 8.000e5 | 6.000e5 | 3.000e5 | 5.000e5 | 2.000e5 |" in text
    # bounds: 4e6 / 8 = 5e5 at neon, 1.25e5 at dotprod, 6.25e4 at i8mm
    assert ("| net_a | 4.000e6 | 1.250 | 2.000 | 1.600 | 2.000 | 4.800 | 2.400 "
            "| 2.500 | 8.000 | 3.200 |") in text
    assert "MACs per cycle: neon 8.0, dotprod 32.0, i8mm 64.0" in text


def test_renders_each_ratio_against_its_target(made_up):
    """min(1.25, 0.9 x ceiling): net_a's ceilings (2.0 at neon) leave room for 1.25; net_b's
    at neon, 2e4 / (8e4 / 8) = 2.0 too, its dotprod 1.5e4 / 2.5e3 = 6.0."""
    results, _ = made_up
    text = rr.TABLES["targets"](rr.Data.load(results))
    assert "| net_a | 1.250 / 1.250 ✓ | 2.000 / 1.250 ✓ | 2.500 / 1.250 ✓ |" in text
    assert f"| net_b | 0.800 / 1.250 ✗ | 1.250 / 1.250 ✓ | {rr.MISSING} |" in text
    assert "4 of 5 met" in text
    assert rd.target(1.1) == pytest.approx(0.99) and rd.target(3.0) == 1.25


def test_renders_the_default_path_beside_one_thread(made_up):
    """Only rows measured with ``bench_models.py --plain`` (a ``tvm_compile`` figure) show:
    the plain build's cycles over the ``threads=1`` build's, and TFLite's over it."""
    results, _ = made_up
    assert "No default-path figures yet" in rr.TABLES["default_path"](rr.Data.load(results))
    rows = rd.load(results / rd.MODELS)
    rows[1].update(tvm_compile=3.3e5, tflite_over_tvm_compile=6.0e5 / 3.3e5)
    rd.write(results / rd.MODELS, rows)
    text = rr.TABLES["default_path"](rr.Data.load(results))
    assert "| net_a | dotprod | 3.000e5 | 3.300e5 | 1.100 | 1.818 |" in text
    assert "net_b" not in text and "armperf version 4, one thread" in text


def test_renders_threaded_ratios_with_their_balance(made_up):
    """A threaded row shows its ratio; where bench_models kept tvm_armq's work per thread,
    the busiest thread's over the mean beside it, and where it kept TFLite's too, the
    ratio against TFLite's work spread evenly over its threads."""
    results, _ = made_up
    assert "No figures on more than one thread" in rr.TABLES["threads"](rr.Data.load(results))
    even = bench_row("net_a", "neon", 6.0e5, 4.0e5, threads=2)
    uneven = {**bench_row("net_a", "dotprod", 3.0e5, 1.5e5, threads=2),
              "tvm_armq_work": [1.5e5, 1.2e5]}  # mean 1.35e5
    four = {**bench_row("net_a", "neon", 6.0e5, 2.0e5, threads=4),
            "tvm_armq_work": [2.0e5] * 4, "tflite_work": [6.0e5, 3.0e5, 2.0e5, 1.0e5]}
    rd.write(results / rd.THREADS, [even, uneven, four])
    text = rr.TABLES["threads"](rr.Data.load(results))
    assert f"| net_a | 2 | 1.500 | 2.000 (1.11) | {rr.MISSING} |" in text
    # TFLite's work spread evenly: 1.2e6 / 4 = 3.0e5 against 2.0e5
    assert f"| net_a | 4 | 3.000 (1.00, 1.500) | {rr.MISSING} | {rr.MISSING} |" in text


def test_check_passes_after_rendering_and_fails_after_a_hand_edit(made_up, capsys):
    results, doc = made_up
    args = ["--results", str(results), str(doc)]
    assert rr.main(["--check", *args]) == 1  # the stale text
    assert rr.main(["--no-charts", *args]) == 0
    assert rr.main(["--check", *args]) == 0
    rendered = doc.read_text()
    doc.write_text(rendered.replace("| net_a | 1.250 |", "| net_a | 1.260 |"))
    edited = doc.read_text()
    capsys.readouterr()
    assert rr.main(["--check", *args]) == 1
    err = capsys.readouterr().err
    assert f"{doc}: table 'models' differs" in err
    assert "-| net_a | 1.260 |" in err and "+| net_a | 1.250 |" in err
    assert "models_cycles" not in err  # the other tables still agree
    assert doc.read_text() == edited  # --check writes nothing


def test_a_table_never_mixes_armperf_versions(made_up):
    results, doc = made_up
    rows = rd.load(results / rd.MODELS)
    rows[3]["armperf"] = 3
    rd.write(results / rd.MODELS, rows)
    with pytest.raises(rd.MixedVersionsError, match="'models'.*version 3: net_b neon"):
        rr.render_text(doc.read_text(), rr.Data.load(results))
    assert rr.main(["--check", "--results", str(results), str(doc)]) == 2


def test_unknown_or_unpaired_markers_are_errors(made_up):
    results, _ = made_up
    data = rr.Data.load(results)
    with pytest.raises(rr.UnknownTableError, match="'speed'"):
        rr.render_text("<!-- results:speed -->\n<!-- /results:speed -->\n", data)
    with pytest.raises(rd.ResultsError, match="never closed"):
        rr.render_text(f"{MODELS_MARKER}\n", data)


def test_stale_ceilings_are_an_error(made_up):
    results, doc = made_up
    rows = rd.load(results / rd.MODELS)
    rows[0]["tvm_armq"] *= 0.9
    rd.write(results / rd.MODELS, rows)
    with pytest.raises(rd.ResultsError, match="ceilings.json is older than models.json"):
        rr.render_text(doc.read_text(), rr.Data.load(results))


def test_ceilings_of_a_model_not_in_them_are_an_error(made_up):
    results, doc = made_up
    rd.write(results / rd.MODELS,
             rd.load(results / rd.MODELS) + [bench_row("net_c", "neon", 3.0e5, 2.0e5)])
    with pytest.raises(rd.ResultsError, match="no row for net_c neon"):
        rr.render_text(doc.read_text(), rr.Data.load(results))

def test_a_file_without_markers_is_left_alone(tmp_path, made_up):
    results, _ = made_up
    plain = tmp_path / "plain.md"
    plain.write_text("# nothing to render\n")
    assert rr.render_files([plain, tmp_path / "absent.md"], rr.Data.load(results)) == []


def test_merge_replaces_by_key_in_the_zoos_order(tmp_path):
    results = tmp_path / "results"
    rd.write(results / rd.MODELS, [bench_row("mobilenet_v2_1.0", "neon", 3.0, 2.0),
                                   bench_row("mobilenet_v1_0.25", "i8mm", 3.0, 1.0)])
    run = tmp_path / "run.json"
    run.write_text(json.dumps([bench_row("mobilenet_v2_1.0", "neon", 3.0, 1.5),
                               bench_row("mobilenet_v1_0.25", "neon", 2.0, 1.0),
                               bench_row("mobilenet_v1_0.25", "neon", 2.0, 0.5, threads=2)]))
    assert rd.merge_files([run], results) == {rd.MODELS: 2, rd.THREADS: 1}
    merged = rd.load(results / rd.MODELS)
    assert [(r["model"], r["isa"]) for r in merged] == [
        ("mobilenet_v1_0.25", "neon"), ("mobilenet_v1_0.25", "i8mm"),
        ("mobilenet_v2_1.0", "neon")]
    assert merged[2]["tvm_armq"] == 1.5  # replaced
    (threaded,) = rd.load(results / rd.THREADS)
    assert threaded["threads"] == 2


def test_merge_refuses_a_row_without_its_armperf_version(tmp_path):
    row = bench_row("ds_cnn", "neon", 2.0, 1.0)
    del row["armperf"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps([row]))
    with pytest.raises(rd.ResultsError, match="lacks armperf"):
        rd.merge_files([run], tmp_path / "results")


def test_draws_the_chart(made_up):
    pytest.importorskip("matplotlib")
    results, _ = made_up
    (path,) = rr.draw_charts(rr.Data.load(results))
    assert path == results / rr.MODELS_CHART
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

