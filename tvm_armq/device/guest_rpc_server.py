"""TVM's RPC server, made to outlive a crashing kernel. Runs *on the device* (aarch64 Python).

Stock ``tvm.exec.rpc_server`` serves each session in a forked worker. When a
kernel kills that worker (SIGILL on a CPU that lacks the instruction, SIGSEGV
from a bad schedule), TVM 0.27's ``_serving`` raises instead of closing the
client's socket: the client hangs and the listening thread dies, so the whole
device is gone. Here a crashed session is logged, its socket closed (the client
gets an error at once) and the server goes on accepting sessions, which is
what a test suite or a tuning run on a board needs.

Only the standard library and the TVM runtime are importable on the device:
this file is run by path, not as part of the tvm_armq package.
"""

import argparse
import os
import time


def _install_crash_guard():
    """Runs inside the server's own worker process (cloudpickle sends it by value)."""
    import logging

    from tvm.rpc import server

    stock_serving = server._serving

    def serving(sock, addr, opts, load_library):
        cwd = os.getcwd()
        try:
            stock_serving(sock, addr, opts, load_library)
        except RuntimeError as err:  # the session's worker process died
            logging.getLogger("RPCServer").error("session from %s crashed: %s", addr, err)
            sock.close()
            os.chdir(cwd)

    server._serving = serving


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--port-end", type=int, default=9199)
    p.add_argument("--tracker", help="HOST:PORT of an RPC tracker")
    p.add_argument("--key", default="")
    a = p.parse_args()
    import logging

    from tvm import rpc

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    tracker = None
    if a.tracker:
        host, port = a.tracker.rsplit(":", 1)
        tracker = (host, int(port))
    srv = rpc.Server(a.host, a.port, a.port_end, tracker_addr=tracker, key=a.key,
                     server_init_callback=_install_crash_guard)
    logging.info("tvm_armq device serving on %s:%d", a.host, srv.port)
    while True:  # the server runs in its own process; stay alive as its parent
        time.sleep(3600)


if __name__ == "__main__":
    main()
