import re
def split_as(name):
    """'<A as B>::m' -> (A, B); None otherwise."""
    if not name.startswith('<'): return None
    depth = 0
    for i, ch in enumerate(name):
        if ch == '<': depth += 1
        elif ch == '>':
            depth -= 1
            if depth == 0:
                inner = name[1:i]
                # find ' as ' at depth 0 of inner
                d = 0
                for j in range(len(inner)):
                    c = inner[j]
                    if c == '<': d += 1
                    elif c == '>': d -= 1
                    elif d == 0 and inner.startswith(' as ', j):
                        return inner[:j], inner[j+4:]
                return inner, None
    return None
STD = ('core::', 'alloc::', 'std::', '&', '*', '[', '(')
def key_of(name):
    name = re.sub(r' \[[^\]]*\]$', '', name)
    m = re.match(r'core::ptr::drop_in_place<(.*)>$', name)
    if m: return key_of(m.group(1))
    s = split_as(name)
    if s:
        a, b = s
        a = a.lstrip('&*').replace('mut ', '').replace('dyn ', '')
        if not a.startswith(STD) and not re.match(r'^[A-Z]\w*$', a): return a
        if b and not b.startswith(STD): return b
        if a.startswith(('core::pin::Pin<', 'alloc::boxed::Box<', 'core::option::Option<', 'alloc::sync::Arc<', 'alloc::vec::Vec<', 'core::result::Result<')):
            inner = re.match(r'[\w:]+<(.*)>$', a)
            if inner and not inner.group(1) in ('P', 'T', 'F', 'T,A', 'T, A'):
                return key_of(inner.group(1) + '::x')
        return a if not b else (a if not a.startswith(STD) else b + '|' + a)
    return name
RULES = [
    ('allocator (malloc/free, __rust_alloc, RawVec growth)', r'^(malloc|_int_malloc|free|_int_free|malloc_consolidate|realloc|_int_realloc|calloc|unlink_chunk|tcache|sysmalloc|__libc_malloc|__libc_free|cfree|__rustc::__r|alloc::raw_vec|<alloc::raw_vec|alloc::alloc::|__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_)'),
    ('libc memcpy/memset/memcmp', r'^(__mem|mem|__strlen|strlen|__bcmp|bcmp|__strchr|__memchr)'),
    ('clock (clock_gettime, Instant/Timespec)', r'(clock_gettime|__vdso|Timespec|std::time::Instant|Instant>::now|^std::time)'),
    ('formatting (core::fmt, alloc::fmt, itoa)', r'(^core::fmt|^alloc::fmt|core::fmt::|itoa|^<alloc::string::String as core::fmt|alloc::string::ToString|pad_integral|^alloc::string::)'),
    ('sha1/hex (script hashing)', r'(sha1|hex::)'),
    ('uuid/rand/getrandom', r'(^uuid|^rand|chacha|getrandom|fastrand)'),
    ('tracing', r'^(tracing|tracing_core)'),
    ('metrics crate (incl. rapidhash of metric keys)', r'^(metrics|rapidhash)'),
    ('hashing (HashMap/SipHash)', r'(core::hash|std::hash|hashbrown|DefaultHasher|SipHasher)'),
    ('redis: reply parsing (combine, redis::parser)', r'^(combine|redis::parser|redis::types::FromRedisValue|redis::types::Value|redis::types::.*from_redis|<redis::types)'),
    ('redis: command building (Cmd, args, EVALSHA)', r'^(redis::cmd|redis::types|redis::script::ScriptInvocation::eval_cmd|redis::script::Script::key|redis::script::ScriptInvocation::(arg|key))'),
    ('redis: script invoke (ScriptInvocation::invoke_async, Script)', r'^redis::script'),
    ('redis: ConnectionManager', r'^redis::aio::connection_manager'),
    ('redis: multiplexed connection (Pipeline, PipelineSink, driver)', r'^redis::aio::multiplexed'),
    ('redis: other', r'^redis'),
    ('tokio: time (timer wheel, Sleep, Timeout)', r'^tokio::(runtime::time|time)'),
    ('tokio: io (registration, TcpStream)', r'^(tokio::(runtime::io|net|io)|mio|tokio_util::util::poll_buf)'),
    ('tokio_util codec (Framed)', r'^tokio_util'),
    ('tokio: sync (mpsc, oneshot, Notify, Semaphore, Mutex)', r'^tokio::sync'),
    ('tokio: scheduler/task/park', r'^tokio'),
    ('futures', r'^futures'),
    ('parking_lot', r'^parking_lot'),
    ('std sync/thread', r'^std::(sys|sync|thread|panicking)'),
    ('arc_swap', r'^arc_swap'),
    ('redlock_runtime', r'^redlock_runtime'),
    ('rslock', r'^rslock'),
    ('benchmark loop (locks::)', r'^locks::'),
    ('libm pow', r'pow'),
    ('syscall stubs (epoll_wait, read, write, futex, syscall)', r'^(epoll|__GI|__libc|syscall|read|write|recv|send|__send|__recv|__read|__write|writev|__writev|__futex|futex|sched_yield|__lll|pthread|__pthread|eventfd|__poll|___pthread|_dl|__tls|__close|close|__errno)'),
]
def group(name):
    k = key_of(name)
    for g, rx in RULES:
        if re.search(rx, k): return g
    # second try on the raw name
    raw = re.sub(r' \[[^\]]*\]$', '', name)
    for g, rx in RULES:
        if re.search(rx, raw): return g
    return 'other: ' + k[:60]
