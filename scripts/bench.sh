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
# The distributed scenario runs separate OS processes (the benchmark binary run again,
# a client each) on one key, at 2, 16 and 48 processes, redlock then rslock, each
# process taking the key 20 times and holding it about 1 ms; it reports utilisation,
# the gap from one hold's release call to the next hold's acquire return, whoever
# holds next (p50, p99, in µs and PING round trips; also from the release's reply, and
# where the next holder is another process), wait p99, fairness
# (longest / median total wait of a process), Redis commands per acquisition (INFO
# total_commands_processed over the loops, scripts' calls included), client CPU per
# acquisition summed over the processes' loops, and overlapping holds (violations).
# The multi-key scenario (issue 35) runs 8 and 16 separate processes transferring 1 unit
# between two of 4 accounts (drawn, so orders cross), 25 transfers each holding both
# accounts' locks about 1 ms: redlock's lock_all (fixed 10 s lease) against rslock's two
# locks taken in sorted order; then the same harness with one key per acquisition. It
# reports transfers/s, wait p99, Redis CPU (INFO cpu) and commands per transfer from the
# processes' common start and their ratio to one single-key acquisition, violations
# (overlapping holds of an account), timeouts, and the ledger's balances (on a second
# redis-server) against the transfers reported.
# The fenced-minimum scenario (issue 34) sets redlock's uncontended cycle against the
# minimal fenced lock (one small script taking max(counter + 1, server clock µs), and a
# compare-and-delete), at 1 and 64 tasks on keys of their own: Redis CPU (INFO cpu) and
# commands per cycle, cycles per second, and the 1-task p50 in RTT.
# scripts/profile.sh profiles the uncontended path.
#
#   scripts/bench.sh                   # the full run (about 75 s here, plus about
#                                      # 10 s for the distributed scenario)
#   scripts/bench.sh --quick           # a quarter of the iterations, to try things out
#   scripts/bench.sh --current-thread  # a current-thread tokio runtime instead
#   scripts/bench.sh --svg PATH        # write the plot elsewhere
#   scripts/bench.sh --only read_throughput,writer_wait,semaphore_handoff
#                                      # only the scenarios named (SCENARIOS in
#                                      # benches/locks/main.rs); the plot needs handoff
#   scripts/bench.sh --only distinct_keys,tracing_info
#                                      # the task-count and tracing rows alone
#   scripts/bench.sh --only distributed [--distributed-holds 20]
#                                      # separate processes on one key alone (about
#                                      # 10 s here); holds per process
#   scripts/bench.sh --only fenced_minimum
#                                      # redlock against the minimal fenced lock alone
#   scripts/bench.sh --only multi_key [--multi-key-transfers 25]
#                                      # several keys as one (issue 35) alone; transfers
#                                      # per process
#   scripts/bench.sh --trace-handoff   # only the hand-off at 2/16/64/256 waiters, each
#                                      # split into its steps (benches/locks/handoff_trace.rs)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
exec cargo bench --locked --bench locks -- "$@"
