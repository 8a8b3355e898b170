"""Celery peer: python3 celery_roundtrip.py [-n TASKS] [-t TIMEOUT] [--rpc] [--worker-args ARGS] [--patch-kombu] <amqp-url>

A Celery 5 application (Debian's python3-celery) configured as ordering-sensitive workers
commonly are: acks_late, prefetch multiplier 1, the solo pool; no result backend unless --rpc
(then rpc://, results coming back through the broker). A worker runs in a child process (extra
worker command-line arguments in --worker-args, e.g. "--without-heartbeat"); this process sends
TASKS tasks (default 202), each of which appends its number and the time to a file, and waits
until every task has run (and, with --rpc, every result came back).

--patch-kombu works around a sleep in kombu's event loop (kombu 5.2, Debian's): a callback
scheduled with call_soon while the loop runs its ready callbacks (the ack of a message read
there) waits until poll returns, that is until more bytes arrive or the next timer, up to 10 s
without the worker's own heartbeat. It makes the loop poll without waiting while callbacks are
ready, so broker and client speed can be compared without it.

Prints "OK tasks=N total=S first=F last=L" and exits 0 when all ran within TIMEOUT seconds
(default 120): S is the whole run's time in seconds, F and L when the first and the last task
ran, in seconds after the start (L - F is the steady-state time, without the worker's
start-up). Otherwise it reports what ran and exits 1.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

from celery import Celery


def make_app(url, rpc):
    app = Celery("roundtrip", broker=url, backend="rpc://" if rpc else None)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_default_queue="roundtrip",
    )

    @app.task(name="roundtrip.record")
    def record(n):
        with open(os.environ["ROUNDTRIP_FILE"], "a") as f:
            f.write("%d %.6f\n" % (n, time.time()))
        return n

    return app


def patch_kombu():
    from kombu.asynchronous.hub import Hub
    fire_timers = Hub.fire_timers

    def fire_timers_unless_ready(self, *args, **kwargs):
        timeout = fire_timers(self, *args, **kwargs)
        return 0 if self._ready else timeout

    Hub.fire_timers = fire_timers_unless_ready


def read(path):
    try:
        with open(path) as f:
            return [(int(a), float(b)) for a, b in (line.split() for line in f if line.strip())]
    except FileNotFoundError:
        return []


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=202)
    p.add_argument("-t", type=float, default=120)
    p.add_argument("--rpc", action="store_true")
    p.add_argument("--worker", action="store_true")
    p.add_argument("--worker-args", default="")
    p.add_argument("--patch-kombu", action="store_true")
    p.add_argument("url")
    a = p.parse_args()
    if a.worker:
        if a.patch_kombu:
            patch_kombu()
        make_app(a.url, a.rpc).worker_main(
            ["worker", "--pool=solo", "--concurrency=1", "--loglevel=WARNING"] + a.worker_args.split())
        return
    fd, path = tempfile.mkstemp(prefix="celery-roundtrip-")
    os.close(fd)
    os.environ["ROUNDTRIP_FILE"] = path
    app = make_app(a.url, a.rpc)
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--worker-args=" + a.worker_args, a.url]
    if a.rpc:
        argv.insert(2, "--rpc")
    if a.patch_kombu:
        argv.insert(2, "--patch-kombu")
    child = subprocess.Popen(argv)
    try:
        start, wall0 = time.monotonic(), time.time()
        results = [app.send_task("roundtrip.record", args=(i,)) for i in range(a.n)]
        deadline = start + a.t
        if a.rpc:
            for i, r in enumerate(results):
                got = r.get(timeout=max(deadline - time.monotonic(), 0.001))
                assert got == i, (got, i)
        while time.monotonic() < deadline and len({n for n, _ in read(path)}) < a.n:
            time.sleep(0.01)
        total = time.monotonic() - start
        runs = read(path)
        missing = sorted(set(range(a.n)) - {n for n, _ in runs})
        if missing:
            print("only %d of %d tasks ran in %.1f s; first missing: %s" % (a.n - len(missing), a.n, total, missing[:10]))
            sys.exit(1)
        times = sorted(t for _, t in runs)
        print("OK tasks=%d total=%.3f first=%.3f last=%.3f" % (a.n, total, times[0] - wall0, times[-1] - wall0))
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        os.unlink(path)


if __name__ == "__main__":
    main()
