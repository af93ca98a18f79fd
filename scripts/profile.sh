#!/usr/bin/env bash
# Profiles redlock's uncontended path: the benchmark binary (the release build that
# scripts/bench.sh runs, built if needed) runs only redlock's uncontended acquire +
# release cycles, one task, for SECONDS (default 5) on a redis-server of its own (a free
# loopback port, never 6379), under
#     perf record -e cpu-clock -F 999 --call-graph dwarf,8192
# (`-g` with DWARF unwinding from .eh_frame: the release build has no frame pointers, so
# plain `-g` would cut the stacks), and prints the top of the report: the functions the
# samples fell in (self time, by process: the benchmark's threads and the redis-server it
# started), then the benchmark's functions with their callees included.
#
#   scripts/profile.sh              # 5 s, the report on stdout
#   scripts/profile.sh 10 FILE      # 10 s, and the report also written to FILE
#                                   # (benches/profile-uncontended.txt is one such)
#   PROFILE_LOCK=rslock scripts/profile.sh 10 FILE
#                                   # rslock's cycles instead, to compare
#                                   # (benches/profile-uncontended-rslock.txt)
#
# The perf data (about 15 MB a second) is deleted afterwards unless KEEP=1.
# Without a working `perf record` (no perf_event access), it falls back to
# valgrind --tool=callgrind on a short run and prints callgrind_annotate's top.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
seconds=${1:-5}
out=${2:-}

cargo bench --locked --bench locks --no-run >&2
binary=$(cargo bench --locked --bench locks --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$binary" ] || { echo "could not find the benchmark binary" >&2; exit 1; }

# perf pads every line to the longest symbol; blank lines and tips go too.
tidy() {
    grep -v -e '^$' -e '^# (Tip' -e '^# To display' -e '^#$' \
        | sed -E 's/ +$//; s/^(.{160}).*/\1…/'
}

data=target/perf-uncontended.data
report=$(mktemp)
trap 'rm -f "$report"; [ "${KEEP:-}" = 1 ] || rm -f "$data" "$data.old"' EXIT
record=(perf record -q -e cpu-clock -F 999 --call-graph dwarf,8192 -o "$data")
if "${record[@]}" -- true >/dev/null 2>&1; then
    {
        echo "# scripts/profile.sh $seconds $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "# ${record[*]} -- $binary --profile $seconds"
        "${record[@]}" -- "$binary" --profile "$seconds" 2>&1 \
            | grep -v '^\[' | sed 's/^/# /' || true
        echo "#"
        main=$(basename "$binary" | cut -c1-15)
        echo "# Where the samples fell, by thread and object: $main = the benchmark's main thread"
        echo "# (block_on: the benchmark's loop and the lock's code), tokio-rt-worker = the runtime's"
        echo "# workers (redis-rs's connection tasks, socket I/O), redis-server = Redis; [kernel.kallsyms]"
        echo "# = system calls, the loopback TCP stack and scheduling."
        echo "# perf report -i $data --stdio --no-children -g none --sort comm,dso --percent-limit 0.3"
        perf report -i "$data" --stdio --no-children -g none --sort comm,dso --percent-limit 0.3 \
            2>/dev/null | tidy | grep -v '^#' || true
        echo "#"
        echo "# Top functions, self time, every thread:"
        echo "# perf report -i $data --stdio --no-children -g none --sort comm,sym | head -40"
        perf report -i "$data" --stdio --no-children -g none --sort comm,sym 2>/dev/null \
            | tidy | grep -v '^#' | head -40 || true
        echo "#"
        echo "# Reading it: cpu-clock samples taken while interrupts are off land where they come back"
        echo "# on (_raw_spin_unlock_irq*): mostly waking a thread (futex, epoll) and the loopback TCP"
        echo "# stack. Below, a function listed above 100 % occurs twice in some stacks (the kernel's"
        echo "# entry when an interrupt arrives during a system call)."
        echo "# The client's threads, callees included (% of those threads' samples):"
        echo "# perf report -i $data --stdio --children -g none --comms $main,tokio-rt-worker \\"
        echo "#     --percentage relative --sort sym --percent-limit 1 | head -80"
        perf report -i "$data" --stdio --children -g none --comms "$main,tokio-rt-worker" \
            --percentage relative --sort sym --percent-limit 1 2>/dev/null \
            | tidy | grep -v '^#' | head -80 || true
        echo "#"
        echo "# The lock's own functions (and the benchmark loop's), callees included, same base:"
        echo "# perf report ... (as above) --percent-limit 0.2 | grep -E 'redlock_runtime|locks::' | head -40"
        perf report -i "$data" --stdio --children -g none --comms "$main,tokio-rt-worker" \
            --percentage relative --sort sym --percent-limit 0.2 2>/dev/null \
            | tidy | grep -E 'redlock_runtime|locks::' | head -40 || true
        echo "#"
        echo "# Redis, self time (% of redis-server's samples):"
        echo "# perf report -i $data --stdio --no-children -g none --comms redis-server \\"
        echo "#     --percentage relative --sort dso,sym | head -30"
        perf report -i "$data" --stdio --no-children -g none --comms redis-server \
            --percentage relative --sort dso,sym 2>/dev/null | tidy | grep -v '^#' | head -30 || true
    } >"$report"
else
    echo "perf record does not work here; using valgrind --tool=callgrind instead" >&2
    cg=target/callgrind-uncontended.out
    short=$(awk "BEGIN { s = $seconds / 5; print (s < 1 ? 1 : s) }")
    {
        echo "# scripts/profile.sh $seconds (callgrind fallback) $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "# valgrind --tool=callgrind --callgrind-out-file=$cg -- $binary --profile $short"
        valgrind --tool=callgrind --callgrind-out-file="$cg" -- "$binary" --profile "$short" 2>/dev/null \
            | grep -v '^\[' | sed 's/^/# /' || true
        echo "# callgrind_annotate $cg | head -60"
        callgrind_annotate "$cg" 2>/dev/null | head -60 || true
    } >"$report"
fi
cat "$report"
if [ -n "$out" ]; then
    cp "$report" "$out"
fi
