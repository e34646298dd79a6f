"""How close a GEMM inner loop comes to the core model's peak int8 multiply-accumulate rate.

The conv2d GEMM's hot block is its innermost K loop. This script finds that loop in a
compiled kernel, prices one iteration with llvm-mca on the ISA level's core model (the
same model and flags armperf uses) and reports

    MACs per cycle of the loop = MACs of one iteration / llvm-mca cycles per iteration
    peak                       = MACs of the level's MAC instruction x its throughput
                                 (llvm-mca on a block of independent instances)

Where K is short (a few blocks), the K loop is unrolled into the loop over tiles, and the
hot loop is a whole tile: its K steps, then its requantization and stores. The second
figure, "K run", prices only the K steps of that loop: its instructions from the first
multiply-accumulate to the last (the loads between them, and whatever else the compiler
scheduled in between), as llvm-mca prices any block. Where the loop is the K loop itself,
the two figures agree to a fraction of a percent (the run leaves out the loads before the
first multiply-accumulate and the loop's own branch).

Levels, MAC instructions and core models (armperf's):

    neon     smull/smull2 (8 int8 MACs)    cortex-a72
    dotprod  sdot        (16 int8 MACs)    neoverse-n1
    i8mm     smmla       (32 int8 MACs)    neoverse-n2

Where the loop comes from (``--source``):

  llvm     (default) the LLVM assembly of the compiled PrimFunc: the innermost loop (a
           block that branches back to its own label) holding the most MACs.
  armperf  the hottest block of an armperf run of the kernel (what the emulated CPU ran).
           armperf 2 and later print sdot/smmla/... decoded; a block from armperf 1
           still holds them as the ``.byte`` words qemu's disassembler printed, which
           llvm-mca would read as data, so such words are decoded here (``decode_word``).

    python scripts/inner_loop_peak.py [--layers REGEX] [--isa neon dotprod i8mm]
                                      [--source llvm|armperf] [--show]

The layers are ``bench_layers.LAYERS`` (conv / dense only), built exactly as bench_layers
builds them (default knobs). The figure is a steady-state, every-load-an-L1-hit estimate of
one loop iteration, as armperf's are.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import armperf_tool  # noqa: E402
import bench_layers as bl  # noqa: E402  (the layer table and the kernel builder)

MCA = "llvm-mca-22"  # the build ../shared/armperf (version 4) prices with
MCA_ATTR = "+dotprod,+i8mm,+bf16,+fullfp16,+rcpc,+crc,+lse"  # as armperf
ITERATIONS = 200
CORE = {"neon": "cortex-a72", "dotprod": "neoverse-n1", "i8mm": "neoverse-n2"}

# int8 multiply-accumulates per instruction (per 128-bit form; the 64-bit smull reads 8
# bytes of each operand, smull2 the other 8).
MACS = {"smull": 8, "smull2": 8, "umull": 8, "umull2": 8, "smlal": 8, "smlal2": 8,
        "umlal": 8, "umlal2": 8, "sdot": 16, "udot": 16, "usdot": 16, "sudot": 16,
        "smmla": 32, "ummla": 32, "usmmla": 32}
# The level's MAC instruction, as a line llvm-mca can price (registers filled in later).
PEAK_INSTRUCTION = {"neon": "smull v{d}.8h, v30.8b, v31.8b",
                    "dotprod": "sdot v{d}.4s, v30.16b, v31.16b",
                    "i8mm": "smmla v{d}.4s, v30.16b, v31.16b"}

# ------------------------------------------------------------------ decoding
# The Advanced SIMD dot-product and matrix-multiply encodings (128-bit forms, .4s
# accumulator). Each entry: (fixed bits mask, fixed bits value, mnemonic, form).
# Fields: Rd = bits 0-4, Rn = bits 5-9, Rm = bits 16-20; the by-element forms take a
# 4-bit Rm (bits 16-19; bit 20 is M, the register's high bit) and the index H:L
# (bits 11 and 21).
_VECTOR_MASK = 0xFFE0FC00
_ELEMENT_MASK = 0xFFC0F400
ENCODINGS = (
    (_VECTOR_MASK, 0x4E809400, "sdot", "vector"),
    (_VECTOR_MASK, 0x6E809400, "udot", "vector"),
    (_VECTOR_MASK, 0x4E809C00, "usdot", "vector"),
    (_ELEMENT_MASK, 0x4F80E000, "sdot", "element"),
    (_ELEMENT_MASK, 0x6F80E000, "udot", "element"),
    (_ELEMENT_MASK, 0x4F80F000, "usdot", "element"),
    (_ELEMENT_MASK, 0x4F00F000, "sudot", "element"),
    (_VECTOR_MASK, 0x4E80A400, "smmla", "vector"),
    (_VECTOR_MASK, 0x6E80A400, "ummla", "vector"),
    (_VECTOR_MASK, 0x4E80AC00, "usmmla", "vector"),
    (_VECTOR_MASK, 0x6E40EC00, "bfmmla", "bf16"),
)


def decode_word(word: int) -> str | None:
    """The mnemonic line of a 32-bit instruction word if it is one of ``ENCODINGS``."""
    rd, rn = word & 0x1F, (word >> 5) & 0x1F
    for mask, value, name, form in ENCODINGS:
        if word & mask != value:
            continue
        if form == "vector":
            return f"{name} v{rd}.4s, v{rn}.16b, v{(word >> 16) & 0x1F}.16b"
        if form == "bf16":
            return f"{name} v{rd}.4s, v{rn}.8h, v{(word >> 16) & 0x1F}.8h"
        index = ((word >> 11) & 1) << 1 | (word >> 21) & 1
        return f"{name} v{rd}.4s, v{rn}.16b, v{(word >> 16) & 0x1F}.4b[{index}]"
    return None


_BYTES = re.compile(r"^\.byte\s+(0x[0-9a-f]{1,2})\s*,\s*(0x[0-9a-f]{1,2})\s*,\s*"
                    r"(0x[0-9a-f]{1,2})\s*,\s*(0x[0-9a-f]{1,2})", re.I)
_WORD = re.compile(r"^\.(?:word|inst|long)\s+(0x[0-9a-f]+)", re.I)


def decode_line(line: str) -> str:
    """``line`` with a ``.byte b0, b1, b2, b3`` (little-endian) or ``.word``/``.inst``
    encoding of a known instruction replaced by its mnemonic; other lines unchanged."""
    text = line.strip()
    m = _BYTES.match(text)
    if m:
        word = int.from_bytes(bytes(int(b, 16) for b in m.groups()), "little")
    else:
        m = _WORD.match(text)
        if not m:
            return line
        word = int(m.group(1), 16)
    return decode_word(word) or line


# ------------------------------------------------------------------ llvm-mca
_BRANCH = re.compile(r"^(b|bl|b\.\w+|cbz|cbnz|tbz|tbnz)\s")


def mca_cycles(insns: list[str], core: str) -> float:
    """llvm-mca's steady-state cycles per execution of the block (armperf's method)."""
    body = []
    for s in insns:
        s = re.sub(r"\s*//.*$", "", s).strip()
        if _BRANCH.match(s):  # every branch of the block targets the block itself
            s = re.sub(r"(#-?0x[0-9a-f]+|\.L\w+)$", "mca_lbl", s)
        body.append(s)
    src = "mca_lbl:\n" + "\n".join(body) + "\n"
    res = subprocess.run([MCA, "-mtriple=aarch64", f"-mcpu={core}", f"-mattr={MCA_ATTR}",
                          f"-iterations={ITERATIONS}", "-"], input=src, capture_output=True,
                         text=True)
    m = re.search(r"Total Cycles:\s+(\d+)", res.stdout)
    if not m:
        raise RuntimeError(f"llvm-mca could not price the block:\n{res.stderr[-2000:]}")
    return int(m.group(1)) / ITERATIONS


def macs(insns: list[str]) -> int:
    return sum(MACS.get(s.split()[0], 0) for s in insns if s.strip())


def k_run(insns: list[str]) -> list[str]:
    """The instructions of ``insns`` from its first multiply-accumulate to its last."""
    at = [i for i, s in enumerate(insns) if MACS.get(s.split()[0], 0)]
    return insns[at[0]:at[-1] + 1]


def peak(level: str) -> float:
    """The core model's int8 MACs per cycle: the level's MAC instruction, independent
    instances back to back."""
    block = [PEAK_INSTRUCTION[level].format(d=d) for d in range(24)]
    return macs(block) / mca_cycles(block, CORE[level])


# ------------------------------------------------------------------ the loop
_LABEL = re.compile(r"^(\.LBB\w+):")


def innermost_loops(asm: str, function: str) -> list[list[str]]:
    """Single-entry innermost loops of ``function`` in LLVM assembly: from a block label
    to the last branch back to it, with no other label in between (instructions only)."""
    start = asm.index(f"\n{function}:")
    end = asm.index(".Lfunc_end", start)
    loops, label, body = [], None, []
    for raw in asm[start:end].splitlines():
        line = raw.strip()
        m = _LABEL.match(line)
        if m:
            label, body = m.group(1), []
            continue
        if not line or line.startswith((".", "//")) or line.endswith(":"):
            continue  # directives, comments, local labels (.Ltmp)
        body.append(line)
        if label and _BRANCH.match(line) and line.split()[-1] == label:
            loops.append(list(body))
    return loops


def llvm_hot_loop(layer, level: str) -> list[str]:
    import tvm

    q, x = bl.check_layer(layer, bl.tflite_model(layer))
    kern = bl.make_kernel(layer, q, x, level, None)
    ex = tvm.compile(tvm.IRModule({layer.symbol: kern.func}),
                     target=bl.targets.resolve(level))
    loops = innermost_loops(ex.mod.inspect_source("asm"), f"{layer.symbol}_compute_")
    if not loops:
        raise RuntimeError(f"{layer.name}: no innermost loop found")
    return max(loops, key=macs)


def armperf_hot_loop(layer, level: str, workdir: Path) -> list[str]:
    q, x = bl.check_layer(layer, bl.tflite_model(layer))
    kern = bl.make_kernel(layer, q, x, level, None)
    lib, npz = bl.export_kernel(kern, level, workdir, layer.symbol)
    setup = workdir / "kernel_setup.py"
    setup.write_text(bl.GUEST_SETUP)
    res = bl.armperf(armperf_tool.DEFAULT, "script", setup, level, 1, 5,
                     args=(lib, npz, layer.symbol))
    code = [[decode_line(s) for s in h["code"]] for h in res["hot"]]
    return max(code, key=lambda c: macs(c) * 1.0)


def main() -> int:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", metavar="REGEX", default=r"pw7|v2\.b7-9\.project|logits")
    ap.add_argument("--isa", nargs="+", default=list(CORE), choices=list(CORE))
    ap.add_argument("--source", choices=("llvm", "armperf"), default="llvm")
    ap.add_argument("--show", action="store_true", help="print the loop's instructions")
    a = ap.parse_args()
    rx = re.compile(a.layers)
    layers = [lay for lay in bl.LAYERS if lay.op != "dw" and rx.search(lay.name)]
    if not layers:
        ap.error("no conv / dense layer selected")
    peaks = {level: peak(level) for level in a.isa}
    print(f"{'layer':18s} {'isa':8s} {'core':12s} {'MACs/iter':>9s} {'cyc/iter':>9s} "
          f"{'MAC/cyc':>8s} {'peak':>6s} {'of peak':>8s} {'K run':>8s}")
    with tempfile.TemporaryDirectory(prefix="inner_loop_peak-") as tmp:
        for layer in layers:
            for level in a.isa:
                loop = (llvm_hot_loop(layer, level) if a.source == "llvm"
                        else armperf_hot_loop(layer, level, Path(tmp)))
                n, cyc = macs(loop), mca_cycles(loop, CORE[level])
                rate = n / cyc
                run = k_run(loop)
                run_rate = n / (cyc if len(run) == len(loop) else mca_cycles(run, CORE[level]))
                print(f"{layer.name:18s} {level:8s} {CORE[level]:12s} {n:9d} {cyc:9.2f} "
                      f"{rate:8.2f} {peaks[level]:6.1f} {rate / peaks[level]:8.1%} "
                      f"{run_rate / peaks[level]:8.1%}", flush=True)
                if a.show:
                    print("    " + "\n    ".join(loop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
