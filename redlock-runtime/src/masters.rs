//! The servers a client locks on, and the majority rule over them.
//!
//! One server is the common case and takes the direct path: one script call per
//! operation. With N independent masters (RedLock) every operation goes to all N in
//! parallel, each bounded by a per-node timeout, and succeeds only on a majority.
//!
//! ## RedLock, as done here
//! - **Acquire** asks all N (not just the first majority to answer, so that a master
//!   restarted empty cannot make a minority look like a majority), and succeeds with a
//!   majority and a validity of `lease − elapsed − drift` above zero, where
//!   `drift = 0.01 × lease + 2 ms`. On failure it releases on every master, answered or
//!   not, before retrying or returning.
//! - **Fencing**: each master returns its own next token; the largest is chosen and
//!   written back to the majority that granted the lock before the guard is handed out.
//!   Any later acquisition's majority shares at least one master with that one, whose
//!   counter is already at least the chosen token, so the later token is larger.
//!   This holds as long as that shared master did not lose its counter (restart without
//!   persistence); the server-clock floor of every counter (see `scripts`) covers that
//!   case too unless the masters' clocks disagree by more than the time between the
//!   two acquisitions. Single-server mode has no such assumption.
//! - **Renew, extend, release** succeed when a majority confirms; masters that do not
//!   answer are left to expire.

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::client::ClientConfig;
use crate::error::LockError;
use crate::node::{Attempt, Node, Waiter};

/// The outcome of one acquisition attempt over every master.
pub(crate) enum Outcome {
    Acquired {
        fencing_token: u64,
        /// The hand-off's previous owner still held the lock, and it was deleted.
        released_previous: bool,
    },
    /// Acquired, but fewer replicas than required confirmed it; undone.
    NotReplicated {
        confirmed: usize,
        needed: usize,
    },
    /// Held by another owner; `ttl` is the shortest remaining lease seen. `split` is set
    /// when this attempt won some masters but not a majority (a tie with another client).
    Held {
        ttl: Duration,
        split: bool,
    },
    NotALock {
        found: String,
    },
    NoQuorum {
        reached: usize,
    },
}

pub(crate) struct Masters {
    nodes: Vec<Node>,
    node_timeout: Option<Duration>,
    response_timeout: Duration,
    confirm_replicas: Option<(usize, Duration)>,
}

impl Masters {
    pub(crate) fn new(nodes: Vec<Node>, config: &ClientConfig) -> Self {
        Masters {
            nodes,
            node_timeout: config.node_timeout,
            response_timeout: config.response_timeout,
            confirm_replicas: config.confirm_replicas,
        }
    }

    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub(crate) fn is_single(&self) -> bool {
        self.nodes.len() == 1
    }

    /// Whether a release may pass the lock to a waiter of the same client inside its
    /// acquire script: on one server (or cluster, or Sentinel primary) without replica
    /// confirmation, where that script is the whole acquisition.
    pub(crate) fn can_hand_off(&self) -> bool {
        self.is_single() && self.confirm_replicas.is_none()
    }

    /// Whether waiting clients queue in Redis (one server, cluster or Sentinel; with
    /// RedLock each master would keep its own order, so they do not).
    pub(crate) fn queues_waiters(&self) -> bool {
        self.is_single()
    }

    /// Takes a waiter that gave up out of `key`'s queue.
    pub(crate) async fn leave_queue(&self, key: &str, waiter_id: &str) {
        if let [node] = self.nodes.as_slice()
            && let Err(error) = node.leave_queue(key, waiter_id).await
        {
            tracing::debug!(%error, key, "redlock: could not leave the queue; the registration will expire");
        }
    }

    pub(crate) fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// How long a lease of `lease` is surely ours, counted from before the acquire was
    /// sent: the whole lease on one server, less the allowed clock drift with RedLock.
    pub(crate) fn validity(&self, lease: Duration) -> Duration {
        if self.is_single() {
            lease
        } else {
            lease.saturating_sub(lease / 100 + Duration::from_millis(2))
        }
    }

    fn node_timeout(&self, lease: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (lease / 10).clamp(Duration::from_millis(50), self.response_timeout))
    }

    /// One attempt on every master.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        lease_ms: u64,
        previous_owner: Option<&str>,
        waiter: Option<Waiter<'_>>,
    ) -> redis::RedisResult<Outcome> {
        if let [node] = self.nodes.as_slice() {
            return Ok(
                match node
                    .acquire(key, owner, lease_ms, previous_owner, waiter)
                    .await?
                {
                    Attempt::Acquired {
                        token: fencing_token,
                        released_previous,
                    } => match self.confirm_replicas {
                        None => Outcome::Acquired {
                            fencing_token,
                            released_previous,
                        },
                        Some((needed, timeout)) => {
                            let confirmed = node.confirm_replicas(needed, timeout).await;
                            match confirmed {
                                Ok(confirmed) if confirmed >= needed => Outcome::Acquired {
                                    fencing_token,
                                    released_previous,
                                },
                                other => {
                                    node.release(key, owner, 0).await.ok();
                                    Outcome::NotReplicated {
                                        confirmed: other?,
                                        needed,
                                    }
                                }
                            }
                        }
                    },
                    Attempt::Held { ttl } => Outcome::Held { ttl, split: false },
                    Attempt::NotALock { found } => Outcome::NotALock { found },
                },
            );
        }
        let sent_at = Instant::now();
        let limit = self.node_timeout(lease);
        let replies = join_all(self.nodes.iter().map(|node| {
            tokio::time::timeout(limit, node.acquire(key, owner, lease_ms, None, None))
        }))
        .await;
        let mut granted = Vec::new();
        let mut ttl: Option<Duration> = None;
        let mut found = None;
        let mut answered = 0;
        for (index, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(Ok(Attempt::Acquired { token, .. })) => {
                    answered += 1;
                    granted.push((index, token));
                }
                Ok(Ok(Attempt::Held { ttl: held })) => {
                    answered += 1;
                    ttl = Some(ttl.map_or(held, |t| t.min(held)));
                }
                Ok(Ok(Attempt::NotALock { found: what })) => {
                    answered += 1;
                    found = Some(what);
                }
                Ok(Err(error)) => {
                    tracing::debug!(node = %self.nodes[index].url, %error, "redlock: acquire failed on a master")
                }
                Err(_) => {
                    tracing::debug!(node = %self.nodes[index].url, "redlock: acquire timed out on a master")
                }
            }
        }
        if granted.len() >= self.quorum() && sent_at.elapsed() < self.validity(lease) {
            let fencing_token = granted.iter().map(|(_, token)| *token).max().unwrap_or(0);
            let raised = join_all(granted.iter().map(|(index, _)| {
                tokio::time::timeout(limit, self.nodes[*index].raise_fence(key, fencing_token))
            }))
            .await
            .into_iter()
            .filter(|raised| matches!(raised, Ok(Ok(()))))
            .count();
            if raised >= self.quorum() && sent_at.elapsed() < self.validity(lease) {
                return Ok(Outcome::Acquired {
                    fencing_token,
                    released_previous: false,
                });
            }
        }
        // No valid majority: undo on every master, including those that did not answer.
        self.release(key, owner, 0).await.ok();
        Ok(if let Some(found) = found {
            Outcome::NotALock { found }
        } else if answered < self.quorum() {
            Outcome::NoQuorum { reached: answered }
        } else {
            Outcome::Held {
                ttl: ttl.unwrap_or(Duration::ZERO),
                split: !granted.is_empty(),
            }
        })
    }

    /// Releases everywhere. `Ok(true)` when a majority deleted or kept it as ours,
    /// `Ok(false)` when a majority answered that it was not ours any more.
    pub(crate) async fn release(
        &self,
        key: &str,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, QuorumError> {
        self.on_every_master(|node| node.release(key, owner, keep_ms))
            .await
    }

    /// Extends everywhere; same answers as [`Masters::release`].
    pub(crate) async fn extend(
        &self,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Result<bool, QuorumError> {
        self.on_every_master(|node| node.extend(key, owner, lease_ms))
            .await
    }

    async fn on_every_master<'a, F, Fut>(&'a self, operation: F) -> Result<bool, QuorumError>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = redis::RedisResult<i64>>,
    {
        if let [node] = self.nodes.as_slice() {
            return operation(node)
                .await
                .map(|confirmed| confirmed > 0)
                .map_err(QuorumError::Redis);
        }
        let replies = join_all(
            self.nodes
                .iter()
                .map(|node| tokio::time::timeout(self.response_timeout, operation(node))),
        )
        .await;
        let mut answered = 0;
        let mut confirmed = 0;
        for reply in replies.into_iter().flatten().flatten() {
            answered += 1;
            if reply > 0 {
                confirmed += 1;
            }
        }
        if confirmed >= self.quorum() {
            Ok(true)
        } else if answered >= self.quorum() {
            Ok(false)
        } else {
            Err(QuorumError::NoQuorum { reached: answered })
        }
    }

    /// Renews `locks` on every master, one pipeline each; per lock, whether a majority
    /// renewed it (`Some(true)`), a majority said it is gone (`Some(false)`), or too few
    /// masters answered to tell (`None`).
    pub(crate) async fn renew(&self, locks: &[(&str, &str)], lease_ms: u64) -> Vec<Option<bool>> {
        let replies =
            join_all(self.nodes.iter().map(|node| {
                tokio::time::timeout(self.response_timeout, node.renew(locks, lease_ms))
            }))
            .await;
        let mut answered = 0;
        let mut renewed = vec![0usize; locks.len()];
        for reply in replies {
            match reply {
                Ok(Ok(per_lock)) if per_lock.len() == locks.len() => {
                    answered += 1;
                    for (count, one) in renewed.iter_mut().zip(per_lock) {
                        if one == 1 {
                            *count += 1;
                        }
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::warn!(%error, "redlock.renew failed on a master"),
                Err(_) => tracing::warn!("redlock.renew timed out on a master"),
            }
        }
        renewed
            .into_iter()
            .map(|count| {
                if count >= self.quorum() {
                    Some(true)
                } else if answered >= self.quorum() {
                    Some(false)
                } else {
                    None
                }
            })
            .collect()
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
            },
        }
    }
}
