#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests against throwaway
# redis-server processes on free loopback ports, compile-fail (trybuild) tests,
# the examples with small parameters, and the doc tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
cargo test --workspace --locked "$@"
