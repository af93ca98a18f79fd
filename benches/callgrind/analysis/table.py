"""Disjoint itemisation of client instructions per cycle (set-up cancelled by differencing)."""
import json, re, sys
from collections import defaultdict, OrderedDict
d = json.load(open('/tmp/cgruns2/edges.json'))
LOCKSIDE = re.compile(r'(redlock_runtime::(?!connection::Connection as redis)|^locks::scenarios::cycle_block|^locks::contenders|^rslock::(?!lock::RedisConnection as)|<rslock::(?!lock::RedisConnection as)|drop_in_place<rslock|MaybeDone<Fut> as core::future::future::Future>::poll|JoinAll<F> as core::future::future::Future>::poll|^<tracing::instrument::Instrumented<T> as core::future::future::Future>::poll$|^<core::pin::Pin<P> as core::future::future::Future>::poll$|^<tokio::time::timeout::Timeout<T> as core::future::future::Future>::poll$|^<core::future::poll_fn::PollFn<F> as core::future::future::Future>::poll$)')
def incl(lock, f):
    S = d[lock]['self']; E = d[lock]['edges']
    return S.get(f, 0) + sum(v for k, v in E.items() if k.split('\t')[0] == f)
def edge(lock, a, b): return d[lock]['edges'].get(a + '\t' + b, 0)
def children(lock, f):
    return {k.split('\t')[1]: v for k, v in d[lock]['edges'].items() if k.split('\t')[0] == f}
# Outgoing calls from the lock side, by callee
OUT = [
    ('redis-rs request: Cmd::query_async (serialise, send, await reply, convert)', r'^redis::cmd::Cmd::query_async|MultiplexedConnection as redis::aio::ConnectionLike>::req_packed_command|ConnectionManager as redis::aio::ConnectionLike>::req_packed_command|RedisConnection as redis::aio::ConnectionLike'),
    ('redis-rs: ScriptInvocation::invoke_async', r'^redis::script::ScriptInvocation::invoke_async'),
    ('redis-rs: Script::new per call (SHA-1 of the script + hex)', r'^redis::script::Script::new'),
    ('redis-rs: building args (write_arg, cmd(), eval_cmd)', r'(RedisWrite>::write_arg|^redis::cmd::cmd$|eval_cmd)'),
    ('redis-rs: dropping ScriptInvocation / Value', r'drop_in_place<redis::'),
    ('formatting: format!/itoa (owner tokens, waitlist ids)', r'(^alloc::fmt|itoa|^alloc::str::join_generic_copy|String as core::clone::Clone)'),
    ('allocator + memcpy (direct calls)', r'(__rust_alloc|__rust_dealloc|__rust_no_alloc|Arc<T,A>::drop_slow|__memcpy|__memcmp|Vec<T,A> as core::ops::drop::Drop|Vec<T> as alloc::vec::spec_from_iter|Vec<T,A> as core::clone::Clone|into_boxed_slice)'),
    ('metrics crate (Key::builder, recorder)', r'^metrics::'),
    ('HashMap (hash, insert) + Arc::default', r'(hash_one|hashbrown|Arc<T> as core::default::Default)'),
    ('tokio time (Timeout, Sleep, Instant)', r'^(tokio::time|<tokio::time|core::ptr::drop_in_place<core::option::Option<tokio::runtime::Timer)'),
    ('tokio sync (watch, Notify, Mutex, Semaphore)', r'(tokio::sync)'),
    ('std Instant (benchmark timing)', r'std::time::Instant'),
]
def item_out(name):
    for label, rx in OUT:
        if re.search(rx, name): return label
    return 'other calls from lock side'
def selfgroup(f):
    if re.search(r'Instrumented', f): return 'tracing::Instrumented::poll (self)'
    if re.search(r'^<core::pin::Pin<P>|PollFn', f): return 'Pin/PollFn::poll (self, inlined lock futures)'
    if re.search(r'Timeout<T> as', f): return 'tokio Timeout::poll (self)'
    if re.search(r'^locks::', f): return 'benchmark cycle_block (self; rslock: with its inlined lock/unlock)'
    if re.search(r'(MaybeDone|JoinAll)', f): return 'futures JoinAll/MaybeDone (self, rslock per-server futures)'
    if 'redlock_runtime' in f: return 'redlock_runtime:: functions (self)'
    if 'rslock' in f: return 'rslock:: functions (self)'
    return 'other lock-side self'
def itemise(lock):
    S = d[lock]['self']; E = d[lock]['edges']
    items = OrderedDict()
    def add(k, v): items[k] = items.get(k, 0) + v
    total = sum(S.values())
    # main thread
    bo = incl(lock, 'tokio::runtime::park::CachedParkThread::block_on')
    cb = edge(lock, 'locks::run::{{closure}}', 'locks::scenarios::cycle_block::{{closure}}')
    add('M: main thread block_on, park/unpark, locks::run (outside cycle_block)', bo - cb)
    inside = {f for f in S if LOCKSIDE.search(f)}
    lockside = 0
    for f in inside:
        add('M: ' + selfgroup(f), S[f]); lockside += S[f]
    req_total = 0
    seen_inv = set()
    for k, v in E.items():
        a, b = k.split('\t')
        if a in inside and b not in inside:
            lockside += v
            it = item_out(b)
            if it.startswith('redis-rs: ScriptInvocation::invoke_async'):
                if b in seen_inv: continue
                seen_inv.add(b)
                ch = children(lock, b)
                for c, cv in ch.items():
                    if 'eval_cmd' in c: add('M: redis-rs: building args (write_arg, cmd(), eval_cmd)', cv)
                    elif 'query_async' in c: req_total += cv
                    else: add('M: redis-rs: ScriptInvocation::invoke_async (self, frees)', cv)
                add('M: redis-rs: ScriptInvocation::invoke_async (self, frees)', S.get(b, 0))
            elif it.startswith('redis-rs request'):
                req_total += v
            else:
                add('M: ' + it, v)
    # the request path, split by what it does
    reqc = [f for f in S if re.search(r'(ConnectionManager|MultiplexedConnection) as redis::aio::ConnectionLike>::req_packed_command::\{\{closure\}\}$', f)]
    ser = sum(edge(lock, f, c) for f in reqc for c in ('redis::cmd::write_command', 'redis::cmd::args_len', 'alloc::raw_vec::RawVecInner<A>::reserve::do_reserve_and_handle'))
    sr = incl(lock, 'redis::aio::multiplexed_connection::Pipeline::send_recv::{{closure}}')
    conv = sum(v for k, v in E.items() if k.startswith('redis::cmd::Cmd::query_async::{{closure}}\t') and re.search(r'(FromRedisValue|extract_error)', k))
    add('M: redis-rs request: serialise command (write_command, args_len, buffer)', ser)
    add('M: redis-rs request: Pipeline::send_recv (mpsc send, oneshot wait, response timeout timer)', sr)
    add('M: redis-rs request: reply conversion (FromRedisValue, extract_error)', conv)
    add('M: redis-rs request: rest (query_async, ConnectionManager/Multiplexed wrappers, boxed futures)', req_total - ser - sr - conv)
    # the warm-up's calls difference out to ~0; lockside also holds cycle_block via warm_up (noise)
    add('M: (correction: lock side counted via other parents)', cb - lockside)
    # workers
    run = incl(lock, 'tokio::runtime::scheduler::multi_thread::worker::Context::run')
    fwd = [f for f in S if re.search(r'^<futures_util::stream::stream::(forward::)?Forward<', f)]
    fwd_incl = sum(incl(lock, f) for f in fwd)
    dec = incl(lock, 'redis::parser::aio_support::ValueCodec::decode_stream')
    rd = incl(lock, 'tokio_util::util::poll_buf::poll_read_buf')
    wr = incl(lock, '<tokio_util::codec::framed_impl::FramedImpl<T,U,W> as futures_sink::Sink<I>>::poll_flush')
    sr = incl(lock, 'redis::aio::multiplexed_connection::PipelineSink<T>::send_result')
    rx = sum(edge(lock, f, 'tokio::sync::mpsc::chan::Rx<T,S>::recv') for f in fwd)
    add('W: driver task: reply parsing (ValueCodec::decode_stream, combine)', dec)
    add('W: driver task: socket read (poll_read_buf)', rd)
    add('W: driver task: socket write (FramedImpl::poll_flush)', wr)
    add('W: driver task: hand reply to caller (send_result, oneshot)', sr)
    add('W: driver task: take request (mpsc Rx::recv)', rx)
    add('W: driver task: rest of Forward/PipelineSink/FramedImpl', fwd_incl - dec - rd - wr - sr - rx)
    rt = incl(lock, 'tokio::runtime::scheduler::multi_thread::worker::Context::run_task')
    add('W: tokio task poll/harness around the driver task', rt - fwd_incl)
    pk = incl(lock, 'tokio::runtime::scheduler::multi_thread::worker::Context::park_internal')
    io = incl(lock, 'tokio::runtime::io::driver::Driver::turn')
    add('W: worker park: I/O driver turn (epoll_wait, readiness)', io)
    add('W: worker park: timer wheel + condvar + rest', pk - io)
    add('W: worker scheduler loop (Context::run self, pow/Instant stats, steal, idle)', run - rt - pk)
    st = incl(lock, 'start_thread')
    add('W: worker threads outside Context::run', st - run)
    add('(other: not under main or worker threads)', total - bo - st)
    return total, items
if __name__ == '__main__':
    R = {l: itemise(l) for l in ('redlock', 'rslock')}
    keys = list(OrderedDict.fromkeys(list(R['redlock'][1]) + list(R['rslock'][1])))
    json.dump({l: {'total': R[l][0], 'items': R[l][1]} for l in R}, open('/tmp/cgruns2/items.json', 'w'))
    for k in keys:
        a = R['redlock'][1].get(k, 0); b = R['rslock'][1].get(k, 0)
        print(f'{a:9.0f} {b:9.0f} {a-b:+9.0f}  {k}')
    print(f"{R['redlock'][0]:9.0f} {R['rslock'][0]:9.0f} {R['redlock'][0]-R['rslock'][0]:+9.0f}  TOTAL; sum of items {sum(R['redlock'][1].values()):.0f} {sum(R['rslock'][1].values()):.0f}")
