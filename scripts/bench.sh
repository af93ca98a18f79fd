#!/usr/bin/env bash
# Runs the lock benchmark of BENCHMARKS.md: redlock against rslock and against the
# limits measured in the same run, on a redis-server the benchmark starts itself
# (a free loopback port, never 6379). Prints the table and one `BENCH {...}` line per
# figure, and writes the handoff-latency plot to benches/handoff-latency.svg.
#
#   scripts/bench.sh                 # the full run (about a minute and a half)
#   scripts/bench.sh --quick         # a quarter of the iterations, to try things out
#   scripts/bench.sh --current-thread  # a current-thread tokio runtime instead
#
# Extra arguments go to the benchmark. CARGO_TARGET_DIR is honoured as usual.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
    # redis-tools (redis-cli, redis-benchmark) comes with redis-server.
    install=(apt-get install -y redis-server redis-tools)
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "bench.sh: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${install[@]}"
    else
        echo "bench.sh: ${missing[*]} not found; install them with:" >&2
        echo "    sudo apt-get update && sudo ${install[*]}" >&2
        exit 1
    fi
fi

exec cargo bench --bench locks -- "$@"
