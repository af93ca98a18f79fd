//! The servers a client locks on, and the majority rule over them.
//!
//! One server is the common case and takes the direct path: one script call per
//! operation. With N independent masters (RedLock) every operation goes to all N in
//! parallel, each bounded by a per-node timeout, and is decided by a majority.
//!
//! ## RedLock, as done here
//! - **Acquire** asks all N and succeeds with a majority of *votes* and a validity of
//!   `lease − elapsed − drift` above zero, where `drift = 0.01 × lease + 2 ms`. It is
//!   decided as soon as the answers so far settle it: a master that hangs (no refusal,
//!   just silence) costs nothing once a majority has answered. A master counts as a
//!   vote only if its Redis process has vouched for its data for at least `max_lease`
//!   (see [`Boot`]): one that restarted, empty or from a stale snapshot, or a replica
//!   promoted behind its address, may have forgotten a lock that still runs, and stays
//!   out until every such lock has expired. On failure the attempt is undone on every
//!   master in a task of its own (again once the slow ones have answered), while the
//!   caller retries or returns.
//! - **Fencing**: each master returns its own next token (never below its clock in
//!   µs: see `scripts`); the largest is chosen and written back to a majority of the
//!   voters before the guard is handed out. Any later acquisition's majority shares a
//!   master with that one; unless that master lost its counter meanwhile, its counter
//!   is already at least the chosen token, so the later token is larger. A master that
//!   lost its counter restarted, and so issues tokens from its clock: larger as long as
//!   the masters' clocks agree to within the time the restart took (at least the
//!   restart quarantine, since it could not vote before).
//! - **Renew, extend, release** are decided by a majority too (confirmed, or denied);
//!   masters that have not answered then finish in the background.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use crate::config::ClientConfig;
use crate::error::LockError;
use crate::node::{Attempt, AttemptRequest, Boot, LineStatus, Node, Seen, Verdict, Waiter};

/// The outcome of one acquisition attempt over every master.
pub(crate) enum Outcome {
    Acquired {
        fencing_token: u64,
        /// The hand-off's previous owner still held the lock, and it was deleted.
        handed_off: bool,
    },
    /// Acquired, but fewer replicas than required confirmed it; undone. Or refused by
    /// the primary for want of replicas (`NOREPLICAS`): nothing written.
    NotReplicated {
        confirmed: usize,
        needed: usize,
    },
    /// Busy: held by another owner; `ttl` is the shortest remaining lease seen. `split` is set
    /// when this attempt won some masters but not a majority (a tie with another client).
    Busy {
        ttl: Duration,
        split: bool,
        /// One server: the hand-off's previous owner's lock was deleted (see
        /// `node::Attempt::Busy`).
        handed_off: bool,
        /// One server: what it tells about grants to come (see `node::LineStatus`).
        line: LineStatus,
    },
    NotALock {
        found: String,
    },
    /// The key is held in shares under another limit (`limit` permits; 0: a read lock).
    OtherShares {
        limit: u32,
    },
    /// Fewer than a majority of voting masters answered.
    NoQuorum {
        reached: usize,
        /// The masters that answered but sit out a quarantine, in the order given, each
        /// with how long it has left (at most `max_lease`).
        sitting_out: Vec<(String, Duration)>,
    },
}

/// What one attempt asks of the masters.
pub(crate) struct Try<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    pub(crate) lease_ms: u64,
    /// A releasing holder of this client handed its lock to this attempt.
    pub(crate) previous_owner: Option<&'a str>,
    pub(crate) waiter: Option<Waiter<'a>>,
    /// A share rather than the whole key (see `node::AttemptRequest::shares`).
    pub(crate) shares: Option<u32>,
}

pub(crate) struct Masters {
    nodes: Vec<Arc<Node>>,
    node_timeout: Option<Duration>,
    response_timeout: Duration,
    confirm_replicas: Option<(usize, Duration)>,
    /// RedLock: how long a master that may have lost data stays out of the vote.
    max_lease: Duration,
    /// Per master: a warning about its quarantine was logged (until it votes again).
    warned: Vec<AtomicBool>,
    /// The client's name, written into each lock it takes.
    name: String,
}

impl Masters {
    pub(crate) fn new(nodes: Vec<Node>, config: &ClientConfig) -> Self {
        let warned = nodes.iter().map(|_| AtomicBool::new(false)).collect();
        Masters {
            nodes: nodes.into_iter().map(Arc::new).collect(),
            warned,
            node_timeout: config.node_timeout,
            response_timeout: config.response_timeout,
            confirm_replicas: config.confirm_replicas,
            max_lease: config.max_lease(),
            name: config.name.clone(),
        }
    }

    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    pub(crate) fn is_single(&self) -> bool {
        self.nodes.len() == 1
    }

    /// The server on which one script may take all of `keys` (`lock_all`'s one step):
    /// one server, Sentinel's primary, or a cluster with every key in one slot, without
    /// replica confirmation (whose `WAIT` follows each key's own script). `None` with
    /// RedLock, or keys in several slots.
    pub(crate) fn one_step_node(&self, keys: &[String]) -> Option<&Node> {
        match self.nodes.as_slice() {
            [node] if self.confirm_replicas.is_none() && node.in_one_slot(keys) => {
                Some(node.as_ref())
            }
            _ => None,
        }
    }

    /// The client's name, written into each lock it takes.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether a release may pass the lock to a waiter of the same client inside its
    /// acquire script: on one server (or cluster, or Sentinel primary) without replica
    /// confirmation, where that script is the whole acquisition.
    pub(crate) fn can_hand_off(&self) -> bool {
        self.is_single() && self.confirm_replicas.is_none()
    }

    /// Whether waiting clients wait on a waitlist in Redis (one server, cluster or Sentinel; with
    /// RedLock each master would keep its own order, so they do not).
    pub(crate) fn keeps_waitlist(&self) -> bool {
        self.is_single()
    }

    /// The longest lease a lock may have here (RedLock only; see `max_lease`).
    pub(crate) fn max_lease(&self) -> Option<Duration> {
        (!self.is_single()).then_some(self.max_lease)
    }

    /// Takes a waiter that gave up off `key`'s waitlist.
    pub(crate) async fn leave_waitlist(&self, key: &str, waiter_id: &str) {
        if let [node] = self.nodes.as_slice()
            && let Err(error) = node.leave_waitlist(key, waiter_id).await
        {
            tracing::debug!(%error, key, "redlock: could not leave the waitlist; the registration will expire");
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        quorum_of(self.nodes.len())
    }

    /// How long a lease of `lease` is surely ours, counted from before the acquire was
    /// sent: the whole lease on one server, less the allowed clock drift with RedLock.
    pub(crate) fn validity(&self, lease: Duration) -> Duration {
        validity_of(lease, !self.is_single())
    }

    fn node_timeout(&self, lease: Duration) -> Duration {
        self.node_timeout.unwrap_or_else(|| {
            (lease / 10)
                .max(Duration::from_millis(50))
                .min(self.response_timeout)
        })
    }

    /// One attempt on every master.
    pub(crate) async fn acquire(&self, request: Try<'_>) -> redis::RedisResult<Outcome> {
        let Try {
            key,
            owner,
            lease,
            lease_ms,
            previous_owner,
            waiter,
            shares,
        } = request;
        if let [node] = self.nodes.as_slice() {
            let request = AttemptRequest {
                key,
                owner,
                lease_ms,
                previous_owner,
                waiter,
                quarantine_ms: None,
                name: &self.name,
                shares,
            };
            return Ok(match self.confirm_replicas {
                None => match node.acquire(&request).await?.0 {
                    Attempt::Acquired { token, handed_off } => Outcome::Acquired {
                        fencing_token: token,
                        handed_off,
                    },
                    Attempt::Busy {
                        ttl,
                        handed_off,
                        line,
                    } => Outcome::Busy {
                        ttl,
                        split: false,
                        handed_off,
                        line,
                    },
                    Attempt::NotALock { found } => Outcome::NotALock { found },
                    Attempt::OtherShares { limit } => Outcome::OtherShares { limit },
                },
                Some((needed, timeout)) => {
                    let confirmed = match node.acquire_confirmed(&request, needed, timeout).await {
                        // The primary refused the write for want of replicas (its
                        // `min-replicas-to-write`, e.g. cut off from them): nothing
                        // was written, and no replica confirmed anything.
                        Err(error) if refused_for_want_of_replicas(&error) => {
                            return Ok(Outcome::NotReplicated {
                                confirmed: 0,
                                needed,
                            });
                        }
                        other => other?,
                    };
                    match confirmed {
                        (Attempt::Acquired { token, .. }, _, confirmed) if confirmed >= needed => {
                            Outcome::Acquired {
                                fencing_token: token,
                                handed_off: false,
                            }
                        }
                        (Attempt::Acquired { .. }, _, confirmed) => {
                            if node.release(key, owner, 0).await.is_err() {
                                // Undo in the background rather than leave it to its lease.
                                let (node, key, owner) =
                                    (node.clone(), key.to_owned(), owner.to_owned());
                                tokio::spawn(async move { node.release(&key, &owner, 0).await });
                            }
                            Outcome::NotReplicated { confirmed, needed }
                        }
                        (
                            Attempt::Busy {
                                ttl,
                                handed_off,
                                line,
                            },
                            _,
                            _,
                        ) => Outcome::Busy {
                            ttl,
                            split: false,
                            handed_off,
                            line,
                        },
                        (Attempt::NotALock { found }, _, _) => Outcome::NotALock { found },
                        (Attempt::OtherShares { limit }, _, _) => Outcome::OtherShares { limit },
                    }
                }
            });
        }
        if shares.is_some() {
            // Refused before any attempt (`acquire`'s checks); kept out of RedLock here too.
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "read locks and semaphores are not available with RedLock",
            )));
        }
        let sent_at = Instant::now();
        let limit = self.node_timeout(lease);
        let sent: Vec<Arc<AtomicBool>> = self
            .nodes
            .iter()
            .map(|_| Arc::new(AtomicBool::new(false)))
            .collect();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let node = node.clone();
                let (key, owner) = (key.to_owned(), owner.to_owned());
                let quarantine_ms = Some(self.max_lease.as_millis() as u64);
                let name = self.name.clone();
                let sent = sent[index].clone();
                // Unconstrained: with the task's cooperative budget spent, the first poll
                // could return Pending before the command reached the connection's
                // queue, and a release sent later would then run on that master first,
                // leaving this attempt's late grant behind (tests/releases.rs saw a 30 s
                // lock left on one master after an acquire and release, once in a loaded
                // full run).
                FirstPolled::new(
                    sent,
                    tokio::task::unconstrained(async move {
                        let request = AttemptRequest {
                            key: &key,
                            owner: &owner,
                            lease_ms,
                            previous_owner: None,
                            waiter: None,
                            quarantine_ms,
                            name: &name,
                            shares: None,
                        };
                        let reply = tokio::time::timeout(limit, node.acquire(&request)).await;
                        (index, reply.ok().and_then(Result::ok))
                    }),
                )
            })
            .collect();
        let mut tally = Tally::new(self.nodes.len());
        let decision = loop {
            if let Some(decision) = tally.decision() {
                break decision;
            }
            match pending.next().await {
                Some((index, reply)) => {
                    if reply.is_none() {
                        tracing::debug!(node = %self.nodes[index].url, "redlock: no answer from a master");
                    }
                    tally.record(index, reply);
                }
                None => break Decision::Lost,
            }
        };
        // Every master's script goes out before the outcome is used. `FuturesUnordered`
        // may hand back a majority before it first polled a slow master's attempt, which
        // is when its script is queued on that master's connection; a release queued
        // first would find nothing there, and the late script would then take a lock
        // nobody releases (tests/releases.rs caught it, about 1 run in 50). Queued
        // first, the script runs before anything sent after it on that connection.
        while sent.iter().any(|sent| !sent.load(Ordering::Acquire)) {
            match std::future::poll_fn(|cx| Poll::Ready(pending.poll_next_unpin(cx))).await {
                Poll::Ready(Some((index, reply))) => tally.record(index, reply),
                Poll::Ready(None) => break,
                Poll::Pending => tokio::task::yield_now().await,
            }
        }
        if decision == Decision::Lost && !tally.may_reach_quorum() {
            // Out of reach whatever the others say: no hurry, and their answers make
            // the error tell how many masters were there.
            while let Some((index, reply)) = pending.next().await {
                tally.record(index, reply);
            }
        }
        let won = match decision {
            Decision::Won { voters } if sent_at.elapsed() < self.validity(lease) => {
                let fencing_token = voters.iter().map(|(_, token)| *token).max().unwrap_or(0);
                if self
                    .write_back(key, owner, fencing_token, &voters, limit)
                    .await
                    && sent_at.elapsed() < self.validity(lease)
                {
                    Some(fencing_token)
                } else {
                    None
                }
            }
            _ => None,
        };
        match won {
            Some(fencing_token) => {
                // Masters still to answer may grant us too; the release cleans them up.
                self.finish_in_background(pending, None);
                Ok(Outcome::Acquired {
                    fencing_token,
                    handed_off: false,
                })
            }
            None => {
                // No valid majority: undo on every master, the silent ones once they answer.
                self.finish_in_background(pending, Some((key.to_owned(), owner.to_owned())));
                self.warn_of_quarantine(&tally);
                Ok(match tally.failure(self.quorum()) {
                    Outcome::NoQuorum { reached, .. } => Outcome::NoQuorum {
                        reached,
                        sitting_out: self.sitting_out(&tally),
                    },
                    other => other,
                })
            }
        }
    }

    /// Writes the chosen token back to the voters; true once a majority has it.
    async fn write_back(
        &self,
        key: &str,
        owner: &str,
        token: u64,
        voters: &[(usize, u64)],
        limit: Duration,
    ) -> bool {
        let raise = |index: usize| {
            let node = self.nodes[index].clone();
            let (key, owner) = (key.to_owned(), owner.to_owned());
            async move {
                let raised = node.raise_fence(&key, token, &owner);
                matches!(tokio::time::timeout(limit, raised).await, Ok(Ok(())))
            }
        };
        // The other masters get the token too, in the background: a late grant there
        // then names the holder's token, and their counters move on as well.
        for index in (0..self.nodes.len()).filter(|index| !voters.iter().any(|(v, _)| v == index)) {
            tokio::spawn(raise(index));
        }
        let mut raising: FuturesUnordered<_> =
            voters.iter().map(|(index, _)| raise(*index)).collect();
        let (mut raised, mut left) = (0, voters.len());
        while raised < self.quorum() && raised + left >= self.quorum() {
            match raising.next().await {
                Some(ok) => {
                    left -= 1;
                    raised += usize::from(ok);
                }
                None => break,
            }
        }
        if !raising.is_empty() {
            tokio::spawn(async move { while raising.next().await.is_some() {} });
        }
        raised >= self.quorum()
    }

    /// The masters `tally` found in quarantine, by URL, in the order given, each with
    /// how long it has left (`max_lease` when it did not say: its quarantine is no
    /// longer).
    fn sitting_out(&self, tally: &Tally) -> Vec<(String, Duration)> {
        tally
            .quarantined()
            .into_iter()
            .map(|(index, left)| {
                (
                    self.nodes[index].url.clone(),
                    left.unwrap_or(self.max_lease).min(self.max_lease),
                )
            })
            .collect()
    }

    /// Logs once per quarantine which masters are out of the vote, and why.
    fn warn_of_quarantine(&self, tally: &Tally) {
        for (index, votes) in tally.voters() {
            let was_warned = self.warned[index].swap(!votes, Ordering::Relaxed);
            if !votes && !was_warned {
                tracing::warn!(
                    node = %self.nodes[index].url,
                    max_lease = ?self.max_lease,
                    "redlock: a master restarted, may have lost data, or was never used by redlock (a first deployment: `redlock vouch` ends that); it does not count toward a majority until max_lease has passed"
                );
            }
        }
    }

    /// Lets the attempts still under way finish in a task of their own; with `undo`,
    /// then releases `(key, owner)` on every master (compare-and-delete: harmless where
    /// nothing was taken).
    fn finish_in_background<F>(
        &self,
        mut pending: FuturesUnordered<F>,
        undo: Option<(String, String)>,
    ) where
        F: Future + Send + 'static,
    {
        if pending.is_empty() && undo.is_none() {
            return;
        }
        let nodes = self.nodes.clone();
        let response_timeout = self.response_timeout;
        tokio::spawn(async move {
            let everywhere = |key: String, owner: String| {
                let nodes = nodes.clone();
                async move {
                    futures_util::future::join_all(nodes.iter().map(|node| {
                        tokio::time::timeout(response_timeout, node.release(&key, &owner, 0))
                    }))
                    .await;
                }
            };
            match undo {
                Some((key, owner)) => {
                    // At once where the masters answered (others may be waiting for the
                    // key), and again once the silent ones have run the attempt.
                    let now = everywhere(key.clone(), owner.clone());
                    let later = async {
                        let straggled = !pending.is_empty();
                        while pending.next().await.is_some() {}
                        if straggled {
                            everywhere(key, owner).await;
                        }
                    };
                    futures_util::future::join(now, later).await;
                }
                None => while pending.next().await.is_some() {},
            }
        });
    }

    /// Releases everywhere. `Ours` when a majority deleted or kept it as ours, `Gone`
    /// (or `Evicted`) when a majority answered that it was not ours any more.
    pub(crate) async fn release(
        &self,
        key: &str,
        owner: &str,
        keep_ms: u64,
    ) -> Result<Verdict, QuorumError> {
        if let [node] = self.nodes.as_slice() {
            return node
                .release(key, owner, keep_ms)
                .await
                .map_err(QuorumError::Redis);
        }
        let (key, owner) = (Arc::<str>::from(key), Arc::<str>::from(owner));
        self.on_every_master(move |node| {
            let (key, owner) = (key.clone(), owner.clone());
            async move { node.release(&key, &owner, keep_ms).await }
        })
        .await
    }

    /// Extends everywhere; same answers as [`Masters::release`].
    pub(crate) async fn extend(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Verdict, QuorumError> {
        if let [node] = self.nodes.as_slice() {
            return node
                .extend(key, owner, lease_ms)
                .await
                .map_err(QuorumError::Redis);
        }
        let (key, owner) = (Arc::<str>::from(key), Arc::<str>::from(owner));
        self.on_every_master(move |node| {
            let (key, owner) = (key.clone(), owner.clone());
            async move { node.extend(&key, &owner, lease_ms).await }
        })
        .await
    }

    /// A grant's confirmation (one server: grants are made nowhere else), which also
    /// tells the next in line the grant will not lapse.
    pub(crate) async fn confirm_grant(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Verdict, QuorumError> {
        match self.nodes.as_slice() {
            [node] => node
                .confirm_grant(key, owner, lease_ms)
                .await
                .map_err(QuorumError::Redis),
            _ => self.extend(key, owner, lease_ms).await,
        }
    }

    /// The lock on `key` as a majority sees it: the holder a majority of masters agree
    /// on (its shortest ttl, its token, earliest start), or `None`. One server:
    /// what it says. The waitlist is counted on one server (RedLock keeps none).
    pub(crate) async fn inspect(&self, key: &str) -> Result<Option<Seen>, QuorumError> {
        self.majority_view_of(|node| async move { node.inspect(key).await })
            .await
    }

    /// Frees `key` whoever holds it, on every master; what it evicted, as a majority
    /// saw it (`None`: no lock was held), see `node::Node::force_unlock`.
    pub(crate) async fn force_unlock(&self, key: &str) -> Result<Option<Seen>, QuorumError> {
        self.majority_view_of(|node| async move { node.force_unlock(key).await })
            .await
    }

    /// Asks every master what it sees of a lock (bounded by the response timeout
    /// each) and answers with the majority's view; one server answers alone.
    async fn majority_view_of<'a, F, Fut>(&'a self, ask: F) -> Result<Option<Seen>, QuorumError>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<Option<Seen>>> + 'a,
    {
        if let [node] = self.nodes.as_slice() {
            return ask(node).await.map_err(QuorumError::Redis);
        }
        let replies = futures_util::future::join_all(
            self.nodes
                .iter()
                .map(|node| tokio::time::timeout(self.response_timeout, ask(node))),
        )
        .await;
        let answers: Vec<Option<Seen>> = replies
            .into_iter()
            .filter_map(|reply| reply.ok().and_then(Result::ok))
            .collect();
        if answers.len() < self.quorum() {
            return Err(QuorumError::NoQuorum {
                reached: answers.len(),
            });
        }
        Ok(majority_view(&answers, self.quorum()))
    }

    /// Keys matching `pattern` that may hold locks, on every server (each primary of
    /// a cluster; the masters that answer, with RedLock).
    pub(crate) async fn candidates(&self, pattern: &str) -> Result<Vec<String>, QuorumError> {
        if let [node] = self.nodes.as_slice() {
            return node.candidates(pattern).await.map_err(QuorumError::Redis);
        }
        let replies =
            futures_util::future::join_all(self.nodes.iter().map(|node| node.candidates(pattern)))
                .await;
        let answered: Vec<Vec<String>> = replies.into_iter().filter_map(Result::ok).collect();
        if answered.len() < self.quorum() {
            return Err(QuorumError::NoQuorum {
                reached: answered.len(),
            });
        }
        let mut keys: Vec<String> = answered.into_iter().flatten().collect();
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }

    /// Runs `operation` on every master in tasks of their own, and answers as soon as
    /// a majority has confirmed, or denied; the others finish in the background.
    async fn on_every_master<F, Fut>(&self, operation: F) -> Result<Verdict, QuorumError>
    where
        F: Fn(Arc<Node>) -> Fut,
        Fut: Future<Output = redis::RedisResult<Verdict>> + Send + 'static,
    {
        let mut replies: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| {
                tokio::spawn(tokio::time::timeout(
                    self.response_timeout,
                    operation(node.clone()),
                ))
            })
            .collect();
        let mut count = MajorityCount::new(self.nodes.len());
        while count.decided().is_none() {
            match replies.next().await {
                Some(Ok(Ok(Ok(verdict)))) => count.answer(verdict),
                Some(_) => count.silence(),
                None => break,
            }
        }
        // Dropping the handles leaves the tasks running: the slow masters still get it.
        match count.verdict() {
            Some(verdict) => Ok(verdict),
            None => Err(QuorumError::NoQuorum {
                reached: count.answered,
            }),
        }
    }

    /// Renews `locks` on every master, one pipeline each; per lock, whether a majority
    /// renewed it (`Some(Ours)`), a majority said it is gone (`Some(Gone)`, or
    /// `Some(Evicted)`), or too few masters answered to tell (`None`). Answers once every
    /// lock is decided.
    pub(crate) async fn renew(
        &self,
        locks: &[(&str, &str)],
        lease_ms: u64,
    ) -> Vec<Option<Verdict>> {
        if let [node] = self.nodes.as_slice() {
            // One server: its answer is the whole decision, no copies or tasks needed.
            return match tokio::time::timeout(self.response_timeout, node.renew(locks, lease_ms))
                .await
            {
                Ok(Ok(per_lock)) if per_lock.len() == locks.len() => per_lock,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "redlock.renew failed");
                    vec![None; locks.len()]
                }
                _ => {
                    tracing::warn!("redlock.renew: no answer");
                    vec![None; locks.len()]
                }
            };
        }
        let shared: Arc<Vec<(String, String)>> = Arc::new(
            locks
                .iter()
                .map(|(key, owner)| (key.to_string(), owner.to_string()))
                .collect(),
        );
        let mut replies: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| {
                let node = node.clone();
                let locks = shared.clone();
                tokio::spawn(tokio::time::timeout(self.response_timeout, async move {
                    let pairs: Vec<(&str, &str)> = locks
                        .iter()
                        .map(|(key, owner)| (key.as_str(), owner.as_str()))
                        .collect();
                    node.renew(&pairs, lease_ms).await
                }))
            })
            .collect();
        let mut counts: Vec<MajorityCount> =
            vec![MajorityCount::new(self.nodes.len()); locks.len()];
        while counts.iter().any(|count| count.decided().is_none()) {
            match replies.next().await {
                Some(Ok(Ok(Ok(per_lock)))) if per_lock.len() == locks.len() => {
                    for (count, one) in counts.iter_mut().zip(per_lock) {
                        match one {
                            Some(verdict) => count.answer(verdict),
                            None => count.silence(),
                        }
                    }
                }
                Some(reply) => {
                    if let Ok(Ok(Err(error))) = &reply {
                        tracing::warn!(%error, "redlock.renew failed on a master");
                    } else {
                        tracing::warn!("redlock.renew: no answer from a master");
                    }
                    counts.iter_mut().for_each(MajorityCount::silence);
                }
                None => break,
            }
        }
        counts.iter().map(MajorityCount::verdict).collect()
    }
}

/// How long a lease is surely ours: all of it on one server; with RedLock, less the
/// allowed drift between the masters' clocks (1 % of the lease + 2 ms).
fn validity_of(lease: Duration, redlock: bool) -> Duration {
    if redlock {
        lease.saturating_sub(lease / 100 + Duration::from_millis(2))
    } else {
        lease
    }
}

fn quorum_of(masters: usize) -> usize {
    masters / 2 + 1
}

/// A future that records that it was polled once (and so, for a Redis command, that
/// the command was handed to its connection).
struct FirstPolled<F> {
    inner: Pin<Box<F>>,
    sent: Arc<AtomicBool>,
}

impl<F: Future> FirstPolled<F> {
    fn new(sent: Arc<AtomicBool>, inner: F) -> Self {
        FirstPolled {
            inner: Box::pin(inner),
            sent,
        }
    }
}

impl<F: Future> Future for FirstPolled<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let polled = self.inner.as_mut().poll(cx);
        // Set after the poll: by then the command is queued.
        self.sent.store(true, Ordering::Release);
        polled
    }
}

/// The lock the masters' answers agree on: an owner seen by at least `quorum` of them,
/// with the shortest ttl and the longest hold among those, and the token a majority
/// names (else the largest).
fn majority_view(answers: &[Option<Seen>], quorum: usize) -> Option<Seen> {
    let held: Vec<&Seen> = answers.iter().flatten().collect();
    held.iter().find_map(|candidate| {
        let agreeing: Vec<&&Seen> = held
            .iter()
            .filter(|seen| seen.owner == candidate.owner)
            .collect();
        (agreeing.len() >= quorum).then(|| Seen {
            ttl: agreeing
                .iter()
                .map(|seen| seen.ttl)
                .min()
                .unwrap_or_default(),
            // Acquire writes the token it chose into a majority before it returns
            // (and into the others soon after): the token a majority names is the
            // holder's; the largest is the best guess until then.
            fencing_token: agreeing
                .iter()
                .map(|seen| seen.fencing_token)
                .find(|token| {
                    agreeing
                        .iter()
                        .filter(|seen| seen.fencing_token == *token)
                        .count()
                        >= quorum
                })
                .or_else(|| agreeing.iter().map(|seen| seen.fencing_token).max())
                .unwrap_or(0),
            held_for: agreeing
                .iter()
                .map(|seen| seen.held_for)
                .max()
                .unwrap_or_default(),
            waiting: 0,
            ..(*candidate).clone()
        })
    })
}

/// Confirmations and denials of one release, extend or renewal over N masters.
#[derive(Debug, Clone)]
struct MajorityCount {
    masters: usize,
    answered: usize,
    confirmed: usize,
    /// Denials that said the lock was force-unlocked.
    evicted: usize,
    finished: usize,
}

impl MajorityCount {
    fn new(masters: usize) -> Self {
        MajorityCount {
            masters,
            answered: 0,
            confirmed: 0,
            evicted: 0,
            finished: 0,
        }
    }

    fn answer(&mut self, verdict: Verdict) {
        self.answered += 1;
        self.finished += 1;
        self.confirmed += usize::from(verdict.is_ours());
        self.evicted += usize::from(verdict == Verdict::Evicted);
    }

    fn silence(&mut self) {
        self.finished += 1;
    }

    /// `Some(true)`: a majority confirmed; `Some(false)`: a majority answered and the
    /// rest can no longer make a majority confirm. `None`: not yet (or never) known.
    fn decided(&self) -> Option<bool> {
        let quorum = quorum_of(self.masters);
        let outstanding = self.masters - self.finished;
        if self.confirmed >= quorum {
            Some(true)
        } else if self.answered >= quorum && self.confirmed + outstanding < quorum {
            Some(false)
        } else {
            None
        }
    }

    /// The decision as a verdict: denied by a majority, the lock was evicted if any
    /// master said so (`force_unlock` ran on every master it reached).
    fn verdict(&self) -> Option<Verdict> {
        self.decided().map(|ours| match ours {
            true => Verdict::Ours,
            false if self.evicted > 0 => Verdict::Evicted,
            false => Verdict::Gone,
        })
    }
}

/// What one acquisition attempt's answers decided.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// A majority of voters granted it: `(master, its token)`.
    Won {
        voters: Vec<(usize, u64)>,
    },
    Lost,
}

/// The answers of one acquisition attempt so far.
#[derive(Debug)]
struct Tally {
    masters: usize,
    finished: usize,
    /// Masters that answered (any reply), with their restart status.
    answers: Vec<(usize, Boot)>,
    granted: Vec<(usize, u64, Boot)>,
    ttl: Option<Duration>,
    found: Option<String>,
}

impl Tally {
    fn new(masters: usize) -> Self {
        Tally {
            masters,
            finished: 0,
            answers: Vec::new(),
            granted: Vec::new(),
            ttl: None,
            found: None,
        }
    }

    fn record(&mut self, index: usize, reply: Option<(Attempt, Boot)>) {
        self.finished += 1;
        let Some((attempt, boot)) = reply else {
            return;
        };
        self.answers.push((index, boot));
        match attempt {
            Attempt::Acquired { token, .. } => self.granted.push((index, token, boot)),
            Attempt::Busy { ttl, .. } => self.ttl = Some(self.ttl.map_or(ttl, |t| t.min(ttl))),
            Attempt::NotALock { found } => self.found = Some(found),
            // RedLock takes no shares (refused before any attempt): a key some other
            // client holds in shares is not a lock this attempt can take.
            Attempt::OtherShares { limit } => self.found = Some(format!("shared:{limit}")),
        }
    }

    fn votes(&self) -> Vec<(usize, u64)> {
        self.granted
            .iter()
            .filter(|(_, _, boot)| boot.votes())
            .map(|(index, token, _)| (*index, *token))
            .collect()
    }

    /// Whether a majority of votes is still possible (counting those yet to answer).
    fn may_reach_quorum(&self) -> bool {
        let outstanding = self.masters - self.finished;
        let voting = self.answers.iter().filter(|(_, boot)| boot.votes()).count();
        voting + outstanding >= quorum_of(self.masters)
    }

    fn decision(&self) -> Option<Decision> {
        let quorum = quorum_of(self.masters);
        let outstanding = self.masters - self.finished;
        let votes = self.votes();
        if votes.len() >= quorum {
            return Some(Decision::Won { voters: votes });
        }
        if votes.len() + outstanding >= quorum {
            return None;
        }
        Some(Decision::Lost)
    }

    /// Why an attempt that did not win failed.
    fn failure(&self, quorum: usize) -> Outcome {
        if let Some(found) = &self.found {
            return Outcome::NotALock {
                found: found.clone(),
            };
        }
        let voting = self.answers.iter().filter(|(_, boot)| boot.votes()).count();
        // Decided early, the masters still to answer count as possible voters: the
        // key is contended, not out of reach.
        let outstanding = self.masters - self.finished;
        if voting + outstanding < quorum {
            // The masters sitting out are named by `Masters`, which knows their URLs.
            return Outcome::NoQuorum {
                reached: voting,
                sitting_out: Vec::new(),
            };
        }
        Outcome::Busy {
            ttl: self.ttl.unwrap_or(Duration::ZERO),
            split: !self.granted.is_empty(),
            handed_off: false,
            line: LineStatus::default(),
        }
    }

    /// The masters that answered, whether each may vote (for the warnings).
    fn voters(&self) -> impl Iterator<Item = (usize, bool)> + '_ {
        self.answers
            .iter()
            .map(|(index, boot)| (*index, boot.votes()))
    }

    /// The masters that answered from quarantine, by index, each with how long it has
    /// left if it said.
    fn quarantined(&self) -> Vec<(usize, Option<Duration>)> {
        let mut out: Vec<(usize, Option<Duration>)> = self
            .answers
            .iter()
            .filter_map(|(index, boot)| match boot {
                Boot::Quarantined { left } => Some((*index, *left)),
                Boot::Votes => None,
            })
            .collect();
        out.sort_unstable_by_key(|(index, _)| *index);
        out
    }
}

/// Why a release or extend could not tell whether the lock is still ours.
pub(crate) enum QuorumError {
    Redis(redis::RedisError),
    NoQuorum { reached: usize },
}

impl QuorumError {
    pub(crate) fn into_lock_error(self, key: &str, masters: &Masters) -> LockError {
        match self {
            QuorumError::Redis(source) => LockError::redis(key, source),
            QuorumError::NoQuorum { reached } => LockError::NoQuorum {
                key: key.to_owned(),
                reached,
                needed: masters.quorum(),
                sitting_out: Vec::new(),
            },
        }
    }
}

/// The primary's refusal to write for want of replicas (`min-replicas-to-write`):
/// `NOREPLICAS`, or before Redis 7 the script error that wraps it.
fn refused_for_want_of_replicas(error: &redis::RedisError) -> bool {
    error.code() == Some("NOREPLICAS")
        || error
            .detail()
            .is_some_and(|detail| detail.contains("NOREPLICAS"))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspection_reports_the_holder_a_majority_agrees_on() {
        let seen = |owner: &str, token: u64, ttl_ms: u64| {
            Some(Seen {
                owner: owner.into(),
                holder: format!("client of {owner}"),
                fencing_token: token,
                held_for: Duration::from_millis(1000 - ttl_ms),
                ttl: Duration::from_millis(ttl_ms),
                waiting: 0,
                shares: None,
            })
        };
        let view = majority_view(&[seen("a", 5, 800), None, seen("a", 7, 700)], 2).unwrap();
        assert_eq!(view.holder, "client of a");
        assert_eq!(
            view.fencing_token, 7,
            "no majority for a token: the largest"
        );
        let agreed = [seen("a", 7, 800), seen("a", 9, 800), seen("a", 7, 700)];
        assert_eq!(
            majority_view(&agreed, 2).unwrap().fencing_token,
            7,
            "the token a majority names (written back by the acquire)"
        );
        assert_eq!(view.ttl, Duration::from_millis(700), "the shortest ttl");
        assert_eq!(
            view.held_for,
            Duration::from_millis(300),
            "the longest hold"
        );
        // A minority's leftover, or two owners splitting the masters, is no lock.
        assert!(majority_view(&[seen("a", 5, 800), None, None], 2).is_none());
        assert!(majority_view(&[seen("a", 5, 800), seen("b", 6, 800), None], 2).is_none());
    }

    fn granted(token: u64) -> Option<(Attempt, Boot)> {
        Some((
            Attempt::Acquired {
                token,
                handed_off: false,
            },
            Boot::Votes,
        ))
    }

    const QUARANTINED: Boot = Boot::Quarantined {
        left: Some(Duration::from_secs(43)),
    };

    fn with(boot: Boot, reply: Option<(Attempt, Boot)>) -> Option<(Attempt, Boot)> {
        reply.map(|(attempt, _)| (attempt, boot))
    }

    fn held() -> Option<(Attempt, Boot)> {
        Some((
            Attempt::Busy {
                ttl: Duration::from_secs(1),
                handed_off: false,
                line: LineStatus::default(),
            },
            Boot::Votes,
        ))
    }

    #[test]
    fn a_majority_of_votes_wins_before_the_slow_masters_answer() {
        let mut tally = Tally::new(5);
        for (index, token) in [(0, 7), (1, 9)] {
            tally.record(index, granted(token));
            assert_eq!(tally.decision(), None);
        }
        tally.record(3, granted(8));
        assert_eq!(
            tally.decision(),
            Some(Decision::Won {
                voters: vec![(0, 7), (1, 9), (3, 8)]
            })
        );
    }

    #[test]
    fn enough_refusals_decide_a_loss_without_the_rest() {
        let mut tally = Tally::new(5);
        tally.record(0, held());
        tally.record(1, held());
        assert_eq!(tally.decision(), None);
        tally.record(2, held());
        assert_eq!(tally.decision(), Some(Decision::Lost));
        assert!(matches!(
            tally.failure(3),
            Outcome::Busy { split: false, .. }
        ));
    }

    #[test]
    fn restarted_masters_do_not_vote() {
        // The sequence: 1 and 2 hold A's lock; 3, 4, 5 restarted empty.
        let mut tally = Tally::new(5);
        tally.record(0, held());
        tally.record(1, held());
        for index in 2..5 {
            tally.record(index, with(QUARANTINED, granted(1)));
        }
        assert_eq!(tally.decision(), Some(Decision::Lost));
        // Only two masters may vote at all: out of reach until the quarantine ends.
        assert!(matches!(
            tally.failure(3),
            Outcome::NoQuorum { reached: 2, .. }
        ));
        // The masters sitting out, in the order given, with how long each has left.
        assert_eq!(
            tally.quarantined(),
            [2, 3, 4].map(|index| (index, Some(Duration::from_secs(43))))
        );
        // Decided early, with masters still to answer, it is contention.
        let mut tally = Tally::new(5);
        tally.record(0, held());
        tally.record(2, with(QUARANTINED, granted(1)));
        tally.record(3, with(QUARANTINED, granted(1)));
        assert_eq!(tally.decision(), Some(Decision::Lost));
        assert!(matches!(
            tally.failure(3),
            Outcome::Busy { split: true, .. }
        ));
        // Same with the two holders silent: three quarantined masters cannot make a
        // majority with two still to answer.
        let mut tally = Tally::new(5);
        for index in 2..5 {
            tally.record(index, with(QUARANTINED, granted(1)));
        }
        assert_eq!(tally.decision(), Some(Decision::Lost));
        // A master restarted from a stale snapshot does not vote either.
        let mut tally = Tally::new(3);
        tally.record(0, granted(5));
        tally.record(1, with(QUARANTINED, granted(6)));
        tally.record(2, held());
        assert_eq!(tally.decision(), Some(Decision::Lost));
    }

    #[test]
    fn every_master_quarantined_is_no_majority_not_a_fresh_deployment() {
        // A rolling restart of every master without persistence, or a first deployment:
        // every master grants, none may vote (tests/redlock.rs replays the first).
        let mut tally = Tally::new(3);
        tally.record(0, with(QUARANTINED, granted(5)));
        tally.record(1, with(QUARANTINED, granted(6)));
        assert_eq!(tally.decision(), Some(Decision::Lost));
        tally.record(2, with(QUARANTINED, granted(4)));
        assert!(matches!(
            tally.failure(2),
            Outcome::NoQuorum { reached: 0, .. }
        ));
        assert_eq!(tally.quarantined().len(), 3);
    }

    #[test]
    fn validity_allows_for_clock_drift_with_redlock_only() {
        let ms = Duration::from_millis;
        assert_eq!(validity_of(ms(10_000), false), ms(10_000));
        assert_eq!(validity_of(ms(10_000), true), ms(9_898));
        assert_eq!(validity_of(ms(2), true), Duration::ZERO);
        assert_eq!(quorum_of(1), 1);
        assert_eq!(quorum_of(3), 2);
        assert_eq!(quorum_of(5), 3);
    }

    #[test]
    fn releases_are_decided_by_a_majority_of_answers() {
        let (ours, gone) = (Verdict::Ours, Verdict::Gone);
        let mut count = MajorityCount::new(5);
        count.answer(ours);
        count.answer(ours);
        assert_eq!(count.decided(), None);
        count.answer(ours);
        assert_eq!(count.decided(), Some(true));
        assert_eq!(count.verdict(), Some(Verdict::Ours));
        let mut count = MajorityCount::new(5);
        count.answer(gone);
        count.answer(gone);
        count.answer(ours);
        assert_eq!(
            count.decided(),
            None,
            "two silent masters could still confirm"
        );
        count.answer(gone);
        assert_eq!(count.decided(), Some(false));
        assert_eq!(count.verdict(), Some(Verdict::Gone));
        let mut count = MajorityCount::new(3);
        count.silence();
        count.silence();
        count.answer(ours);
        assert_eq!(count.decided(), None);
        assert_eq!(count.verdict(), None);
        // Denied, and a master found the eviction marker: force-unlocked.
        let mut count = MajorityCount::new(3);
        count.answer(Verdict::Evicted);
        count.answer(gone);
        assert_eq!(count.verdict(), Some(Verdict::Evicted));
    }
}
