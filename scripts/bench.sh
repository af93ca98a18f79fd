#!/usr/bin/env bash
# Runs the lock benchmark of BENCHMARKS.md: redlock against rslock and against the
# limits measured in the same run, on a redis-server the benchmark starts itself
# (a free loopback port, never 6379). Prints the table and one `BENCH {...}` line per
# figure, and writes the handoff-latency plot to benches/handoff-latency.svg. Every
# scenario runs, the lock family's too (read throughput, writer wait under readers,
# semaphore hand-off: redlock only, rslock has neither). The uncontended and 64-task
# throughput scenarios also say where a cycle's time goes (Redis time by command and
# script, client CPU, the remainder); the distinct-key scenario runs at 1, 4, 16 and 64
# tasks, then again with a tracing subscriber at INFO (last: it cannot be removed).
# scripts/profile.sh profiles the uncontended path.
#
#   scripts/bench.sh                   # the full run (about 75 s here)
#   scripts/bench.sh --quick           # a quarter of the iterations, to try things out
#   scripts/bench.sh --current-thread  # a current-thread tokio runtime instead
#   scripts/bench.sh --svg PATH        # write the plot elsewhere
#   scripts/bench.sh --only read_throughput,writer_wait,semaphore_handoff
#                                      # only the scenarios named (SCENARIOS in
#                                      # benches/locks/main.rs); the plot needs handoff
#   scripts/bench.sh --only distinct_keys,tracing_info
#                                      # the task-count and tracing rows alone
#   scripts/bench.sh --trace-handoff   # only the hand-off at 2/16/64/256 waiters, each
#                                      # split into its steps (benches/locks/handoff_trace.rs)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
exec cargo bench --locked --bench locks -- "$@"
