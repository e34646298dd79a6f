"""Estimated cycles of aarch64 code on an Arm core's model: measuring without the board.

Read this first. Wall time under qemu says how hard qemu works, not how fast a Cortex-A76
runs the code. What qemu does know exactly is which code ran how often, and llvm-mca knows
how many cycles a straight run of instructions takes on a core's scheduling model. So:

1. ``profile`` runs a library on the level's emulated CPU (``qemu-aarch64 -cpu ...``, the
   same CPU the device uses, so an instruction the level lacks still dies with SIGILL)
   with the ``blockcount`` plugin (``blockcount.c``, built by ``device.provision``). The guest
   (``guest_cycles.py``) marks regions: the measured runs, and optionally each VM call.
   The plugin counts how often every translated block ran in each region and writes the
   blocks' instruction bytes.
2. ``Pricer`` decodes those bytes with llvm-mc (so ``sdot``, ``smmla``, ``bfmmla`` are
   instructions, not data) and prices each block with llvm-mca on the chosen core: cycles
   per execution in steady state (``Total Cycles`` of ``MCA_ITERATIONS`` back-to-back
   executions, divided by that number), cached per core and llvm-mca build in
   ``$TVM_ARMQ_HOME/mca``. Both are LLVM 22's (``LLVM_VERSION``), as armperf's are.
3. ``Profile.cycles`` sums count x cycles per region. qemu ends a block at a page end or
   when its buffer is full, so one straight run of code can arrive as several blocks; such
   a chain is priced as the one sequence it is for the executions that run through it
   from its first piece, as ``../shared/armperf`` does.
   Blocks covering the last ``1 - COVERAGE`` of executed instructions are charged the
   average cycles per instruction of the rest.
4. On several threads (``threads=N``: TVM's pool has N threads, the calling one among
   them) the plugin counts each guest thread apart, ``waiting_blocks`` takes out the loops
   a thread waits in (under emulation they spin as long as the host takes to run the
   others), and the run's figure is its critical path: the busiest thread's work.

What the figure assumes: one core, every load an L1 hit, no branch mispredictions beyond
what the model's steady state contains. It ranks implementations of the same work; it is
not milliseconds. ``../shared/armperf`` is the project's independent yardstick for it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .. import device, zoo
from ..targets import LEVELS, UnknownIsaError

# The core whose model prices a level's code by default: the core the level is named for.
DEFAULT_CORE = {"neon": "cortex-a72", "dotprod": "neoverse-n1", "i8mm": "neoverse-n2"}
# Cores a user may price with, and the highest ISA level each one runs (a core cannot
# price code it could not execute: i8mm code on a Cortex-A76 is refused).
CORES = {
    "cortex-a53": "neon", "cortex-a55": "dotprod", "cortex-a57": "neon",
    "cortex-a72": "neon", "cortex-a73": "neon", "cortex-a75": "dotprod",
    "cortex-a76": "dotprod", "cortex-a77": "dotprod", "cortex-a78": "dotprod",
    "cortex-x1": "dotprod", "cortex-a510": "i8mm", "cortex-a710": "i8mm",
    "cortex-x2": "i8mm", "neoverse-n1": "dotprod", "neoverse-n2": "i8mm",
    "neoverse-v1": "i8mm", "neoverse-v2": "i8mm",
}
MCA_ITERATIONS = 200
COVERAGE = 0.998  # share of executed instructions priced block by block
# Decoding and pricing accept every instruction of the richest level: only code the
# emulated CPU ran reaches them, and that CPU already refused what its level lacks.
MC_ATTR = "+v8.6a,+dotprod,+i8mm,+bf16,+fullfp16"
# llvm-mc and llvm-mca come from this LLVM (Debian's llvm-22): the build ../shared/armperf
# (version 4) prices with, so that ``estimate`` and ``tune --measure cycles`` price what
# armperf measures the way it does. Prices are cached per llvm-mca build (``Pricer``).
LLVM_VERSION = 22
REGION_TAG = 0x41524D51 << 32  # also in blockcount.c and guest_cycles.py
MEASURED = 1  # the region of the measured runs; 2 + i: the i-th function with layers=True
# Instructions after which qemu's block ends because the flow goes elsewhere: a block
# ending in anything else ran on into the code that follows it.
_ENDS_FLOW = re.compile(r"^(b|bl|br|blr|ret|b\.\w+|bc\.\w+|cbn?z|tbn?z|svc|hvc|smc|brk|hlt|"
                        r"udf|eret\w*|reta\w*|bra\w*|blra\w*)$")
GUEST_SCRIPT = Path(__file__).with_name("guest_cycles.py")


@functools.cache
def llvm_version(path: str) -> str:
    """The LLVM version an LLVM tool reports (``llvm-mca --version``): "22.1.0"."""
    res = subprocess.run([path, "--version"], capture_output=True, text=True)
    m = re.search(r"LLVM version (\S+)", res.stdout)
    return m.group(1) if m else "unknown"


class CycleModelError(device.DeviceError):
    """The cycle model cannot run here (a tool is missing) or the counted run failed (a
    SIGILL: code above the emulated level); the message says which."""


class UnknownCore(UnknownIsaError):
    """A core the cycle model does not know, or one that cannot run the level's code."""


def core_for(level: str, core: str | None = None) -> str:
    """The core model that prices ``level``'s code: ``core``, checked, or the default."""
    if level not in LEVELS:
        raise UnknownIsaError(f"unknown ISA level {level!r}: expected one of "
                              f"{', '.join(LEVELS)}")
    if core is None:
        return DEFAULT_CORE[level]
    if core not in CORES:
        raise UnknownCore(f"unknown core {core!r}: expected one of {', '.join(CORES)}")
    order = list(LEVELS)
    if order.index(CORES[core]) < order.index(level):
        raise UnknownCore(f"core {core} runs ISA level {CORES[core]} at most; it cannot "
                          f"run {level} code (choose a {level} core, e.g. "
                          f"{DEFAULT_CORE[level]})")
    return core


def tool(name: str) -> str:
    """Path of an LLVM tool of ``LLVM_VERSION`` (Debian's versioned name, or the plain one
    if it is that version) or of qemu; the Debian package that brings it is the one
    provisioning installs (``device.DEBIAN_PACKAGES``)."""
    if not name.startswith("llvm"):
        candidates = [name]
    else:
        candidates = [f"{name}-{LLVM_VERSION}"]
        plain = shutil.which(name)
        if plain and llvm_version(plain).split(".")[0] == str(LLVM_VERSION):
            return plain
    for candidate in candidates:
        if path := shutil.which(candidate):
            return path
    package = next(device.DEBIAN_PACKAGES[c] for c in candidates if c in device.DEBIAN_PACKAGES)
    raise CycleModelError(f"{name} not found: install Debian's {package} package "
                          f"(`python -m tvm_armq device provision` as root does)")


# ------------------------------------------------------------------------------ profile
@dataclasses.dataclass
class Profile:
    """What one guest run executed: blocks (id -> (address, 32-bit instruction words)),
    counts (region -> block id -> executions), the guest's code mappings (start, end,
    file) and, with layers, the VM functions whose calls were regions 2, 3, ... and how
    many calls of each one run made."""

    blocks: dict
    counts: dict
    maps: list
    names: list
    calls: list
    runs: int
    per_thread: dict = dataclasses.field(default_factory=dict)  # region -> thread -> counts

    def library_of(self, vaddr: int) -> str:
        for lo, hi, path in self.maps:
            if lo <= vaddr < hi:
                return path
        return "?"

    def cycles(self, pricer: "Pricer", keep=None) -> dict:
        """Estimated cycles per run of each region (``keep(library path)`` chooses the
        blocks counted: all by default)."""
        return self._priced(self.counts, pricer, keep)

    def thread_cycles(self, pricer: "Pricer", keep=None) -> dict:
        """Estimated cycles of **work** per run of each region and guest thread (region ->
        thread -> cycles), for a profile taken with ``threads`` > 1. Waiting is left out
        (``waiting_blocks``): under emulation a waiting thread spins for as long as the host
        takes to run the others, which says nothing of the core."""
        keys = {(r, t): per for r, threads in self.per_thread.items()
                for t, per in threads.items()}
        decoded = self._decoded(pricer, {b for per in keys.values() for b in per})
        work = {}
        for k, per in keys.items():
            waiting = waiting_blocks(per, self.blocks, decoded)
            work[k] = {b: c for b, c in per.items() if b not in waiting}
        priced = self._priced(work, pricer, keep)
        out = collections.defaultdict(dict)
        for (region, thread), cyc in priced.items():
            out[region][thread] = cyc
        return dict(out)

    def _decoded(self, pricer: "Pricer", ids) -> dict:
        """Block id -> its instructions as text."""
        decoded = pricer.decode({w for b in ids for w in self.blocks[b][1]})
        return {b: tuple(decoded[w] for w in self.blocks[b][1]) for b in ids}

    def _priced(self, counts: dict, pricer: "Pricer", keep) -> dict:
        """Cycles per run of each key of ``counts`` (key -> block id -> executions). The
        hot blocks and the chains are chosen over all keys together."""
        ids = {b for per in counts.values() for b in per}
        if keep is not None:
            ids = {b for b in ids if keep(self.library_of(self.blocks[b][0]))}
        insns = self._decoded(pricer, ids)
        executed = collections.Counter()
        for per in counts.values():
            for b, c in per.items():
                if b in ids:
                    executed[b] += c * len(insns[b])
        total = sum(executed.values())
        hot, covered = set(), 0
        for b, n in executed.most_common():
            if covered >= COVERAGE * total:
                break
            hot.add(b)
            covered += n
        chains = _chains(hot, self.blocks, insns)
        price = pricer.cycles({*(sum((insns[b] for b in c), ()) for c in chains),
                               *(insns[b] for b in hot)})
        return {key: _region_cycles({b: c for b, c in per.items() if b in ids}, hot,
                                    chains, insns, price) / self.runs
                for key, per in counts.items()}


# Waiting. A thread that waits for others (TVM's pool, glibc) loops over a system call
# (futex, sched_yield) or a wait hint, or polls an atomic flag with an acquire load, and
# reaches the C library through PLT trampolines. Those blocks are the seeds; the rest of
# such a loop is the short blocks around them that run as often as they do.
_WAIT_INSTRUCTION = re.compile(r"^(svc|wfe|wfi|yield)$")
_ACQUIRE_LOAD = re.compile(r"^(ldar|ldapr|ldaxr)\w*$")
_PLT = ("adrp", "ldr", "add", "br")  # a PLT trampoline: x16 = &GOT slot; br x17
SPIN_BLOCK_MAX = 6  # instructions: a block of a waiting loop is no longer than this
SPIN_COUNT_MATCH = 0.1  # a loop's blocks run as often as each other, to within this share


def is_waiting(insns) -> bool:
    """Is this block (its instructions as text) a seed of waiting rather than work?"""
    ops = [i.split()[0] for i in insns if i]
    if any(_WAIT_INSTRUCTION.match(op) for op in ops):
        return True
    if tuple(ops) == _PLT:
        return True
    return len(ops) <= SPIN_BLOCK_MAX and any(_ACQUIRE_LOAD.match(op) for op in ops)


def _direct_target(addr: int, insns) -> int | None:
    """Where the block's last instruction branches or calls to, if it names the place
    (llvm-mc prints a direct target as an offset from the instruction: ``b #-24``)."""
    if not insns:
        return None
    m = re.search(r"#(-?\d+)$", insns[-1])
    op = insns[-1].split()[0]
    if m and (op in ("b", "bl", "cbz", "cbnz", "tbz", "tbnz") or op.startswith("b.")):
        return addr + 4 * (len(insns) - 1) + int(m.group(1))
    return None


def waiting_blocks(counts: dict, blocks: dict, insns: dict) -> set:
    """The blocks of one thread's counts (block id -> executions) that are waiting: the
    seeds (``is_waiting``), and every short block joined to a waiting one — it starts where
    the other ends (falls through, or is where a call returns), or one branches or calls
    straight to the other — that ran as often as it did."""
    start = {blocks[b][0]: b for b in counts}
    end = {blocks[b][0] + 4 * len(insns[b]): b for b in counts}
    target = {b: _direct_target(blocks[b][0], insns[b]) for b in counts}
    branching_to = collections.defaultdict(list)
    for b, t in target.items():
        branching_to[t].append(b)

    def neighbours(b):
        addr, n = blocks[b][0], len(insns[b])
        out = [start.get(addr + 4 * n), end.get(addr), start.get(target[b])]
        return [o for o in out if o is not None] + branching_to.get(addr, [])

    waiting = {b for b in counts if is_waiting(insns[b])}
    todo = list(waiting)
    while todo:
        b = todo.pop()
        for o in neighbours(b):
            if (o not in waiting and len(insns[o]) <= SPIN_BLOCK_MAX
                    and abs(counts[o] - counts[b]) <= SPIN_COUNT_MATCH * counts[b]):
                waiting.add(o)
                todo.append(o)
    return waiting


def _chains(hot: set, blocks: dict, insns: dict) -> list:
    """Hot blocks that are one straight run of code qemu cut in pieces (a page end, a full
    buffer): each piece but the last ends without leaving the flow, exactly where the next
    one starts. Each chain starts at a piece no other piece falls into; in address order."""
    at = {blocks[b][0]: b for b in hot}
    nxt = {}
    for b in hot:
        last = insns[b][-1].split()[0] if insns[b] else "b"
        nxt[b] = None if _ENDS_FLOW.match(last) else at.get(blocks[b][0] + 4 * len(insns[b]))
    fallen_into = set(nxt.values())
    chains = []
    for head in sorted((b for b in hot if b not in fallen_into), key=lambda b: blocks[b][0]):
        chain = [head]
        while nxt[chain[-1]] is not None and nxt[chain[-1]] not in chain:
            chain.append(nxt[chain[-1]])
        if len(chain) > 1:
            chains.append(chain)
    return chains


def _region_cycles(counts: dict, hot: set, chains: list, insns: dict, price: dict) -> float:
    """Cycles of one region. The executions that run through a chain from its first piece
    to its last (as many as its least executed piece has left) are priced as the one
    sequence the chain is; every other execution of a piece, at the piece's own price.
    (``../shared/armperf`` prices chains this way; pricing each entry's rest of the chain
    whole instead would be kinder to loops whose head follows a page end, and would make
    the yardstick and this model rank such code differently.)"""
    left = {b: counts.get(b, 0) for b in hot}
    cycles = instructions = 0.0
    for chain in chains:
        whole = sum((insns[b] for b in chain), ())
        through = min(left[b] for b in chain)
        if through and price.get(whole) is not None:
            cycles += through * price[whole]
            instructions += through * len(whole)
            for b in chain:
                left[b] -= through
    for b in hot:
        if left[b] and price.get(insns[b]) is not None:
            cycles += left[b] * price[insns[b]]
            instructions += left[b] * len(insns[b])
    executed = sum(c * len(insns[b]) for b, c in counts.items())
    cpi = cycles / instructions if instructions else 0.5
    return cycles + max(executed - instructions, 0) * cpi


def profile(lib: Path, level: str, args, *, kind: str = "vm", entry: str = "main",
            runs: int = 1, layers: bool = False, threads: int = 1,
            timeout: float = 3600.0, layers_lib: Path | None = None) -> Profile:
    """Run ``lib`` (a Relax VM library, or one function of a library with ``kind="func"``)
    on ``level``'s emulated CPU under the plugin; ``args``: (shape, dtype) of each input.
    Its measured runs are region ``MEASURED``. With ``layers``, the VM calls of
    ``layers_lib`` (the same model with a bytecode ``main``: ``lib``'s compiled ``main``
    has no per-call hook) or else of ``lib`` are regions 2, 3, ..."""
    items = [(lib, entry, args)] + ([(layers_lib, entry, args)] if layers_lib else [])
    return profile_items(items, level, kind=kind, runs=runs, layers=layers,
                         threads=threads, timeout=timeout)


def profile_items(items, level: str, *, kind: str = "func", runs: int = 1,
                  layers: bool = False, threads: int = 1,
                  timeout: float = 3600.0) -> Profile:
    """One emulator run for several (library, entry function, args): item i's measured
    runs are region ``MEASURED + i`` (``kind="vm"``: the first item is measured, a second
    one gives the layers; see ``profile``). With ``threads`` > 1
    TVM's pool has that many threads (the calling thread is one of them) and every guest
    thread is counted apart (``Profile.per_thread``; thread 0 is the calling thread)."""
    device.provision()  # idempotent, quick when done; builds the plugin (blockcount.c)
    lib = items[0][0]
    with tempfile.TemporaryDirectory(prefix="tvm_armq-cycles-") as tmp:
        tmp = Path(tmp)
        spec = {"kind": kind, "runs": runs, "layers": layers,
                "items": [{"lib": str(Path(path).resolve()), "entry": entry,
                           "args": [[list(map(int, s)), str(d)] for s, d in args]}
                          for path, entry, args in items],
                "names_out": str(tmp / "names.json"), "maps_out": str(tmp / "maps.txt")}
        (tmp / "spec.json").write_text(json.dumps(spec))
        out = tmp / "counts.txt"
        plugin = f"{device.plugin_library()},out={out}" + (",threads=1" if threads > 1 else "")
        cmd = [tool("qemu-aarch64"), "-cpu", LEVELS[level].qemu_cpu,
               "-plugin", plugin, str(device.guest_python()),
               str(GUEST_SCRIPT), str(tmp / "spec.json")]
        try:
            # a fixed hash seed: the interpreter's code between the markers runs the same
            # way each time, so one candidate measured twice costs the same cycles
            env = {**device.guest_env(level), "PYTHONHASHSEED": "0",
                   "TVM_NUM_THREADS": str(threads)}
            res = subprocess.run(cmd, env=env, capture_output=True,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CycleModelError(f"the counted run of {Path(lib).name} on {level} took "
                                  f"more than {timeout:.0f} s") from None
        if res.returncode != 0:
            what = Path(lib).name + (f" and {len(items) - 1} more" if len(items) > 1 else "")
            raise CycleModelError(f"the counted run of {what} on {level} failed "
                                  f"(exit {res.returncode}):\n{res.stderr[-3000:]}")
        blocks, counts, per_thread = _read_counts(out)
        called = (json.loads((tmp / "names.json").read_text()) if layers
                  else {"names": [], "calls": []})
        return Profile(blocks, counts, _read_maps(tmp / "maps.txt"), called["names"],
                       [c // runs for c in called["calls"]], runs,
                       per_thread if threads > 1 else {})


def _read_counts(path: Path):
    """Blocks, counts per region, and counts per region and guest thread."""
    blocks, counts = {}, collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        part = line.split()
        if part[0] == "B":
            raw = bytes.fromhex(part[3])
            words = tuple(raw[i:i + 4] for i in range(0, len(raw) - len(raw) % 4, 4))
            blocks[int(part[1])] = (int(part[2], 16), words)
        elif part[0] == "C":
            counts[int(part[1]), int(part[3])][int(part[2])] += int(part[4])
    # a block translated twice (same code, same address) is one block to price
    first = {}
    merged = collections.defaultdict(collections.Counter)
    per_thread = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for (region, thread), per in counts.items():
        for b, c in per.items():
            one = first.setdefault(blocks[b], b)
            merged[region][one] += c
            per_thread[region][thread][one] += c
    return ({b: blocks[b] for b in set(first.values())}, dict(merged),
            {r: dict(t) for r, t in per_thread.items()})


def _read_maps(path: Path) -> list:
    spans = []
    for line in path.read_text().splitlines():
        part = line.split()
        if len(part) >= 6 and "x" in part[1]:
            lo, hi = (int(x, 16) for x in part[0].split("-"))
            spans.append((lo, hi, part[5]))
    return spans


# ------------------------------------------------------------------------------ pricing
class Pricer:
    """Decodes instruction words with llvm-mc and prices instruction sequences with
    llvm-mca on one core's model; both answers are cached on disk per core and per build
    of the tool that gave them (another llvm-mca prices differently, another llvm-mc may
    print an instruction differently: an old build's answers are never reused)."""

    BATCH = 64  # sequences per llvm-mca process (each its own code region)

    def __init__(self, core: str):
        import threading

        self.lock = threading.Lock()  # one Pricer serves a tuning round's threads
        self.core = core
        self.dir = device.home() / "mca"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"{core}-{self.build('llvm-mca')}.json"
        self.cache = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.words_path = self.dir / f"decoded-{self.build('llvm-mc')}.json"
        self.words = json.loads(self.words_path.read_text()) if self.words_path.exists() else {}

    @staticmethod
    def build(name: str) -> str:
        """Which build of an LLVM tool answers: "llvm-mca-22.1.0"."""
        return f"{name}-{llvm_version(tool(name))}"

    def decode(self, words: set) -> dict:
        """word (4 bytes) -> instruction text ("sdot v0.4s, v1.16b, v2.16b")."""
        with self.lock:
            return self._decode(words)

    def _decode(self, words: set) -> dict:
        todo = sorted(w.hex() for w in words if w.hex() not in self.words)
        if todo:
            src = "".join(" ".join(f"0x{w[i:i + 2]}" for i in range(0, 8, 2)) + "\n"
                          for w in todo)
            res = subprocess.run([tool("llvm-mc"), "--disassemble", "-triple=aarch64",
                                  f"-mattr={MC_ATTR}"], input=src, capture_output=True,
                                 text=True)
            bad = {int(m.group(1)) - 1
                   for m in re.finditer(r"<stdin>:(\d+):\d+: warning: invalid", res.stderr)}
            lines = [ln.strip() for ln in res.stdout.splitlines()
                     if ln.strip() and not ln.strip().startswith(".")]
            good = [w for i, w in enumerate(todo) if i not in bad]
            if len(lines) != len(good):
                raise CycleModelError(f"llvm-mc decoded {len(lines)} of {len(good)} "
                                      f"instruction words:\n{res.stderr[-1000:]}")
            for w, text in zip(good, lines):
                self.words[w] = re.sub(r"\s*//.*$", "", text).replace("\t", " ")
            for i in bad:  # not an instruction (data in code): priced as a nop
                self.words[todo[i]] = "nop"
            _write_json(self.words_path, self.words)
        return {w: self.words[w.hex()] for w in words}

    def _key(self, seq: tuple) -> str:
        return hashlib.sha1("\n".join(seq).encode()).hexdigest()

    def cycles(self, sequences) -> dict:
        """sequence (tuple of instruction texts) -> cycles per execution, or None where
        llvm-mca cannot read it."""
        with self.lock:
            return self._cycles(sequences)

    def _cycles(self, sequences) -> dict:
        todo = [s for s in set(sequences) if self._key(s) not in self.cache]
        batches = [todo[i:i + self.BATCH] for i in range(0, len(todo), self.BATCH)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for batch, got in zip(batches, pool.map(self._mca, batches)):
                for s, c in zip(batch, got):
                    self.cache[self._key(s)] = c
        if todo:
            _write_json(self.path, self.cache)
        return {s: self.cache[self._key(s)] for s in sequences}

    def _mca(self, batch: list) -> list:
        src = []
        for i, seq in enumerate(batch):
            src += [f"# LLVM-MCA-BEGIN s{i}", *seq, f"# LLVM-MCA-END s{i}"]
        res = subprocess.run([tool("llvm-mca"), "-mtriple=aarch64", f"-mcpu={self.core}",
                              f"-mattr={MC_ATTR}", f"-iterations={MCA_ITERATIONS}",
                              "-all-views=false", "-summary-view"],
                             input="\n".join(src) + "\n", capture_output=True, text=True)
        if res.returncode != 0:
            if len(batch) == 1:
                return [None]
            return [c for s in batch for c in self._mca([s])]  # find the unreadable one
        found = [int(m.group(1)) / MCA_ITERATIONS
                 for m in re.finditer(r"Total Cycles:\s+(\d+)", res.stdout)]
        if len(found) != len(batch):
            raise CycleModelError(f"llvm-mca priced {len(found)} of {len(batch)} blocks")
        return found


def _write_json(path: Path, data) -> None:
    """Written whole under a name of its own, then renamed (``zoo.atomic_write``): readers
    never see half a file, and writers (processes, threads) never share a temporary."""
    zoo.atomic_write(path, json.dumps(data).encode())


# ------------------------------------------------------------------------------ estimate
def is_layer_code(path: str) -> bool:
    """Code a layer's own work runs in: the model's library and the C library (memcpy,
    memset). In a layer's region the rest (the interpreter, TVM's FFI and runtime) is the
    per-call instrumentation and the VM's call (the dynamic loader's TLS look-ups, ctypes'
    libffi among them): counted in the total, not in the layer."""
    name = Path(path).name
    return not (name.startswith(("python3", "libtvm", "libstdc++", "ld-linux", "libffi"))
                or ".cpython-" in name or "/lib-dynload/" in path)


def _is_libc(path: str) -> bool:
    return Path(path).name.startswith("libc.")


def _own_code(path: str) -> bool:
    """Layer code outside the C library: the model's library (and libm, ...)."""
    return is_layer_code(path) and not _is_libc(path)


def _less_hook(libc: dict, calls: list) -> dict:
    """Each layer region's C-library cycles (region -> cycles per run) less the per-call
    hook's. The hook (the interpreter's lock taken and given back around the Python call
    that marks the region: pthread mutexes, condition variables, thread-specific data) runs
    in the C library between a layer's two marks, the same code at every call, and no
    marker can leave it out; a layer's own C-library work (memcpy, memset) is what it has
    beyond that. The hook's cost is the least C-library work per call of any function the
    VM called (a builtin such as ``vm.builtin.null_value`` has none of its own). Without
    this the rows of MobileNetV1 0.25 at neon summed to more than the run (the VM's row
    -6.4e3 cycles)."""
    per_call = [libc.get(2 + i, 0.0) / c for i, c in enumerate(calls) if c]
    hook = min(per_call, default=0.0)
    return {r: (max(v - hook * calls[r - 2], 0.0) if 2 <= r < 2 + len(calls) else v)
            for r, v in libc.items()}


@dataclasses.dataclass
class LayerCycles:
    function: str    # the VM function called (a PrimFunc's name, or a VM builtin)
    calls: int       # calls per run
    cycles: float    # estimated cycles per run, all its calls (threaded: its busiest thread's)
    balance: float = 1.0  # threaded: busiest thread's work / the mean over the threads


@dataclasses.dataclass
class Estimate:
    level: str
    core: str
    total: float     # estimated cycles of one run (threaded: the busiest thread's work)
    layers: list     # LayerCycles, in the order of their first call
    threads: int = 1
    work: list = dataclasses.field(default_factory=list)  # threaded: each thread's work

    @property
    def balanced(self) -> float:
        """The run's cycles were its work split evenly over the threads."""
        return sum(self.work) / self.threads if self.work else self.total


def estimate(lib: Path, level: str, args, core: str | None = None, runs: int = 1,
             layers: bool = True, threads: int = 1,
             layers_lib: Path | None = None) -> Estimate:
    """Estimated cycles of one run of a Relax VM library on ``core``'s model (default: the
    level's core), and with ``layers`` of each VM function it calls.

    The total is ``lib``'s: give the library ``compile`` writes (``main`` compiled), the
    one armperf measures. Per-layer rows need the bytecode interpreter's per-call hook:
    ``layers_lib`` is the same model built with ``exec_mode="bytecode"`` (``lib`` itself if
    None, when it is such a build). The interpreter's own work is no layer's, so the rows
    are the same for either ``main``; the total is not (MobileNetV2 0.35, 96 px, at
    dotprod: bytecode 1.245e6, compiled 1.155e6, armperf 4 on the compiled 1.152e6).

    With ``threads`` > 1 TVM's pool runs that many threads on as many cores of that model
    and each thread's work (waiting left out) is counted apart: the run's figure is the
    critical path, the busiest thread's work, and a layer's its busiest thread's work in
    that layer. (A static split, as TVM's parallel loops make, is the same on the core as
    here; only its waiting depends on the host, and it is left out.)"""
    core = core_for(level, core)
    prof = profile(lib, level, args, runs=runs, layers=layers, threads=threads,
                   layers_lib=layers_lib if layers else None)
    pricer = Pricer(core)
    if threads == 1:
        total = prof.cycles(pricer)[MEASURED] if MEASURED in prof.counts else 0.0
        rows = []
        if layers:
            own = prof.cycles(pricer, keep=_own_code)
            libc = _less_hook(prof.cycles(pricer, keep=_is_libc), prof.calls)
            rows = [LayerCycles(name, calls, own.get(2 + i, 0.0) + libc.get(2 + i, 0.0))
                    for i, (name, calls) in enumerate(zip(prof.names, prof.calls))]
        return Estimate(level, core, total, rows)
    work = _thread_work(prof.thread_cycles(pricer).get(MEASURED, {}), threads)
    rows = []
    if layers:
        own = prof.thread_cycles(pricer, keep=_own_code)
        libc = prof.thread_cycles(pricer, keep=_is_libc)
        # the hook runs on the calling thread (0)
        calling = _less_hook({r: t.get(0, 0.0) for r, t in libc.items()}, prof.calls)
        for r, t in libc.items():
            if 0 in t:
                t[0] = calling[r]
        for i, (name, calls) in enumerate(zip(prof.names, prof.calls)):
            split = [a + b for a, b in zip(_thread_work(own.get(2 + i, {}), threads),
                                           _thread_work(libc.get(2 + i, {}), threads))]
            mean = sum(split) / threads
            rows.append(LayerCycles(name, calls, max(split), max(split) / mean if mean else 1.0))
    return Estimate(level, core, max(work), rows, threads, work)


def _thread_work(by_thread: dict, threads: int) -> list:
    """Each thread's work, the calling thread first; threads that did nothing count as
    zero (the guest's thread ids are qemu's vCPU numbers, not 0..N-1)."""
    work = [by_thread.get(0, 0.0)] + sorted((c for t, c in by_thread.items() if t != 0),
                                            reverse=True)
    return (work + [0.0] * threads)[:max(threads, len(work))]
