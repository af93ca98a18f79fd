#!/usr/bin/env bash
# Runs the lock benchmark of BENCHMARKS.md: redlock against rslock and against the
# limits measured in the same run, on a redis-server the benchmark starts itself
# (a free loopback port, never 6379). Prints the table and one `BENCH {...}` line per
# figure, and writes the handoff-latency plot to benches/handoff-latency.svg.
#
#   scripts/bench.sh                   # the full run (under a minute here)
#   scripts/bench.sh --quick           # a quarter of the iterations, to try things out
#   scripts/bench.sh --current-thread  # a current-thread tokio runtime instead
#   scripts/bench.sh --svg PATH        # write the plot elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
# redis-benchmark comes in redis-tools, which redis-server depends on; check anyway.
if ! command -v redis-benchmark >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "redis-benchmark is missing: installing redis-tools with apt-get" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq redis-tools >/dev/null || {
            echo "apt-get could not install redis-tools" >&2
            exit 1
        }
    else
        echo "redis-benchmark is missing. Install it with:" >&2
        echo "    sudo apt-get install -y redis-tools" >&2
        exit 1
    fi
fi
exec cargo bench --locked --bench locks -- "$@"
