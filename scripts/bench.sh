#!/usr/bin/env bash
# Runs the lock benchmark of BENCHMARKS.md: redlock against rslock and against the
# limits measured in the same run, on a redis-server the benchmark starts itself
# (a free loopback port, never 6379). Prints the table and one `BENCH {...}` line per
# figure, and writes the handoff-latency plot to benches/handoff-latency.svg. Every
# scenario runs, the lock family's too (read throughput, writer wait under readers,
# semaphore hand-off: redlock only, rslock has neither).
#
#   scripts/bench.sh                   # the full run (under a minute here)
#   scripts/bench.sh --quick           # a quarter of the iterations, to try things out
#   scripts/bench.sh --current-thread  # a current-thread tokio runtime instead
#   scripts/bench.sh --svg PATH        # write the plot elsewhere
#   scripts/bench.sh --only read_throughput,writer_wait,semaphore_handoff
#                                      # only the scenarios named (SCENARIOS in
#                                      # benches/locks/main.rs); the plot needs handoff
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
exec cargo bench --locked --bench locks -- "$@"
