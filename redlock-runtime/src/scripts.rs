//! The Lua scripts that make each lock operation one atomic round trip.
//!
//! Each is a `redis::Script`: sent as EVALSHA, loaded on the NOSCRIPT reply (after a
//! Redis restart too). The lock key is a string with the lease as its expiry.
//!
//! ## The lock's value
//! `<owner> <fencing token> <since ms> <name>`: the owner token (random, no spaces),
//! which every compare-and-set checks (`owned_by`: the value starts with the token and
//! a space); the fencing token it was given; when it was taken (server clock, ms); and
//! the holding client's name (may hold spaces: it runs to the end); the time is
//! followed by `~` once an attempt found the lock busy (see [`CONTENDED`]). So who holds a lock,
//! since when and with which token is read from the lock itself — no side key, nothing
//! that outlives the lock, and no extra round trip to acquire. A key kept for
//! `hold_at_least` reads `kept:` and the same; one reserved for the next waiter reads
//! `reserved:<waiter id>`.
//!
//! ## Fencing tokens
//! One counter key, [`FENCE_KEY`], is shared by every lock of a Redis server (on a
//! cluster, one per slot): the state fencing needs is bounded, however many lock names
//! are ever used. Each acquisition takes `max(counter + 1, server clock in µs)` and
//! writes it back (one `SET … GET` with the clock's digits in the common case: the
//! counter is rewritten only on a tie). So a token is never below the clock of the
//! server that issued it,
//! and the counter is only ever needed to order acquisitions within one microsecond:
//! - tokens strictly increase per key (across all keys of a server, in fact) while
//!   the counter survives;
//! - when it does not — a restart from a stale snapshot or AOF, a restart empty, a
//!   replica promoted before the last increments reached it, a slot moved to another
//!   shard — the next token is the new server's clock, which is above every earlier
//!   token as long as that clock is not behind the previous server's clock at its last
//!   acquisition by more than the time the switch took (a restart, a failover: at least
//!   milliseconds, usually seconds). The counter's lead over the clock stays below one
//!   (a script takes well over a microsecond), so no rate assumption is needed;
//! - they stay below 2^53, exact in Lua's doubles, until the year 2255.
//!
//! ## Restarted RedLock masters
//! With RedLock, a master that may have lost data (restarted empty or from a stale
//! snapshot, a replica promoted behind its address, a flush) must not count toward a
//! majority until every lock it may have forgotten has expired. The acquire script
//! keeps a restart marker, [`BOOT_KEY`], naming the process that serves the data and
//! since when; a change of process starts a quarantine there and then, which each
//! client compares with its `max_lease`: see `Boot` in the `node` module. A master of
//! a new deployment sits one out too, unless an operator vouches for it ([`VOUCH`]:
//! only when it holds no redlock data), which marks it with no quarantine.

use std::sync::LazyLock;

/// The key of the shared fencing counter.
pub(crate) const FENCE_KEY: &str = "redlock:fence";

/// The key of a RedLock master's restart marker.
pub(crate) const BOOT_KEY: &str = "redlock:boot";

/// Every key the library keeps starts with this; lock keys may not.
pub(crate) const RESERVED_PREFIX: &str = "redlock:";

/// Prefixes of a key's waitlist and of their registrations' expiries.
pub(crate) const WAITLIST_PREFIX: &str = "redlock:waitlist:";
pub(crate) const WAITLIST_EXPIRY_PREFIX: &str = "redlock:waitlist-expiry:";

/// Prefix of a key's eviction marker: [`FORCE_UNLOCK`] leaves the evicted owner's token
/// there, expiring with the lease it evicted, so that the holder's next renewal,
/// extension or release can tell it was force-unlocked (see [`GONE`]). A hand-off
/// leaves its evidence there too (see [`HANDED_MARK`]).
pub(crate) const FORCED_PREFIX: &str = "redlock:forced:";

/// The eviction marker reads `handed:<owner>` after an acquire script deleted `owner`'s
/// lock to take it over (a hand-off inside a client): the releasing holder, when it
/// cannot hear its taker's verdict (the taker was cancelled or is not polled after
/// sending its script), releases in Redis, and the release script's [`GONE`] tells
/// "handed off" from "lost" by it. It expires after the time the client gives the
/// holder to read it (see `node`'s `hand_off_evidence_ms`), and is never written over an
/// eviction's marker: the holder then reports the lock lost, a false alarm.
pub(crate) const HANDED_MARK: &str = "handed:";

/// Lua that leaves the evidence of a hand-off of `previous`'s lock (see
/// [`HANDED_MARK`]) in the eviction marker `marker`, for `ms` milliseconds.
fn leave_evidence(marker: &str, previous: &str, ms: &str) -> String {
    format!(
        r#"
local evidence = {marker}
local before = redis.pcall('GET', evidence)
if not before or (type(before) == 'string' and string.sub(before, 1, {len}) == '{HANDED_MARK}') then
  redis.call('SET', evidence, '{HANDED_MARK}' .. {previous}, 'PX', {ms})
end
"#,
        len = HANDED_MARK.len(),
    )
}

/// Lua that is true when the waitlist id `id` is a writer's (not a reader's: see
/// [`READER_ID_PREFIX`]).
fn is_writer(id: &str) -> String {
    format!(
        "(string.sub({id}, 1, {len}) ~= '{READER_ID_PREFIX}')",
        len = READER_ID_PREFIX.len()
    )
}

/// Lua that is true when the lock value `value` (a local: it is read more than once)
/// belongs to the owner token `owner`: the value starts with the token and a space. Shared by every
/// script that compares before it writes; spliced as an expression rather than defined
/// as a function, which would be a closure made anew on every run (see [`next_token`]).
/// A plain search and a byte, not two new strings (a cut and the token with its space):
/// every release runs it, and each string Lua makes is hashed, and collected later.
fn owned_by(value: &str, owner: &str) -> String {
    format!(
        "(type({value}) == 'string' and string.find({value}, {owner}, 1, true) == 1 and string.byte({value}, #{owner} + 1) == 32)"
    )
}

/// `gone(marker, owner)`: the reply of a release, extension or renewal that found the
/// lock not `owner`'s: -1 when the eviction marker `marker` names this owner (it was
/// force-unlocked; a key held in shares names each evicted share's owner, separated
/// by spaces), -2 when it holds the evidence that this owner's lock was handed off
/// (see [`HANDED_MARK`]), else 0. Read only on that path: what succeeds costs nothing
/// more.
static GONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
local function gone(marker, owner)
  local forced = redis.pcall('GET', marker)
  if type(forced) == 'string' then
    if forced == '{HANDED_MARK}' .. owner then
      return -2
    end
    if string.find(' ' .. forced .. ' ', ' ' .. owner .. ' ', 1, true) then
      return -1
    end
  end
  return 0
end
"#
    )
});

/// Prefix of the channel a release is published on; the lock key follows it.
pub(crate) const RELEASE_CHANNEL_PREFIX: &str = "redlock:released:";

/// A Lua script with its source. `redis::Script` keeps the source to itself, and a
/// load whose reply is checked needs to send it (see [`Lua::load_checked`]); everything
/// else uses the script through `Deref`.
pub(crate) struct Lua {
    script: redis::Script,
    code: String,
}

impl Lua {
    fn new(code: String) -> Self {
        Lua {
            script: redis::Script::new(&code),
            code,
        }
    }

    /// `SCRIPT LOAD`s the script, and checks that the SHA1 Redis answers is its own: a
    /// reply out of step (another request's) is an error, not a script believed loaded.
    /// (`Script::load_async` only `debug_assert`s it: a release build goes on, a debug
    /// build panics.)
    pub(crate) async fn load_checked(
        &self,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<()> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.code)
            .query_async(connection)
            .await?;
        loaded_as(self.get_hash(), &sha)
    }
}

impl std::ops::Deref for Lua {
    type Target = redis::Script;

    fn deref(&self) -> &redis::Script {
        &self.script
    }
}

/// Whether `SCRIPT LOAD` answered the script's own SHA1 (`expected`).
fn loaded_as(expected: &str, answered: &str) -> redis::RedisResult<()> {
    if answered.eq_ignore_ascii_case(expected) {
        return Ok(());
    }
    tracing::warn!(
        expected,
        answered,
        "redlock: SCRIPT LOAD answered another script's SHA1: the connection's replies are out of step"
    );
    Err(redis::RedisError::from((
        redis::ErrorKind::Client,
        "replies out of step: SCRIPT LOAD answered another script's SHA1",
        format!("expected {expected}, got {answered}"),
    )))
}

/// The source of the script of SHA1 `sha` (hex, as `EVALSHA` names it), if it is one of
/// [`all`].
pub(crate) fn source_of(sha: &[u8]) -> Option<&'static str> {
    all()
        .into_iter()
        .find(|script| script.get_hash().as_bytes().eq_ignore_ascii_case(sha))
        .map(|script| script.code.as_str())
}

/// Every script the client runs on its servers, loaded at connect (`Node::load_scripts`).
pub(crate) fn all() -> [&'static Lua; 11] {
    [
        &ACQUIRE,
        &ACQUIRE_ALL,
        &SHARED_ACQUIRE,
        &RELEASE,
        &LEAVE_WAITLIST,
        &LAPSED_GRANT,
        &EXTEND,
        &INSPECT,
        &FORCE_UNLOCK,
        &RAISE_FENCE,
        &VOUCH,
    ]
}

/// KEYS: lock, fence counter, waitlist, and with RedLock the restart marker (off a
/// cluster, without the marker, the lock key alone: the other two are derived). The
/// waitlist's expiries key is derived from the waitlist's (see [`companion_of`]): one
/// key fewer to send and to read on every call. On a cluster it is declared instead, as
/// KEYS[5] (KEYS[4] is then the lock key again, untouched): while its slot migrates, a
/// script with every key declared is refused whole (`TRYAGAIN`, retried) rather than
/// failing half-way at an undeclared key that has already moved. A hand-off on a
/// cluster declares the eviction marker as well, as `KEYS[6]`: it leaves its evidence
/// there (see [`HANDED_MARK`]); elsewhere it is derived.
/// ARGV: owner token, lease in ms, the client's name, this waiter's id (empty for an
/// attempt that will not wait, and with RedLock, which keeps no waitlist), "1" if an
/// earlier attempt may have registered it on the waitlist ("0" when left out), how long
/// a registration outlives the holder's lease (ms; [`REGISTRATION_SLACK_MS`] when left
/// out), the publish command (PUBLISH when left out): off a cluster each of these three
/// is left out when it is the default and nothing follows it, so that an uncontended
/// attempt sends four arguments
/// (each costs Redis a parse and a Lua string); then, only when needed, the
/// owner token of a same-client holder handing the lock off (its lock, if still there,
/// is deleted first: see `turn`'s hand-off), the restart quarantine in ms (RedLock
/// only) and, with a hand-off, how long its evidence lasts in ms. The release channel
/// is not sent: [`companion_of`] derives it.
///
/// A waiter that fails registers on the key's waitlist (a sorted set by arrival; a second
/// one holds each registration's expiry, so that waiters that died are dropped); a
/// release reserves the key for the waitlist's head (`reserved:<id>`, for a short grace)
/// and names it in its message; the named waiter's attempt takes the reservation and
/// announces it with its lease (`T:<ms>`; a hand-off inside a client does the same),
/// the others keep waiting without a round trip, until that lease ends at the latest.
/// A writer waiting on readers (the key holds `shared:0`) is told to come back within
/// [`WRITER_REFRESH_MS`] instead, and its registration outlives that by the slack:
/// it holds new readers back (see [`SHARED_ACQUIRE`]), so it must lapse soon after a
/// writer that died without leaving the line.
///
/// The path without contention is three commands: `TIME`, the fencing counter's
/// `SET … GET` and the lock's `SET NX PX GET` with its final value (Redis 7.0: on a busy
/// key, the same call answers what holds it). An attempt that finds
/// the key busy marks the holder's lock *contended* (see [`CONTENDED`]), so that its
/// release is published; a lock that nobody found busy is released without a message.
///
/// Returns `{1, token, handed_off, boot, left}` when acquired (`handed_off` = 1 if the
/// previous owner's lock was found and deleted) — just `token`, its digits, when
/// `handed_off` and `boot` are 0: the common reply, the cheapest for the client to
/// read — `{0, pttl, boot, 0, floor, ms, registered, left}` when held by another owner
/// or reserved for another waiter (`floor`: the token this attempt took, above every
/// grant made before it and below every grant made after it: a grant message at or
/// below it is stale, see `acquire`'s `wait_for_news`; `ms`: the server clock;
/// `registered`: 1 when this attempt put the waiter in line, at `ms`), `{-1, type,
/// boot, left}` when the key holds something redlock did not write. `boot`: 0 the
/// master may vote; 2 its quarantine runs and it may have forgotten locks that are
/// still running, for `left` ms more (rounded up; 0 when it votes). New fields go at
/// the end of each reply: `node`'s `parse_attempt` reads the ones it knows.
///
/// The restart marker [`BOOT_KEY`] holds `<run_id>:<since µs>:<origin>`: the process
/// that serves the data, since when (server clock) its quarantine runs (0: none — only
/// with the origin `vouched`, which [`VOUCH`] writes for a master of a deployment an
/// operator vouches for; an older client's `0:blank` adoption is quarantined once), and whether it
/// started `blank` (no marker at all) or from `stale` data (another process's marker).
/// Whenever the marker does not name the running process — a restart, a promotion, a
/// flush — the quarantine starts anew at that moment, so data lost without a restart
/// is caught too, and each client compares it with its own `max_lease`. A master with
/// no marker is quarantined like any other: a fresh master and one that lost
/// everything look the same from its data, its process and its uptime alike (a
/// rolling restart of every master without persistence leaves them all blank and
/// young while a lock runs), so no answer, not even every master's, may be taken for
/// a fresh deployment. The cost is availability, once: a first deployment (or one
/// that forgot everything) answers `NoQuorum` until `max_lease` has passed since a
/// client first found it so — unless an operator, who knows it is new, vouches for
/// its masters ([`VOUCH`]).
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
-- Off a cluster, and without a restart marker, only the lock key is sent: the fencing
-- counter and the waitlist are derived, and the publish command (ARGV[7]) defaults to
-- PUBLISH. Each argument costs Redis a parse and a Lua string on every acquisition.
-- The waitlist's name is made only on the paths that use it: an uncontended
-- acquisition does not.
local KEYS = {{KEYS[1], KEYS[2] or '{FENCE_KEY}', KEYS[3], KEYS[4], KEYS[5], KEYS[6]}}
local publish = ARGV[7] or 'PUBLISH'
local boot, left = 0, 0
if ARGV[9] and ARGV[9] ~= '' then
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
  local now = redis.call('TIME')
  local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local marker = redis.pcall('GET', KEYS[4])
  local id, since, origin
  if type(marker) == 'string' then
    id, since, origin = string.match(marker, '^(%w+):(%d+):(%a+)$')
  end
  -- A marker without quarantine (since 0) counts only when vouched for by hand: older
  -- clients wrote `:0:blank` for every master they all found blank, which a rolling
  -- restart of every master also produces.
  if id ~= run_id or (since == '0' and origin ~= 'vouched') then
    if id == run_id then
      origin = 'blank'
    elseif type(marker) == 'string' then
      origin = 'stale'
    else
      origin = 'blank'
    end
    since = now_us
    redis.call('SET', KEYS[4], run_id .. ':' .. string.format('%.0f', since) .. ':' .. origin)
  end
  since = tonumber(since)
  local ends = since + tonumber(ARGV[9]) * 1000
  if since ~= 0 and now_us <= ends then
    boot = 2
    -- How long it still sits out (ms, rounded up): the client names it in `NoQuorum`.
    left = math.ceil((ends - now_us) / 1000)
  end
end
local handed_off = 0
local previous = ARGV[8]
if previous and previous ~= '' then
  {waitlist}
  local held = redis.pcall('GET', KEYS[1])
  if {previous_owns} then
    redis.call('DEL', KEYS[1])
    handed_off = 1
    {evidence}
  end
end
{token}
-- Who holds it, with which token, since when (ms): read by `inspect`. A key that
-- changes hands here (a hand-off, a reservation taken) may have waiters listening:
-- its lock is contended from the start. Each value is made in one concatenation:
-- every string Lua makes is hashed and later collected, and an uncontended
-- acquisition makes few.
local contended = ' '
if handed_off == 1 then contended = '{CONTENDED} ' end
-- Taken if free; otherwise `GET` answers what holds it, in the same call (WRONGTYPE for
-- a key of another type: not a lock). Any other error is the server's (before 7.0,
-- NX with GET is a syntax error) and goes to the client as it is, named.
local value = redis.pcall('SET', KEYS[1], {value_marked_by_contended}, 'NX', 'PX', ARGV[2], 'GET')
if type(value) == 'table' and value.err and not string.find(value.err, '^WRONGTYPE') then
  return redis.error_reply('redlock needs Redis 7.0 or newer (SET NX GET): ' .. value.err)
end
local acquired = not value
local reserved = false
local taken_grant = false
if not acquired then
  -- A release granted the key to this waiter while this attempt was on its way (see
  -- `free_for_next`): the attempt takes it, as it would a reservation.
  -- Granted: the holder's owner token, up to the value's first space, is this waiter's
  -- id, which its member starts with, followed by a space (plain comparisons: this
  -- runs on every attempt that finds the key busy).
  local space = ARGV[4] ~= '' and type(value) == 'string' and string.find(value, ' ', 1, true)
  taken_grant = space and string.sub(value, 1, space) == string.sub(ARGV[4], 1, space)
  if taken_grant or (space and string.byte(value, 1) == 114 and value == 'reserved:' .. ARGV[4]) then
    -- Taken, its grant or its reservation. After its own grant (`taken_grant`) no `T:`
    -- follows: the other waiters heard what they need when it was made (`free_for_next`
    -- announces a grant of a shorter lease), and this lease, counted from now, ends no
    -- sooner than that one.
    redis.call('SET', KEYS[1], {contended_value}, 'PX', ARGV[2])
    acquired = true
    reserved = true
  else
    -- Not taken: the token goes unused (tokens only need to rise), but a counter this
    -- attempt created would be left behind.
    if not last then
      redis.call('DEL', KEYS[2])
    end
    if type(value) ~= 'string' then
      return {{-1, redis.call('TYPE', KEYS[1])['ok'], boot, left}}
    end
  end
end
if acquired then
  if ARGV[5] == '1' or reserved then
    {waitlist}
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('ZREM', {expiries}, ARGV[4])
    if not reserved and handed_off == 0 and redis.call('EXISTS', KEYS[3]) == 1 then
      -- A waiter took a free key (a grant ahead of it lapsed, a holder's lease ran
      -- out) while others wait: contended, so that its release goes to the line, and
      -- its lease announced, which may end sooner than the one they were told (as a
      -- lapsed grant's check announces the grant it passes on).
      redis.call('SET', KEYS[1], {contended_value}, 'PX', ARGV[2])
      redis.call(publish, {channel}, 'T:' .. ARGV[2])
    end
  end
  if (reserved and not taken_grant) or handed_off == 1 then
    -- The key changed hands: tell the other waiters when the new lease ends, which may
    -- be sooner than the lease they were told (tests/model.rs found them asleep on a
    -- free key otherwise).
    redis.call(publish, {channel}, 'T:' .. ARGV[2])
  end
  if handed_off == 0 and boot == 0 then
    -- The common case, the token alone: a reply the client reads without an array.
    return token
  end
  return {{1, token, handed_off, boot, left}}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return {{-1, 'string', boot, left}}
end
{mark_contended}
local ms = tonumber(since_ms)
local registered = 0
if ARGV[4] ~= '' then
  if value == 'shared:0' then
    -- Readers hold it, and this writer's registration holds new readers back: come
    -- back soon, so that it lapses soon after this writer is gone (killed).
    ttl = math.min(ttl, {WRITER_REFRESH_MS})
  end
  {waitlist}
  local expiries = {expiries}
  -- Read before this registration: -2 when nobody was in line (an empty line is no key).
  local line_ttl = redis.call('PTTL', KEYS[3])
  registered = redis.call('ZADD', KEYS[3], 'NX', ms, ARGV[4])
  -- (The first byte a hex digit: a lock's owner token, not `kept:`, `reserved:`.)
  local first = string.byte(value, 1)
  if marked and string.byte(value, since_at + 1) == {unconfirmed_byte}
      and (first <= 57 or (first >= 97 and first <= 102)) then
    -- A grant not confirmed yet (its grantee confirms a while later, or releases), with
    -- another waiter ahead in line: that one covers the grant's lapse (see
    -- `UNCONFIRMED`), so this one sleeps its own lease, not the grace, and its
    -- registration lasts as long. A waiter new to the line has others ahead when the
    -- line was there before it (one command fewer than its rank, on nearly every join
    -- under contention); one in line already is ranked. Those in line joined earlier,
    -- save one of the same millisecond (or after the server's clock stepped back)
    -- ranked behind it: this waiter then sleeps its own lease as first in line, where
    -- the grace is one more cover, not the one relied on (see `UNCONFIRMED`).
    local behind
    if registered == 1 then
      behind = line_ttl ~= -2
    else
      behind = redis.call('ZRANK', KEYS[3], ARGV[4]) > 0
    end
    if behind then
      ttl = math.max(ttl, tonumber(ARGV[2]))
    end
  end
  {register}
end
-- The token this attempt took is the grant floor: every grant made before it has a
-- lower one, every grant made after it a higher one. The server clock, and whether
-- this attempt put the waiter in line, time a later grant (see `acquire`).
return {{0, ttl, boot, 0, token, ms, registered, left}}
"#,
        token = next_token("KEYS[2]"),
        value_marked_by_contended = lock_value("contended"),
        contended_value = lock_value(&format!("'{CONTENDED} '")),
        waitlist = format!("KEYS[3] = KEYS[3] or '{WAITLIST_PREFIX}' .. KEYS[1]"),
        previous_owns = owned_by("held", "previous"),
        evidence = leave_evidence(
            &format!(
                "(KEYS[6] or {})",
                companion_of("KEYS[1]", "KEYS[3]", FORCED_PREFIX)
            ),
            "previous",
            "ARGV[10]"
        ),
        channel = companion_of("KEYS[1]", "KEYS[3]", RELEASE_CHANNEL_PREFIX),
        expiries = format!(
            "(KEYS[5] or {})",
            companion_of("KEYS[1]", "KEYS[3]", WAITLIST_EXPIRY_PREFIX)
        ),
        mark_contended = mark_contended("KEYS[1]", "value"),
        unconfirmed_byte = UNCONFIRMED as u8,
        register = register_expiry(
            "KEYS[3]",
            "expiries",
            "ARGV[4]",
            &format!("ms + ttl + tonumber(ARGV[6] or '{REGISTRATION_SLACK_MS}')"),
            Some("line_ttl"),
        ),
    ))
});

/// Lua for the lock value [`ACQUIRE`] writes, `<owner> <token> <since ms><mark> <name>`,
/// made in one concatenation from its locals `clock` and `since_ms` and its arguments;
/// `mark` is a Lua expression for the contended mark and the space after it (see
/// [`CONTENDED`]).
fn lock_value(mark: &str) -> String {
    format!("ARGV[1] .. ' ' .. clock .. ' ' .. since_ms .. {mark} .. ARGV[3]")
}

/// How long a waiter's registration outlives the lease it was told (ms): it refreshes
/// it by attempting when that lease ends at the latest. [`ACQUIRE`]'s default.
pub(crate) const REGISTRATION_SLACK_MS: u64 = 2_000;

/// A grant's start time begins with this digit until its grantee confirms it
/// (`<id> <token> 0<since ms>~ <name>`: a start time never begins with 0, and the
/// value still reads as a lock's). An attempt that finds the key so granted, with
/// another waiter ahead of it in line, is told its own lease rather than the grant's
/// grace: the grantee confirms later (a quarter of the grace after the grant, which
/// extends the key without a message to the line) or releases first (which grants the
/// next in line), and every waiter that joined while the grant was young would
/// otherwise wake at its lapse and attempt for nothing — one script more per
/// acquisition once a waiter waits longer than a grace (48 processes holding 1.6 ms
/// each). The lapse of a grant nobody picks up stays the waiter told `N`'s (its client
/// keeps the lapse across its attempts), or else the releasing client's; the first in
/// line keeps the grace as one more cover (tests/model.rs checks the rule).
pub(crate) const UNCONFIRMED: char = '0';

/// Lua that records when the registration `id` on the line `line` lapses (`until_ms`,
/// server clock) in the line's expiries `expiries`, and makes both keys last past the
/// latest registration. Under steady contention each join lapses later than the joins
/// before it (the holder changes, and a waiter behind an unconfirmed grant is told its
/// own lease): setting both keys' expiry whenever a join lapsed later than the latest
/// cost a read and two commands on nearly every join. Instead they are given
/// [`REGISTRATION_SLACK_MS`] more than needed, and set again only when the line's
/// expiry no longer covers this registration: about once per slack under steady
/// contention, and on the join that creates the line (no expiry yet). An empty line is
/// gone at once (Redis deletes an empty sorted set). The line's expiry stands for both
/// keys: every script adds and removes a registration in both and sets both expiries
/// together, so they come and go together (under `noeviction`, RELIABILITY.md's
/// assumption; an expiries key deleted by hand alone would be made again without an
/// expiry until the next refresh). A line whose waiters all died without leaving it
/// outlives the last registration by the slack at most. Expects
/// the server clock in ms in `ms`. `line_ttl`: a Lua local holding the line's `PTTL`,
/// read by the caller before it added the registration (a registration changes no
/// expiry, and a line it made has none: -2 before it, -1 after, both short); `None`:
/// read here.
fn register_expiry(
    line: &str,
    expiries: &str,
    id: &str,
    until_ms: &str,
    line_ttl: Option<&str>,
) -> String {
    let line_ttl = match line_ttl {
        Some(local) => local.to_owned(),
        None => format!("redis.call('PTTL', {line})"),
    };
    format!(
        r#"
  local lapses = {until_ms}
  redis.call('ZADD', {expiries}, lapses, {id})
  if {line_ttl} < lapses - ms then
    local keep = math.max(1, lapses - ms) + {REGISTRATION_SLACK_MS}
    redis.call('PEXPIRE', {line}, keep)
    redis.call('PEXPIRE', {expiries}, keep)
  end
"#
    )
}

/// Several free keys taken in one step (`LockClient::lock_all` on one server, or keys
/// of one Cluster slot), in the caller's (canonical) order: every key up to the first
/// that is not free.
///
/// KEYS: the fencing counter (one per server, or per slot: shared by every key here),
/// then the locks in order. ARGV: the lease in ms, the client's name, then one owner
/// token per lock. The locks are taken in order while free, as [`ACQUIRE`] takes an
/// uncontended one, each with a token above the last (`max(counter + 1, clock µs)`,
/// then + 1); the first lock key that exists — held, reserved or granted to a waiter,
/// or not a lock at all — and those after it are left alone. The reply is the tokens
/// of the keys taken (none: an empty array, and nothing written). The caller goes on
/// from the first key not taken with its own attempt, which joins that key's line: the
/// same steps as taking the keys one by one, fewer round trips. A free key has no line
/// (a release with waiters leaves it reserved or granted, never free), so nobody is
/// overtaken. An `EXISTS` per key looked at, then one `TIME`, one `GET` and a `SET` per
/// key taken plus one: cheaper than a script per key.
pub(crate) static ACQUIRE_ALL: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local last_taken = 1
while last_taken < #KEYS and redis.call('EXISTS', KEYS[last_taken + 1]) == 0 do
  last_taken = last_taken + 1
end
if last_taken == 1 then
  return {}
end
local now = redis.call('TIME')
local micros = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
local since_ms = string.sub(micros, 1, -4)
local token = tonumber(micros) - 1
local last = tonumber(redis.call('GET', KEYS[1]))
if last and last > token then
  token = last
end
local tokens = {}
for i = 2, last_taken do
  token = token + 1
  local clock = string.format('%.0f', token)
  redis.call('SET', KEYS[i], ARGV[i + 1] .. ' ' .. clock .. ' ' .. since_ms .. ' ' .. ARGV[2], 'PX', ARGV[1])
  tokens[i - 1] = token
end
redis.call('SET', KEYS[1], string.format('%.0f', token))
return tokens
"#
        .to_owned(),
    )
});

/// The next fencing token from the counter `fence` (see "Fencing tokens" above), as
/// Lua that leaves in locals `token` and `clock` (both its digits: a script answers the
/// token as a string, which the client reads as a number), `since_ms` (the server
/// clock in ms, digits), `now` (`TIME`'s reply) and `last` (the counter's previous
/// value; false if this run created it). Spliced into each acquire script rather than
/// called: a Lua function is a closure made anew on every run of the script that
/// defines it.
///
/// The counter and the clock are compared as digits while they have as many (every
/// clock in µs from 2001 to 2286 has 16): Lua reads a number of 16 digits through
/// `strtod`'s slow path, twice per acquisition, which cost about 3 % of the Redis
/// server's instructions for an uncontended acquire and release
/// (`scripts/callgrind-scripts.sh`'s way of counting). Numbers are compared only when
/// the lengths differ or the counter is not below the clock, and a counter that is not
/// a number is passed over, as before. Every writer of the counter (these scripts,
/// `ACQUIRE_ALL`, [`RAISE_FENCE`]) writes plain digits; a counter of 16 characters
/// edited by hand into another form (`1.0000000000e20`) would be compared as digits,
/// and passed over. (Lua compares strings with `strcoll`: in every locale, digit
/// strings of one length sort as their numbers.)
fn next_token(fence: &str) -> String {
    next_token_at(fence, "redis.call('TIME')")
}

/// [`next_token`] with the server clock `now` (a `TIME` reply) already read.
fn next_token_at(fence: &str, now: &str) -> String {
    format!(
        r#"
local now = {now}
local micros = now[1] .. string.rep('0', 6 - #now[2]) .. now[2]
local clock = micros
local last = redis.call('SET', {fence}, clock, 'GET')
if last and (#last ~= #clock or last >= clock) and (tonumber(last) or 0) >= tonumber(clock) then
  -- Two acquisitions within one microsecond, or a clock behind the counter.
  clock = string.format('%.0f', tonumber(last) + 1)
  redis.call('SET', {fence}, clock)
end
local token = clock
local since_ms = string.sub(micros, 1, -4)
"#
    )
}

/// A lock is *contended* once an attempt found it busy, or when it changed hands while
/// others may be waiting (a hand-off, a reservation taken): its value's start time
/// then ends with `~` (`<owner> <token> <since>~ <name>`). The release of a contended
/// lock goes through the waitlist and is published; an uncontended one is deleted with
/// no message, since no waiter can be listening for it: every waiter's attempt found
/// the lock busy (and marked it), or woke at a message or timer that a contended lock
/// or an expiry gave it (tests/model.rs checks "no forgotten waiter" with it).
pub(crate) const CONTENDED: char = '~';

/// Lua that marks the lock `value` on `key` contended if it is an uncontended lock of
/// redlock's (never a reservation, a kept or shared key, or anything else).
fn mark_contended(key: &str, value: &str) -> String {
    format!(
        r#"
-- Where the start time begins (`since_at`, its leading space) and whether it ends with
-- the mark, found by plain searches: every attempt but the first finds a contended lock
-- marked already, and the pattern that checks an unmarked one costs several times as
-- much. (A value that is not a lock may pass the first test by chance; the pattern
-- still stands between it and the write.)
local since_at = string.find({value}, ' ', (string.find({value}, ' ', 1, true) or #{value}) + 1, true)
local since_ends = since_at and string.find({value}, ' ', since_at + 1, true)
local marked = since_ends and string.byte({value}, since_ends - 1) == {contended_byte}
if not marked and string.find({value}, '^{owner} %d+ %d+ ') then
  redis.call('SET', {key}, (string.gsub({value}, '^(%S+ %d+ %d+)', '%1{CONTENDED}', 1)), 'KEEPTTL')
end
"#,
        owner = OWNER_PATTERN,
        contended_byte = CONTENDED as u8,
    )
}

/// An owner token as a Lua pattern: 32 hex digits, `:`, a hex counter (see `core`'s
/// `fresh_token`).
const OWNER_PATTERN: &str = "%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x:%x+";

/// Lua for the companion of `lock` named `prefix` + lock (its release channel, its
/// waitlist's expiries, its eviction marker, its holders), derived from its waitlist
/// key `waitlist`, which starts with the same slot tag on a cluster (so the companion
/// is in the lock's slot, as if declared). Companions used only off the common path
/// are derived rather than sent: fewer arguments to build, send and read on every call.
fn companion_of(lock: &str, waitlist: &str, prefix: &str) -> String {
    companion_from(lock, waitlist, WAITLIST_PREFIX, prefix)
}

/// Lua for the companion of `lock` named `prefix` + lock, derived from another of its
/// companions, `sibling`, named `sibling_prefix` + lock (see [`companion_of`]).
fn companion_from(lock: &str, sibling: &str, sibling_prefix: &str, prefix: &str) -> String {
    format!(
        "(string.sub({sibling}, 1, #{sibling} - #{lock} - {skip}) .. '{prefix}' .. {lock})",
        skip = sibling_prefix.len(),
    )
}

/// A key held in shares (a read lock's readers, a semaphore's permits) holds
/// `shared:<limit>`: 0 for a read lock (no limit), N for a semaphore of N.
///
/// Prefix of a key's holders when it is held in shares: a sorted set of owner tokens,
/// each scored with the end of its own lease (server clock, ms).
pub(crate) const HOLDERS_PREFIX: &str = "redlock:holders:";

/// Prefix of a key's share names when it is held in shares: a hash from each share's
/// owner token to `<fencing token> <client name>`, for `inspect` (see [`INSPECT`]). It
/// is written, settled and deleted by the same scripts as the holders, expires with
/// them and holds an entry for no share they lack, so nothing outlives the last share.
/// The scripts derive it from the holders' name (see [`companion_from`]); on a cluster
/// it is declared as well.
pub(crate) const NAMES_PREFIX: &str = "redlock:names:";

/// How often, at most, a writer waiting on readers attempts again, renewing its
/// waitlist registration; the registration outlives each attempt by this plus the
/// registration slack (see `node::WaitlistTimings`). So a writer whose process died
/// without leaving the line holds new readers back for at most that long after its last
/// attempt, or after readers took the key (see [`SHARED_ACQUIRE`]): readers blocked by
/// it retry when its registration lapses. One attempt a second per waiting writer is
/// cheap; a longer period would keep readers out longer after such a death.
pub(crate) const WRITER_REFRESH_MS: u64 = 1_000;

/// Prefix of a waiting reader's id on the waitlist: readers wait behind any waiting
/// writer (an id without it), never behind each other.
pub(crate) const READER_ID_PREFIX: &str = "r:";

/// First letter of a semaphore waiter's id on the waitlist: `s<permits>:` and an owner
/// token, so that a release can grant it a permit (see `free_for_next`).
pub(crate) const PERMIT_ID_PREFIX: &str = "s";

/// `settle_shares(lock, holders, ms)`: drops the shares of `holders` whose lease ended
/// by `ms` (and their names: see [`NAMES_PREFIX`]), and gives `lock`, `holders` and
/// the names the lease of the longest remaining share; returns that lease in ms, or 0
/// when no share is left (then none is touched; no name is left either). A dead
/// holder's share ends with its own lease: a live holder's renewal never carries it
/// along. `share_names(lock, holders)`: the names' key. Shared by the acquire, release
/// and extend scripts.
static SETTLE_SHARES_FN: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
local function share_names(lock, holders)
  return {names}
end
local function settle_shares(lock, holders, ms)
  local names = share_names(lock, holders)
  local ended = redis.call('ZRANGEBYSCORE', holders, '-inf', ms)
  if #ended > 0 then
    -- A share that ran out (its holder died) takes its name along.
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', ms)
    for _, owner in ipairs(ended) do
      if string.sub(owner, 1, 5) == 'kept:' then owner = string.sub(owner, 6) end
      redis.call('HDEL', names, owner)
    end
  end
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  if not last[2] then
    return 0
  end
  local rest = math.max(1, tonumber(last[2]) - ms)
  -- The three keys are given their expiry together, and every script that makes one
  -- of them anew gives it one, so the lock's stands for all three: set again only when
  -- it falls short of the longest share or outlasts it by more than the clock's
  -- rounding. Most releases end a share that was not the longest, and leave the
  -- expiry as it was: one read, not three writes.
  local lasts = redis.call('PTTL', lock)
  if lasts < rest or lasts > rest + 2 then
    redis.call('PEXPIRE', lock, rest)
    redis.call('PEXPIRE', holders, rest)
    redis.call('PEXPIRE', names, rest)
  end
  return rest
end
"#,
        names = companion_from("lock", "holders", HOLDERS_PREFIX, NAMES_PREFIX),
    )
});

/// `server_ms()`: the server clock in ms.
const SERVER_MS_FN: &str = r#"
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
"#;

/// Acquires a share of a key: a read lock (limit 0) or a semaphore's permit (limit N).
/// KEYS: lock, waitlist, waitlist expiries, holders, fence counter, and with a hand-off
/// or on a cluster the eviction marker (see [`HANDED_MARK`]), and on a cluster the
/// share names (see [`NAMES_PREFIX`]), declared for the same reason as `ACQUIRE`'s
/// (elsewhere derived). ARGV: owner token,
/// lease in ms, release channel, publish command, grace of a reservation (ms), this
/// waiter's id (empty when not waiting; readers' ids start with `r:`), "1" if an
/// earlier attempt may have registered it, how long a registration outlives the lease
/// it waited on (ms), the owner token of a same-client holder handing its lock off (or
/// empty), the limit, the client's name (written with the share's fencing token into
/// the share names), and with a hand-off how long its evidence lasts (ms).
///
/// The key holds `shared:<limit>` for as long as the longest share lasts; each share
/// is an entry of the holders set scored with its own lease's end. The exclusive
/// acquire script sees a string with a lease: busy, so a plain (write) lock excludes
/// every share, and a share is refused while a plain lock (or a reservation for
/// another waiter) holds the key. Readers prefer writers: while a writer waits on the
/// key's waitlist, a new reader waits too (registering behind it), so a stream of
/// readers cannot starve a writer; when the key is free but a writer waits, the
/// reader reserves the key for the waitlist's head and wakes it. A writer that leaves
/// the line lets the readers behind it in: one that gives up (timeout, cancelled) tells
/// them at once (see [`LEAVE_WAITLIST`]); one whose process died stops holding them
/// back when its registration lapses, at most [`WRITER_REFRESH_MS`] plus the
/// registration slack after its last attempt or after readers took the key, whichever
/// is later (a reader cuts a registration made for a write lock's lease down to
/// that: a live writer was told the key changed hands, and renews it at once), and a
/// reader it holds back is told to retry then.
///
/// Returns `{1, token, handed_off, 0}` when acquired, `{0, ms to wait at most, 0,
/// handed_off, floor, ms, registered}` when busy (a hand-off's lock may have been
/// deleted for a writer first in line; `floor`: the higher of the fencing counter and
/// the server clock in µs less one, at or above every grant made before this attempt
/// and below every grant made after it; `ms` and `registered` as [`ACQUIRE`]'s), `{-1, type, 0}` when the key holds something redlock did not write, `{-2, limit
/// found, 0}` when the key is held in shares under another limit (a semaphore of
/// another size, or a read lock).
pub(crate) static SHARED_ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local channel, publish, grace = ARGV[3], ARGV[4], ARGV[5]
{settle_shares}{SERVER_MS_FN}{free_for_next}
local ms = server_ms()
local limit = tonumber(ARGV[10])
local handed_off = 0
-- (false, not ours, when no owner hands the key off)
local held = ARGV[9] ~= '' and redis.pcall('GET', KEYS[1])
if {previous_owns} then
  redis.call('DEL', KEYS[1])
  handed_off = 1
  {evidence}
end
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' then
  return {{-1, redis.call('TYPE', KEYS[1])['ok'], 0}}
end
local reserved = ARGV[6] ~= '' and value == 'reserved:' .. ARGV[6]
-- A release granted this waiter a share while this attempt was on its way (see
-- `free_for_next`): the attempt takes it over, in its own name, ahead of everyone.
-- Only a waiter an earlier attempt may have put in line can have been granted one:
-- a first attempt does not look.
local granted_to = ARGV[7] == '1' and string.match(ARGV[6], '^(%S+) ')
if granted_to and value and string.sub(value, 1, 7) == 'shared:' then
  local score = redis.call('ZSCORE', KEYS[4], granted_to)
  if score and tonumber(score) > ms then
    redis.call('ZREM', KEYS[4], granted_to)
    redis.call('HDEL', share_names(KEYS[1], KEYS[4]), granted_to)
    reserved = true
  end
end
local busy_for = nil
if value and not reserved then
  if string.sub(value, 1, 7) ~= 'shared:' then
    -- Held whole (a write lock), kept, or reserved for another waiter.
    busy_for = redis.call('PTTL', KEYS[1])
    if busy_for < 0 then
      return {{-1, 'string', 0}}
    end
    {mark_contended}
  elseif value ~= 'shared:' .. ARGV[10] then
    return {{-2, string.sub(value, 8), 0}}
  end
end
local rest = 0
if not busy_for then
  if not value or (reserved and string.sub(value, 1, 7) ~= 'shared:') then
    -- Shares left from a key deleted by hand must not come back: a key that does not
    -- hold `shared:` has no live share (a release that reserves it for the next in
    -- line has ended the last one), even when a write lock came and went in between
    -- and the key now comes to this reader through a reservation.
    redis.call('DEL', KEYS[4], share_names(KEYS[1], KEYS[4]))
  end
  rest = settle_shares(KEYS[1], KEYS[4], ms)
  if not value or rest == 0 then
    -- Free (or every share ran out).
    if value then
      -- Names of shares whose holders were deleted by hand must not linger either.
      redis.call('DEL', share_names(KEYS[1], KEYS[4]))
    end
    value = false
  end
end
if not busy_for and not reserved and limit == 0 then
  -- A waiting writer goes first.
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms)) do
    redis.call('ZREM', KEYS[2], gone)
    redis.call('ZREM', KEYS[3], gone)
  end
  -- Held back until the writers' registrations lapse at the latest (they may have
  -- died: see WRITER_REFRESH_MS).
  local writers_until = nil
  local line = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
  local renewed_by = ms + {WRITER_REFRESH_MS} + tonumber(ARGV[8])
  for i = 1, #line, 2 do
    local id, lapse = line[i], tonumber(line[i + 1])
    if id ~= ARGV[6] and {writer} then
      if value and lapse > renewed_by then
        -- Registered for the lease of a write lock that held the key before these
        -- shares; a live writer renewed it when the key came to readers (it was
        -- told), so only a writer that died keeps it, and holds readers back.
        lapse = renewed_by
        redis.call('ZADD', KEYS[3], 'XX', lapse, id)
      end
      writers_until = math.max(writers_until or 0, lapse)
    end
  end
  if writers_until then
    if value then
      -- Until the shares end, or the writers' registrations lapse, whichever comes
      -- first; a writer that gives up says so at once (see LEAVE_WAITLIST).
      busy_for = math.min(rest, math.max(1, writers_until - ms))
    else
      -- Nobody holds it: hand it to the head of the line at once.
      free_for_next(KEYS[5])
      busy_for = tonumber(ARGV[5])
    end
  end
end
if not busy_for and limit > 0 and redis.call('ZCARD', KEYS[4]) >= limit then
  -- Every permit taken: one is free at the latest when the shortest lease ends.
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  busy_for = math.max(1, tonumber(first[2]) - ms)
end
if busy_for then
  local registered = 0
  if ARGV[6] ~= '' then
    registered = redis.call('ZADD', KEYS[2], 'NX', ms, ARGV[6])
    {register}
  end
  -- The grant floor (see ACQUIRE): no token was taken on this path, so what the next
  -- one would be at least: the counter, or the clock (µs) less one, whichever is higher
  -- (the counter may have been lost with the grant, in a restart or a failover).
  local clock = redis.call('TIME')
  local floor = math.max(tonumber(redis.call('GET', KEYS[5]) or 0) or 0,
    tonumber(clock[1]) * 1000000 + tonumber(clock[2]) - 1)
  return {{0, busy_for, 0, handed_off, string.format('%.0f', floor), ms, registered}}
end
if ARGV[6] ~= '' and (ARGV[7] == '1' or reserved) then
  redis.call('ZREM', KEYS[2], ARGV[6])
  redis.call('ZREM', KEYS[3], ARGV[6])
end
{token}
redis.call('ZADD', KEYS[4], ms + tonumber(ARGV[2]), ARGV[1])
-- Who holds the share, with which token: read by `inspect`.
redis.call('HSET', share_names(KEYS[1], KEYS[4]), ARGV[1], clock .. ' ' .. ARGV[11])
-- Settled above: the key lasts as long as the longest share, this one included.
local lasts = math.max(rest, tonumber(ARGV[2]))
redis.call('SET', KEYS[1], 'shared:' .. ARGV[10], 'PX', lasts)
redis.call('PEXPIRE', KEYS[4], lasts)
redis.call('PEXPIRE', share_names(KEYS[1], KEYS[4]), lasts)
if reserved or handed_off == 1 then
  -- The key was reserved for this reader, or handed to it by a writer of its client:
  -- the readers waiting elsewhere may join now.
  redis.call(ARGV[4], ARGV[3], '')
end
return {{1, token, handed_off, 0}}
"#,
        token = next_token("KEYS[5]"),
        previous_owns = owned_by("held", "ARGV[9]"),
        evidence = leave_evidence("KEYS[6]", "ARGV[9]", "ARGV[12]"),
        mark_contended = mark_contended("KEYS[1]", "value"),
        writer = is_writer("id"),
        settle_shares = &*SETTLE_SHARES_FN,
        free_for_next = &*FREE_FOR_NEXT,
        register = register_expiry(
            "KEYS[2]",
            "KEYS[3]",
            "ARGV[6]",
            "ms + busy_for + tonumber(ARGV[8])",
            None,
        ),
    ))
});

/// `grant_permits(fence, holders, names, value, ms, rest)`: a semaphore's key (`value`,
/// `shared:<permits>`; a read lock's does nothing) has permits free, now that `ms` (with
/// the waitlist's expired registrations dropped, and the shares settled: `rest` is what
/// `settle_shares` answered): the waiters of the same count at the head of the line are
/// granted as many as are free (see `grant_shares`), and the key lasts as long as its
/// longest share, a granted one's grace included. True when it granted one. Shared by
/// the release, the leave and the lapsed-grant scripts; needs `free_for_next`'s
/// functions before it.
const GRANT_PERMITS_FN: &str = r#"
local function grant_permits(fence, holders, names, value, ms, rest)
  local limit = tonumber(string.sub(value, 8))
  if limit == 0 then
    return false
  end
  local granted, _, latest = grant_shares(fence, holders, names, limit, redis.call('ZCARD', holders), ms)
  if granted == 0 then
    return false
  end
  -- The shares were settled just before: the keys last `rest` more, longer only when a
  -- share granted here outlasts the others (settling again would read what is known).
  local lasts = math.max(rest, latest - ms)
  if lasts > rest then
    redis.call('PEXPIRE', KEYS[1], lasts)
    redis.call('PEXPIRE', holders, lasts)
  end
  -- The grant's name may have made the names' key anew (the shares before it were an
  -- older redlock's, which names none): given the keys' expiry.
  redis.call('PEXPIRE', names, lasts)
  return true
end
"#;

/// `release_share(marker)`: the shares' side of the release script (same KEYS and ARGV,
/// KEYS[5] the holders; the locals of `free_for_next`, and `keep`, ms): ends ARGV[1]'s share, or keeps it for `keep` ms as `kept:`
/// (no renewal finds it then), gives the key the longest remaining lease and tells the
/// waiters (a semaphore's: a permit is free; a read lock's: when it ends at the
/// latest), or frees the key for the next in line when no share is left.
const RELEASE_SHARE_FN: &str = r#"
local function release_share(value)
  local ms = server_ms()
  local score = redis.call('ZSCORE', KEYS[5], ARGV[1])
  if not score or tonumber(score) <= ms then
    return gone(KEYS[4], ARGV[1])
  end
  local kept = tonumber(keep) > 0
  if kept then
    -- Its name stays, for the kept share (settled as `kept:<owner>`). Added before the
    -- share goes: a last share removed first would take the holders' key, and its
    -- expiry, with it, and the kept share would make the key anew without one (the
    -- settling below leaves the expiries alone when the lock's is right).
    redis.call('ZADD', KEYS[5], ms + tonumber(keep), 'kept:' .. ARGV[1])
  else
    redis.call('HDEL', share_names(KEYS[1], KEYS[5]), ARGV[1])
  end
  redis.call('ZREM', KEYS[5], ARGV[1])
  local rest = settle_shares(KEYS[1], KEYS[5], ms)
  if rest > 0 then
    if value == 'shared:0' then
      redis.call(publish, channel, 'T:' .. rest)
    elseif kept then
      -- A permit kept for its minimum hold is free when that ends.
      redis.call(publish, channel, 'K:' .. keep)
    elseif redis.call('EXISTS', KEYS[2]) == 1
        and grant_permits(fence, KEYS[5], names, value, drop_expired_waiters(ms), rest) then
      return 3
    else
      redis.call(publish, channel, '')
    end
    if kept then return 2 end
    return 1
  end
  redis.call('DEL', KEYS[5], share_names(KEYS[1], KEYS[5]))
  local granted, told = free_for_next(fence, nil, KEYS[5], names)
  if told then
    return 4
  elseif granted then
    return 3
  end
  return 1
end
"#;

/// (`redis.pcall`: a key holding another type is simply not ours; nothing is touched.)
/// KEYS: lock, waitlist (off a cluster the lock alone: the waitlist is derived); off
/// the common path the script derives from them (see
/// [`companion_of`]) the waitlist's expiries, the eviction marker and the holders (of a
/// key held in shares), as KEYS[3..5] of a local `KEYS`: the layout the shared
/// functions read. On a cluster those three are declared instead (see `ACQUIRE` for
/// why), and the share names (see [`NAMES_PREFIX`]) as `KEYS[6]`. ARGV: owner
/// token, ms to keep the key (0, the default: release it), grace of a
/// reservation (ms; the default grace when left out), publish command (SPUBLISH on a
/// cluster; elsewhere PUBLISH, the default), and "1" to publish every release
/// (RedLock: see `Node`), else nothing. Off a cluster the defaults are left out when
/// nothing follows them: an uncontended release sends the owner alone.
/// A share (read lock, permit) is released by the same script (see `release_share`).
/// Returns 1 when released (deleted, or reserved for the waitlist's head), 2 when kept
/// for `hold_at_least`, 3 when released by a grant to the waitlist's head, 4 when so and
/// the waiter after it heard `N` (see `free_for_next`), 0 when the lock was not ours any
/// more, -1 when it was force-unlocked, -2 when an acquire script of this client took it
/// over (see [`GONE`]).
///
/// Without contention this is `GET` and `DEL`: a lock nobody contended (see [`CONTENDED`])
/// has no one to tell. A contended one goes to the waitlist's head, or is deleted with a
/// message to every listener.
///
/// A kept key's value gains the prefix `kept:`, so that a renewal already on its
/// way cannot stretch it back to the full lease, and tells every waiter when it ends
/// (`K:<ms>`), so that they retry then rather than at the end of the original lease.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local value = redis.pcall('GET', KEYS[1])
local ours = {ours}
-- Keeping nothing and the default grace are left out when nothing follows.
local keep = ARGV[2] or '0'
if ours and keep == '0' and not ARGV[5] then
  -- Uncontended: no `{CONTENDED}` ends the start time, the field after the token (plain
  -- finds: a pattern costs several times as much on this path).
  local token_ends = string.find(value, ' ', #ARGV[1] + 2, true)
  local since_ends = token_ends and string.find(value, ' ', token_ends + 1, true)
  if since_ends and string.byte(value, since_ends - 1) ~= {contended_byte} then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
-- Defined only off the common path: each definition costs every run that makes it.
-- Off a cluster the waitlist is derived, and the publish command defaults to PUBLISH.
local waitlist = KEYS[2] or '{WAITLIST_PREFIX}' .. KEYS[1]
local channel, publish, grace = {channel}, ARGV[4] or 'PUBLISH', ARGV[3] or '{default_grace_ms}'
-- The shared functions below read these as KEYS[3..5]: a local KEYS (the global one
-- is Redis's to fill) with the companions added, each derived only on the path that
-- needs it (a grant of the lock needs the expiries alone; see `free_for_next`).
local fence = KEYS[7] or '{FENCE_KEY}'
local forced, holders, names = KEYS[4], KEYS[5], KEYS[6]
local KEYS = {{KEYS[1], waitlist, KEYS[3] or {expiries}}}
{free_for_next}
if not ours then
  KEYS[4], KEYS[5], names = forced or {forced}, holders or {holders}, names or {names}
  {gone}{SERVER_MS_FN}{settle_shares}{GRANT_PERMITS_FN}{RELEASE_SHARE_FN}
  if type(value) == 'string' and string.sub(value, 1, 7) == 'shared:' then
    return release_share(value)
  end
  return gone(KEYS[4], ARGV[1])
end
if tonumber(keep) > 0 then
  redis.call('SET', KEYS[1], 'kept:' .. value, 'PX', keep)
  redis.call(publish, channel, 'K:' .. keep)
  return 2
end
local granted, told = free_for_next(fence, redis.call('PTTL', KEYS[1]), holders or true, names)
if told then
  return 4
elseif granted then
  return 3
end
return 1
"#,
        ours = owned_by("value", "ARGV[1]"),
        default_grace_ms = crate::config::DEFAULT_RESERVATION_GRACE.as_millis(),
        contended_byte = CONTENDED as u8,
        names = companion_of("KEYS[1]", "waitlist", NAMES_PREFIX),
        free_for_next = &*FREE_FOR_NEXT,
        channel = companion_of("KEYS[1]", "waitlist", RELEASE_CHANNEL_PREFIX),
        expiries = companion_of("KEYS[1]", "waitlist", WAITLIST_EXPIRY_PREFIX),
        forced = companion_of("KEYS[1]", "waitlist", FORCED_PREFIX),
        holders = companion_of("KEYS[1]", "waitlist", HOLDERS_PREFIX),
        gone = &*GONE,
        settle_shares = &*SETTLE_SHARES_FN,
    ))
});

/// Prefix of a client's grant channel for a key: `redlock:granted:<client id>:` + key
/// (on a cluster behind the key's slot tag, like its other companions). The client id
/// is the 32 hex digits every owner token of that client starts with.
pub(crate) const GRANT_CHANNEL_PREFIX: &str = "redlock:granted:";

/// Frees the lock key (KEYS[1]) for the next in line (KEYS[2], arrival order; KEYS[3],
/// expiries: waiters past theirs are dropped), or, with nobody in line, deletes it and
/// says so on the key's channel. Shared by the scripts that free a key; each declares,
/// before it, the locals `channel`, `publish` (the command) and `grace` (ms), which it
/// reads. `free_for_next(fence, before)`: with the fencing counter `fence`, the head of
/// the line is *granted* the lock when it can be (see below); without one (nil) it is
/// reserved. `before`: how long the lock being released had left (ms), which every
/// waiter was told at the latest; nil when unknown. Returns true when it granted, and
/// then, second, true when the next in line heard `N` (below): the releasing client
/// then leaves the lapse to that waiter and runs no check of its own.
///
/// **The grant.** A waiter that registered as `<id> <lease ms> <client name>` (see
/// [`ACQUIRE`]) is made the holder right here: owner `<id>`, the next fencing token, for
/// the grace only, and told alone, on its client's grant channel (see
/// [`GRANT_CHANNEL_PREFIX`]): `G <id> <token> <ms since it registered> <grace ms>` (the
/// releasing client's grace, which the grant lasts unconfirmed). It learns from
/// that message that it holds the lock, and confirms in the background a quarter of the
/// grace later (an extension to its lease), unless it released first: a short hold's
/// release frees the grant as it would a confirmed lock. Unconfirmed, the grant lapses
/// with the grace. A grant no client hears
/// (its process died, its connection dropped) goes to the next in line at once — on one
/// server: on a cluster the publish's count leaves out the shard's replicas, whose
/// subscribers hear it too, so the grant stands, and lapses with the grace if unheard. A grant
/// whose lease ends before the released lock would have (`before`) is announced to the
/// other waiters (`T:<lease>`), as a reservation taken is: otherwise nothing wakes them.
/// The next in line is told when the grant lapses unconfirmed (`N <id> <grace ms>`, on
/// its client's grant channel), and attempts then unless the grantee's confirmation
/// told it `C <id>` first: a grant nobody confirms reaches the next waiter a grace
/// later whatever became of the releasing client (issue 34). The releasing client
/// checks ([`LAPSED_GRANT`]) only when no client heard `N` (its count was 0: nobody in
/// line behind the grantee, none of the next three listening, or a share grant): one
/// script per contended hand-off fewer.
/// Any
/// other head (a reader, a waiter of an older redlock) gets the key *reserved*
/// (`reserved:<member>` for the grace, named on the key's channel: `R:<member>`), and
/// takes it with an attempt of its own.
/// Lua for the slot tag a lock's companions start with (`{tag}` on a cluster, else
/// empty), from its waitlist, KEYS[2] (see [`companion_of`]).
fn slot_tag_of_waitlist() -> String {
    format!(
        "string.sub(KEYS[2], 1, #KEYS[2] - #KEYS[1] - {})",
        WAITLIST_PREFIX.len()
    )
}

static FREE_FOR_NEXT: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
local function tell_granted(id, clock, after, px)
  local client = string.match(id, '(%x+):%x+$')
  local granted = {tag} .. '{GRANT_CHANNEL_PREFIX}' .. client .. ':' .. KEYS[1]
  local heard = redis.call(publish, granted, 'G ' .. id .. ' ' .. clock .. ' ' .. after .. ' ' .. px)
  if publish == 'SPUBLISH' then
    -- On a cluster the count is this node's subscribers only, yet the message reaches
    -- every node of the shard: a waiter subscribed on a replica hears it while the count
    -- says 0 (the cluster client subscribes where its slot map says, which after a
    -- failover is the old master, now a replica). Passing the key on would make two
    -- holders (tests/crossed_replies.rs); kept, a grant nobody hears lapses with the
    -- grace, and the releaser's lapsed-grant check passes it on.
    return math.max(heard, 1)
  end
  return heard
end
-- After a grant lasting `px` unconfirmed: the next in line (the first whose client
-- listens) is told, on its client's grant channel, `N <id> <px>`. Should the grantee
-- never confirm (its process stopped, or cut off), that waiter attempts when the
-- grant has lapsed and takes the key, whatever became of the client that released.
-- (The grantee's confirmation tells it `C <id>`: see [`EXTEND`].) True when a client
-- heard it (a count above 0 is a listener, on a cluster too): that waiter covers the
-- lapse, and the releasing client need not check (see `free_for_next`).
-- `behind`: the next three members of the line when the caller has read them already.
local function tell_next(px, behind)
  for _, member in ipairs(behind or redis.call('ZRANGE', KEYS[2], 0, 2)) do
    local id = string.match(member, '^({OWNER_PATTERN}) %d+ ')
    if not id then
      return false
    end
    local client = string.match(id, '(%x+):%x+$')
    local granted = {tag} .. '{GRANT_CHANNEL_PREFIX}' .. client .. ':' .. KEYS[1]
    if redis.call(publish, granted, 'N ' .. id .. ' ' .. px) > 0 then
      return true
    end
    -- On a cluster a count of 0 leaves out the shard's replicas (see `tell_granted`):
    -- the message may have been heard, so nobody after it is told.
    if publish == 'SPUBLISH' then
      return false
    end
  end
  return false
end
-- The waiter `head` (a member of the line) as a share waiter: its id, its lease, its
-- client's name and the limit of the key it waits for (0: a reader); nil otherwise.
local function share_waiter(head)
  local id, kind, lease, name = string.match(head, '^(([{READER_ID_PREFIX_0}{PERMIT_ID_PREFIX_0}]%d*):{OWNER_PATTERN}) (%d+) (.*)$')
  if not id then
    return nil
  end
  return id, lease, name, tonumber(string.sub(kind, 2)) or 0
end
-- Grants shares of the key (held in shares under `limit`, `held` of them taken) to the
-- run of share waiters of that limit at the head of the line, as many as it has room
-- for. Returns how many it granted, the longest lease among them, and when the last
-- granted share ends unconfirmed (server clock, ms; 0 when none). Expired
-- registrations must be gone already.
local function grant_shares(fence, holders, names, limit, held, ms)
  local granted, longest, latest = 0, 0, 0
  while limit == 0 or held < limit do
    local line = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if not line[1] then
      break
    end
    local id, lease, name, of = share_waiter(line[1])
    if not id or of ~= limit then
      break
    end
    redis.call('ZREM', KEYS[2], line[1])
    redis.call('ZREM', KEYS[3], line[1])
    if not redis.call('ZSCORE', holders, id) then
      {token}
      local share = math.min(tonumber(grace), tonumber(lease))
      redis.call('ZADD', holders, ms + share, id)
      redis.call('HSET', names, id, clock .. ' ' .. name)
      if tell_granted(id, clock, math.max(0, ms - tonumber(line[2])), share) > 0 then
        granted = granted + 1
        held = held + 1
        longest = math.max(longest, tonumber(lease))
        latest = math.max(latest, ms + share)
      else
        -- Nobody of its client listens (its process died, its connection dropped).
        redis.call('ZREM', holders, id)
        redis.call('HDEL', names, id)
      end
    end
  end
  return granted, longest, latest
end
-- `ms`: the server clock, when the caller has read it already.
local function drop_expired_waiters(ms)
  if not ms then
    local now = redis.call('TIME')
    ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms)) do
    redis.call('ZREM', KEYS[2], gone)
    redis.call('ZREM', KEYS[3], gone)
  end
  return ms
end
local function free_for_next(fence, before, holders, names)
  -- The head and the three behind it in one read: who is granted, and who is told when
  -- that grant lapses (`tell_next`). An empty line costs this read alone.
  local line = redis.call('ZRANGE', KEYS[2], 0, 3, 'WITHSCORES')
  if line[1] then
    -- One clock for dropping expired waiters and for the grant's token.
    local now = redis.call('TIME')
    local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms)
    if expired[1] then
      for _, gone in ipairs(expired) do
        redis.call('ZREM', KEYS[2], gone)
        redis.call('ZREM', KEYS[3], gone)
      end
      line = redis.call('ZRANGE', KEYS[2], 0, 3, 'WITHSCORES')
    end
    while line[1] do
      local head = line[1]
      local id, lease, name = string.match(head, '^({OWNER_PATTERN}) (%d+) (.*)$')
      local share_id, _, _, limit = share_waiter(head)
      if fence and share_id and holders then
        if holders == true then
          -- Left to derive (see `RELEASE`).
          holders, names = {holders}, {names}
        end
        -- A run of readers (or of a semaphore's waiters) is granted together.
        redis.call('DEL', holders, names)
        local granted, longest = grant_shares(fence, holders, names, limit, 0, ms)
        if granted > 0 then
          local until_ms = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2] - ms
          redis.call('SET', KEYS[1], 'shared:' .. limit, 'PX', until_ms)
          redis.call('PEXPIRE', holders, until_ms)
          redis.call('PEXPIRE', names, until_ms)
          if not before or longest < before then
            redis.call(publish, channel, 'T:' .. longest)
          end
          return true
        end
      else
        redis.call('ZREM', KEYS[2], head)
        redis.call('ZREM', KEYS[3], head)
        if not (fence and id) then
          redis.call('SET', KEYS[1], 'reserved:' .. head, 'PX', grace)
          redis.call(publish, channel, 'R:' .. head)
          return false
        end
        {token_now}
        local px = math.min(tonumber(grace), tonumber(lease))
        -- Marked unconfirmed (see `UNCONFIRMED`) until its confirmation rewrites it.
        redis.call('SET', KEYS[1], id .. ' ' .. clock .. ' {UNCONFIRMED}' .. since_ms .. '{CONTENDED} ' .. name, 'PX', px)
        if tell_granted(id, clock, math.max(0, ms - tonumber(line[2])), px) > 0 then
          if not before or tonumber(lease) < before then
            -- The others were told when the lock before ends, at the latest; this one
            -- may end sooner (tests/model.rs found them asleep on a free key
            -- otherwise). A release of a lock with the same lease, the common case,
            -- says nothing.
            redis.call(publish, channel, 'T:' .. lease)
          end
          return true, tell_next(px, {{line[3], line[5], line[7]}})
        end
        -- Nobody of its client listens (its process died, its connection dropped):
        -- the next in line. (The token stays used: tokens only need to rise.)
      end
      line = redis.call('ZRANGE', KEYS[2], 0, 3, 'WITHSCORES')
    end
  end
  redis.call('DEL', KEYS[1])
  redis.call(publish, channel, '')
  return false
end
"#,
        token = next_token("fence"),
        token_now = next_token_at("fence", "now"),
        tag = slot_tag_of_waitlist(),
        holders = companion_of("KEYS[1]", "KEYS[2]", HOLDERS_PREFIX),
        names = companion_of("KEYS[1]", "KEYS[2]", NAMES_PREFIX),
        READER_ID_PREFIX_0 = &READER_ID_PREFIX[..1],
        PERMIT_ID_PREFIX_0 = &PERMIT_ID_PREFIX[..1],
    )
});

/// A waiter that gave up leaves the waitlist; if a release reserved the key for it
/// meanwhile, the reservation goes on to the next in line at once instead of running
/// out. A writer that leaves while readers hold the key, and was the last writer in
/// line, publishes that the key is free: the readers it held back (see
/// [`SHARED_ACQUIRE`]'s writer preference) join the holders now rather than at the end
/// of their wait. A waiter granted the key (or a share of it) as it gave up (see
/// `free_for_next`) frees it for the next in line at once, as its release would. KEYS:
/// lock, waitlist, waitlist expiries, fence counter, and on a cluster the holders and
/// share names (derived elsewhere). ARGV: waiter id (its waitlist member), (unused), release
/// channel, publish command, grace of a reservation (ms). Returns 3 when it granted
/// the key to the next in line (4 when the waiter after it heard `N`), 1 when it passed
/// the key on otherwise, 5 when the key may be under a grant that lapses unchecked (the
/// waiter leaving may have been the one told of its lapse, and no client heard it
/// passed on: the client leaving checks it), else 0. A key found free while others
/// wait (a grant that lapsed before the leaving waiter's attempt) goes to the next in
/// line, as [`LAPSED_GRANT`] would give it.
pub(crate) static LEAVE_WAITLIST: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local channel, publish, grace = ARGV[3], ARGV[4], ARGV[5]
local value = redis.pcall('GET', KEYS[1])
if value == 'shared:0' and {leaving_writer} then
  {SERVER_MS_FN}
  local readers = false
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. server_ms(), '+inf')) do
    if {writer} then
      -- Another writer still waits: the readers keep waiting behind it.
      return 0
    end
    readers = true
  end
  if readers then
    redis.call(publish, channel, '')
  end
  return 0
end
local granted_to = string.match(ARGV[1], '^(%S+) ')
{free_for_next}{settle_shares}{GRANT_PERMITS_FN}
if granted_to and type(value) == 'string' and string.sub(value, 1, 7) == 'shared:' then
  local holders = KEYS[5] or {holders}
  local names = KEYS[6] or {names}
  if not redis.call('ZSCORE', holders, granted_to) then
    return 0
  end
  -- Granted a share (a read lock's, a permit) as it gave up: the share ends, and the
  -- next in line gets what it frees.
  redis.call('ZREM', holders, granted_to)
  redis.call('HDEL', names, granted_to)
  local ms = drop_expired_waiters()
  local rest = settle_shares(KEYS[1], holders, ms)
  if rest == 0 then
    redis.call('DEL', holders, names)
    local granted, told = free_for_next(KEYS[4], nil, holders, names)
    if told then
      return 4
    elseif granted then
      return 3
    end
    return 1
  end
  if grant_permits(KEYS[4], holders, names, value, ms, rest) then
    return 3
  end
  return 1
end
if not value and redis.call('EXISTS', KEYS[2]) == 1 then
  -- Free while others wait: a grant this waiter was to cover (`N`) lapsed before its
  -- attempt. The next in line gets it, as the lapsed-grant check would give it.
  local granted, told = free_for_next(KEYS[4])
  if told then
    return 4
  elseif granted then
    return 3
  end
  return 1
end
if value ~= 'reserved:' .. ARGV[1] and not (granted_to and {granted}) then
  -- Held by another, contended, within the longest grace a client may set of its end:
  -- perhaps a grant not confirmed yet (made with the releasing client's grace, not
  -- this one's), whose lapse this waiter was told of (`N`), and nobody else watches
  -- it. The next in line is told instead; if no client hears it, this waiter's client
  -- checks.
  if type(value) == 'string' and string.find(value, '^%S+ %d+ %d+{CONTENDED}') then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 and ttl <= {max_grace_ms} and not tell_next(ttl) then
      return 5
    end
  end
  return 0
end
local granted, told = free_for_next(KEYS[4])
if told then
  return 4
elseif granted then
  return 3
end
return 1
"#,
        max_grace_ms = crate::config::MAX_RESERVATION_GRACE.as_millis(),
        leaving_writer = is_writer("ARGV[1]"),
        writer = is_writer("id"),
        granted = owned_by("value", "granted_to"),
        free_for_next = &*FREE_FOR_NEXT,
        settle_shares = &*SETTLE_SHARES_FN,
        holders = companion_of("KEYS[1]", "KEYS[2]", HOLDERS_PREFIX),
        names = companion_of("KEYS[1]", "KEYS[2]", NAMES_PREFIX),
    ))
});

/// A grant nobody confirmed lapses with the grace (see `free_for_next`); the client
/// whose release granted it runs this a little after the grace, so that the next in
/// line is not left waiting for the lease it was told. Frees the key for the next in
/// line if it is free while someone is in line (a run of readers, or a writer, as a
/// release would), and a semaphore's permits left free by a lapsed grant to its waiters;
/// a key held (the grant confirmed, or taken since) is left alone. KEYS and ARGV as
/// [`LEAVE_WAITLIST`]'s (no waiter id), and on a cluster the holders and share names as
/// KEYS[5] and KEYS[6] (derived elsewhere). Returns 3 when it granted (4 when the
/// waiter after the grantee heard `N`), 1 when it reserved the key, else 0.
pub(crate) static LAPSED_GRANT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local channel, publish, grace = ARGV[3], ARGV[4], ARGV[5]
{free_for_next}{settle_shares}{GRANT_PERMITS_FN}
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' and string.match(value, '^shared:[1-9]') then
  -- A semaphore's permit granted and never confirmed: once its grace ended, the next
  -- in line gets it.
  local holders = KEYS[5] or {holders}
  local names = KEYS[6] or share_names(KEYS[1], holders)
  local ms = drop_expired_waiters()
  local rest = settle_shares(KEYS[1], holders, ms)
  if grant_permits(KEYS[4], holders, names, value, ms, rest) then
    return 3
  end
  return 0
end
if value then
  -- Taken since the grant lapsed (by the grantee's own attempt, or by a newcomer), with
  -- no attempt to find it busy: its release must still go to the line, which nobody
  -- else will wake (tests/model.rs found the waiters asleep on a free key otherwise).
  if type(value) == 'string' then
    {mark_contended}
  end
  return 0
end
local granted, told = free_for_next(KEYS[4], nil, KEYS[5] or {holders}, KEYS[6] or {names})
if told then
  return 4
elseif granted then
  return 3
end
return 1
"#,
        free_for_next = &*FREE_FOR_NEXT,
        settle_shares = &*SETTLE_SHARES_FN,
        holders = companion_of("KEYS[1]", "KEYS[2]", HOLDERS_PREFIX),
        names = companion_of("KEYS[1]", "KEYS[2]", NAMES_PREFIX),
        mark_contended = mark_contended("KEYS[1]", "value"),
    ))
});

/// KEYS: lock, and off a cluster its eviction marker. ARGV: owner token, new lease in
/// ms, publish command, "1" to announce every shortened lease (RedLock: see `Node`),
/// on a cluster the eviction marker's name (else empty, when an argument follows), and
/// `c` for a grant's confirmation, which tells the next in line `C <id>` (see
/// `free_for_next`'s `N`). The release channel and the holders
/// (of a key held in shares) are derived from the marker (see [`companion_of`]).
/// Returns 1 when extended, 0 when not ours, -1 when force-unlocked, -2 when handed
/// off (see [`GONE`]). The
/// watchdog's renewals run it too, pipelined. A share's lease is its own score in the
/// holders set; the key then lasts as long as the longest share.
///
/// On a cluster only the lock key is declared: while its slot migrates with the lock
/// still on the source node, a script declaring companions that do not exist there is
/// refused whole (`TRYAGAIN`, for as long as the migration stalls), whereas this one
/// runs. It can touch an undeclared companion that has moved only off the common path,
/// and there the first touch of one is a read before any write: the script fails
/// whole, never half-way.
///
/// A lease made shorter than the key's remaining time to live is announced (`T:<ms>`,
/// as a taken reservation announces its lease): waiters sleep until the end of the
/// lease they were told, and a holder that shortens its lease and dies must cost them
/// no more than the lease in force (guarantee 3). Only a contended lock (see
/// [`CONTENDED`]) can have such waiters, or a key held in shares (its waiters mark
/// nothing), or on RedLock any lock (a waiter listens on masters its attempts may not
/// have marked); an uncontended lock's extend stays `GET` and `PEXPIRE`.
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local value = redis.pcall('GET', KEYS[1])
if {ours} then
  if ARGV[4] == '1' or string.find(value, '^%S+ %d+ %d+{CONTENDED}') then
    if ARGV[6] == 'c' then
      -- A grant's confirmation: the next in line, told when the grant would lapse
      -- (`N`, see `free_for_next`), is told it will not (`C <id>`), so that it does
      -- not attempt for nothing. Read before any write (see above on a moving slot).
      local forced = KEYS[2] or ARGV[5]
      -- pcall: on a cluster the waitlist is not declared, and while the slot migrates
      -- a read of it may fail; the confirmation must not (C only spares an attempt).
      local line = redis.pcall('ZRANGE', {waitlist}, 0, 0)
      local head = type(line) == 'table' and line[1]
      local id = head and string.match(head, '^({OWNER_PATTERN}) %d+ ')
      if id then
        local client = string.match(id, '(%x+):%x+$')
        local tag = string.sub(forced, 1, #forced - #KEYS[1] - {forced_prefix_len})
        redis.call(ARGV[3], tag .. '{GRANT_CHANNEL_PREFIX}' .. client .. ':' .. KEYS[1], 'C ' .. id)
      end
    end
    local before = redis.call('PTTL', KEYS[1])
    if ARGV[6] == 'c' then
      -- Picked up: the grant's mark goes with the grace (see `UNCONFIRMED`).
      redis.call('SET', KEYS[1], (string.gsub(value, '^(%S+ %d+ ){UNCONFIRMED}', '%1', 1)), 'PX', ARGV[2])
    else
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    if before > tonumber(ARGV[2]) then
      local forced = KEYS[2] or ARGV[5]
      redis.call(ARGV[3], {channel}, 'T:' .. ARGV[2])
    end
  else
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
-- Defined only off the common path: each definition costs every run that makes it.
local forced = KEYS[2] or ARGV[5]
{gone}{SERVER_MS_FN}{settle_shares}
if type(value) == 'string' and string.sub(value, 1, 7) == 'shared:' then
  local holders = {holders}
  local ms = server_ms()
  local score = redis.call('ZSCORE', holders, ARGV[1])
  if score and tonumber(score) > ms then
    -- The share names are read before any write (see above on a moving slot).
    redis.call('EXISTS', share_names(KEYS[1], holders))
    local before = redis.call('PTTL', KEYS[1])
    local ends = ms + tonumber(ARGV[2])
    redis.call('ZADD', holders, 'XX', ends, ARGV[1])
    local rest = settle_shares(KEYS[1], holders, ms)
    -- A read lock's waiters were told when the last share ends; a semaphore's, when
    -- the first one does.
    if (value == 'shared:0' and rest < before) or (value ~= 'shared:0' and ends < tonumber(score)) then
      local lease = rest
      if value ~= 'shared:0' then lease = ARGV[2] end
      redis.call(ARGV[3], {channel}, 'T:' .. lease)
    end
    return 1
  end
end
return gone(forced, ARGV[1])
"#,
        ours = owned_by("value", "ARGV[1]"),
        channel = companion_from("KEYS[1]", "forced", FORCED_PREFIX, RELEASE_CHANNEL_PREFIX),
        holders = companion_from("KEYS[1]", "forced", FORCED_PREFIX, HOLDERS_PREFIX),
        waitlist = companion_from("KEYS[1]", "forced", FORCED_PREFIX, WAITLIST_PREFIX),
        forced_prefix_len = FORCED_PREFIX.len(),
        gone = &*GONE,
        settle_shares = &*SETTLE_SHARES_FN,
    ))
});

/// KEYS: lock, waitlist, waitlist expiries, holders and share names (of a key held in
/// shares). Returns `{value, pttl, now ms, waiting, shares}` when the key holds a lock (one of ours,
/// held or kept, or shares of it), else nil: a free key, a reservation for the next
/// waiter (it is being taken), and an application's key of any other type or shape
/// are not locks. `waiting`: the waitlist's live entries; `shares`: for a key held in
/// shares, each live share's owner token, remaining lease (ms) and `<fencing token>
/// <client name>` (empty for a share an older redlock took), flat; else empty.
pub(crate) static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
{seen}
return seen() or shares_seen(KEYS[4], KEYS[5])
"#,
        seen = &*SEEN
    ))
});

/// KEYS: lock, waitlist, waitlist expiries, eviction marker, holders and share names
/// (of a key held in shares). ARGV: (unused), (unused), release channel, publish command, grace of a
/// reservation (ms). Frees a lock whoever holds it — every share of a key held in
/// shares — as its release would (the waitlist's head gets the reservation, every
/// waiter the news), and returns what it evicted as `INSPECT` would have seen it; nil
/// when the key held no lock.
///
/// A held lock's owner token is left in the eviction marker ([`FORCED_PREFIX`]) for as
/// long as the evicted lease had to run: the holder's next renewal, extension or
/// release answers -1 instead of 0 (see [`GONE`]), and it counts the loss as forced.
/// Evicted shares leave their owners' tokens, separated by spaces, for as long as the
/// longest of them had to run. One marker per key, gone with the lease it evicted:
/// nothing accumulates (a second eviction of the same key within that time names only
/// the later owners).
pub(crate) static FORCE_UNLOCK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
{seen}
local evicted = seen()
if evicted then
  local owner = string.match(evicted[1], '^(%S+) ')
  if owner and string.sub(owner, 1, 5) ~= 'kept:' then
    redis.call('SET', KEYS[4], owner, 'PX', math.max(1, evicted[2]))
  end
  free_for_next(nil)
  return evicted
end
evicted = shares_seen(KEYS[5], KEYS[6])
if evicted then
  local owners = {{}}
  for i = 1, #evicted[5], 3 do
    if string.sub(evicted[5][i], 1, 5) ~= 'kept:' then
      owners[#owners + 1] = evicted[5][i]
    end
  end
  if #owners > 0 then
    redis.call('SET', KEYS[4], table.concat(owners, ' '), 'PX', math.max(1, evicted[2]))
  end
  redis.call('DEL', KEYS[5], KEYS[6])
  free_for_next(nil)
end
return evicted
"#,
        seen = &*SEEN
    ))
});

/// `seen()`: the lock on KEYS[1] as `{value, pttl, now ms, waiting, {}}` (waiting: the
/// live entries of the waitlist KEYS[2]/KEYS[3]), or false when it holds no lock held
/// whole; `shares_seen(holders, names)`: the same for a key held in shares
/// (`shared:<limit>`), its last element each live share of `holders` (owner token,
/// remaining lease in ms, its entry in `names` or empty; flat), or false; brings `free_for_next` along for the script that frees it.
static SEEN: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
local channel, publish, grace = ARGV[3], ARGV[4], ARGV[5]
{IS_LOCK}
local function seen()
  -- Only a string short enough to be a lock's value is read: a large cached value
  -- must not be copied into the script.
  if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' or redis.call('STRLEN', KEYS[1]) > 1024 then
    return false
  end
  local value = redis.call('GET', KEYS[1])
  if not is_lock(value) then
    return false
  end
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    return false
  end
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  return {{value, ttl, ms, redis.call('ZCOUNT', KEYS[3], '(' .. ms, '+inf'), {{}}}}
end
local function shares_seen(holders, names)
  if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' or redis.call('STRLEN', KEYS[1]) > 30 then
    return false
  end
  local value = redis.call('GET', KEYS[1])
  local ttl = redis.call('PTTL', KEYS[1])
  if not string.match(value, '^shared:%d+$') or ttl < 0 or redis.call('TYPE', holders)['ok'] ~= 'zset' then
    return false
  end
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  -- Shares whose lease ended are gone, even before a script settles them.
  local live = redis.call('ZRANGEBYSCORE', holders, '(' .. ms, '+inf', 'WITHSCORES')
  if #live == 0 then
    return false
  end
  local owners = {{}}
  for i = 1, #live, 2 do
    local owner = live[i]
    if string.sub(owner, 1, 5) == 'kept:' then owner = string.sub(owner, 6) end
    owners[#owners + 1] = owner
  end
  -- A share an older redlock took has no name: empty. (In parts: Lua's `unpack`
  -- takes a few thousand values at most.)
  local named = {{}}
  for first = 1, #owners, 1000 do
    local part = redis.call('HMGET', names, unpack(owners, first, math.min(first + 999, #owners)))
    for i = 1, #part do
      named[first + i - 1] = part[i]
    end
  end
  local shares = {{}}
  for i = 1, #owners do
    shares[#shares + 1] = live[2 * i - 1]
    shares[#shares + 1] = math.floor(tonumber(live[2 * i]) - ms)
    shares[#shares + 1] = named[i] or ''
  end
  return {{value, ttl, ms, redis.call('ZCOUNT', KEYS[3], '(' .. ms, '+inf'), shares}}
end
{free_for_next}
"#,
        free_for_next = &*FREE_FOR_NEXT,
    )
});

/// `is_lock(value)`: the value of a lock redlock wrote (held, or kept for
/// `hold_at_least`): an owner token (32 hex digits, `:`, a hex counter: see `core`'s
/// `fresh_token`), a token (≤ 19 digits), a time in ms (≤ 15 digits, then `~` when
/// [contended](CONTENDED)) and a name; or an
/// owner token alone (a lock an older redlock wrote). `node::parse_lock_value` accepts
/// exactly the same shapes.
const IS_LOCK: &str = r#"
local OWNER = string.rep('%x', 32) .. ':' .. '%x+'
local function is_lock(value)
  if type(value) ~= 'string' or #value > 1024 then
    return false
  end
  if string.sub(value, 1, 5) == 'kept:' then
    value = string.sub(value, 6)
  end
  local owner, token, since = string.match(value, '^(' .. OWNER .. ') (%d+) (%d+)~? ')
  if not owner then
    -- A lock an older redlock wrote: its owner token alone.
    owner = string.match(value, '^' .. OWNER .. '$')
    return owner ~= nil and #owner <= 49
  end
  return #owner <= 49 and #token <= 19 and #since <= 15
end
"#;

/// KEYS: fence counter, lock. ARGV: token, the owner whose lock takes the token.
/// Raises the counter to the token if
/// below it and writes the token into the owner's lock (RedLock: the token chosen
/// from a majority is written back to it, on every master, so that each names the
/// token its holder was given).
pub(crate) static RAISE_FENCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
local value = redis.pcall('GET', KEYS[2])
if {ours} then
  local rest = string.match(value, '^%S+ %d+ (.*)$')
  if rest then
    redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[1] .. ' ' .. rest, 'KEEPTTL')
  end
end
local current = tonumber(redis.pcall('GET', KEYS[1])) or 0
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return redis.status_reply('OK')
"#,
        ours = owned_by("value", "ARGV[2]"),
    ))
});

/// The most keys [`VOUCH`] looks through on one master: it reads them all in one
/// script, during which the server serves nobody else (about a second per million
/// keys). A master of a new deployment holds few, if any.
pub(crate) const VOUCH_KEYS_LOOKED_AT: u64 = 100_000;

/// KEYS: the restart marker ([`BOOT_KEY`]). ARGV: `1` to vouch for a blank master (else
/// it only looks), the quarantine (the client's `max_lease`, ms), the most keys to look
/// through ([`VOUCH_KEYS_LOOKED_AT`]). Vouches for a master that holds no redlock data —
/// no lock, no key of redlock's — by writing the restart marker `<run_id>:0:vouched`
/// ([`ACQUIRE`]'s marker with no quarantine): the master votes at once, until its
/// process changes (a restart, a promotion, a flush starts a quarantine as usual).
///
/// Blank, besides a master with no key of redlock's at all, is one that holds only
/// what attempts leave on a master still in its first quarantine: the marker naming
/// its running process, found with no marker (`blank`) less than the quarantine ago,
/// and the fencing counter. Not blank (refused, nothing written): a lock's value (held,
/// kept, reserved, shares) under any key; any other key of redlock's (waitlists,
/// eviction markers, holders, on a cluster behind a slot tag); a marker naming another
/// process (the master restarted with redlock's data), one from stale data or an older
/// client, one older than the quarantine (the master may have voted), one that is not
/// a marker; a vouched marker with a fencing counter beside it (locks were taken
/// since: a vouch drops the counter of the first quarantine's attempts, which won
/// nothing, so that this holds). Check and write are one script: an attempt cannot
/// slip between them.
///
/// Returns `{1}` blank (marked when asked), `{2}` already vouched for by its running
/// process and unused since (nothing written), `{0, key, why}` not blank (`why`:
/// `lock`, `internal`, `restarted`, `stale`, `voted`, `used`), `{-1, keys}` more keys
/// than it looks through.
pub(crate) static VOUCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r#"
{IS_LOCK}
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local vouched = run_id .. ':0:vouched'
local already = false
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' then
  if kind ~= 'string' then
    return {{0, KEYS[1], 'stale'}}
  end
  local marker = redis.call('GET', KEYS[1])
  if marker == vouched then
    already = true
  else
    local id, since, origin = string.match(marker, '^(%w+):(%d+):(%a+)$')
    if not id then
      return {{0, KEYS[1], 'stale'}}
    end
    if id ~= run_id then
      return {{0, KEYS[1], 'restarted'}}
    end
    if origin ~= 'blank' or since == '0' then
      return {{0, KEYS[1], 'stale'}}
    end
    if now_us - tonumber(since) > tonumber(ARGV[2]) * 1000 then
      return {{0, KEYS[1], 'voted'}}
    end
  end
end
local size = redis.call('DBSIZE')
if size > tonumber(ARGV[3]) then
  return {{-1, size}}
end
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    if key == '{FENCE_KEY}' then
      -- Left by attempts during the first quarantine; after a vouch, by locks taken.
      if already or kind == 'none' then
        return {{0, key, 'used'}}
      end
    elseif key ~= KEYS[1] then
      if string.sub(key, 1, {reserved_len}) == '{RESERVED_PREFIX}' or string.find(key, '^{{[^}}]*}}{RESERVED_PREFIX}') then
        return {{0, key, 'internal'}}
      end
      if redis.call('TYPE', key)['ok'] == 'string' and redis.call('STRLEN', key) <= 1024 then
        local value = redis.call('GET', key)
        if is_lock(value) or string.find(value, '^reserved:%S+$') or string.find(value, '^shared:%d+$') then
          return {{0, key, 'lock'}}
        end
      end
    end
  end
until cursor == '0'
if already then
  return {{2}}
end
if ARGV[1] == '1' then
  redis.call('SET', KEYS[1], vouched)
  -- The counter of the first quarantine's attempts (they won nothing: no master voted)
  -- goes, so that a counter beside a vouched marker always means locks taken since.
  -- Tokens then come from the clock, as after any restart (see "Fencing tokens").
  redis.call('DEL', '{FENCE_KEY}')
end
return {{1}}
"#,
        reserved_len = RESERVED_PREFIX.len(),
    ))
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Not a check: a tool for `scripts/callgrind-scripts.sh`, which runs the scripts'
    /// contended steps under callgrind. Writes the source of the scripts it runs into
    /// the directory `REDLOCK_DUMP_SCRIPTS` names (`acquire.lua`, `release.lua`).
    #[test]
    #[ignore = "a tool for scripts/callgrind-scripts.sh"]
    fn dump_scripts() {
        let dir = std::env::var("REDLOCK_DUMP_SCRIPTS").expect("REDLOCK_DUMP_SCRIPTS: a directory");
        for (name, script) in [("acquire", &*ACQUIRE), ("release", &*RELEASE)] {
            std::fs::write(format!("{dir}/{name}.lua"), &script.code).expect("write a script");
        }
    }

    #[test]
    fn a_script_load_answering_another_scripts_sha_is_an_error() {
        let acquire = ACQUIRE.get_hash();
        assert!(loaded_as(acquire, acquire).is_ok());
        assert!(loaded_as(acquire, &acquire.to_uppercase()).is_ok());
        let error = loaded_as(acquire, RELEASE.get_hash()).expect_err("another script's SHA1");
        assert!(error.to_string().contains("out of step"), "{error}");
        // Every script has its own SHA1, so a reply out of step is always told apart.
        let mut hashes: Vec<&str> = all().iter().map(|script| script.get_hash()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), all().len());
    }
}
