#!/usr/bin/env python3
"""Where a contended acquisition's Redis time goes, for one lock of the benchmark.

Starts a redis-server of its own (a free loopback port, never 6379), runs PROCESSES
separate processes of the distributed benchmark's child (each with its own client, all
on one key, HOLDS holds of about 1 ms each), and prints, per acquisition and counted
from the processes' common start (connecting is left out, as in the benchmark):
- Redis's CPU (INFO cpu, user and sys apart);
- the commands Redis ran (INFO commandstats, a script's inner calls included), each with
  its mean time;
- every script's time on the server, by SHA1 (SLOWLOG with a 0 µs threshold: wall time
  from the script's start to its reply, its inner calls included), p50 and p90;
- the release call as the processes saw it (call to return), p50, p10 and p90.

    scripts/server-cost.py 16                 # redlock, 16 processes, 40 holds each
    scripts/server-cost.py 16 rslock          # rslock in the same harness
    scripts/server-cost.py 2 redlock 40 BIN   # another benchmark binary
    scripts/server-cost.py 16 redlock-semaphore:4   # a semaphore of 4 permits
    REDLOCK_BENCH_GRANT_TRACE=1 scripts/server-cost.py 16   # and the grantee's side
                                              # (benches/locks/grant_trace.rs)
    scripts/server-cost.py 16 grant-minimum   # the floor of a lock that grants
                                              # (benches/locks/grant_minimum.rs)

The benchmark binary is the newest release/deps/locks-* under CARGO_TARGET_DIR (else
target/; build it with `cargo bench --bench locks --no-run`), or BIN. REDIS_SERVER chooses the server binary
(valkey-server, say). Figures vary from run to run on a busy machine: run each lock
several times, alternated.
"""

import glob
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Resp:
    """A minimal RESP2 connection: enough for INFO, CONFIG and SLOWLOG."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = self.sock.makefile("rb")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self.sock.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.buf.readline()[:-2]
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self.buf.read(size + 2)[:-2]
            return data.decode(errors="replace")
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self.read() for _ in range(size)]
        raise RuntimeError(f"unexpected reply {line!r}")


def start_server(port):
    """A redis-server (REDIS_SERVER: another binary) on `port`, without persistence."""
    return subprocess.Popen(
        [os.environ.get("REDIS_SERVER", "redis-server"), "--port", str(port), "--bind",
         "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL)


def connect(port):
    """A connection to the server just started on `port`, once it answers."""
    for _ in range(100):
        try:
            conn = Resp(port)
            conn.call("PING")
            return conn
        except OSError:
            time.sleep(0.05)
    sys.exit("redis-server did not start")


def info(conn, section):
    text = conn.call("INFO", section)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    processes = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    lock = sys.argv[2] if len(sys.argv) > 2 else "redlock"
    holds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    if len(sys.argv) > 4:
        binary = sys.argv[4]
    else:
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
        found = [path for path in glob.glob(os.path.join(target, "release/deps/locks-*"))
                 if os.access(path, os.X_OK) and not path.endswith(".d")]
        if not found:
            sys.exit("no benchmark binary: run `cargo bench --bench locks --no-run`, or name one")
        binary = max(found, key=os.path.getmtime)
    port = free_port()
    server = start_server(port)
    children = []
    try:
        conn = connect(port)
        url = f"redis://127.0.0.1:{port}"
        for index in range(processes):
            # The child's settings, as benches/locks/distributed.rs reads them: lock, URL,
            # key, index, holds, hold (µs), wait (ms), lease (ms).
            spec = "\t".join([lock, url, "bench:k", str(index), str(holds), "1000", "30000", "10000"])
            env = dict(os.environ, REDLOCK_BENCH_DISTRIBUTED_CHILD=spec)
            children.append(subprocess.Popen([binary], env=env, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True))
        for child in children:
            while True:
                line = child.stdout.readline()
                if not line:
                    sys.exit(f"a benchmark process exited before it was ready ({binary})")
                if line.strip() == "ready":
                    break
        conn.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        conn.call("CONFIG", "SET", "slowlog-max-len", "1000000")
        conn.call("SLOWLOG", "RESET")
        conn.call("CONFIG", "RESETSTAT")
        before = info(conn, "cpu")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        releases = []
        grants = []
        for child in children:
            for line in child.stdout:
                if line.strip() == "done":
                    break
                if line.startswith("hold "):
                    _, _asked, _acquired, releasing, released = line.split()
                    releases.append((int(released) - int(releasing)) / 1000)
                if line.startswith("grant "):
                    _, message, returned = line.split()
                    grants.append((int(message) / 1000, int(returned) / 1000))
            else:
                sys.exit("a benchmark process stopped before it was done: its figures would be partial")
        after = info(conn, "cpu")
        stats = info(conn, "commandstats")
        slowlog = conn.call("SLOWLOG", "GET", "-1")
        for child in children:
            child.stdin.close()
            if child.wait() != 0:
                sys.exit(f"a benchmark process failed (exit status {child.returncode})")
    finally:
        for child in children:
            child.kill()
        server.kill()
        server.wait()

    acquisitions = len(releases)
    if not acquisitions:
        sys.exit("no acquisition was made")

    def cpu(field):
        return (float(after[field]) - float(before[field])) * 1e6 / acquisitions

    rows = []
    for name, text in stats.items():
        fields = dict(item.split("=") for item in text.split(","))
        rows.append((int(fields["calls"]), name.removeprefix("cmdstat_"),
                     float(fields["usec_per_call"])))
    rows = [row for row in rows if not row[1].startswith("config")]
    rows.sort(reverse=True)
    print(f"{lock}, {processes} processes, {acquisitions} acquisitions "
          f"({binary}, {os.environ.get('REDIS_SERVER', 'redis-server')})")
    print(f"Redis CPU per acquisition: {cpu('used_cpu_user') + cpu('used_cpu_sys'):.0f} µs "
          f"(user {cpu('used_cpu_user'):.0f}, sys {cpu('used_cpu_sys'):.0f})")
    total = sum(calls for calls, _, _ in rows)
    print(f"commands per acquisition: {total / acquisitions:.1f}")
    for calls, name, usec in rows:
        print(f"  {name:16} {calls / acquisitions:6.2f} per acquisition, {usec:6.1f} µs each")
    scripts = {}
    for entry in slowlog:
        # id, timestamp, duration (µs), arguments, …
        duration, arguments = entry[2], entry[3]
        if arguments and arguments[0].upper() == "EVALSHA":
            scripts.setdefault(arguments[1][:8], []).append(duration)
    for sha, durations in sorted(scripts.items(), key=lambda item: -len(item[1])):
        print(f"  script {sha}: {len(durations) / acquisitions:.2f} per acquisition, "
              f"p50 {quantile(durations, 0.5)} µs, p90 {quantile(durations, 0.9)} µs on the server")
    print(f"release call: p50 {quantile(releases, 0.5):.0f} µs, p10 {quantile(releases, 0.1):.0f}, "
          f"p90 {quantile(releases, 0.9):.0f}")
    if grants:
        for index, what in enumerate(["message to grant taken", "grant taken to return"]):
            values = [grant[index] for grant in grants]
            print(f"{what}: p50 {quantile(values, 0.5):.0f} µs, p10 {quantile(values, 0.1):.0f}, "
                  f"p90 {quantile(values, 0.9):.0f} ({len(values)} grants)")


if __name__ == "__main__":
    main()
