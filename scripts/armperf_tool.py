"""What the benchmark scripts share about ``../shared/armperf``, the project's yardstick:
where it is, the ``--armperf`` option that moves it, and its estimated cycles of one TVM
library. (The scripts run as ``python scripts/NAME.py``, so this module is importable.)"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "armperf" / "armperf.py"


def add_option(ap: argparse.ArgumentParser) -> None:
    """``--armperf PATH``, by default the checkout beside the repository."""
    ap.add_argument("--armperf", type=Path, default=DEFAULT,
                    help=f"armperf.py to measure with (default {DEFAULT})")


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``ap``'s arguments with ``--armperf`` added, ending with a usage error if armperf is
    not where it says."""
    add_option(ap)
    a = ap.parse_args(argv)
    require(ap, a.armperf)
    return a


def require(ap: argparse.ArgumentParser, path: Path) -> None:
    """End the script with a usage error if armperf is not at ``path``."""
    if not path.exists():
        ap.error(f"{path} not found: pass --armperf")


def tvm_cycles(armperf: Path, lib: Path, model, level: str,
               runs: int | None = None) -> tuple[float, int]:
    """armperf's estimated cycles per run of a TVM library on ``level`` (the inputs are
    ``model``'s, a ``TFLiteModel``; every output the module returns, however many), and
    armperf's version. ``runs``: armperf's ``--runs`` (None: its default)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(armperf), "tvm", str(lib), "--isa", level, "--json", out.name]
        if runs is not None:
            cmd += ["--runs", str(runs)]
        for t in model.signature()[0]:
            cmd += ["--input", ",".join(map(str, t.shape)) + ":" + t.dtype]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"armperf failed on {lib} at {level}:\n{res.stderr[-2000:]}")
        r = json.load(open(out.name))["tvm"]
        return r["cycles_per_run"], r.get("armperf", 1)


@contextlib.contextmanager
def guest_script(prefix: str, source: str):
    """Within: (a temporary folder, ``source`` written in it as the guest script armperf's
    ``script`` mode runs)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        guest = work / "guest.py"
        guest.write_text(source)
        yield work, guest
