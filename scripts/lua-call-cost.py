#!/usr/bin/env python3
"""What a script's pieces cost the server: the time of small scripts that each do one
thing ten times (a `redis.call` of GET, TIME, SET or ZADD (then one DEL), or a string
concatenation),
against an empty script, from SLOWLOG (0 µs threshold: each script's wall time on the
server), 300 runs each, p50. Starts a redis-server of its own on a free loopback port
(REDIS_SERVER chooses another binary, valkey-server say).

    scripts/lua-call-cost.py
"""

import os
import sys

# Its RESP connection and helpers come from server-cost.py (no bytecode cache left in
# scripts/).
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
server_cost = __import__("server-cost")

SCRIPTS = {
    "empty": "return 1",
    "GET x10": "for i = 1, 10 do redis.call('GET', 'x') end return 1",
    "TIME x10": "for i = 1, 10 do redis.call('TIME') end return 1",
    "SET x10": "for i = 1, 10 do redis.call('SET', 'x', 'y') end return 1",
    "ZADD x10 + DEL": "for i = 1, 10 do redis.call('ZADD', 'z', i, 'member' .. i) end redis.call('DEL', 'z') return 1",
    "concat x10": "local s = '' for i = 1, 10 do s = s .. 'abcdefghij' .. i end return 1",
}


def main():
    port = server_cost.free_port()
    server = server_cost.start_server(port)
    try:
        conn = server_cost.connect(port)
        shas = {conn.call("SCRIPT", "LOAD", body): name for name, body in SCRIPTS.items()}
        conn.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        conn.call("CONFIG", "SET", "slowlog-max-len", "100000")
        conn.call("SLOWLOG", "RESET")
        for _ in range(300):
            for sha in shas:
                conn.call("EVALSHA", sha, "0")
        times = {}
        for entry in conn.call("SLOWLOG", "GET", "-1"):
            arguments = entry[3]
            if arguments[0].upper() == "EVALSHA":
                times.setdefault(shas[arguments[1]], []).append(entry[2])
    finally:
        server.kill()
        server.wait()
    for name in SCRIPTS:
        print(f"{name:16} p50 {server_cost.quantile(times[name], 0.5)} µs")


if __name__ == "__main__":
    main()
