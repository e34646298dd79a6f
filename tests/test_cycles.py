"""The cycle model (tvm_armq/device/cycles.py): the qemu plugin counts block executions
exactly, llvm-mca prices blocks on a core's model, code qemu cut in pieces is priced whole,
code above the emulated level dies (SIGILL) instead of being priced, ``estimate`` breaks a
model's cycles down by layer, and on several threads counts each thread's work apart with
its waiting left out. The tests that run code under qemu are marked ``device``."""

from __future__ import annotations

import pytest

from tvm_armq import build, cli, export, targets, zoo
from tvm_armq.device import cycles
from tvm_armq.frontend.model import TFLiteModel

LOOP_TRIPS = 1000
RUNS = 3


def _loop_library(tmp_path, level):
    """One function: ``LOOP_TRIPS`` scalar iterations, each its own pass through the
    loop's block (a serial, unvectorized loop of a data-dependent recurrence)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def scan(a: T.Buffer((LOOP_TRIPS,), "int32"), b: T.Buffer((LOOP_TRIPS,), "int32")):
        T.func_attr({"global_symbol": "scan", "tirx.noalias": True})
        for i in T.serial(LOOP_TRIPS):
            b[i] = a[i] * 3 + b[T.max(i - 1, 0)]

    lib = tvm.compile(tvm.IRModule({"scan": scan}), target=targets.resolve(level))
    return export.export_aarch64(lib, tmp_path / f"scan-{level}.so")


@pytest.mark.device
def test_plugin_counts_every_execution(tmp_path):
    """Counts are exact and belong to their region: three measured calls count every
    block of the library exactly three times as often as one call does, and the loop
    runs its trips (LLVM may unroll it, so its block runs a fraction of LOOP_TRIPS)."""
    lib = _loop_library(tmp_path, "neon")

    def counted(runs):
        prof = cycles.profile(lib, "neon", [((LOOP_TRIPS,), "int32")] * 2, kind="func",
                              entry="scan", runs=runs)
        return {prof.blocks[b]: c for b, c in prof.counts[cycles.MEASURED].items()
                if prof.library_of(prof.blocks[b][0]).endswith(lib.name)}

    once, thrice = counted(1), counted(RUNS)
    assert once and once.keys() == thrice.keys()
    assert all(thrice[b] == RUNS * once[b] for b in once), (once, thrice)
    loop = max(once.values())
    assert LOOP_TRIPS // 8 <= loop <= LOOP_TRIPS
    # the trips' instructions: at least a load, a multiply-add and a store each
    assert sum(c * len(b[1]) for b, c in once.items()) >= 3 * LOOP_TRIPS


def test_llvm_mca_prices_a_dependency_chain():
    # eight dependent single-cycle ALU adds: eight cycles an execution on a Cortex-A72
    chain = ("add x0, x0, #1",) * 8
    price = cycles.Pricer("cortex-a72").cycles([chain])[chain]
    assert price == pytest.approx(8.0, abs=0.1)
    # the same adds on eight registers issue two a cycle (A72: two integer pipes)
    wide = tuple(f"add x{r}, x{r}, #1" for r in range(8))
    assert cycles.Pricer("cortex-a72").cycles([wide])[wide] == pytest.approx(4.0, abs=0.1)


def test_prices_come_from_armperf_llvm_and_are_kept_per_build():
    """llvm-mca and llvm-mc are LLVM 22's, armperf version 4's; a price is cached under the
    llvm-mca build that gave it, so an older build's prices are never reused."""
    mca, mc = cycles.tool("llvm-mca"), cycles.tool("llvm-mc")
    assert cycles.llvm_version(mca).split(".")[0] == "22", mca
    assert cycles.llvm_version(mc) == cycles.llvm_version(mca)
    pricer = cycles.Pricer("cortex-a72")
    assert pricer.path.name == f"cortex-a72-llvm-mca-{cycles.llvm_version(mca)}.json"
    assert pricer.words_path.name == f"decoded-llvm-mc-{cycles.llvm_version(mc)}.json"


@pytest.mark.device
def test_cli_estimate_prices_the_library_compile_writes(tmp_path, capsys):
    """``estimate``'s total is the library ``compile --threads 1`` writes (``main`` as
    compiled code, what armperf measures), not the bytecode build its per-layer rows come
    from: pricing that one added the interpreter's work (MobileNetV2 0.35 at dotprod, 8%)."""
    model = str(cli.BUNDLED_MODEL)
    out = tmp_path / "m.so"
    assert cli.main(["compile", model, "--isa", "neon", "--threads", "1", "-o", str(out)]) == 0
    args = [(t.shape, t.dtype) for t in TFLiteModel.load(cli.BUNDLED_MODEL).signature()[0]]
    compiled = cycles.estimate(out, "neon", args, layers=False).total
    capsys.readouterr()
    assert cli.main(["estimate", model, "--isa", "neon"]) == 0
    text = capsys.readouterr().out
    total = next(ln.split() for ln in text.splitlines() if ln.strip().startswith("total"))
    assert float(total[-1].replace(",", "")) == pytest.approx(compiled, rel=0.003), text


class _Pricer:
    """A stand-in for llvm-mca: a sequence costs its length, plus 100 if it is longer than
    one piece (so a test sees which sequences were priced whole)."""

    def decode(self, words):
        return {w: "nop" if w != b"\0\0\0\x14" else "b #0" for w in words}

    def cycles(self, seqs):
        return {s: len(s) + (100 if len(s) > 2 else 0) for s in seqs}


def test_code_qemu_cut_in_pieces_is_priced_whole():
    nop, branch = b"\x1f\x20\x03\xd5", b"\0\0\0\x14"
    # A (0x1000, two nops) falls into B (0x1008, a nop and a branch); 10 executions enter
    # at A and run A+B, 5 more enter B alone (a jump to 0x1008)
    blocks = {0: (0x1000, (nop, nop)), 1: (0x1008, (nop, branch))}
    prof = cycles.Profile(blocks, {1: {0: 10, 1: 15}}, [], [], [], runs=1)
    assert prof.cycles(_Pricer())[1] == 10 * (4 + 100) + 5 * 2


def test_a_waiting_loop_is_left_out_of_a_thread_work():
    # addresses in units of instructions, as the plugin gives them
    def at(i):
        return 0x10000 + 4 * i

    # where each block starts, and the code: a loop of work; TVM's pool polling a flag,
    # calling sched_yield through a PLT trampoline and looping back; the loop's exit
    where = {"plt": 0, "work": 10, "poll": 20, "call": 23, "back": 25, "after": 40,
             "yield": 50, "ret": 53}
    insns = {
        "work": ("add x0, x0, #1", "mul x1, x1, x2", "str x1, [x3]", "ldr x2, [x4]",
                 "add x4, x4, #8", "subs x5, x5, #1", "b.ne #-24"),
        "poll": ("ldarb w0, [x20]", "tst w0, #0xff", f"b.eq #{4 * (40 - 22)}"),  # to exit
        "call": ("add w19, w19, #1", f"bl #{4 * (0 - 24)}"),                      # the PLT
        "back": ("cmp w21, w19", f"b.ne #{4 * (20 - 26)}"),                       # the poll
        "plt": ("adrp x16, #4096", "ldr x17, [x16, #944]", "add x16, x16, #944", "br x17"),
        "yield": ("nop", "mov x8, #124", "svc #0"),                 # libc's sched_yield
        "ret": ("cmn x0, #4095", "b.hs #8"),                        # what follows the call
        "after": ("mov x0, x19", "ret"),                            # the loop's exit, once
    }
    ids = {name: i for i, name in enumerate(insns)}
    blocks = {ids[n]: (at(where[n]), ()) for n in insns}
    spins = 5000
    counts = {ids["work"]: 7000, ids["after"]: 1, **{ids[n]: spins for n in
                                                     ("poll", "call", "back", "plt", "yield",
                                                      "ret")}}
    waiting = cycles.waiting_blocks(counts, blocks, {ids[n]: insns[n] for n in insns})
    assert waiting == {ids[n] for n in ("poll", "call", "back", "plt", "yield", "ret")}
    # a short block of work that runs as often as the loop but is not joined to it stays
    counts[ids["work"]] = spins
    assert ids["work"] not in cycles.waiting_blocks(counts, blocks,
                                                    {ids[n]: insns[n] for n in insns})


@pytest.mark.device
def test_threaded_estimate_counts_each_thread_work_apart(tmp_path):
    model = TFLiteModel.load(cli.BUNDLED_MODEL)
    lib = export.export_aarch64(build.compile_tflite(model, "dotprod"), tmp_path / "m.so")
    args = [(t.shape, t.dtype) for t in model.signature()[0]]
    one = cycles.estimate(lib, "dotprod", args, layers=False)
    two = cycles.estimate(lib, "dotprod", args, layers=False, threads=2)
    assert len(two.work) == 2 and min(two.work) > 0.2 * one.total, two.work
    # the same work, split (waiting left out: its spin would add host-dependent cycles)
    assert sum(two.work) == pytest.approx(one.total, rel=0.03)
    assert two.total == max(two.work) < 0.9 * one.total


@pytest.mark.device
def test_code_above_the_level_is_refused_not_priced(tmp_path):
    model = TFLiteModel.load(zoo.build("conv2d_1x1"))
    lib = export.export_aarch64(build.compile_tflite(model, "i8mm"), tmp_path / "i8mm.so")
    with pytest.raises(cycles.CycleModelError, match="on neon failed"):
        cycles.profile(lib, "neon", [(t.shape, t.dtype) for t in model.signature()[0]])


def test_cores_are_checked_against_the_level():
    assert cycles.core_for("dotprod") == "neoverse-n1"
    assert cycles.core_for("neon", "cortex-a55") == "cortex-a55"
    with pytest.raises(cycles.UnknownCore, match="runs ISA level dotprod at most"):
        cycles.core_for("i8mm", "cortex-a76")
    with pytest.raises(cycles.UnknownCore, match="unknown core 'cortex-a999'"):
        cycles.core_for("neon", "cortex-a999")


@pytest.mark.device
def test_cli_estimate_breaks_the_total_down_by_layer(capsys):
    assert cli.main(["estimate", str(cli.BUNDLED_MODEL), "--isa", "neon"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("  tvm_armq_")]
    total = next(ln.split() for ln in out.splitlines() if ln.strip().startswith("total"))
    vm = next(ln.split() for ln in out.splitlines() if ln.strip().startswith("VM and"))
    cyc = [float(r[-2].replace(",", "")) for r in rows]
    layers = build.inspect(TFLiteModel.load(cli.BUNDLED_MODEL), "neon")
    assert sum(int(r[3]) for r in rows) == len(layers), out  # every layer, once a run
    assert all(c > 0 for c in cyc), out
    assert all("_neon" in r[2] for r in rows), out  # each names its kernel, of this level
    assert float(vm[-2].replace(",", "")) > 0, out
    assert sum(cyc) + float(vm[-2].replace(",", "")) == pytest.approx(
        float(total[-1].replace(",", "")), rel=1e-4)
    assert "priced on the cortex-a72 model" in out


def test_cli_estimate_refuses_a_core_below_the_level(capsys):
    assert cli.main(["estimate", str(cli.BUNDLED_MODEL), "--isa", "i8mm",
                     "--core", "cortex-a72"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "core cortex-a72 runs ISA level neon at most" in err and "\n" == err[-1]
    assert err.count("\n") == 1


@pytest.mark.device
def test_cli_estimate_on_threads_names_each_layer_busiest_thread(capsys):
    assert cli.main(["estimate", str(cli.BUNDLED_MODEL), "--isa", "neon",
                     "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "priced on 2 cortex-a72 cores" in out and "busiest/mean" in out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("  tvm_armq_")]
    assert rows and all(1.0 <= float(r[-1]) <= 2.0 for r in rows), out
    work = out.split("Work per thread (the calling thread first): ")[1].split(";")[0]
    work = [float(w.replace(",", "")) for w in work.split(", ")]
    total = next(ln.split() for ln in out.splitlines() if ln.strip().startswith("total"))
    assert len(work) == 2 and float(total[-1].replace(",", "")) == pytest.approx(max(work))


def test_cli_estimate_refuses_no_threads(capsys):
    assert cli.main(["estimate", str(cli.BUNDLED_MODEL), "--threads", "0"]) == cli.EXIT_USAGE
    assert "--threads must be at least 1, got 0" in capsys.readouterr().err
