"""The emulated aarch64 device: a TVM RPC server running under qemu-user.

There is no Arm board here, so tvm_armq makes one. ``start("i8mm")`` runs an
aarch64 Python 3.11 under ``qemu-aarch64 -cpu <the level's CPU>`` with the
aarch64 TVM runtime on its path, serving TVM RPC on loopback. To a client it is
an RPC endpoint (host, port, optional tracker key) like any real board, so the
same client code runs against a phone or a server unchanged.

What the device needs is provisioned once per machine, idempotently, into a
cache outside the repo (``$TVM_ARMQ_HOME``, default ``~/.cache/tvm_armq``):

1. Debian packages: qemu-user, qemu-user-static, binfmt-support, the aarch64
   cross g++ and llvm-22 (llvm-mc, llvm-mca: the cycle model, the same build as
   ``../shared/armperf`` version 4) (needs root;
   nothing is installed if all are present).
2. An aarch64 sysroot: Python 3.11 and the libraries it loads, from Debian's
   arm64 packages (``apt-get download`` + ``dpkg -x``, no arm64 install).
3. aarch64 wheels (numpy, apache-tvm, apache-tvm-ffi, ...) from pip with
   ``--platform manylinux_2_28_aarch64``, unpacked into a site directory.
4. binfmt registration of aarch64 ELF files: the RPC server re-executes its
   own Python for the worker process, and that execve of an aarch64 binary only
   works when the kernel knows to hand it to qemu. ``QEMU_LD_PREFIX`` (the
   sysroot) and ``QEMU_CPU`` (the level) travel in the environment, so the
   re-executed worker runs on the same emulated CPU as its parent.
5. The cycle model's qemu plugin, built with gcc from ``blockcount.c``.

The server loads only the TVM runtime (``TVM_USE_RUNTIME_LIB=1``): a board
does not compile, it loads cross-linked modules and runs them.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

from ..targets import LEVELS, level as _level

TVM_VERSION = "0.27.0.post1"
DEBIAN_PACKAGES = {  # command that must exist -> Debian package that provides it
    "qemu-aarch64": "qemu-user",
    "qemu-aarch64-static": "qemu-user-static",
    "update-binfmts": "binfmt-support",
    "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
    # the cycle model (cycles.py): decoding and pricing the blocks qemu counted
    "llvm-mc-22": "llvm-22",
    "llvm-mca-22": "llvm-22",
}
# What the aarch64 Python 3.11 and the TVM runtime load, as Debian arm64 packages.
SYSROOT_PACKAGES = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6",
    "libexpat1", "zlib1g", "libssl3", "libffi8", "libstdc++6", "libgcc-s1", "libbz2-1.0",
    "liblzma5", "libsqlite3-0", "libuuid1", "libncursesw6", "libtinfo6", "libreadline8",
    "libcrypt1", "libgomp1",
)
AARCH64_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_27_aarch64",
                     "manylinux_2_24_aarch64", "manylinux_2_17_aarch64",
                     "manylinux2014_aarch64", "any")
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# ELF magic and mask of an aarch64 executable (e_machine = 0xb7), as the kernel's
# binfmt_misc matches it; the same values Debian's qemu-user-static ships.
_BINFMT_AARCH64 = (
    r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
)
DEFAULT_PORTS = {"neon": 9190, "dotprod": 9290, "i8mm": 9390}
START_TIMEOUT = 300.0  # seconds; importing the runtime under emulation takes a while
# A device or tracker that has not answered a TCP connect and the RPC handshake by then
# is taken for dead or hung (the CLI's --timeout). A session under qemu forks a worker that
# imports the TVM runtime first, which takes a few seconds; a real board answers at once.
CONNECT_TIMEOUT = 60.0
# How long one session (upload, load, run, fetch the outputs) may last before the device
# ends it and the client gives up (the CLI's --session-timeout).
SESSION_TIMEOUT = 900.0
# Past a session's own limit, how long the client waits for the device to report that it
# ended the session, before giving up on the device itself.
SESSION_GRACE = 30.0


class DeviceError(RuntimeError):
    """The emulated device cannot be provisioned or started, or a device cannot be reached
    or used; the message says why."""


class DeviceUnreachable(DeviceError):
    """Nothing answers at a device's or tracker's address, or it did not answer in time."""


class DeviceLacksFeature(DeviceError):
    """The device was reached but cannot run the code: its CPU lacks an ISA extension."""


def home() -> Path:
    """The cache directory for the sysroot, wheels, run state and logs."""
    return Path(os.environ.get("TVM_ARMQ_HOME", Path.home() / ".cache" / "tvm_armq"))


def sysroot() -> Path:
    return home() / "sysroot"


def site_dir() -> Path:
    return home() / "site"


def guest_python() -> Path:
    return sysroot() / "usr" / "bin" / "python3.11"


def _log(msg: str) -> None:
    print(f"[tvm_armq.device] {msg}", file=sys.stderr, flush=True)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise DeviceError(f"`{' '.join(map(str, cmd))}` failed (exit {res.returncode}):\n"
                          f"{(res.stderr or res.stdout)[-2000:]}")
    return res


def _run_shown(cmd, what: str, **kw) -> None:
    """Run a long download with its own progress on the user's terminal (stderr), since
    provisioning fetches a few hundred MB; a failure is a ``DeviceError`` naming ``what``."""
    stderr_fd = 2  # the process's own stderr, whatever Python's sys.stderr was replaced by
    res = subprocess.run(cmd, stdout=stderr_fd, stderr=stderr_fd, stdin=subprocess.DEVNULL,
                         **kw)
    if res.returncode != 0:
        raise DeviceError(f"{what} failed: `{' '.join(map(str, cmd))}` exited with "
                          f"{res.returncode} (its messages are above)")


def _unpack_progress(i: int, n: int, path: Path) -> None:
    _log(f"unpacking {i}/{n}: {path.name} ({path.stat().st_size / 2**20:.1f} MB)")


def _size_mb(paths) -> float:
    return sum(p.stat().st_size for p in paths) / 2**20


# ---------------------------------------------------------------- provisioning
def _ensure_debian_packages() -> None:
    missing = sorted({pkg for cmd, pkg in DEBIAN_PACKAGES.items() if not shutil.which(cmd)})
    if not missing:
        return
    if not _is_root() or not shutil.which("apt-get"):
        raise DeviceError(
            f"missing Debian packages {', '.join(missing)}: install them as root "
            f"(apt-get install {' '.join(missing)}) or run provisioning as root")
    _log(f"installing {' '.join(missing)}")
    _run(["apt-get", "update", "-qq"])
    _run_shown(["apt-get", "install", "-y", "-q", *missing], "installing Debian packages",
               env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def _ensure_sysroot() -> None:
    if guest_python().exists():
        return
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise DeviceError("building the aarch64 sysroot needs apt-get and dpkg (Debian)")
    foreign = _run(["dpkg", "--print-foreign-architectures"]).stdout.split()
    if "arm64" not in foreign:
        if not _is_root():
            raise DeviceError("dpkg does not know arm64: run `dpkg --add-architecture arm64 "
                              "&& apt-get update` as root, or provision as root")
        _run(["dpkg", "--add-architecture", "arm64"])
    if _is_root():  # the arm64 package lists must be present for `apt-get download`
        _run(["apt-get", "update", "-qq"])
    _log("building the aarch64 Python 3.11 sysroot from Debian arm64 packages")
    debs = home() / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    _log(f"downloading {len(SYSROOT_PACKAGES)} Debian arm64 packages")
    _run_shown(["apt-get", "download", *[f"{p}:arm64" for p in SYSROOT_PACKAGES]],
               "downloading the arm64 packages", cwd=debs)
    tmp = home() / "sysroot.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    packages = sorted(debs.glob("*.deb"))
    _log(f"downloaded {len(packages)} packages, {_size_mb(packages):.0f} MB")
    for i, deb in enumerate(packages, 1):
        _unpack_progress(i, len(packages), deb)
        _run(["dpkg", "-x", str(deb), str(tmp)])
    shutil.rmtree(sysroot(), ignore_errors=True)
    tmp.rename(sysroot())
    shutil.rmtree(debs, ignore_errors=True)


def _guest_requirements() -> list[str]:
    """aarch64 wheels for the device, tvm-ffi pinned to the host's so both speak one protocol."""
    try:
        ffi = f"apache-tvm-ffi=={metadata.version('apache-tvm-ffi')}"
    except metadata.PackageNotFoundError:
        ffi = "apache-tvm-ffi"
    return [f"apache-tvm=={TVM_VERSION}", ffi, "numpy", "ml-dtypes", "typing_extensions",
            "cloudpickle", "psutil"]


def _ensure_site() -> None:
    reqs = _guest_requirements()
    stamp = site_dir() / ".tvm_armq-wheels.json"
    if stamp.exists() and json.loads(stamp.read_text()) == reqs:
        return
    _log("downloading aarch64 wheels: " + " ".join(reqs))
    wheels = home() / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    plat = [a for p in AARCH64_PLATFORMS for a in ("--platform", p)]
    _run_shown([sys.executable, "-m", "pip", "download", "--progress-bar", "on", "--no-deps",
                "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                *plat, "-d", str(wheels), *reqs], "downloading the aarch64 wheels")
    tmp = home() / "site.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    found = sorted(wheels.glob("*.whl"))
    _log(f"downloaded {len(found)} wheels, {_size_mb(found):.0f} MB")
    for i, whl in enumerate(found, 1):
        _unpack_progress(i, len(found), whl)
        with zipfile.ZipFile(whl) as z:
            z.extractall(tmp)
    # zipfile drops the executable bits; the runtime only dlopen()s, which needs none.
    (tmp / stamp.name).write_text(json.dumps(reqs))
    shutil.rmtree(site_dir(), ignore_errors=True)
    tmp.rename(site_dir())
    shutil.rmtree(wheels, ignore_errors=True)


def _qemu_static() -> str:
    path = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not path:
        raise DeviceError("qemu-aarch64 not found: install Debian's qemu-user-static")
    return path


def binfmt_registered() -> bool:
    entry = BINFMT_DIR / "qemu-aarch64"
    return entry.exists() and entry.read_text().startswith("enabled")


def _ensure_binfmt() -> None:
    if binfmt_registered():
        return
    if not _is_root():
        raise DeviceError(
            "aarch64 binfmt is not registered, and registering it needs root: run "
            "`mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; "
            "update-binfmts --enable qemu-aarch64` as root")
    if not (BINFMT_DIR / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)])
    if shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True)
    if not binfmt_registered():  # no binfmt-support entry: register by hand
        magic, mask = _BINFMT_AARCH64
        rule = f":qemu-aarch64:M::{magic}:{mask}:{_qemu_static()}:F"
        try:
            (BINFMT_DIR / "register").write_text(rule)
        except OSError as e:
            raise DeviceError(f"could not register aarch64 binfmt: {e}") from None
    if not binfmt_registered():
        raise DeviceError("aarch64 binfmt registration did not take effect")


def provision() -> None:
    """Make this machine able to run the emulated device. Idempotent; quick when done.
    One process at a time: another that provisions meanwhile (a second test worker, a
    second command) waits for it, then finds everything in place, instead of racing it
    for apt's lock and the sysroot's files."""
    home().mkdir(parents=True, exist_ok=True)
    with open(home() / "provision.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _ensure_debian_packages()
        _ensure_sysroot()
        _ensure_site()
        _ensure_binfmt()
        plugin_library()


PLUGIN_SOURCE = Path(__file__).with_name("blockcount.c")  # the cycle model's qemu plugin


def plugin_library() -> Path:
    """The cycle model's qemu plugin (``blockcount.c``, see ``cycles.py``), built with gcc
    into the cache and rebuilt when its source changes."""
    import hashlib
    import tempfile

    digest = hashlib.sha1(PLUGIN_SOURCE.read_bytes()).hexdigest()[:12]
    lib = home() / f"blockcount-{digest}.so"
    if not lib.exists():
        gcc = shutil.which("gcc")
        if gcc is None:
            raise DeviceError("gcc not found: the cycle model's qemu plugin is built from C "
                              "source (install Debian's gcc)")
        lib.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=lib.parent, prefix=lib.name, suffix=".tmp")
        os.close(fd)  # a name of its own: two threads may build it at once
        res = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", name, str(PLUGIN_SOURCE),
                              "-lpthread"], capture_output=True, text=True)
        if res.returncode != 0:
            Path(name).unlink(missing_ok=True)
            raise DeviceError(f"building the blockcount plugin failed:\n{res.stderr}")
        Path(name).replace(lib)  # atomic: a qemu already running keeps the file it mapped
    return lib


def provisioned() -> bool:
    """True when everything ``provision`` sets up is in place (checks nothing remotely)."""
    return (guest_python().exists() and (site_dir() / "tvm").is_dir() and binfmt_registered()
            and all(shutil.which(c) for c in DEBIAN_PACKAGES))


# ----------------------------------------------------------------- endpoints
@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where an aarch64 device answers TVM RPC: directly at host:port, or through a
    tracker at host:port that hands out a device registered under ``key``."""

    host: str
    port: int
    key: str | None = None  # set: (host, port) is a tracker, ask it for this key

    @classmethod
    def parse(cls, text: str) -> "Endpoint":
        """``HOST:PORT`` (a direct RPC server) or ``HOST:PORT:KEY`` (a tracker and key)."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise ValueError(f"device endpoint {text!r}: expected HOST:PORT or HOST:PORT:KEY")
        return cls(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else None)

    def connect(self, session_timeout: float = 0, timeout: float | None = None):
        """An RPC session on the device (``tvm.rpc.RPCSession``).

        ``session_timeout`` (s, 0: none): the device ends the session after that long.
        ``timeout`` (s): the device (or tracker) must accept the connection and complete
        the handshake within it, else ``DeviceUnreachable`` naming the endpoint; without
        one, TVM waits as long as it takes (a busy device serves one session at a time).
        """
        from tvm import rpc

        if timeout is None:
            if self.key:
                return rpc.connect_tracker(self.host, self.port).request(
                    self.key, session_timeout=session_timeout)
            return rpc.connect(self.host, self.port, session_timeout=session_timeout)
        if self.key:
            tracker = connect_tracker(self.host, self.port, timeout)
            check_key(tracker, self, timeout)
            return call_with_timeout(
                lambda: tracker.request(self.key, session_timeout=session_timeout,
                                        max_retry=1),
                timeout, f"the RPC tracker {self.host}:{self.port} did not hand out a "
                         f"device under key {self.key!r}")
        reach(self.host, self.port, timeout, "device")
        try:
            return call_with_timeout(
                lambda: rpc.connect(self.host, self.port, session_timeout=session_timeout),
                timeout, f"the device at {self} accepted the connection but did not "
                         "complete the TVM RPC handshake")
        except DeviceError:
            raise
        except Exception as e:  # noqa: BLE001 - TVM says what in its last line
            raise DeviceUnreachable(f"the device at {self}: TVM RPC handshake failed "
                                    f"({last_line(e)}): is it a tvm.exec.rpc_server?") from None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}" + (f":{self.key}" if self.key else "")


def last_line(error) -> str:
    """The line of a (TVM) error message that says what happened, without the C++ stack."""
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(error).__name__


def reach(host: str, port: int, timeout: float, what: str) -> None:
    """A TCP connect to ``host:port`` within ``timeout`` s, or ``DeviceUnreachable`` saying
    which ``what`` (device, RPC tracker) at which address, and why (unknown host, nothing
    listening, no answer). TVM's own connect retries a refused port for 60 s and reports
    an unknown host as a C++ stack."""
    where = f"{what} {host}:{port}"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except socket.gaierror as e:
        raise DeviceUnreachable(f"{where}: unknown host {host!r} ({e.strerror}): check the "
                                "address") from None
    except ConnectionRefusedError:
        raise DeviceUnreachable(f"{where}: connection refused, nothing listens on port "
                                f"{port}: is the {what} running, and is the port right?") from None
    except (socket.timeout, TimeoutError):
        raise DeviceUnreachable(f"{where}: no answer to a TCP connect within {timeout:g} s "
                                "(--timeout): is the host up and the port open?") from None
    except OSError as e:
        raise DeviceUnreachable(f"{where}: {e.strerror or e}") from None


SIGNAL_POLL = 0.1  # s: how often call_with_timeout's caller wakes up to take a Ctrl-C


RPC_CALL_THREAD = "tvm_armq-rpc-call"  # cli ends the process at once while one is stuck


def call_with_timeout(fn, timeout: float, what: str, option: str = "--timeout"):
    """``fn()``, or ``DeviceUnreachable`` if it has not returned within ``timeout`` s (the
    message names ``option``, the CLI option that sets the limit).

    TVM's RPC client blocks in C++ socket calls that no Python timeout reaches: ``fn`` runs
    in a daemon thread, which is abandoned (it ends with the process) when it overruns."""
    import threading

    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = e

    thread = threading.Thread(target=run, name=RPC_CALL_THREAD, daemon=True)
    thread.start()
    # Wait in short slices: a signal (Ctrl-C) that the kernel hands to the blocked thread
    # instead of this one is only acted on when this thread wakes up.
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(min(SIGNAL_POLL, max(0.0, deadline - time.monotonic())))
    if thread.is_alive():
        raise DeviceUnreachable(f"{what} within {timeout:g} s ({option}): the endpoint is "
                                "hung or overloaded")
    if "error" in result:
        raise result["error"]
    return result["value"]


def connect_tracker(host: str, port: int, timeout: float):
    """A ``TrackerSession`` with ``host:port``, or ``DeviceUnreachable`` within ``timeout``."""
    from tvm import rpc

    reach(host, port, timeout, "RPC tracker")
    try:
        return call_with_timeout(lambda: rpc.connect_tracker(host, port), timeout,
                                 f"the RPC tracker {host}:{port} accepted the connection but "
                                 "did not answer the tracker handshake")
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001 - "is not RPC Tracker" and the like
        raise DeviceUnreachable(f"RPC tracker {host}:{port}: {last_line(e)}") from None


def check_key(tracker, endpoint: "Endpoint", timeout: float) -> None:
    """``DeviceUnreachable`` unless some device is registered under ``endpoint.key`` at the
    tracker: a request for a key nobody serves would queue forever."""
    summary = call_with_timeout(tracker.summary, timeout,
                                f"the RPC tracker {endpoint.host}:{endpoint.port} did not "
                                "answer a summary request")
    keys = sorted({str(s.get("key", "")).split(":", 1)[-1]
                   for s in summary.get("server_info", [])})
    if endpoint.key not in keys:
        raise DeviceUnreachable(
            f"no device is registered under key {endpoint.key!r} at the RPC tracker "
            f"{endpoint.host}:{endpoint.port} (registered: {', '.join(keys) or 'none'}): "
            "start the board's rpc_server with --tracker and this --key")


# ------------------------------------------------------------ ISA probe
# Per level above neon, one instruction that only that level adds, as the LLVM intrinsic
# that emits it, with its operand types: a probe module calls each in turn on the device.
PROBES = (
    ("dotprod", "sdot (Armv8.2 +dotprod)", "llvm.aarch64.neon.sdot.v4i32.v16i8"),
    ("i8mm", "smmla (Armv8.6 +i8mm)", "llvm.aarch64.neon.smmla.v4i32.v16i8"),
)


def _probe_library(folder: Path) -> Path:
    """An aarch64 library with one function per ``PROBES`` entry, each executing just that
    instruction on 16 int8 pairs, compiled for the richest level."""
    import tvm
    from tvm.script import tirx as T

    from .. import export

    funcs = {}
    for lvl, _, intrin in PROBES:
        @T.prim_func
        def probe(A: T.Buffer((16,), "int8"), C: T.Buffer((4,), "int32")):
            C[T.ramp(0, 1, 4)] = T.call_llvm_pure_intrin(
                "int32x4", intrin, T.Broadcast(T.int32(0), 4), A[T.ramp(0, 1, 16)],
                A[T.ramp(0, 1, 16)])

        funcs[f"probe_{lvl}"] = probe.with_attr("global_symbol", f"probe_{lvl}")
    lib = tvm.compile(tvm.IRModule(funcs), target=LEVELS["i8mm"].target())
    return export.export_aarch64(lib, folder / "tvm_armq_isa_probe.so")


def probe_level(endpoint: "Endpoint", timeout: float = CONNECT_TIMEOUT) -> str:
    """The richest ISA level whose instructions the device at ``endpoint`` executes.

    Each probe runs in a session of its own: an instruction the CPU lacks kills the
    session's worker (SIGILL), and the device serves the next session."""
    import tempfile

    import numpy as np
    import tvm

    with tempfile.TemporaryDirectory(prefix="tvm_armq_probe_") as tmp:
        lib = _probe_library(Path(tmp))
        found = "neon"
        for lvl, _, _ in PROBES:
            sess = endpoint.connect(session_timeout=timeout, timeout=timeout)
            try:
                def run():
                    sess.upload(str(lib))
                    dev = sess.cpu(0)
                    f = sess.load_module(lib.name)[f"probe_{lvl}"]
                    f(tvm.runtime.tensor(np.ones(16, np.int8), dev),
                      tvm.runtime.tensor(np.zeros(4, np.int32), dev))

                call_with_timeout(run, timeout + SESSION_GRACE,
                                  f"the device at {endpoint} did not finish an ISA probe")
            except DeviceUnreachable:
                raise
            except Exception:  # noqa: BLE001 - the worker died: the level is missing
                return found
            finally:
                del sess
            found = lvl
        return found


def lacks_message(endpoint: "Endpoint", wanted: str, has: str) -> str:
    """"this device lacks <feature>: compile with --isa <level>", for code of level
    ``wanted`` sent to a device whose CPU stops at level ``has``."""
    names = list(LEVELS)
    missing = [desc for lvl, desc, _ in PROBES
               if names.index(has) < names.index(lvl) <= names.index(wanted)]
    return (f"the device at {endpoint} lacks {' and '.join(missing)}, which --isa {wanted} "
            f"code uses (its CPU runs the {has} level): compile with --isa {has}")


# ------------------------------------------------------------ running servers
def _run_dir() -> Path:
    """Where running devices are recorded (pid, port) and log; ``TVM_ARMQ_RUN_DIR`` overrides."""
    d = Path(os.environ.get("TVM_ARMQ_RUN_DIR", home() / "run"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def guest_env(level_name: str) -> dict:
    """Environment under which aarch64 programs run on the level's emulated CPU."""
    lvl = _level(level_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(QEMU_LD_PREFIX=str(sysroot()), QEMU_CPU=lvl.qemu_cpu,
               PYTHONPATH=str(site_dir()), PYTHONNOUSERSITE="1", TVM_USE_RUNTIME_LIB="1",
               TVM_NUM_THREADS=env.get("TVM_NUM_THREADS", "1"))
    return env


def guest_command(level_name: str, *args: str) -> list[str]:
    """argv that runs the aarch64 Python with ``args`` on the level's emulated CPU."""
    return [_qemu_static(), "-cpu", _level(level_name).qemu_cpu, str(guest_python()), *args]


def _free_port(host: str, start: int) -> int:
    for port in range(start, start + 100):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    raise DeviceError(f"no free port in {start}..{start + 99} on {host}")


SERVER_SCRIPT = "guest_rpc_server.py"  # what a device's command line runs (checked by stop)
# psutil's process start times are derived from clock ticks since boot; two readings of
# the same process agree far closer than this, another process started later does not.
START_TIME_SLACK = 0.05


@dataclasses.dataclass
class Device:
    """One emulated aarch64 RPC server process (or a record of one, for the CLI)."""

    level: str
    endpoint: Endpoint
    pid: int
    log: Path
    tracker: str | None = None  # HOST:PORT of the tracker it registered with, if any
    started: float | None = None  # the process's start time (psutil), to recognise it

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        try:  # a zombie of ours is not alive
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return True

    def impostor(self) -> str | None:
        """Why the process now at ``pid`` is not this device, or None if it is.

        The pid comes from a record on disk: the device may have died and the pid been
        reused by an unrelated process. It is ours only if it started when the recorded
        one did and runs the device's server script."""
        import psutil

        try:
            proc = psutil.Process(self.pid)
            started, cmdline = proc.create_time(), proc.cmdline()
        except psutil.NoSuchProcess:
            return f"pid {self.pid} has exited"
        except psutil.AccessDenied:
            return f"pid {self.pid} belongs to another user"
        if not any(arg.endswith(SERVER_SCRIPT) for arg in cmdline):
            return f"pid {self.pid} now runs `{' '.join(cmdline)[:120]}`, not the device"
        if self.started is not None and abs(started - self.started) > START_TIME_SLACK:
            return (f"pid {self.pid} was started at {time.ctime(started)}, the device at "
                    f"{time.ctime(self.started)}: another process reuses the pid")
        return None

    def connect(self, session_timeout: float = 0, timeout: float | None = None):
        return self.endpoint.connect(session_timeout, timeout)

    def stop(self) -> None:
        """Stop the server and the workers it forked (they share its process group), after
        checking that the pid is still this device (``impostor``): a reused pid's process
        group is never signalled, only the stale record is removed."""
        if self.alive() and self.impostor() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                for _ in range(50):
                    if not self.alive():
                        break
                    time.sleep(0.1)
        _state_file(self.level, self.pid).unlink(missing_ok=True)

    def to_json(self) -> dict:
        return {"level": self.level, "host": self.endpoint.host, "port": self.endpoint.port,
                "key": self.endpoint.key, "pid": self.pid, "log": str(self.log),
                "tracker": self.tracker, "started": self.started}

    @classmethod
    def from_json(cls, d: dict) -> "Device":
        return cls(d["level"], Endpoint(d["host"], d["port"], d.get("key")), d["pid"],
                   Path(d["log"]), d.get("tracker"), d.get("started"))


def _state_file(level_name: str, pid: int) -> Path:
    return _run_dir() / f"{level_name}-{pid}.json"


def _log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def start(level_name: str, *, host: str = "127.0.0.1", port: int | None = None,
          tracker: str | None = None, key: str | None = None,
          timeout: float = START_TIMEOUT, provision_first: bool = True,
          env: dict | None = None) -> Device:
    """Start the emulated device of ``level_name`` and wait until it answers RPC.

    With ``tracker="HOST:PORT"`` the server also registers there under ``key``
    (default ``armq-<level>``), as a board in a tuning farm does. ``env``: variables set
    for the device's process on top of ours (``TVM_ARMQ_ISA``, say).
    """
    lvl = _level(level_name)
    if provision_first:
        provision()
    elif not provisioned():
        raise DeviceError("the emulated device is not provisioned: run "
                          "`python -m tvm_armq device provision` (as root)")
    port = _free_port(host, port or DEFAULT_PORTS[lvl.name])
    log = _run_dir() / f"{lvl.name}-{port}.log"
    server = Path(__file__).with_name("guest_rpc_server.py")
    args = [str(server), "--host", host, "--port", str(port), "--port-end", str(port + 1)]
    if tracker:
        key = key or f"armq-{lvl.name}"
        args += ["--tracker", tracker, "--key", key]
    with open(log, "w") as logf:
        proc = subprocess.Popen(guest_command(lvl.name, *args),
                                env={**guest_env(lvl.name), **(env or {})},
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
    # Registered with a tracker, the server only accepts clients the tracker sends
    # (it hands them a match key), so the device is reached through the tracker.
    if tracker:
        thost, tport = tracker.rsplit(":", 1)
        endpoint = Endpoint(thost, int(tport), key)
    else:
        endpoint = Endpoint(host, port)
    import psutil

    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:  # exited at once: the loop below reports its log
        started = None
    dev = Device(lvl.name, endpoint, proc.pid, log, tracker, started)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise DeviceError(f"the {lvl.name} device exited with code {proc.returncode} "
                              f"while starting; its log ({log}):\n{_log_tail(log)}")
        if time.monotonic() > deadline:
            dev.stop()
            raise DeviceError(f"the {lvl.name} device did not answer RPC at {endpoint} "
                              f"within {timeout:.0f} s; its log ({log}):\n{_log_tail(log)}")
        try:
            # A tracker queues a request for a key nobody serves yet, forever: ask it only
            # once the server has registered, so this loop keeps watching the process.
            if tracker and not _tracker_serves(endpoint):
                raise ConnectionError("not registered yet")
            sess = dev.connect()
            sess.cpu(0)  # a round trip through the worker proves it is up
            del sess
            break
        except Exception:  # not listening yet
            time.sleep(1.0)
    _state_file(lvl.name, dev.pid).write_text(json.dumps(dev.to_json()))
    return dev


def _tracker_serves(endpoint: Endpoint) -> bool:
    """True once some server is registered at the tracker under ``endpoint.key``."""
    from tvm import rpc

    queue = rpc.connect_tracker(endpoint.host, endpoint.port).summary().get("queue_info", {})
    return int(queue.get(endpoint.key, {}).get("free", 0)) > 0


# Records dropped by ``instances`` because their pid is no longer the device: (level, why).
STALE: list[tuple[str, str]] = []


def instances(level_name: str) -> list[Device]:
    """The devices of ``level_name`` started by ``start`` (in any process) that still run.

    A record whose process died, or whose pid another process now has (``impostor``), is
    forgotten (and noted in ``STALE``): its pid is never signalled."""
    alive = []
    for f in sorted(_run_dir().glob(f"{_level(level_name).name}-*.json")):
        try:
            dev = Device.from_json(json.loads(f.read_text()))
        except (OSError, ValueError, KeyError, TypeError):  # a half-written or foreign file
            STALE.append((level_name, f"{f}: not a device record, removed"))
            f.unlink(missing_ok=True)
            continue
        why = dev.impostor() if dev.alive() else f"pid {dev.pid} has exited"
        if why is None:
            alive.append(dev)
        else:  # died or was killed without `stop`, or the pid was reused: forget it
            if dev.alive():
                STALE.append((level_name, f"{why}: not signalled, its record {f} removed"))
            f.unlink(missing_ok=True)
    return alive


def running(level_name: str) -> Device | None:
    """A running device of ``level_name``, if there is one."""
    devs = instances(level_name)
    return devs[0] if devs else None


def stop(level_name: str) -> bool:
    """Stop every running device of ``level_name``; False if none was running."""
    devs = instances(level_name)
    for dev in devs:
        dev.stop()
    return bool(devs)


def status() -> dict[str, list[Device]]:
    return {name: instances(name) for name in LEVELS}
