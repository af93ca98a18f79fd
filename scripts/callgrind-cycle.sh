#!/usr/bin/env bash
# Counts the client's user-space instructions per uncontended acquire + release cycle,
# function by function, for redlock and for rslock: the benchmark binary's `--profile`
# mode (one task, one lock, its own redis-server on a free loopback port) under
#     valgrind --tool=callgrind --separate-threads=no --trace-children=no
# (so redis-server, a child, is not counted), run twice per lock, SHORT and LONG
# seconds. A figure per cycle is the difference between the two runs divided by the
# difference in cycles: the start-up (runtime, connections, server, warm-up) cancels.
# Instruction counts do not depend on the machine's load, unlike timings; the parts
# that depend on timing (parking, timers, polls) still vary by a few per cent.
#
#   scripts/callgrind-cycle.sh              # 2 s and 6 s runs (about 4 minutes)
#   scripts/callgrind-cycle.sh 3 10 FILE    # 3 s and 10 s, the report also in FILE
#
# Prints, per lock: cycles and instructions of each run, the total per cycle, then the
# top functions per cycle by inclusive cost (callees included) and by self cost.
# BENCHMARKS.md groups these into items ("Client CPU, item by item").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/require-redis.sh
short=${1:-2}
long=${2:-6}
out=${3:-}
command -v valgrind >/dev/null || {
    echo "valgrind is needed: apt-get install valgrind" >&2
    exit 1
}

cargo bench --locked --bench locks --no-run >&2
binary=$(cargo bench --locked --bench locks --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$binary" ] || { echo "could not find the benchmark binary" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One run: prints "<cycles> <instructions>" and leaves the annotations in $work.
run() {
    local lock=$1 seconds=$2 file="$work/$1-$2"
    PROFILE_LOCK=$lock valgrind --tool=callgrind --separate-threads=no --trace-children=no \
        --callgrind-out-file="$file.out" -- "$binary" --profile "$seconds" >"$file.log" 2>&1
    callgrind_annotate --inclusive=yes --threshold=100 "$file.out" >"$file.incl" 2>/dev/null
    callgrind_annotate --inclusive=no --threshold=100 "$file.out" >"$file.self" 2>/dev/null
    local cycles instructions
    cycles=$(sed -n 's/^profile: \([0-9]*\) .*/\1/p' "$file.log")
    instructions=$(sed -n 's/^\([0-9,]*\) (100.0%) *PROGRAM TOTALS.*/\1/p' "$file.incl" | tr -d ,)
    echo "$cycles $instructions"
}

# Per-cycle cost of each function: (long − short) / (cycles long − cycles short).
per_cycle() {
    local a=$1 b=$2 cycles=$3 limit=$4
    awk -v cycles="$cycles" '
        FNR == 1 { file++ }
        /^ *[0-9,]+ \([ 0-9.]+%\) / {
            cost = $1; gsub(",", "", cost)
            name = $0; sub(/^ *[0-9,]+ \([ 0-9.]+%\) +/, "", name)
            sub(/ \[[^]]*\]$/, "", name); sub(/^[?][?][?]:/, "", name)
            if (file == 1) before[name] += cost; else after[name] += cost
        }
        END {
            for (name in after) {
                d = (after[name] - before[name]) / cycles
                if (d >= 50) printf "%10.0f  %s\n", d, substr(name, 1, 150)
            }
        }' "$a" "$b" | sort -rn | awk -v limit="$limit" 'NR <= limit'
}

{
    echo "# scripts/callgrind-cycle.sh $short $long  $(date -u '+%Y-%m-%d %H:%M UTC')  $(git rev-parse --short HEAD)"
    for lock in redlock rslock; do
        read -r c1 i1 < <(run "$lock" "$short")
        read -r c2 i2 < <(run "$lock" "$long")
        cycles=$((c2 - c1))
        echo
        echo "## $lock: $c1 cycles / $i1 instructions in ${short} s; $c2 / $i2 in ${long} s"
        echo "## per cycle: $(( (i2 - i1) / cycles )) instructions (client, user space)"
        echo "### inclusive (callees included), instructions per cycle"
        per_cycle "$work/$lock-$short.incl" "$work/$lock-$long.incl" "$cycles" 70
        echo "### self, instructions per cycle"
        per_cycle "$work/$lock-$short.self" "$work/$lock-$long.self" "$cycles" 30
    done
} | tee "$work/report"
if [ -n "$out" ]; then
    cp "$work/report" "$out"
fi
