#!/usr/bin/env bash
# The main job: the lottery draw, on a cron schedule, recorded in a SQL database
# (SQLite, a file in a temporary directory), in two steps.
#   1. four worker processes contend for each round's lock (--mode round, the default),
#      on the schedule "*/5 * * * * *" (the real job's is "0 0 12 * * *", every day at
#      noon: try --cron "0 0 12 * * *" --rounds 1);
#   2. --mode leader: the workers elect one scheduler that draws every round; the demo
#      kills the leader with SIGKILL mid-run and another worker takes over within the
#      watchdog lease (2 s here), and the exactly-once check runs again.
# Each run ends by reading every round's draws back from the database.
# With arguments, runs the example once with them instead (try --help).
# Each run starts its own throwaway redis-server on a free loopback port (unless
# REDLOCK_URL is set) and stops it when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
# The first run compiles the example and its dependencies (SQLite, axum, the redis
# client): about 75 s on a fresh 2-core machine. Cargo shows its progress here; the
# runs below then start at once.
echo "== building the lottery example (the first time takes a minute or two; cargo shows its progress)" >&2
cargo build --locked --example lottery
if [ "$#" -gt 0 ]; then
    exec cargo run --quiet --locked --example lottery -- "$@"
fi
echo "== 1/2: a lock per round: every worker fires, one draws (--mode round)"
cargo run --quiet --locked --example lottery
echo
echo "== 2/2: an elected scheduler draws every round; the leader is killed mid-run (--mode leader)"
cargo run --quiet --locked --example lottery -- \
    --mode leader --workers 4 --rounds 4 --cron "*/3 * * * * *" --lease-ms 2000 --kill-leader-after 2
