//! Leader election: an exclusive lock on the election's name, held with the watchdog
//! lease for as long as the leader serves. The term is the lock's fencing token; who
//! leads is who holds the lock (`operate::inspect`).

use std::sync::Arc;
use std::time::Duration;

use crate::acquire::LockRequest;
use crate::core::Core;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::limits::MAX_DURATION;
use crate::operate::{self, LockInfo};

/// A leader election among every client that campaigns under one name
/// (`LockClient::election`).
///
/// At most one client leads at a time, within its lease: the leader holds the lock
/// named after the election, renewed by the watchdog while its [`LockGuard`] lives.
/// A leader that dies (crash, SIGKILL, network partition) is replaced once its lease
/// runs out (the client's watchdog lease, 30 s by default); one that lost its lease
/// learns it through [`LockGuard::lost`], and must stop acting as the leader. Terms
/// ([`LockGuard::fencing_token`]) strictly increase from one leader to the next: give
/// the term to whatever the leader writes, so that a deposed leader's late writes can
/// be refused.
///
/// ```no_run
/// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
/// let election = client.election("lottery-scheduler");
/// let term = election.campaign().await?; // waits until elected
/// println!("leading in term {}", term.fencing_token());
/// tokio::select! {
///     () = term.lost() => eprintln!("no longer the leader"),
///     () = async { /* schedule the draws */ } => {}
/// }
/// term.release().await?; // resign: the next candidate is elected at once
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    core: Arc<Core>,
    name: String,
    wait: Option<Duration>,
}

impl Election {
    pub(crate) fn new(core: Arc<Core>, name: String) -> Self {
        Election {
            core,
            name,
            wait: None,
        }
    }

    /// The election's name: the key of its lock.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Gives up campaigning after `wait` ([`LockError::Timeout`]); without it,
    /// [`Election::campaign`] waits until elected.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Waits until this client is elected, and leads until the returned guard is
    /// released (resigning) or dropped, or its lease is lost. Its
    /// [`fencing_token`](LockGuard::fencing_token) is the term. Cancellation-safe:
    /// dropping the future mid-way leaves no leadership behind.
    pub async fn campaign(&self) -> Result<LockGuard, LockError> {
        LockRequest::new(self.core.clone(), self.name.clone())
            .wait(self.wait.unwrap_or(MAX_DURATION))
            .label(&self.name)
            .acquire()
            .await
    }

    /// The current leader, if any: the client holding the election's lock (its
    /// [`holder`](LockInfo::holder) is that client's name), since when and in which
    /// term ([`fencing_token`](LockInfo::fencing_token)).
    pub async fn leader(&self) -> Result<Option<LockInfo>, LockError> {
        operate::inspect(&self.core, &self.name).await
    }
}
