#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests against throwaway
# redis-server processes on free loopback ports, compile-fail (trybuild) tests,
# the examples with small parameters, and the doc tests. The tests build the runtime
# with its `tls` and `metrics` features (and the `redlock` command with `cli`); the
# lean default build, with no feature, is checked first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
cargo check --locked -p redlock-runtime --no-default-features --lib
cargo test --workspace --locked "$@"
