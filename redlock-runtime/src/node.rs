//! One Redis server: its connection, its release notifications, and each lock
//! operation as one script call on it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};
use tokio::time::Instant;

use crate::cleanup::InFlight;
use crate::config::ClientConfig;
use crate::confirm::Confirming;
use crate::connection::{Connection, slot_of};
use crate::connection::{
    retrying_moves_and_reconnects, retrying_moves_and_resending, slot_is_moving, while_slot_moves,
};
use crate::grant_watch::GrantWatches;
use crate::notify::{Listener, ReleaseNotifications};
use crate::scripts;

/// What one acquire script run found.
pub(crate) enum Attempt {
    /// `handed_off`: the hand-off's previous owner still held it, and its lock was deleted.
    Acquired {
        token: u64,
        handed_off: bool,
    },
    /// `handed_off`: the hand-off's previous owner still held it and its lock was
    /// deleted, but the key went to someone first in line (a read lock's waiting
    /// writer): the release is done all the same.
    Busy {
        ttl: Duration,
        handed_off: bool,
        line: LineStatus,
    },
    NotALock {
        found: String,
    },
    /// The key is held in shares under another limit: `limit` permits (0: a read lock).
    OtherShares {
        limit: u32,
    },
}

/// What a busy attempt tells its waiter about the grants to come (one server; with
/// RedLock, which grants nothing, the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LineStatus {
    /// A fencing token above every grant made before the attempt ran and below every
    /// grant made after (0 when unknown): a grant message for this waiter at or below
    /// it was made before the attempt found the key busy, and is stale (see
    /// `acquire`'s `wait_for_news`).
    pub(crate) grant_floor: u64,
    /// The server clock (ms) when the attempt ran.
    pub(crate) server_ms: Option<u64>,
    /// The attempt put the waiter in line (at `server_ms`): a grant's time, which its
    /// message counts from the waiter's registration, is known from here.
    pub(crate) registered: bool,
}

/// What a release, extension or renewal found: the lock still `owner`'s (released,
/// kept or extended), gone, or gone because `force_unlock` evicted it (the script found
/// the eviction marker naming this owner: see `scripts::FORCE_UNLOCK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ours,
    Gone,
    Evicted,
    /// Gone because an acquire script of this client took it over (see
    /// `scripts::HANDED_MARK`): only a release after a hand-off whose taker's verdict was
    /// not heard takes that for released.
    HandedOff,
}

impl Verdict {
    /// The reply of the release and extend scripts: above 0 ours, -1 evicted, -2 handed
    /// off, else gone.
    pub(crate) fn of_reply(reply: i64) -> Self {
        match reply {
            1.. => Verdict::Ours,
            -1 => Verdict::Evicted,
            -2 => Verdict::HandedOff,
            _ => Verdict::Gone,
        }
    }

    pub(crate) fn is_ours(self) -> bool {
        self == Verdict::Ours
    }
}

/// How a RedLock master's process relates to the data it serves (see
/// `scripts::ACQUIRE`): may its answer count toward a majority? A master is in
/// quarantine from the moment a client finds its marker missing or naming another
/// process, until `max_lease` has passed on its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Boot {
    /// Its process has served its data for longer than the quarantine (or no check
    /// was asked for): it votes.
    Votes,
    /// In quarantine: restarted (empty, or from a snapshot or AOF), a replica promoted
    /// behind the master's address, flushed, or never used by redlock before — any of
    /// which may miss locks still running. Does not vote, for `left` more (by the
    /// master's clock when it answered; `None` from a reply that does not say).
    Quarantined { left: Option<Duration> },
}

impl Boot {
    pub(crate) fn votes(self) -> bool {
        self == Boot::Votes
    }
}

/// A connection to one Redis server, shared by every lock of a client.
pub(crate) struct Node {
    pub(crate) url: String,
    connection: Connection,
    notifications: Arc<ReleaseNotifications>,
    waitlist: WaitlistTimings,
    response_timeout: Duration,
    /// How long a renewal round goes on retrying a slot that moves (see
    /// `renew_by_slot`).
    renew_retries_for: Duration,
    /// Connections of their own for acquisitions confirmed by `WAIT`, which blocks the
    /// connection it is sent on.
    confirming: Option<Confirming>,
    /// A RedLock master: every release is published, contended or not (see
    /// `scripts::CONTENDED`), because a waiter listens on a majority of masters that
    /// need not be the ones its attempts marked.
    publish_every_release: bool,
    /// The lapsed-grant checks this node's releases started (see `watch_grant`): a
    /// shutdown waits for them, since its own releases may have granted.
    grant_checks: Arc<InFlight>,
    /// The keys those checks watch, one check of a key at a time.
    grant_watches: Arc<GrantWatches>,
}

/// Timings of the waitlist (see `scripts::ACQUIRE`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitlistTimings {
    /// How long a release reserves the key for the named waiter.
    pub(crate) reservation_ms: u64,
    /// How long a registration outlives the holder's lease; a waiter refreshes it by
    /// retrying when that lease ends at the latest (a writer waiting on readers, within
    /// `scripts::WRITER_REFRESH_MS`: its registration holds new readers back, so it
    /// must lapse soon after a writer that died).
    pub(crate) registration_slack_ms: u64,
}

impl WaitlistTimings {
    fn from_config(config: &ClientConfig) -> Self {
        WaitlistTimings {
            reservation_ms: config.reservation_grace.as_millis().max(1) as u64,
            registration_slack_ms: scripts::REGISTRATION_SLACK_MS,
        }
    }
}

/// A waiting client's place on a key's waitlist.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter<'a> {
    pub(crate) id: &'a str,
    pub(crate) registered: bool,
}

impl Node {
    /// A node around a connection that is up (or retrying: a RedLock master down at
    /// connect), its release notifications and its settings.
    pub(crate) fn new(
        url: String,
        connection: Connection,
        notifications: Arc<ReleaseNotifications>,
        config: &ClientConfig,
        confirming: Option<Confirming>,
    ) -> Self {
        Node {
            url,
            connection,
            notifications,
            waitlist: WaitlistTimings::from_config(config),
            response_timeout: config.response_timeout,
            renew_retries_for: (config.response_timeout * 3 / 4).min(config.renew_every / 2),
            confirming,
            publish_every_release: false,
            grant_checks: Arc::new(InFlight::default()),
            grant_watches: Arc::new(GrantWatches::default()),
        }
    }

    /// Resolves once no lapsed-grant check of this node's is running.
    pub(crate) async fn grant_checks_finished(&self) {
        self.grant_checks.none_running().await;
    }

    /// Makes this node a RedLock master (see `publish_every_release`).
    pub(crate) fn one_of_several_masters(mut self) -> Self {
        self.publish_every_release = true;
        self
    }

    /// Loads every script, so that none meets `NOSCRIPT` at its first use. redis-rs
    /// answered `NOSCRIPT` by loading the script and sending it again, and a command
    /// another task sent meanwhile on the same connection ran in between: a RedLock
    /// master that answered an attempt late ran the holder's release before the
    /// attempt's second send, and kept the lock for its whole lease (seen in
    /// `tests/redlock.rs`). A script that meets `NOSCRIPT` all the same (a restart, a
    /// failover) is now sent again with its source in one command (see
    /// `Connection::req_packed_command`). Best effort, within the response timeout: a
    /// server that refuses `SCRIPT LOAD` runs each script with its source at its first
    /// use.
    pub(crate) async fn load_scripts(&self) {
        let loads = scripts::all().map(|script| {
            let mut connection = self.connection.clone();
            async move { script.load_checked(&mut connection).await }
        });
        let loaded =
            tokio::time::timeout(self.response_timeout, futures_util::future::join_all(loads))
                .await;
        if !matches!(&loaded, Ok(replies) if replies.iter().all(Result::is_ok)) {
            tracing::debug!(url = %self.url, "redlock: could not load the scripts at connect; each loads at its first use");
        }
    }

    /// Warns when the server may evict keys under memory pressure: a held lock would
    /// silently vanish. Servers that refuse `CONFIG GET` (managed Redis, ACLs) are
    /// left unchecked.
    pub(crate) async fn check_eviction_policy(&self) {
        let mut connection = self.connection.clone();
        let asked = tokio::time::timeout(
            self.response_timeout,
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query_async::<Value>(&mut connection),
        )
        .await;
        let Ok(Ok(reply)) = asked else {
            return;
        };
        if let Some(policy) = eviction_policy(&reply)
            && policy != "noeviction"
        {
            tracing::warn!(
                url = %self.url,
                %policy,
                "redlock: the server's maxmemory-policy is `{policy}`, which can evict a held lock; \
                 locks need `maxmemory-policy noeviction`"
            );
        }
    }

    /// Runs the acquire script and then `WAIT` on a connection of their own (the one
    /// `WAIT` counts the script's write on, and blocks), so that other locks' traffic
    /// goes on meanwhile. The connection never follows a failover between the two: a
    /// newly promoted primary would confirm a write it never had.
    /// Returns the attempt and, when acquired, how many replicas confirmed it.
    pub(crate) async fn acquire_confirmed(
        &self,
        request: &AttemptRequest<'_>,
        replicas: usize,
        timeout: Duration,
    ) -> RedisResult<(Attempt, Boot, usize)> {
        let Some(confirming) = &self.confirming else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "replica confirmation is not available for this kind of server",
            )));
        };
        let (generation, mut connection) = confirming.checkout().await?;
        let (attempt, boot) = self.attempt_on(&mut connection, request).await?;
        let mut confirmed = 0;
        if matches!(attempt, Attempt::Acquired { .. }) {
            confirmed = redis::cmd("WAIT")
                .arg(replicas)
                .arg(timeout.as_millis() as u64)
                .query_async(&mut connection)
                .await?;
        }
        confirming.checkin(generation, connection);
        Ok((attempt, boot, confirmed))
    }

    /// Registers interest in `key`'s releases on this server.
    pub(crate) fn listen(
        &self,
        key: &str,
        waiter_id: Option<String>,
        since: Instant,
    ) -> (
        Listener,
        impl Future<Output = RedisResult<()>> + use<>,
        bool,
    ) {
        self.notifications
            .listen(self.connection.release_channel(key), waiter_id, since)
    }

    /// Registers `member`'s interest in grants of `key` on this server (see
    /// `scripts::GRANT_CHANNEL_PREFIX`): `client` is its client's id.
    pub(crate) fn listen_for_grants(
        &self,
        key: &str,
        client: &str,
        member: String,
        since: Instant,
    ) -> (
        Listener,
        impl Future<Output = RedisResult<()>> + use<>,
        bool,
    ) {
        self.notifications.listen(
            self.connection.grant_channel(key, client),
            Some(member),
            since,
        )
    }

    /// One run of the acquire script. If this future is dropped or fails while Redis
    /// may have run the script, the caller cleans up (see `acquire`).
    pub(crate) async fn acquire(
        &self,
        request: &AttemptRequest<'_>,
    ) -> RedisResult<(Attempt, Boot)> {
        let mut connection = self.connection.clone();
        self.attempt_on(&mut connection, request).await
    }

    async fn attempt_on(
        &self,
        connection: &mut impl ConnectionLike,
        request: &AttemptRequest<'_>,
    ) -> RedisResult<(Attempt, Boot)> {
        if let Some(limit) = request.shares {
            return self.share_on(connection, request, limit).await;
        }
        let key = request.key;
        let mut script = scripts::ACQUIRE.key(key);
        let cluster = self.connection.is_cluster();
        // The arguments that are usually empty go last, and only when needed.
        let trailing = request.previous_owner.is_some() || request.quarantine_ms.is_some();
        if cluster {
            // Declared on a cluster (see `scripts::ACQUIRE`); the lock key stands in for
            // the restart marker (RedLock's only).
            let [waitlist, expiries] = self.connection.waitlist_keys(key);
            script
                .key(self.connection.fence_key(key).as_ref())
                .key(waitlist)
                .key(key)
                .key(expiries);
            if request.previous_owner.is_some() {
                // Where a hand-off leaves its evidence.
                script.key(self.connection.forced_key(key));
            }
        } else if request.quarantine_ms.is_some() {
            script
                .key(self.connection.fence_key(key).as_ref())
                .key(self.connection.waitlist_key(key))
                .key(scripts::BOOT_KEY);
        }
        // Elsewhere the lock key alone: the script derives the counter and the waitlist.
        script
            .arg(request.owner)
            .arg(request.lease_ms)
            .arg(request.name)
            .arg(request.waiter.map_or("", |waiter| waiter.id));
        // "Not registered yet" and the registration's slack are the script's defaults,
        // left out when nothing follows: an uncontended attempt sends 4 arguments.
        let registered = request.waiter.is_some_and(|waiter| waiter.registered);
        let slack = self.waitlist.registration_slack_ms;
        let slack_follows = slack != scripts::REGISTRATION_SLACK_MS || cluster || trailing;
        if registered || slack_follows {
            script.arg(if registered { "1" } else { "0" });
        }
        if slack_follows {
            script.arg(slack);
        }
        if cluster || trailing {
            // PUBLISH, the script's default, is left out when nothing follows.
            script.arg(self.connection.publish_command());
        }
        if trailing {
            script.arg(request.previous_owner.unwrap_or(""));
        }
        if let Some(quarantine_ms) = request.quarantine_ms {
            script.arg(quarantine_ms);
        } else if request.previous_owner.is_some() {
            script.arg("");
        }
        if request.previous_owner.is_some() {
            script.arg(self.hand_off_evidence_ms());
        }
        parse_acquire_reply(script.invoke_async(connection).await?)
    }

    /// Whether one script may touch every one of `keys` on this node.
    pub(crate) fn in_one_slot(&self, keys: &[String]) -> bool {
        self.connection.in_one_slot(keys)
    }

    /// One run of `scripts::ACQUIRE_ALL`: `keys` (in one slot) taken in order, each for
    /// the matching owner of `owners`, up to the first that is not free; the tokens of
    /// those taken, in order (none: nothing was written).
    pub(crate) async fn acquire_all(
        &self,
        keys: &[String],
        owners: &[String],
        lease_ms: u64,
        name: &str,
    ) -> RedisResult<Vec<u64>> {
        let Some(first) = keys.first() else {
            return Ok(Vec::new());
        };
        let mut script = scripts::ACQUIRE_ALL.key(self.connection.fence_key(first).as_ref());
        for key in keys {
            script.key(key);
        }
        script.arg(lease_ms).arg(name);
        for owner in owners {
            script.arg(owner);
        }
        let mut connection = self.connection.clone();
        match script.invoke_async(&mut connection).await? {
            Value::Array(tokens) if tokens.len() <= keys.len() => tokens
                .iter()
                .map(|token| match token {
                    Value::Int(token) if *token > 0 => Ok(*token as u64),
                    other => Err(redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "unexpected token from the acquire-all script",
                        format!("{other:?}"),
                    ))),
                })
                .collect::<RedisResult<Vec<u64>>>(),
            other => Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "unexpected reply from the acquire-all script",
                format!("{other:?}"),
            ))),
        }
    }

    /// One run of the shares' acquire script (a read lock, a semaphore's permit).
    async fn share_on(
        &self,
        connection: &mut impl ConnectionLike,
        request: &AttemptRequest<'_>,
        limit: u32,
    ) -> RedisResult<(Attempt, Boot)> {
        let key = request.key;
        let [waitlist, expiries] = self.connection.waitlist_keys(key);
        let mut script = scripts::SHARED_ACQUIRE.key(key);
        script
            .key(waitlist)
            .key(expiries)
            .key(self.connection.holders_key(key))
            .key(self.connection.fence_key(key).as_ref());
        if request.previous_owner.is_some() || self.connection.is_cluster() {
            // Where a hand-off leaves its evidence.
            script.key(self.connection.forced_key(key));
        }
        if self.connection.is_cluster() {
            // Every key declared on a cluster (see `scripts::ACQUIRE`).
            script.key(self.connection.names_key(key));
        }
        script
            .arg(request.owner)
            .arg(request.lease_ms)
            .arg(self.connection.release_channel(key))
            .arg(self.connection.publish_command())
            .arg(self.waitlist.reservation_ms)
            .arg(request.waiter.map_or("", |waiter| waiter.id))
            .arg(if request.waiter.is_some_and(|waiter| waiter.registered) {
                "1"
            } else {
                "0"
            })
            .arg(self.waitlist.registration_slack_ms)
            .arg(request.previous_owner.unwrap_or(""))
            .arg(limit)
            .arg(request.name);
        if request.previous_owner.is_some() {
            script.arg(self.hand_off_evidence_ms());
        }
        let reply: Vec<Value> = script.invoke_async(connection).await?;
        parse_attempt(reply)
    }

    /// How long the evidence of a hand-off lasts (ms; see `scripts::HANDED_MARK`): until
    /// the releasing holder has read it at the latest. It waits for its taker's verdict
    /// for the pick-up limit (a tenth of a second) and a response timeout at most, then
    /// releases in Redis, whose reply takes a response timeout at most (more while a
    /// slot moves): three response timeouts and a second leave room for that.
    fn hand_off_evidence_ms(&self) -> u64 {
        (self.response_timeout * 3 + Duration::from_secs(1)).as_millis() as u64
    }

    /// Compare-and-delete (or keep for `keep_ms`).
    pub(crate) async fn release(
        &self,
        key: &str,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<Verdict> {
        let (reply, first_send_failed) =
            retrying_moves_and_resending(self.response_timeout, || {
                release_on(
                    self.connection.clone(),
                    self.waitlist,
                    key,
                    owner,
                    keep_ms,
                    self.publish_every_release,
                )
            })
            .await?;
        // Sent twice, the first run may have granted the key and its reply been lost:
        // the check passes on a grant nobody confirms, and does nothing otherwise.
        if reply == GRANTED || first_send_failed.is_some() {
            self.watch_grant(key);
        }
        let verdict = Verdict::of_reply(reply);
        match first_send_failed {
            // The second run found the lock gone: the first may have released it, or
            // it was lost before. Unknown, as when no answer came (the guard then says
            // lost if its lease has run out).
            Some(error) if matches!(verdict, Verdict::Gone | Verdict::HandedOff) => Err(error),
            _ => Ok(verdict),
        }
    }

    /// Takes a waiter that gave up off `key`'s waitlist (passing on a reservation or a
    /// grant made for it meanwhile).
    pub(crate) async fn leave_waitlist(&self, key: &str, waiter_id: &str) -> RedisResult<()> {
        let (reply, first_send_failed) = self
            .waitlist_script(&scripts::LEAVE_WAITLIST, key, waiter_id)
            .await?;
        // Sent twice, the first run may have passed a grant on, its reply lost.
        if reply == GRANTED || reply == GRANT_UNWATCHED || first_send_failed.is_some() {
            self.watch_grant(key);
        }
        Ok(())
    }

    /// Runs `script` (LEAVE_WAITLIST's keys and arguments) for `key`.
    async fn waitlist_script(
        &self,
        script: &redis::Script,
        key: &str,
        waiter_id: &str,
    ) -> RedisResult<(i64, Option<redis::RedisError>)> {
        retrying_moves_and_resending(self.response_timeout, || {
            waitlist_script_on(
                self.connection.clone(),
                self.waitlist,
                script,
                key,
                waiter_id,
            )
        })
        .await
    }

    /// A release of ours granted `key` to a waiter of another client (or of this one),
    /// and no waiter after it heard `N` (see [`GRANTED_NEXT_TOLD`]), or the reply was
    /// lost: should nobody confirm the grant (its process gone, stopped or cut off
    /// without Redis knowing yet), it lapses with the grace, and then the next in line
    /// must not wait for the lease it was told. So, a little after the grace, the key is freed
    /// for the next in line if it is free while someone waits (`scripts::LAPSED_GRANT`),
    /// again for as long as that grants it anew. A runtime shutting down drops this
    /// check: the waiters then retry when the lease they were told ends.
    ///
    /// Grants on one key share the check under way (see `grant_watch`): a semaphore
    /// whose permits pass between clients grants on nearly every release.
    fn watch_grant(&self, key: &str) {
        let after = Duration::from_millis(self.waitlist.reservation_ms + GRANT_CHECK_MARGIN_MS);
        let Some(id) = self.grant_watches.watch(key, Instant::now() + after) else {
            return;
        };
        let connection = self.connection.clone();
        let timings = self.waitlist;
        let key = key.to_owned();
        let response_timeout = self.response_timeout;
        let watches = self.grant_watches.clone();
        let running = self.grant_checks.start();
        tokio::spawn(async move {
            let _running = running;
            // However the task ends (dropped with its runtime, too), the next grant on the
            // key is watched anew.
            let _ends = EndsWatch {
                watches: &watches,
                key: &key,
                id,
            };
            let mut checked_again = false;
            loop {
                tokio::time::sleep_until(watches.next(&key)).await;
                let checked_at = Instant::now();
                let checked = retrying_moves_and_resending(response_timeout, || {
                    waitlist_script_on(
                        connection.clone(),
                        timings,
                        &scripts::LAPSED_GRANT,
                        &key,
                        "",
                    )
                })
                .await;
                let granted_anew = match checked {
                    Ok((GRANTED, _)) => true,
                    // Passed on, and the waiter after it watches the new grant.
                    Ok((GRANTED_NEXT_TOLD, None)) => false,
                    // Sent twice: the first run may have granted anew, its reply lost
                    // (checked once more, as a grant; once for each run of resends).
                    Ok((_, Some(_))) if !checked_again => {
                        checked_again = true;
                        true
                    }
                    Ok(_) => false,
                    Err(error) => {
                        // The grants due by now fall back on their waiters' lease
                        // timers; those made since are still checked when due.
                        tracing::debug!(%error, %key, "redlock: could not check a grant; waiters fall back on their lease timers");
                        false
                    }
                };
                if !granted_anew {
                    checked_again = false;
                }
                // A grant this check made lapses a grace after its reply, not its send.
                let answered_at = Instant::now();
                if watches
                    .checked(&key, checked_at, answered_at, after, granted_anew)
                    .is_none()
                {
                    return;
                }
            }
        });
    }

    /// The lock on `key`, if one is held (or kept for `hold_at_least`).
    pub(crate) async fn inspect(&self, key: &str) -> RedisResult<Option<Seen>> {
        retrying_moves_and_reconnects(self.response_timeout, || {
            let mut connection = self.connection.clone();
            let [waitlist, expiries] = self.connection.waitlist_keys(key);
            let holders = self.connection.holders_key(key);
            let names = self.connection.names_key(key);
            async move {
                let reply: SeenReply = scripts::INSPECT
                    .key(key)
                    .key(waitlist)
                    .key(expiries)
                    .key(holders)
                    .key(names)
                    .invoke_async(&mut connection)
                    .await?;
                Ok(parse_seen(reply))
            }
        })
        .await
    }

    /// Frees the lock on `key` whoever holds it, as a release would; what it evicted,
    /// or `None` when no lock was held.
    pub(crate) async fn force_unlock(&self, key: &str) -> RedisResult<Option<Seen>> {
        // Not sent again on a closed connection: if the first run freed the lock, a
        // second one would evict the waiter it let in.
        while_slot_moves(self.response_timeout, || {
            let mut connection = self.connection.clone();
            let [waitlist, expiries] = self.connection.waitlist_keys(key);
            let forced = self.connection.forced_key(key);
            let channel = self.connection.release_channel(key);
            let publish = self.connection.publish_command();
            let reservation_ms = self.waitlist.reservation_ms;
            let holders = self.connection.holders_key(key);
            let names = self.connection.names_key(key);
            async move {
                let reply: SeenReply = scripts::FORCE_UNLOCK
                    .key(key)
                    .key(waitlist)
                    .key(expiries)
                    .key(forced)
                    .key(holders)
                    .key(names)
                    .arg("")
                    .arg("")
                    .arg(channel)
                    .arg(publish)
                    .arg(reservation_ms)
                    .invoke_async(&mut connection)
                    .await?;
                Ok(parse_seen(reply))
            }
        })
        .await
    }

    /// The keys matching `pattern` that may be locks (strings, never redlock's own).
    pub(crate) async fn candidates(&self, pattern: &str) -> RedisResult<Vec<String>> {
        let mut keys = self.connection.scan_strings(pattern).await?;
        keys.retain(|key| !is_internal(key));
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Compare-and-expire; a lease made shorter is announced to the waiters (see
    /// `scripts::EXTEND`).
    pub(crate) async fn extend(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> RedisResult<Verdict> {
        self.extend_within(self.response_timeout, key, owner, lease_ms, false)
            .await
    }

    /// A grant's confirmation: [`Node::extend`], which also tells the next in line
    /// that the grant will not lapse (see `scripts::EXTEND`).
    pub(crate) async fn confirm_grant(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> RedisResult<Verdict> {
        self.extend_within(self.response_timeout, key, owner, lease_ms, true)
            .await
    }

    /// [`Node::extend`], retried for at most `limit` while the key's slot moves.
    async fn extend_within(
        &self,
        limit: Duration,
        key: &str,
        owner: &str,
        lease_ms: u64,
        confirming: bool,
    ) -> RedisResult<Verdict> {
        retrying_moves_and_reconnects(limit, || {
            let mut connection = self.connection.clone();
            let (keys, mut args) = self.extend_call(key, owner, lease_ms);
            if confirming {
                if keys.len() > 1 {
                    args.push(String::new());
                }
                args.push("c".to_owned());
            }
            async move {
                let mut invocation = scripts::EXTEND.prepare_invoke();
                invocation.key(keys).arg(args);
                invocation.invoke_async(&mut connection).await
            }
        })
        .await
        .map(Verdict::of_reply)
    }

    /// The extend script's KEYS and ARGV for one lock (see `scripts::EXTEND`): on a
    /// cluster only the lock key is declared, so that a lock in a slot that migrates
    /// is still renewed on the node that holds it.
    fn extend_call(&self, key: &str, owner: &str, lease_ms: u64) -> (Vec<String>, Vec<String>) {
        let forced = self.connection.forced_key(key);
        let announce_every = if self.publish_every_release { "1" } else { "" };
        let mut keys = vec![key.to_owned()];
        let mut args = vec![
            owner.to_owned(),
            lease_ms.to_string(),
            self.connection.publish_command().to_owned(),
            announce_every.to_owned(),
        ];
        if self.connection.is_cluster() {
            args.push(forced);
        } else {
            keys.push(forced);
        }
        (keys, args)
    }

    /// Raises the fencing counter of `key` on this server to at least `token`, and
    /// writes `token` into `owner`'s lock there (RedLock: the token chosen from the
    /// majority, so that every master names the token its holder was given).
    pub(crate) async fn raise_fence(&self, key: &str, token: u64, owner: &str) -> RedisResult<()> {
        let mut connection = self.connection.clone();
        scripts::RAISE_FENCE
            .key(self.connection.fence_key(key).as_ref())
            .key(key)
            .arg(token)
            .arg(owner)
            .invoke_async(&mut connection)
            .await
    }

    /// Looks whether this master holds no redlock data (see `scripts::VOUCH`), and with
    /// `mark` vouches for it if so, in the same script; `quarantine_ms` is the client's
    /// `max_lease`. Sent once: a vouch that met no answer may have run.
    pub(crate) async fn vouch(&self, mark: bool, quarantine_ms: u64) -> RedisResult<Blankness> {
        let mut connection = self.connection.clone();
        let reply: Vec<Value> = scripts::VOUCH
            .key(scripts::BOOT_KEY)
            .arg(if mark { "1" } else { "" })
            .arg(quarantine_ms)
            .arg(scripts::VOUCH_KEYS_LOOKED_AT)
            .invoke_async(&mut connection)
            .await?;
        parse_vouch(reply)
    }

    /// Renews many locks in one pipelined round trip (on a cluster, one per slot in
    /// use, sent concurrently: a pipeline may not cross slots). Per lock, its verdict,
    /// or `None` when its renewal failed while others' went through (on a cluster, its
    /// slot moving or its node not answering). `Err` when nothing was renewed.
    pub(crate) async fn renew(
        &self,
        locks: &[(&str, &str)],
        lease_ms: u64,
    ) -> RedisResult<Vec<Option<Verdict>>> {
        if !self.connection.is_cluster() {
            let replies = self
                .renew_pipeline(self.connection.clone(), locks, lease_ms)
                .await?;
            return Ok(replies.into_iter().map(verdict_of).collect());
        }
        Ok(self.renew_by_slot(locks, lease_ms).await)
    }

    /// Each slot on its own: a slot that migrates, or a node that does not answer,
    /// must not hold back the renewals of the locks elsewhere. A slot's answer is
    /// awaited for three quarters of the response timeout, so that the others' are in
    /// before the caller gives up on the whole round (`Masters::renew`); a slot that
    /// moves is retried for `renew_retries_for` at most, so that the round ends in time
    /// for the next one (the watchdog starts it once this one is over): a lock left
    /// unrenewed this round is tried again the next.
    async fn renew_by_slot(&self, locks: &[(&str, &str)], lease_ms: u64) -> Vec<Option<Verdict>> {
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> =
            std::collections::HashMap::new();
        for (index, (key, _)) in locks.iter().enumerate() {
            by_slot
                .entry(slot_of(key.as_bytes()))
                .or_default()
                .push(index);
        }
        let groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        let answer_within = self.response_timeout * 3 / 4;
        let replies = futures_util::future::join_all(groups.iter().map(|group| {
            let batch: Vec<(&str, &str)> = group.iter().map(|&index| locks[index]).collect();
            async move {
                let renewed = self.renew_slot(&batch, lease_ms, self.renew_retries_for);
                tokio::time::timeout(answer_within, renewed)
                    .await
                    .unwrap_or_else(|_| {
                        tracing::warn!(locks = batch.len(), "redlock.renew: no answer for a slot");
                        vec![None; batch.len()]
                    })
            }
        }))
        .await;
        let mut renewed = vec![None; locks.len()];
        for (group, reply) in groups.iter().zip(replies) {
            for (&index, one) in group.iter().zip(reply) {
                renewed[index] = one;
            }
        }
        renewed
    }

    /// The locks of one slot in one pipeline; a lock its node refused because the slot
    /// moves is tried again on its own (the cluster connection follows a lock that
    /// moved). No retry starts after `retries_for`.
    async fn renew_slot(
        &self,
        batch: &[(&str, &str)],
        lease_ms: u64,
        retries_for: Duration,
    ) -> Vec<Option<Verdict>> {
        let deadline = Instant::now() + retries_for;
        let replies = match retrying_moves_and_reconnects(retries_for, || {
            self.renew_pipeline(self.connection.clone(), batch, lease_ms)
        })
        .await
        {
            Ok(replies) => replies,
            Err(error) => {
                tracing::warn!(%error, locks = batch.len(), "redlock.renew failed for a slot");
                return vec![None; batch.len()];
            }
        };
        let mut renewed = Vec::with_capacity(batch.len());
        for (reply, &(key, owner)) in replies.into_iter().zip(batch) {
            renewed.push(match reply {
                Err(error) if slot_is_moving(&error) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let retried = if left.is_zero() {
                        Err(error)
                    } else {
                        self.extend_within(left, key, owner, lease_ms, false).await
                    };
                    retried
                        .inspect_err(|error| {
                            tracing::warn!(%error, %key, "redlock.renew failed: the slot moves")
                        })
                        .ok()
                }
                other => verdict_of(other),
            });
        }
        renewed
    }

    /// One pipeline of the extend script, one call per lock, each answered on its own:
    /// 1 renewed, 0 gone, -1 evicted (see [`Verdict::of_reply`]), or the error that
    /// call met. `Err` when the pipeline as a whole got no answer.
    async fn renew_pipeline(
        &self,
        mut connection: Connection,
        locks: &[(&str, &str)],
        lease_ms: u64,
    ) -> RedisResult<Vec<RedisResult<i64>>> {
        let mut pipeline = redis::pipe();
        pipeline.ignore_errors();
        for (key, owner) in locks {
            let (keys, args) = self.extend_call(key, owner, lease_ms);
            pipeline
                .cmd("EVALSHA")
                .arg(scripts::EXTEND.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args);
        }
        let replies: Vec<RedisResult<i64>> = pipeline.query_async(&mut connection).await?;
        let no_script = |reply: &RedisResult<i64>| {
            reply.as_ref().is_err_and(|error| {
                error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            })
        };
        if replies.iter().any(no_script) {
            // Redis restarted (or flushed its scripts): load it, then renew once more.
            scripts::EXTEND.load_checked(&mut connection).await?;
            return pipeline.query_async(&mut connection).await;
        }
        Ok(replies)
    }
}

/// Ends a lapsed-grant check's watch when its task ends (see `GrantWatches::end`).
struct EndsWatch<'a> {
    watches: &'a GrantWatches,
    key: &'a str,
    id: u64,
}

impl Drop for EndsWatch<'_> {
    fn drop(&mut self) {
        self.watches.end(self.key, self.id);
    }
}

/// One lock's renewal reply as a verdict; `None` (logged) when it failed.
fn verdict_of(reply: RedisResult<i64>) -> Option<Verdict> {
    match reply {
        Ok(reply) => Some(Verdict::of_reply(reply)),
        Err(error) => {
            tracing::warn!(%error, "redlock.renew failed for a lock");
            None
        }
    }
}

/// The reply of the release, leave-waitlist and lapsed-grant scripts when they granted
/// the key to the next in line (see `scripts::GRANT_CHANNEL_PREFIX`), and nobody else
/// watches that grant: this client checks it (see `Node::watch_grant`).
const GRANTED: i64 = 3;
/// Their reply when they granted the key and the waiter after the grantee heard that it
/// lapses unless confirmed (`N`): that waiter covers the lapse, whatever becomes of this
/// client, and no check is made here.
const GRANTED_NEXT_TOLD: i64 = 4;
/// The leave-waitlist script's reply when the key may be under a grant whose lapse the
/// waiter leaving was told of, and no other client heard it passed on: this client
/// checks it, as the releasing client would have.
const GRANT_UNWATCHED: i64 = 5;

/// How long after the grace the releasing client checks for a grant nobody confirmed
/// (ms): the grantee's confirmation, sent as the message arrived, is answered by then
/// unless it is gone or far behind.
const GRANT_CHECK_MARGIN_MS: u64 = 5;

/// The grace `scripts::RELEASE` assumes when it is left out.
const DEFAULT_GRACE_MS: u64 = crate::config::DEFAULT_RESERVATION_GRACE.as_millis() as u64;

async fn waitlist_script_on(
    mut connection: Connection,
    timings: WaitlistTimings,
    script: &redis::Script,
    key: &str,
    waiter_id: &str,
) -> RedisResult<i64> {
    let [waitlist, expiries] = connection.waitlist_keys(key);
    let mut invocation = script.key(key);
    invocation
        .key(waitlist)
        .key(expiries)
        .key(connection.fence_key(key).as_ref());
    if connection.is_cluster() {
        // Every key declared on a cluster (see `scripts::ACQUIRE`).
        invocation
            .key(connection.holders_key(key))
            .key(connection.names_key(key));
    }
    invocation
        .arg(waiter_id)
        .arg("")
        .arg(connection.release_channel(key))
        .arg(connection.publish_command())
        .arg(timings.reservation_ms)
        .invoke_async::<i64>(&mut connection)
        .await
}

async fn release_on(
    mut connection: Connection,
    timings: WaitlistTimings,
    key: &str,
    owner: &str,
    keep_ms: u64,
    publish_every_release: bool,
) -> RedisResult<i64> {
    let publish = connection.publish_command();
    let cluster = connection.is_cluster();
    let mut script = scripts::RELEASE.key(key);
    if cluster {
        // Every key declared on a cluster (see `scripts::ACQUIRE`).
        let [waitlist, expiries] = connection.waitlist_keys(key);
        let forced = connection.forced_key(key);
        script
            .key(waitlist)
            .key(expiries)
            .key(forced)
            .key(connection.holders_key(key))
            .key(connection.names_key(key))
            .key(connection.fence_key(key).as_ref());
    }
    // Off a cluster the lock key alone: the script derives the waitlist.
    script.arg(owner);
    // Keeping nothing, the default grace and PUBLISH are the script's defaults, left out
    // when nothing follows: an uncontended release sends the owner alone.
    let trailing = cluster || publish_every_release;
    let default_grace = timings.reservation_ms == DEFAULT_GRACE_MS;
    if keep_ms > 0 || !default_grace || trailing {
        script.arg(keep_ms);
    }
    if !default_grace || trailing {
        script.arg(timings.reservation_ms);
    }
    if trailing {
        script.arg(publish);
    }
    if publish_every_release {
        script.arg("1");
    }
    script.invoke_async(&mut connection).await
}

/// The acquire script's reply: the common success as a bare token (its digits; an
/// integer from older scripts), anything else as the array [`parse_attempt`] reads
/// (see `scripts::ACQUIRE`).
fn parse_acquire_reply(reply: Value) -> RedisResult<(Attempt, Boot)> {
    let token = match &reply {
        Value::Int(token) if *token > 0 => Some(*token as u64),
        Value::BulkString(digits) => std::str::from_utf8(digits)
            .ok()
            .and_then(|digits| digits.parse::<u64>().ok())
            .filter(|token| *token > 0),
        _ => None,
    };
    if let Some(token) = token {
        return Ok((
            Attempt::Acquired {
                token,
                handed_off: false,
            },
            Boot::Votes,
        ));
    }
    match reply {
        Value::Array(reply) => parse_attempt(reply),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the acquire script",
            format!("{other:?}"),
        ))),
    }
}

fn parse_attempt(reply: Vec<Value>) -> RedisResult<(Attempt, Boot)> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(number) => number.to_string(),
        other => format!("{other:?}"),
    };
    let number = |value: Option<&Value>| match value {
        Some(Value::Int(number)) => u64::try_from(*number).ok(),
        Some(other) => text(other).parse().ok(),
        None => None,
    };
    let bad_reply = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the acquire script",
            format!("{reply:?}"),
        ))
    };
    let value = reply.get(1);
    // The master's restart status: after the token and the hand-off flag when
    // acquired, after the ttl or type otherwise; how long its quarantine has left comes
    // last (a reply without it, from an older script, says nothing of it).
    let (boot_at, left_at) = match reply.first() {
        Some(Value::Int(1)) => (3, 4),
        Some(Value::Int(0)) => (2, 7),
        _ => (2, 3),
    };
    let boot = match reply.get(boot_at) {
        Some(Value::Int(2)) => Boot::Quarantined {
            left: number(reply.get(left_at)).map(Duration::from_millis),
        },
        _ => Boot::Votes,
    };
    let attempt = match reply.first() {
        Some(Value::Int(1)) => {
            let token = number(value).ok_or_else(bad_reply)?;
            Ok(Attempt::Acquired {
                token,
                handed_off: number(reply.get(2)) == Some(1),
            })
        }
        Some(Value::Int(0)) => number(value)
            .map(|ttl| Attempt::Busy {
                ttl: Duration::from_millis(ttl),
                handed_off: number(reply.get(3)) == Some(1),
                line: LineStatus {
                    grant_floor: number(reply.get(4)).unwrap_or(0),
                    server_ms: number(reply.get(5)),
                    registered: number(reply.get(6)) == Some(1),
                },
            })
            .ok_or_else(bad_reply),
        Some(Value::Int(-2)) => number(value)
            .and_then(|limit| u32::try_from(limit).ok())
            .map(|limit| Attempt::OtherShares { limit })
            .ok_or_else(bad_reply),
        Some(Value::Int(_)) => Ok(Attempt::NotALock {
            found: value.map(text).unwrap_or_default(),
        }),
        _ => Err(bad_reply()),
    }?;
    Ok((attempt, boot))
}

/// What the vouch script found on a master (see `scripts::VOUCH`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Blankness {
    /// It holds no redlock data: vouched for now (or it would be, when only looking).
    Blank,
    /// Its marker already vouches for its running process, and nothing was locked on
    /// it since: nothing written.
    AlreadyVouched,
    /// Redlock used it: `key` shows how.
    Used { key: String, sign: UseSign },
    /// It holds more keys than a vouch looks through.
    TooManyKeys { keys: u64 },
}

/// What shows that redlock used a master (see `scripts::VOUCH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UseSign {
    /// A lock's value: held, kept, reserved, or shares.
    Lock,
    /// Another key of redlock's: a waitlist, an eviction marker, a key's holders.
    Internal,
    /// The restart marker names another Redis process: it restarted with redlock's data.
    Restarted,
    /// The restart marker says it started from redlock's data (or an older client's
    /// adoption), or it is not a marker.
    Stale,
    /// The restart marker is older than the quarantine: it may have voted for locks.
    Voted,
    /// The fencing counter, without the marker of a first quarantine: locks were taken.
    Counter,
}

fn parse_vouch(reply: Vec<Value>) -> RedisResult<Blankness> {
    let bad_reply = || {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from the vouch script",
            format!("{reply:?}"),
        ))
    };
    let text = |value: Option<&Value>| match value {
        Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Some(Value::SimpleString(text)) => Some(text.clone()),
        _ => None,
    };
    match reply.first() {
        Some(Value::Int(1)) => Ok(Blankness::Blank),
        Some(Value::Int(2)) => Ok(Blankness::AlreadyVouched),
        Some(Value::Int(-1)) => match reply.get(1) {
            Some(Value::Int(keys)) => Ok(Blankness::TooManyKeys {
                keys: u64::try_from(*keys).unwrap_or(0),
            }),
            _ => Err(bad_reply()),
        },
        Some(Value::Int(0)) => {
            let key = text(reply.get(1)).ok_or_else(bad_reply)?;
            let sign = match text(reply.get(2)).as_deref() {
                Some("lock") => UseSign::Lock,
                Some("internal") => UseSign::Internal,
                Some("restarted") => UseSign::Restarted,
                Some("voted") => UseSign::Voted,
                Some("used") => UseSign::Counter,
                Some(_) => UseSign::Stale,
                None => return Err(bad_reply()),
            };
            Ok(Blankness::Used { key, sign })
        }
        _ => Err(bad_reply()),
    }
}

/// What one acquire script run asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttemptRequest<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease_ms: u64,
    /// A same-client holder handing the lock off (see `turn`).
    pub(crate) previous_owner: Option<&'a str>,
    /// Set for an attempt that will wait if it fails (it takes a place on the waitlist).
    pub(crate) waiter: Option<Waiter<'a>>,
    /// RedLock: the restart quarantine in ms (see [`Boot`]).
    pub(crate) quarantine_ms: Option<u64>,
    /// The client's name, written into the lock for `inspect`.
    pub(crate) name: &'a str,
    /// A share rather than the whole key: `Some(0)` a read lock, `Some(n)` one of a
    /// semaphore's `n` permits (one server only: see `scripts::SHARED_ACQUIRE`).
    pub(crate) shares: Option<u32>,
}

/// The holder shown for a lock an older redlock wrote (its value names no client).
pub(crate) const OLDER_HOLDER: &str = "(unknown: taken by an older redlock)";

/// A lock as one server sees it: what its value says (see `scripts` on the lock's
/// value), its remaining lease and how many clients wait on the waitlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) owner: String,
    pub(crate) holder: String,
    pub(crate) fencing_token: u64,
    pub(crate) held_for: Duration,
    pub(crate) ttl: Duration,
    pub(crate) waiting: usize,
    /// A key held in shares (then `owner` is its value, `shared:<limit>`, and the
    /// fencing token, holder and time held are not recorded for the key as a whole).
    pub(crate) shares: Option<Shares>,
}

/// The shares of a key held in shares, as one server sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shares {
    /// 0 for a read lock, N for a semaphore of N permits.
    pub(crate) limit: u32,
    /// Each live share, by the end of its lease.
    pub(crate) holders: Vec<Holder>,
}

/// One live share of a key held in shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its owner token (`kept:` first when kept for `hold_at_least`).
    pub(crate) owner: String,
    /// Its remaining lease.
    pub(crate) ttl: Duration,
    /// Its fencing token and its client's name; `None` for a share an older redlock
    /// took (it recorded neither).
    pub(crate) named: Option<(u64, String)>,
}

/// What `INSPECT` and `FORCE_UNLOCK` answer: `{value, pttl, now ms, waiting, shares}`.
type SeenReply = Option<(Vec<u8>, i64, u64, i64, Vec<(Vec<u8>, i64, Vec<u8>)>)>;

/// The parts of a lock's value: owner token (with `kept:` when kept for
/// `hold_at_least`), fencing token, since when (server ms), name; `None` for a value
/// redlock did not write as a lock. A lock an older redlock wrote holds its owner token
/// alone: token 0, no start, no name. The same shapes as `scripts`' `is_lock`.
fn parse_lock_value(value: &str) -> Option<(&str, u64, Option<u64>, &str)> {
    let mut parts = value.splitn(4, ' ');
    let owner = parts.next()?;
    // 32 hex digits, `:`, a hex counter: as `Core::fresh_token` makes them.
    let (random, counter) = owner
        .strip_prefix("kept:")
        .unwrap_or(owner)
        .split_once(':')?;
    let hex = |text: &str| text.bytes().all(|b| b.is_ascii_hexdigit());
    if random.len() != 32 || !hex(random) || !(1..=16).contains(&counter.len()) || !hex(counter) {
        return None;
    }
    let Some(token) = parts.next() else {
        return Some((owner, 0, None, ""));
    };
    let digits = |text: &str, most: usize| {
        (1..=most).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
    };
    let since = parts.next()?;
    let since = since.strip_suffix(scripts::CONTENDED).unwrap_or(since);
    let name = parts.next()?;
    if !digits(token, 19) || !digits(since, 15) {
        return None;
    }
    Some((owner, token.parse().ok()?, Some(since.parse().ok()?), name))
}

/// A key redlock keeps for itself: counters and the restart marker (`redlock:…`, which
/// lock keys may not start with), and on a cluster a lock's companion keys behind the
/// slot's hash tag.
fn is_internal(key: &str) -> bool {
    if key.starts_with(scripts::RESERVED_PREFIX) {
        return true;
    }
    // On a cluster a lock's companion keys are `{<slot tag>}redlock:<kind>:<key>`
    // (no lock may be named so either: `limits::check_key`).
    let Some((tag, rest)) = key.strip_prefix('{').and_then(|rest| rest.split_once('}')) else {
        return false;
    };
    let slot_tag = !tag.is_empty()
        && tag.len() <= 4
        && tag
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    slot_tag
        && [
            scripts::WAITLIST_PREFIX,
            scripts::WAITLIST_EXPIRY_PREFIX,
            scripts::FORCED_PREFIX,
        ]
        .iter()
        .any(|prefix| rest.starts_with(prefix))
}

/// The inspect script's reply `{value, pttl, now ms, waiting, shares}` (nil: no lock).
fn parse_seen(reply: SeenReply) -> Option<Seen> {
    let (value, ttl, now_ms, waiting, shares) = reply?;
    let value = String::from_utf8_lossy(&value);
    let ttl = Duration::from_millis(u64::try_from(ttl).ok()?);
    let waiting = usize::try_from(waiting).unwrap_or(0);
    if let Some(limit) = value.strip_prefix("shared:") {
        let holders = shares
            .into_iter()
            .map(|(owner, left, named)| Holder {
                owner: String::from_utf8_lossy(&owner).into_owned(),
                ttl: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                // `<fencing token> <client name>` (see `scripts::NAMES_PREFIX`).
                named: String::from_utf8_lossy(&named)
                    .split_once(' ')
                    .and_then(|(token, name)| Some((token.parse().ok()?, name.to_owned()))),
            })
            .collect();
        return Some(Seen {
            owner: value.to_string(),
            holder: String::new(),
            fencing_token: 0,
            held_for: Duration::ZERO,
            ttl,
            waiting,
            shares: Some(Shares {
                limit: limit.parse().ok()?,
                holders,
            }),
        });
    }
    let (owner, fencing_token, since_ms, name) = parse_lock_value(&value)?;
    Some(Seen {
        owner: owner.to_owned(),
        holder: match since_ms {
            Some(_) => name.to_owned(),
            None => OLDER_HOLDER.to_owned(),
        },
        fencing_token,
        held_for: Duration::from_millis(since_ms.map_or(0, |since| now_ms.saturating_sub(since))),
        ttl,
        waiting,
        shares: None,
    })
}

/// The policy in a `CONFIG GET maxmemory-policy` reply (a map in RESP3, a flat array in RESP2).
fn eviction_policy(reply: &Value) -> Option<String> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match reply {
        Value::Map(pairs) => pairs.first().and_then(|(_, value)| text(value)),
        Value::Array(items) => items.get(1).and_then(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_bare_token_is_an_acquisition_as_digits_or_as_an_integer() {
        let acquired = |reply| match parse_acquire_reply(reply) {
            Ok((Attempt::Acquired { token, handed_off }, Boot::Votes)) => {
                assert!(!handed_off);
                Some(token)
            }
            _ => None,
        };
        assert_eq!(acquired(bulk("1795404822378057")), Some(1795404822378057));
        // From a script of an older version.
        assert_eq!(
            acquired(Value::Int(1795404822378057)),
            Some(1795404822378057)
        );
        for not_a_token in ["0", "", "17954048223780x7", "-5"] {
            assert!(
                parse_acquire_reply(bulk(not_a_token)).is_err(),
                "{not_a_token:?}"
            );
        }
    }

    #[test]
    fn acquire_replies_mean_what_the_script_says() {
        let (attempt, boot) = parse_attempt(vec![
            Value::Int(1),
            Value::Int(1795404822378057),
            Value::Int(1),
            Value::Int(0),
        ])
        .unwrap();
        assert!(matches!(
            attempt,
            Attempt::Acquired {
                token: 1795404822378057,
                handed_off: true
            }
        ));
        assert_eq!(boot, Boot::Votes);
        let (attempt, boot) =
            parse_attempt(vec![Value::Int(0), Value::Int(250), Value::Int(2)]).unwrap();
        assert!(
            matches!(attempt, Attempt::Busy { ttl, line, .. } if ttl == Duration::from_millis(250) && line == LineStatus::default())
        );
        assert_eq!(boot, Boot::Quarantined { left: None });
        // A busy reply carries the grant floor: the token the attempt took.
        let (attempt, _) = parse_attempt(vec![
            Value::Int(0),
            Value::Int(250),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1795404822378060),
            Value::Int(1795404822378),
            Value::Int(1),
        ])
        .unwrap();
        assert!(matches!(
            attempt,
            Attempt::Busy {
                line: LineStatus {
                    grant_floor: 1795404822378060,
                    server_ms: Some(1795404822378),
                    registered: true,
                },
                handed_off: false,
                ..
            }
        ));
        let (attempt, boot) =
            parse_attempt(vec![Value::Int(-1), bulk("list"), Value::Int(2)]).unwrap();
        assert!(matches!(attempt, Attempt::NotALock { found } if found == "list"));
        assert_eq!(boot, Boot::Quarantined { left: None });
        // A quarantined master says for how long, last in each reply.
        let ms = Duration::from_millis;
        let (_, boot) = parse_attempt(vec![
            Value::Int(1),
            Value::Int(7),
            Value::Int(0),
            Value::Int(2),
            Value::Int(43_001),
        ])
        .unwrap();
        assert_eq!(
            boot,
            Boot::Quarantined {
                left: Some(ms(43_001))
            }
        );
        let busy = |boot, left| {
            parse_attempt(vec![
                Value::Int(0),
                Value::Int(250),
                Value::Int(boot),
                Value::Int(0),
                Value::Int(9),
                Value::Int(8),
                Value::Int(0),
                Value::Int(left),
            ])
            .unwrap()
            .1
        };
        assert_eq!(
            busy(2, 500),
            Boot::Quarantined {
                left: Some(ms(500))
            }
        );
        assert_eq!(busy(0, 0), Boot::Votes);
        let (_, boot) = parse_attempt(vec![
            Value::Int(-1),
            bulk("hash"),
            Value::Int(2),
            Value::Int(9),
        ])
        .unwrap();
        assert_eq!(boot, Boot::Quarantined { left: Some(ms(9)) });
        // Fields after the ones this client knows are left alone.
        let (attempt, boot) = parse_attempt(vec![
            Value::Int(1),
            Value::Int(7),
            Value::Int(0),
            Value::Int(2),
            Value::Int(10),
            bulk("a later field"),
        ])
        .unwrap();
        assert!(matches!(attempt, Attempt::Acquired { token: 7, .. }));
        assert_eq!(boot, Boot::Quarantined { left: Some(ms(10)) });
        // Replies of an older script (no restart status) still parse, as votes.
        let (_, boot) = parse_attempt(vec![Value::Int(0), Value::Int(5)]).unwrap();
        assert_eq!(boot, Boot::Votes);
        assert!(parse_attempt(vec![]).is_err());
        assert!(parse_attempt(vec![Value::Int(1)]).is_err());
        assert!(parse_attempt(vec![Value::Int(0), bulk("soon")]).is_err());
        // The common success is the bare token; the array still parses; nothing else does.
        let (attempt, boot) = parse_acquire_reply(Value::Int(1795404822378058)).unwrap();
        assert!(matches!(
            attempt,
            Attempt::Acquired {
                token: 1795404822378058,
                handed_off: false
            }
        ));
        assert_eq!(boot, Boot::Votes);
        let (attempt, _) =
            parse_acquire_reply(Value::Array(vec![Value::Int(0), Value::Int(9)])).unwrap();
        assert!(matches!(attempt, Attempt::Busy { .. }));
        assert!(parse_acquire_reply(Value::Int(0)).is_err());
        assert!(parse_acquire_reply(bulk("one")).is_err());
    }

    #[test]
    fn vouch_replies_say_blank_vouched_or_what_shows_use() {
        assert_eq!(parse_vouch(vec![Value::Int(1)]).unwrap(), Blankness::Blank);
        assert_eq!(
            parse_vouch(vec![Value::Int(2)]).unwrap(),
            Blankness::AlreadyVouched
        );
        assert_eq!(
            parse_vouch(vec![Value::Int(0), bulk("order:1"), bulk("lock")]).unwrap(),
            Blankness::Used {
                key: "order:1".into(),
                sign: UseSign::Lock
            }
        );
        for (why, sign) in [
            ("internal", UseSign::Internal),
            ("restarted", UseSign::Restarted),
            ("stale", UseSign::Stale),
            ("voted", UseSign::Voted),
            ("used", UseSign::Counter),
        ] {
            assert!(matches!(
                parse_vouch(vec![Value::Int(0), bulk("k"), bulk(why)]).unwrap(),
                Blankness::Used { sign: found, .. } if found == sign
            ));
        }
        assert_eq!(
            parse_vouch(vec![Value::Int(-1), Value::Int(200_000)]).unwrap(),
            Blankness::TooManyKeys { keys: 200_000 }
        );
        assert!(parse_vouch(vec![]).is_err());
        assert!(parse_vouch(vec![Value::Int(0)]).is_err());
        assert!(parse_vouch(vec![Value::Int(-1)]).is_err());
    }

    #[test]
    fn release_and_extend_replies_say_ours_gone_or_evicted() {
        // Released, kept for `hold_at_least`, extended: still ours.
        assert_eq!(Verdict::of_reply(1), Verdict::Ours);
        assert_eq!(Verdict::of_reply(2), Verdict::Ours);
        assert_eq!(Verdict::of_reply(0), Verdict::Gone);
        // The eviction marker named this owner.
        assert_eq!(Verdict::of_reply(-1), Verdict::Evicted);
        assert_eq!(Verdict::of_reply(-2), Verdict::HandedOff);
        assert!(Verdict::Ours.is_ours() && !Verdict::Evicted.is_ours());
    }

    #[test]
    fn a_lock_value_names_owner_token_start_and_holder() {
        let owner = format!("{}:7", "ab12".repeat(8));
        let value = format!("{owner} 1700000000123456 1700000000123 billing 7:42");
        let seen =
            parse_seen(Some((value.into_bytes(), 2500, 1700000001123, 3, vec![]))).expect("a lock");
        assert_eq!(seen.owner, owner);
        assert_eq!(seen.holder, "billing 7:42", "a name may hold spaces");
        assert_eq!(seen.fencing_token, 1700000000123456);
        assert_eq!(seen.held_for, Duration::from_secs(1));
        assert_eq!(seen.ttl, Duration::from_millis(2500));
        assert_eq!(seen.waiting, 3);
        let kept = format!("kept:{owner} 5 6 n");
        assert_eq!(
            parse_lock_value(&kept).unwrap(),
            (&kept[..owner.len() + 5], 5, Some(6), "n")
        );
        // A contended lock (an attempt found it busy): its start time ends with `~`.
        let contended = format!("{owner} 5 6~ n m");
        assert_eq!(
            parse_lock_value(&contended).unwrap(),
            (owner.as_str(), 5, Some(6), "n m")
        );
        assert!(parse_lock_value(&format!("{owner} 5 6~~ n")).is_none());
        // An older redlock's lock: the owner token alone.
        let older =
            parse_seen(Some((owner.clone().into_bytes(), 900, 5, 0, vec![]))).expect("a lock");
        assert_eq!(
            (older.holder.as_str(), older.fencing_token),
            (OLDER_HOLDER, 0)
        );
        // A name that is not UTF-8 is shown, not refused.
        let mut odd = format!("{owner} 1 2 ").into_bytes();
        odd.extend_from_slice(&[0xff, b'x']);
        assert!(parse_seen(Some((odd, 1, 2, 0, vec![]))).is_some());
        // What is not a lock's value is not a lock.
        for other in [
            format!("reserved:{owner}"),
            "hello".into(),
            "dead:beef 12 34 hello".into(),
            format!("{owner} 1 2"),
            format!("{owner} 123456789012345678901 2 n"),
            format!("{owner} 1 1234567890123456 n"),
            format!("{}:7 1 2 n", "ab".repeat(15)),
            format!("0{owner} 1 2 n"),
            String::new(),
        ] {
            assert!(parse_lock_value(&other).is_none(), "{other:?}");
        }
        assert!(parse_seen(None).is_none());
        // A key held in shares: each share's owner and remaining lease.
        let shares = vec![
            (
                format!("{owner}1").into_bytes(),
                800,
                b"12 reader a".to_vec(),
            ),
            (b"kept:x".to_vec(), 900, Vec::new()),
        ];
        let seen = parse_seen(Some((b"shared:3".to_vec(), 900, 5, 1, shares))).expect("shares");
        assert_eq!(seen.owner, "shared:3");
        let shares = seen.shares.expect("shares");
        assert_eq!(shares.limit, 3);
        assert_eq!(
            shares.holders[0].named,
            Some((12, "reader a".to_owned())),
            "the token and the whole name"
        );
        assert_eq!(
            shares.holders[1],
            Holder {
                owner: "kept:x".into(),
                ttl: Duration::from_millis(900),
                named: None,
            }
        );
        assert!(parse_seen(Some((b"shared:x".to_vec(), 900, 5, 1, vec![]))).is_none());
    }

    #[test]
    fn internal_keys_are_never_listed_as_locks() {
        assert!(is_internal("redlock:fence"));
        assert!(is_internal("redlock:fence:{x1}"));
        assert!(!is_internal("order:1"));
        assert!(is_internal("{x1}redlock:waitlist:order:1"));
        assert!(is_internal("{x1}redlock:forced:order:1"));
        assert!(!is_internal("{t}redlock:x"), "a lock may be named so");
        assert!(!is_internal("{user}:order"));
    }

    #[test]
    fn the_eviction_policy_is_read_from_either_protocol() {
        let resp3 = Value::Map(vec![(bulk("maxmemory-policy"), bulk("allkeys-lru"))]);
        assert_eq!(eviction_policy(&resp3).as_deref(), Some("allkeys-lru"));
        let resp2 = Value::Array(vec![bulk("maxmemory-policy"), bulk("noeviction")]);
        assert_eq!(eviction_policy(&resp2).as_deref(), Some("noeviction"));
        assert_eq!(eviction_policy(&Value::Nil), None);
    }
}
