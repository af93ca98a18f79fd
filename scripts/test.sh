#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests against throwaway
# redis-server processes on free loopback ports, compile-fail (trybuild) tests,
# the examples with small parameters, and the doc tests. The tests build the runtime
# with every feature (and the `redlock` command with `cli`); first the lean default
# build and each feature on its own are checked, the docs built with the default
# features and with every feature (warnings denied), the library built with the
# declared minimum Rust version, and the two published crates packaged and built from their
# packages (`cargo package`, offline: every dependency was fetched by the checks).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
# Every dependency's sources, for every platform: the build fetches only Linux's, but
# `tests/msrv.rs` reads every manifest (`cargo metadata --offline`) and `cargo package`
# below works offline. On a fresh machine (an empty cargo home) nothing is there yet.
echo "== cargo fetch --locked (every platform's dependencies)" >&2
cargo fetch --locked --quiet
for features in "" cluster sentinel tls metrics test-util; do
    echo "== cargo check -p redlock-runtime --no-default-features --features '$features'" >&2
    cargo check --locked --quiet -p redlock-runtime --no-default-features --features "$features" --lib
done
# The lean build's unit tests: what a build without a feature says when asked for it.
echo "== cargo test -p redlock-runtime --no-default-features --lib" >&2
cargo test --locked --quiet -p redlock-runtime --no-default-features --lib
for features in "" "--all-features"; do
    echo "== cargo doc ${features:-(default features)} (warnings denied)" >&2
    RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps $features \
        -p redlock-runtime -p redlock-macros
done
# The declared rust-version (Cargo.toml), checked with that very toolchain when rustup
# can install it; tests/msrv.rs checks it against every dependency's own.
source scripts/check-msrv.sh
echo "== cargo package -p redlock-macros -p redlock-runtime" >&2
cargo package --locked --offline --quiet --allow-dirty -p redlock-macros -p redlock-runtime
# The partition tests (tests/partitions/) make network namespaces with iproute2's `ip`;
# as root without it, install it (without root they skip, saying so).
if [ "$(id -u)" = "0" ] && ! command -v ip >/dev/null 2>&1 && [ ! -x /usr/sbin/ip ] \
    && [ ! -x /sbin/ip ] && command -v apt-get >/dev/null 2>&1; then
    echo "ip (iproute2) is missing: installing it with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; } \
        || { echo "apt-get could not install iproute2: the partition tests will be skipped" >&2
             # In CI, a suite that quietly skips is a failure.
             if [ -n "${CI:-}" ]; then exit 1; fi; }
fi
cargo test --workspace --locked "$@"
