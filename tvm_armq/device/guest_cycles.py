"""Runs on the emulated device, under the blockcount plugin (tvm_armq/device/cycles.py).

Only the standard library, numpy and the TVM runtime are importable here. It loads a
library, gives it seeded random inputs, runs it once to warm up (code translated, memory
touched), then tells the plugin which region each later part of the run belongs to. A
Relax VM library (``kind="vm"``):

    region 1      the measured runs, ``runs`` times the entry function
    region 2 + i  with ``layers``: one more set of runs, each VM call of function i in
                  its own region (names and call counts go to ``names_out``)

A second item, if there is one, is the same model built with a bytecode ``main`` whose
interpreter has the per-call hook the layers need: the first (``main`` compiled, what
``compile`` writes) is measured, the second gives the layers.

Functions (``kind="func"``, a round of tuning candidates: one emulator start for all):
item i's ``runs`` calls are region 1 + i.

and writes the guest's memory map to ``maps_out`` (qemu shows the guest's own there), so
that the host can tell code of the library and runtime from the Python interpreter's.

    python guest_cycles.py SPEC.json
"""

import json
import os
import sys

REGION_TAG = 0x41524D51 << 32  # blockcount.c: lseek(fd, REGION_TAG | region, SEEK_SET)


def mark(region: int, fd: int = -1) -> None:
    """Tell the plugin the run is in ``region`` from here on. On fd -1 the call fails
    (EBADF) and Python raises and catches an OSError after it, as ../shared/armperf's
    markers do: the measured region's ends cost what armperf's do. Around each layer, on
    an fd of /dev/null, where any seek succeeds: no exception (its errno message and
    object, thousands of instructions in the C library and the interpreter) is counted
    in the layer."""
    try:
        os.lseek(fd, REGION_TAG | region, os.SEEK_SET)
    except OSError:  # EBADF on fd -1, always: the call exists to be seen by the plugin
        pass


def random_array(rng, shape, dtype):
    import numpy as np

    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    import numpy as np
    import tvm

    dev = tvm.cpu()
    rng = np.random.default_rng(spec.get("seed", 0))
    runs = spec["runs"]

    def arguments(item):
        return [tvm.runtime.tensor(random_array(rng, shape, dtype), dev)
                for shape, dtype in item["args"]]

    if spec["kind"] == "vm":
        from tvm.runtime.vm import VirtualMachine

        def machine(item):
            lib, entry = tvm.runtime.load_module(item["lib"]), item["entry"]
            vm = VirtualMachine(lib, dev)
            vm.set_input(entry, *arguments(item))
            vm.invoke_stateful(entry)
            return vm, entry

        # the measured runs call main as ../shared/armperf's guest does (its outputs
        # returned to Python, each of them): the same interpreter and runtime work between
        # the marks (invoke_stateful ran 2.7e3 more instructions a run: 2% of a small net)
        item = spec["items"][0]
        main_fn = VirtualMachine(tvm.runtime.load_module(item["lib"]), dev)[item["entry"]]
        args = arguments(item)

        def work():
            return main_fn(*args)

        work()
        mark(1)
        for _ in range(runs):
            work()
        mark(0)
        if spec.get("layers"):
            # the bytecode build if there is one: its interpreter has the per-call hook
            vm, entry = machine(spec["items"][-1])
            quiet = os.open("/dev/null", os.O_RDONLY)
            names, calls, index = [], [], {}

            def instrument(func, symbol, before_run, ret_value, *call_args):
                if before_run:
                    if symbol not in index:
                        index[symbol] = len(names)
                        names.append(symbol)
                        calls.append(0)
                    calls[index[symbol]] += 1
                    mark(2 + index[symbol], quiet)
                else:
                    mark(0, quiet)
                return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

            vm.set_instrument(instrument)
            for _ in range(runs):
                vm.invoke_stateful(entry)
            json.dump({"names": names, "calls": calls}, open(spec["names_out"], "w"))
    else:  # functions of libraries, item i in region 1 + i: a round of tuning candidates
        for i, item in enumerate(spec["items"]):
            func, args = tvm.runtime.load_module(item["lib"])[item["entry"]], arguments(item)
            func(*args)
            mark(1 + i)
            for _ in range(runs):
                func(*args)
            mark(0)
    with open("/proc/self/maps") as src, open(spec["maps_out"], "w") as dst:
        dst.write(src.read())


if __name__ == "__main__":
    main()
