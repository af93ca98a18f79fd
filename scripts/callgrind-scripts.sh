#!/usr/bin/env bash
# Counts the server's instructions per contended step of redlock's scripts, on Valkey
# (the Valkey of the test suite's Valkey pass) under
#     valgrind --tool=callgrind
# Instruction counts do not depend on the machine's load, unlike `INFO cpu`, so they
# resolve a change of a few per cent that the benchmark's spread hides. They leave out
# the kernel's share (socket reads and writes), which `INFO cpu` counts.
#
# The steps, each on a key held by an unconfirmed grant (the distributed benchmark's
# common case) with three waiters in line, each of whose clients listens:
#   join   an attempt by a fourth waiter: it finds the key busy and joins the line
#          (its registration is removed again after each step, the line kept)
#   grant  the holder's release: it grants the key to the head and tells the next `N`
# And without contention, on 64 keys in turn:
#   cycle    an acquire and its release (redlock's scripts, with the arguments the
#            client sends)
#   minimum  the same with the benchmark's minimal fenced lock (its two scripts, from
#            benches/locks/fenced_minimum.rs): the floor a fenced lock costs
# Each is measured as the difference between N and 2N repetitions, less the same
# difference for the set-up commands alone (`setup`), divided by N: start-up and the
# set-up cancel.
#
#   scripts/callgrind-scripts.sh          # N = 200 (about 2 minutes)
#   scripts/callgrind-scripts.sh 400
#   CONTENDED=0 scripts/callgrind-scripts.sh   # the uncontended cycle alone
#
# To compare two commits, run it in a checkout of each, or give it a directory holding
# another commit's acquire.lua and release.lua (written by the ignored test
# `scripts::tests::dump_scripts`, or by hand) as SCRIPTS=dir.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
source scripts/require-valkey.sh
n=${1:-200}
command -v valgrind >/dev/null || {
    echo "valgrind is needed: apt-get install valgrind" >&2
    exit 1
}
[ -n "${VALKEY_SERVER:-}" ] || { echo "Valkey is needed (see above)" >&2; exit 1; }

work=$(mktemp -d)
# Every process started, by pid (each run is a subshell: a variable would not come back).
cleanup() {
    if [ -f "$work/pids" ]; then
        xargs -r kill 2>/dev/null < "$work/pids" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${SCRIPTS:-}" ]; then
    cp "$SCRIPTS/acquire.lua" "$SCRIPTS/release.lua" "$work/"
else
    REDLOCK_DUMP_SCRIPTS=$work cargo test --locked --quiet -p redlock-runtime --lib \
        scripts::tests::dump_scripts -- --ignored --exact >&2
fi

# The minimal fenced lock's scripts, as the benchmark runs them.
script_of() {
    awk -v name="$1" '$0 ~ "^const " name ": &str = r#\"" { on = 1; next } on && /^"#;/ { exit } on' \
        benches/locks/fenced_minimum.rs
}
script_of ACQUIRE > "$work/minimum-acquire.lua"
script_of RELEASE > "$work/minimum-release.lua"
[ -s "$work/minimum-acquire.lua" ] && [ -s "$work/minimum-release.lua" ] \
    || { echo "could not read the fenced minimum's scripts" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
hex() { printf "$1%.0s" $(seq 32); }
holder=$(hex a)
waiters=("$(hex b)" "$(hex c)" "$(hex d)")
joiner=$(hex e)

# One run of `kind` repeated `count` times: prints the server's instructions.
run() {
    local kind=$1 count=$2 port out
    port=$(free_port)
    out="$work/callgrind.$kind.$count"
    valgrind --tool=callgrind --callgrind-out-file="$out" "$VALKEY_SERVER" --port "$port" \
        --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
    local server=$!
    echo "$server" >> "$work/pids"
    local cli=("$VALKEY_CLI" -h 127.0.0.1 -p "$port")
    for _ in $(seq 100); do "${cli[@]}" PING >/dev/null 2>&1 && break; sleep 0.2; done
    local acquire release minimum_acquire minimum_release
    acquire=$("${cli[@]}" SCRIPT LOAD "$(cat "$work/acquire.lua")")
    release=$("${cli[@]}" SCRIPT LOAD "$(cat "$work/release.lua")")
    minimum_acquire=$("${cli[@]}" SCRIPT LOAD "$(cat "$work/minimum-acquire.lua")")
    minimum_release=$("${cli[@]}" SCRIPT LOAD "$(cat "$work/minimum-release.lua")")
    # Each waiter's client listens on its grant channel for the key.
    local listeners=()
    for id in "${waiters[@]}" "$joiner"; do
        "${cli[@]}" SUBSCRIBE "redlock:granted:$id:k" >/dev/null 2>&1 &
        listeners+=("$!")
        echo "$!" >> "$work/pids"
    done
    sleep 1
    local line="" expiries="" score=1
    for id in "${waiters[@]}"; do
        line+=" $score \"$id:1 10000 vm:1\""
        expiries+=" 4000000000000 \"$id:1 10000 vm:1\""
        score=$((score + 1))
    done
    for i in $(seq "$count"); do
        local key="free:$((i % 64))" owner="$joiner:$i"
        case $kind in
            cycle)
                echo "EVALSHA $acquire 1 $key $owner 10000 vm:1 \"$owner 10000 vm:1\""
                echo "EVALSHA $release 1 $key $owner"
                continue ;;
            minimum)
                echo "EVALSHA $minimum_acquire 2 $key redlock:fence \"$owner 1\" 10000"
                echo "EVALSHA $minimum_release 1 $key \"$owner 1\""
                continue ;;
            none) echo "PING"; echo "PING"; continue ;;
        esac
        echo "SET k \"$holder:1 1700000000000000 01700000000000~ vm:1\" PX 10000"
        echo "ZADD redlock:waitlist:k$line"
        echo "ZADD redlock:waitlist-expiry:k$expiries"
        case $kind in
            join) echo "EVALSHA $acquire 1 k $joiner:$i 10000 vm:1 \"$joiner:$i 10000 vm:1\"" ;;
            grant) echo "EVALSHA $release 1 k $holder:1" ;;
        esac
        if [ "$kind" = grant ]; then
            echo "DEL redlock:waitlist:k redlock:waitlist-expiry:k"
        else
            echo "ZREM redlock:waitlist:k \"$joiner:$i 10000 vm:1\""
            echo "ZREM redlock:waitlist-expiry:k \"$joiner:$i 10000 vm:1\""
        fi
    done | "${cli[@]}" > "$work/replies.$kind.$count" 2>&1
    kill "${listeners[@]}" 2>/dev/null || true
    "${cli[@]}" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$server" 2>/dev/null || true
    if grep -q ERR "$work/replies.$kind.$count"; then
        echo "$kind: a script failed:" >&2
        grep -m3 ERR "$work/replies.$kind.$count" >&2
        exit 1
    fi
    callgrind_annotate "$out" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}

# CONTENDED=0 leaves the contended steps out.
kinds=(none cycle minimum)
if [ "${CONTENDED:-1}" != 0 ]; then
    kinds=(setup join grant "${kinds[@]}")
fi
declare -A cost
for kind in "${kinds[@]}"; do
    small=$(run "$kind" "$n") || exit 1
    large=$(run "$kind" $((2 * n))) || exit 1
    cost[$kind]=$(( (large - small) / n ))
done
if [ -n "${cost[setup]:-}" ]; then
    echo "Valkey instructions per step ($n and $((2 * n)) repetitions, set-up subtracted):"
    for kind in join grant; do
        echo "  $kind: $(( cost[$kind] - cost[setup] ))"
    done
    echo "  (set-up commands alone: ${cost[setup]} per repetition)"
fi
echo "Without contention, per acquire and release (two requests; two PINGs cost ${cost[none]}):"
echo "  redlock: ${cost[cycle]}"
echo "  fenced minimum: ${cost[minimum]}"
python3 -c "print(f'  ratio: {${cost[cycle]} / ${cost[minimum]}:.3f} ({(${cost[cycle]} - ${cost[none]}) / (${cost[minimum]} - ${cost[none]}):.3f} less the PINGs)')"
