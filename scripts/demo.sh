#!/usr/bin/env bash
# The main job: the lottery draw, four worker processes contending for each round.
# Extra arguments go to the example (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
cargo run --quiet --locked --example lottery -- "$@"
