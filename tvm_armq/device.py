"""The emulated aarch64 device: a TVM RPC server running under qemu-user.

There is no Arm board here, so tvm_armq makes one. ``start("i8mm")`` runs an
aarch64 Python 3.11 under ``qemu-aarch64 -cpu <the level's CPU>`` with the
aarch64 TVM runtime on its path, serving TVM RPC on loopback. To a client it is
an RPC endpoint (host, port, optional tracker key) like any real board, so the
same client code runs against a phone or a server unchanged.

What the device needs is provisioned once per machine, idempotently, into a
cache outside the repo (``$TVM_ARMQ_HOME``, default ``~/.cache/tvm_armq``):

1. Debian packages: qemu-user, qemu-user-static, binfmt-support and the
   aarch64 cross g++ (needs root; nothing is installed if all are present).
2. An aarch64 sysroot: Python 3.11 and the libraries it loads, from Debian's
   arm64 packages (``apt-get download`` + ``dpkg -x``, no arm64 install).
3. aarch64 wheels (numpy, apache-tvm, apache-tvm-ffi, ...) from pip with
   ``--platform manylinux_2_28_aarch64``, unpacked into a site directory.
4. binfmt registration of aarch64 ELF files: the RPC server re-executes its
   own Python for the worker process, and that execve of an aarch64 binary only
   works when the kernel knows to hand it to qemu. ``QEMU_LD_PREFIX`` (the
   sysroot) and ``QEMU_CPU`` (the level) travel in the environment, so the
   re-executed worker runs on the same emulated CPU as its parent.

The server loads only the TVM runtime (``TVM_USE_RUNTIME_LIB=1``): a board
does not compile, it loads cross-linked modules and runs them.
"""

from __future__ import annotations

import dataclasses
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

from .targets import LEVELS, level as _level

TVM_VERSION = "0.27.0.post1"
DEBIAN_PACKAGES = {  # command that must exist -> Debian package that provides it
    "qemu-aarch64": "qemu-user",
    "qemu-aarch64-static": "qemu-user-static",
    "update-binfmts": "binfmt-support",
    "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
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


class DeviceError(RuntimeError):
    """The emulated device cannot be provisioned or started; the message says why."""


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
    _run(["apt-get", "install", "-y", "-qq", *missing],
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
    _run(["apt-get", "download", "-qq", *[f"{p}:arm64" for p in SYSROOT_PACKAGES]], cwd=debs)
    tmp = home() / "sysroot.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for deb in sorted(debs.glob("*.deb")):
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
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
          "--python-version", "3.11", "--implementation", "cp", *plat, "-d", str(wheels),
          *reqs])
    tmp = home() / "site.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for whl in sorted(wheels.glob("*.whl")):
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
    """Make this machine able to run the emulated device. Idempotent; quick when done."""
    home().mkdir(parents=True, exist_ok=True)
    _ensure_debian_packages()
    _ensure_sysroot()
    _ensure_site()
    _ensure_binfmt()


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

    def connect(self, session_timeout: float = 0):
        """An RPC session on the device (``tvm.rpc.RPCSession``)."""
        from tvm import rpc

        if self.key:
            return rpc.connect_tracker(self.host, self.port).request(
                self.key, session_timeout=session_timeout)
        return rpc.connect(self.host, self.port, session_timeout=session_timeout)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}" + (f":{self.key}" if self.key else "")


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


@dataclasses.dataclass
class Device:
    """One emulated aarch64 RPC server process (or a record of one, for the CLI)."""

    level: str
    endpoint: Endpoint
    pid: int
    log: Path
    tracker: str | None = None  # HOST:PORT of the tracker it registered with, if any

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        try:  # a zombie of ours is not alive
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return True

    def connect(self, session_timeout: float = 0):
        return self.endpoint.connect(session_timeout)

    def stop(self) -> None:
        """Stop the server and the workers it forked (they share its process group)."""
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
                "tracker": self.tracker}

    @classmethod
    def from_json(cls, d: dict) -> "Device":
        return cls(d["level"], Endpoint(d["host"], d["port"], d.get("key")), d["pid"],
                   Path(d["log"]), d.get("tracker"))


def _state_file(level_name: str, pid: int) -> Path:
    return _run_dir() / f"{level_name}-{pid}.json"


def _log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def start(level_name: str, *, host: str = "127.0.0.1", port: int | None = None,
          tracker: str | None = None, key: str | None = None,
          timeout: float = START_TIMEOUT, provision_first: bool = True) -> Device:
    """Start the emulated device of ``level_name`` and wait until it answers RPC.

    With ``tracker="HOST:PORT"`` the server also registers there under ``key``
    (default ``armq-<level>``), as a board in a tuning farm does.
    """
    lvl = _level(level_name)
    if provision_first:
        provision()
    elif not provisioned():
        raise DeviceError("the emulated device is not provisioned: run "
                          "`python -m tvm_armq device provision` (as root)")
    port = _free_port(host, port or DEFAULT_PORTS[lvl.name])
    log = _run_dir() / f"{lvl.name}-{port}.log"
    server = Path(__file__).with_name("_guest_rpc_server.py")
    args = [str(server), "--host", host, "--port", str(port), "--port-end", str(port + 1)]
    if tracker:
        key = key or f"armq-{lvl.name}"
        args += ["--tracker", tracker, "--key", key]
    with open(log, "w") as logf:
        proc = subprocess.Popen(guest_command(lvl.name, *args), env=guest_env(lvl.name),
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)
    # Registered with a tracker, the server only accepts clients the tracker sends
    # (it hands them a match key), so the device is reached through the tracker.
    if tracker:
        thost, tport = tracker.rsplit(":", 1)
        endpoint = Endpoint(thost, int(tport), key)
    else:
        endpoint = Endpoint(host, port)
    dev = Device(lvl.name, endpoint, proc.pid, log, tracker)
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


def instances(level_name: str) -> list[Device]:
    """The devices of ``level_name`` started by ``start`` (in any process) that still run."""
    alive = []
    for f in sorted(_run_dir().glob(f"{_level(level_name).name}-*.json")):
        dev = Device.from_json(json.loads(f.read_text()))
        if dev.alive():
            alive.append(dev)
        else:  # died or was killed without `stop`: forget it
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
