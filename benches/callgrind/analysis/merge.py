"""The report's 19-item table: merges table.py's raw items (items.json, items-3-6.json, items-6-10.json)
for the new run (/tmp/cgruns2) with the 8266988 run (/tmp/cg/callgrind) as an extra column."""
import json
NEW = '/tmp/cgruns2'; OLD = '/tmp/cg/callgrind'; NS = 0.849
GROUPS = [
 ('Reply parsing on the connection driver task (`ValueCodec::decode_stream`, combine)', ['W: driver task: reply parsing']),
 ('Owner token + waitlist id formatting (`format!`/itoa/`join`/`String::clone` called from lock code; the hand-written tokens are now in #3/#14)', ['M: formatting']),
 ('redlock_runtime:: functions, self instructions', ['M: redlock_runtime:: functions (self)']),
 ('Serialising the commands (`write_command`, `args_len`, buffer growth)', ['M: redis-rs request: serialise']),
 ('Dropping the `ScriptInvocation`s and reply `Value`s', ['M: redis-rs: dropping']),
 ('Building the args (`ScriptInvocation` `write_arg`, `eval_cmd`; rslock: `Cmd::arg`, `cmd()`, `eval_cmd`)', ['M: redis-rs: building args']),
 ('Reply conversion in the caller (`FromRedisValue`, `Value::extract_error`)', ['M: redis-rs request: reply conversion']),
 ('redis-rs request plumbing (`Pipeline::send_recv`, `query_async`, ConnectionManager/Multiplexed wrappers, `invoke_async` self)', ['M: redis-rs request: Pipeline::send_recv', 'M: redis-rs request: rest', 'M: redis-rs: ScriptInvocation::invoke_async']),
 ('rslock only: `redis::Script::new` on every release (SHA-1 + hex)', ['M: redis-rs: Script::new']),
 ('tokio timers/Instant called from lock code (outer `timeout` in `acquire`; at 8266988 also `timeout_at` in `take_turn`)', ['M: tokio time', 'M: tokio Timeout::poll (self)']),
 ('Future wrappers: `Pin<P>::poll`/`PollFn` self and `tracing::Instrumented::poll` self', ['M: Pin/PollFn', 'M: tracing::Instrumented']),
 ('Turnstile HashMap (`HashMap::insert` + `hash_one` + `Arc<Turnstile>::default`)', ['M: HashMap']),
 ('metrics crate (`Key::builder`, recorder look-up), `metrics` feature on in the bench', ['M: metrics crate']),
 ('Allocator + memcpy called directly from lock-side code', ['M: allocator']),
 ("rslock's own code (rslock:: self, `JoinAll`/`MaybeDone` self, cycle_block self)", ['M: rslock:: functions', 'M: futures JoinAll', 'M: benchmark cycle_block']),
 ('Main thread misc (block_on/park, tokio sync calls, Instant in the bench, other)', ['M: main thread block_on', 'M: tokio sync', 'M: std Instant', 'M: other calls from lock side', 'M: (correction']),
 ('Worker park: timer wheel + I/O driver', ['W: worker park']),
 ('Worker scheduler loop (`Context::run` self, stats, steal, idle)', ['W: worker scheduler loop', 'W: worker threads outside']),
 ('Driver task, rest (socket read/write, `send_result`, mpsc recv, task harness)', ['W: driver task: socket', 'W: driver task: hand reply', 'W: driver task: take request', 'W: driver task: rest', 'W: tokio task poll', '(other: not under']),
]
def grouped(path):
    d = json.load(open(path)); out = {}
    for lock in ('redlock', 'rslock'):
        items = d[lock]['items']; vals = []; used = set()
        for _, prefixes in GROUPS:
            ks = [k for k in items if any(k.startswith(p) for p in prefixes)]
            assert not (used & set(ks)); used |= set(ks)
            vals.append(sum(items[k] for k in ks))
        assert used == set(items), set(items) - used
        assert abs(sum(vals) - d[lock]['total']) < 1, (sum(vals), d[lock]['total'])
        out[lock] = (vals, d[lock]['total'])
    return out
new = grouped(f'{NEW}/items.json'); n36 = grouped(f'{NEW}/items-3-6.json'); n610 = grouped(f'{NEW}/items-6-10.json')
old = grouped(f'{OLD}/items.json'); o36 = grouped(f'{OLD}/items-3-6.json'); o610 = grouped(f'{OLD}/items-6-10.json')
f = lambda x: f'{x:,.0f}'.replace('-0', '0') if round(x) != 0 else '0'
s = lambda x: ('+' if round(x) > 0 else '') + f(x)
print('| # | item | redlock at 8266988 (earlier report) | redlock now (bf4d5f9) | change | rslock (8266988 outputs, reused) | diff now (redlock − rslock) | spread of diff now (3–6 s / 6–10 s pairs) | ≈ µs/cycle diff now (0.849 ns/instr) | diff at 8266988 |')
print('|---|---|---:|---:|---:|---:|---:|---|---:|---:|')
for i, (label, _) in enumerate(GROUPS):
    r, o, b = new['redlock'][0][i], old['redlock'][0][i], new['rslock'][0][i]
    assert abs(b - old['rslock'][0][i]) < 0.5
    d36 = n36['redlock'][0][i] - n36['rslock'][0][i]; d610 = n610['redlock'][0][i] - n610['rslock'][0][i]
    print(f'| {i+1} | {label} | {f(o)} | {f(r)} | {s(r-o)} | {f(b)} | {s(r-b)} | {s(d36)} / {s(d610)} | {(r-b)*NS/1000:+.2f} | {s(o-b)} |')
R, O, B = new['redlock'][1], old['redlock'][1], new['rslock'][1]
T36 = n36['redlock'][1] - n36['rslock'][1]; T610 = n610['redlock'][1] - n610['rslock'][1]
print(f'| | **total (client, all threads)** | **{f(O)}** | **{f(R)}** | **{s(R-O)}** | **{f(B)}** | **{s(R-B)}** | {s(T36)} / {s(T610)} | **{(R-B)*NS/1000:+.1f}** | {s(O-B)} |')
print(f"\nItems sum: redlock now {sum(new['redlock'][0]):,.0f}, rslock {sum(new['rslock'][0]):,.0f}, redlock at 8266988 {sum(old['redlock'][0]):,.0f} (= the totals).")
