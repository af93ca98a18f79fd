//! The lock client: one multiplexed Redis connection per server, shared by every lock it takes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;

use crate::acquire::{LockRequest, Mode};
use crate::config::{ClientConfig, DEFAULT_URL, redact};
use crate::connect;
use crate::core::{Core, Reconnect};
use crate::election::Election;
use crate::error::LockError;
use crate::masters::Masters;
use crate::multi::MultiLockRequest;
use crate::node::Node;
use crate::operate::{self, LockInfo};

/// A client of distributed locks on Redis: one server, RedLock over independent
/// masters, a Redis Cluster, or the primary Sentinel names (see the constructors and
/// [`LockClient::from_env`]).
///
/// Cheap to clone (an `Arc`); every clone shares one connection, one watchdog and one
/// line of waiting tasks (turn) per key. The connection reconnects by itself after a drop.
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Core>,
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("url", &self.inner.url())
            .field("watchdog_lease", &self.inner.config().watchdog_lease)
            .field("renew_every", &self.inner.config().renew_every)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to the Redis server at `url` with the default settings:
    /// `redis://[[user]:password@]host[:port][/db]`, or `rediss://…` for TLS (feature
    /// `tls`; see [`LockClientBuilder::tls_root_certificate`] for a private CA). An ACL
    /// user and its password, or a password alone (`redis://:password@host/`), come in
    /// the URL; they never appear in errors or `Debug` output.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).connect().await
    }

    /// Connects to `REDLOCK_URL`, or to [`DEFAULT_URL`] when it is not set.
    ///
    /// One URL means one server; a comma-separated list means RedLock over those
    /// independent masters (`redis://a:6379/,redis://b:6379/,redis://c:6379/`, or the
    /// same after a `redlock:` prefix).
    /// A `cluster:` prefix means a Redis Cluster reached through the listed seed nodes
    /// (`cluster:redis://node-a:7000/,redis://node-b:7000/`); `sentinel:NAME:` means
    /// the primary named NAME by the listed sentinels
    /// (`sentinel:mymaster:redis://s1:26379/,redis://s2:26379/`).
    pub async fn from_env() -> Result<Self, LockError> {
        let url = std::env::var("REDLOCK_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
        Self::builder_from_spec(&url).connect().await
    }

    /// The builder for a `REDLOCK_URL`-style specification (see [`LockClient::from_env`]).
    pub fn builder_from_spec(spec: &str) -> LockClientBuilder {
        let spec = spec.trim();
        let urls = |list: &str| {
            list.split(',')
                .filter(|part| !part.trim().is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let mut builder = if let Some(seeds) = spec.strip_prefix("cluster:") {
            let builder = Self::builder_for(urls(seeds));
            #[cfg(feature = "cluster")]
            let builder = builder.cluster();
            #[cfg(not(feature = "cluster"))]
            let builder = builder.needs_feature("a `cluster:` spec", "cluster");
            builder
        } else if let Some(rest) = spec.strip_prefix("sentinel:") {
            let (service, sentinels) = rest.split_once(':').unwrap_or((rest, ""));
            let mut builder = Self::builder_for(urls(sentinels));
            #[cfg(feature = "sentinel")]
            {
                builder = builder.sentinel(service);
            }
            #[cfg(not(feature = "sentinel"))]
            {
                builder = builder.needs_feature("a `sentinel:` spec", "sentinel");
            }
            // A missing feature is the first thing to fix.
            let named = builder.spec_problem.is_some()
                || !(service.is_empty() || sentinels.starts_with("//"));
            if !named {
                // `sentinel:redis://h/`: the service name is missing, `redis` was taken for it.
                builder.spec_problem = Some(format!(
                    "`{}` names no Sentinel service: write `sentinel:NAME:redis://host:26379/`",
                    redact(spec)
                ));
            }
            builder
        } else {
            // `redlock:URL,URL…` says RedLock outright; the bare list means the same.
            Self::builder_for(urls(spec.strip_prefix("redlock:").unwrap_or(spec)))
        };
        if builder.targets.is_empty() && builder.spec_problem.is_none() {
            builder.spec_problem = Some(format!("`{}` names no Redis server", redact(spec)));
        }
        builder.spec = redact(spec);
        builder
    }

    /// The primary that Redis Sentinel names for `service`, followed across failovers.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn sentinel<I, S>(sentinels: I, service: &str) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder_for(sentinels)
            .sentinel(service)
            .connect()
            .await
    }

    /// A Redis Cluster, reached through some of its nodes. Each lock lives on the shard
    /// that owns its key's slot; its fencing counter and release channel (sharded
    /// pub/sub) are in the same slot.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn cluster<I, S>(seeds: I) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder_for(seeds).cluster().connect().await
    }

    /// Reuses the address and credentials of a `redis::Client` the application already has.
    /// The lock client opens its own connection (in RESP3, for push notifications).
    pub async fn from_redis(client: redis::Client) -> Result<Self, LockError> {
        LockClientBuilder {
            targets: vec![Target::Info(Box::new(client.get_connection_info().clone()))],
            config: ClientConfig::default(),
            topology: Topology::Masters,
            spec_problem: None,
            spec: String::new(),
        }
        .connect()
        .await
    }

    /// A builder for a client with non-default settings.
    pub fn builder(url: &str) -> LockClientBuilder {
        Self::builder_for([url])
    }

    /// A builder for RedLock over independent masters (one URL: a single server).
    pub fn builder_for<I, S>(urls: I) -> LockClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        LockClientBuilder {
            targets: urls
                .into_iter()
                .map(|url| Target::Url(url.as_ref().trim().to_owned()))
                .collect(),
            config: ClientConfig::default(),
            topology: Topology::Masters,
            spec_problem: None,
            spec: String::new(),
        }
    }

    /// RedLock over N independent masters: every operation needs a majority of them.
    /// Connects even when a minority cannot be reached (they are retried on every use).
    /// Masters redlock has never used vote only once `max_lease` has passed since the
    /// first acquisition found them so (see [`LockClientBuilder::max_lease`]): a first
    /// deployment answers [`LockError::NoQuorum`] until then, unless an operator
    /// vouches for its masters ([`LockClient::vouch_for_blank_masters`]).
    pub async fn redlock<I, S>(urls: I) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder_for(urls).connect().await
    }

    /// Starts building an acquisition of the lock named `key`: exclusive, the same lock
    /// as [`LockClient::write_lock`] (it excludes readers too).
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.inner.clone(), key.into())
    }

    /// Starts building an acquisition of several keys as one: exclusive locks on every
    /// key, each with its own fencing token (from that key's counter), held and
    /// released together by one [`MultiLockGuard`](crate::MultiLockGuard). A key named twice is one key.
    ///
    /// ```no_run
    /// # async fn demo(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// use std::time::Duration;
    /// let both = client
    ///     .lock_all(["acct:7", "acct:3"])
    ///     .wait(Duration::from_secs(5))
    ///     .acquire()
    ///     .await?;
    /// let (from, to) = (both.fencing_token("acct:7"), both.fencing_token("acct:3"));
    /// # let _ = (from, to);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Several keys as one
    /// **All or nothing**: within the `wait` the call holds every key, or returns
    /// [`LockError::Timeout`] naming the key still busy (or the error that stopped it)
    /// holding none — what it had taken is released before it returns, and a dropped
    /// acquisition (cancelled, timed out around it) releases it at once in the
    /// background, not at the end of its lease. **No deadlock, no livelock**: every
    /// caller takes the keys one by one in one global order (byte order), each through
    /// the key's own fair line, so callers naming the same keys in opposite orders, in
    /// different processes, both complete; nothing is retried from scratch. **No
    /// starvation**: a caller waiting for its second key keeps its place in that key's
    /// line, so callers of that key alone do not overtake it forever. **Every mode**:
    /// each key is taken where it lives, so keys in different Cluster slots and nodes
    /// lock together (no `CROSSSLOT`).
    ///
    /// **What it costs others**: the keys taken first are held while the later ones are
    /// awaited. A waiter of one of those keys waits for this caller, at most this
    /// caller's `wait` (then the keys are given back) plus, once all are held, as long
    /// as this caller holds them. With a fixed `lease`, the keys whose lease aged
    /// meanwhile are extended once all are held, so that each is held `lease` from the
    /// return of `acquire` (give or take a tenth of it).
    ///
    /// `inspect`, `locks` and the `redlock` command show each key held by this client;
    /// a [`force_unlock`](Self::force_unlock) of any one key makes the guard lost.
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLockRequest::new(
            self.inner.clone(),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// A read lock on `key`: any number of readers at once, in every process, but no
    /// writer ([`LockClient::write_lock`], or a plain [`LockClient::lock`]).
    ///
    /// Writer-preferring: once a writer waits for the key, new readers wait behind it,
    /// so that a stream of readers cannot starve it. A writer that leaves the line lets
    /// them in: at once when it gives up (its wait ran out, its acquisition was
    /// dropped), within about 3 s when its process dies while waiting (a waiting
    /// writer renews its place every second, and a place not renewed lapses 2 s
    /// later). Each reader has its own lease (and
    /// watchdog renewal without one): a reader that dies frees its share when its own
    /// lease ends, and a live reader's renewals never keep a dead one's share alive.
    /// Each reader gets a fencing token; a writer's is above every earlier reader's and
    /// writer's. One server, Sentinel or Cluster: RedLock refuses it
    /// ([`LockError::InvalidOptions`]).
    ///
    /// ```no_run
    /// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// use std::time::Duration;
    /// let reader = client.read_lock("doc:7").wait(Duration::from_secs(2)).acquire().await?;
    /// // … read doc 7; other readers may too, no writer can …
    /// reader.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::with_mode(self.inner.clone(), key.into(), Mode::Read)
    }

    /// The write lock on `key`: exclusive of every reader and writer. The same lock as
    /// [`LockClient::lock`] (the name says what it is for).
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.inner.clone(), key.into())
    }

    /// One of `permits` permits named `name`: at most `permits` holders at once, across
    /// every process.
    ///
    /// Each permit has its own lease (and watchdog renewal without one): a holder that
    /// dies returns its permit when that lease ends. Nothing is left in Redis once no
    /// permit is held. Every client must ask for the same count: asking for another
    /// while permits are held fails with [`LockError::PermitsMismatch`] naming both.
    /// Each permit gets a fencing token. A freed permit wakes the waiters (in each
    /// client, first come first served). One server, Sentinel or Cluster: RedLock
    /// refuses it ([`LockError::InvalidOptions`]); so is a count of 0.
    ///
    /// ```no_run
    /// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// use std::time::Duration;
    /// let permit = client
    ///     .semaphore("partner-api", 5)
    ///     .wait(Duration::from_secs(3))
    ///     .lease(Duration::from_secs(10))
    ///     .acquire()
    ///     .await?;
    /// // … call the partner API: at most 5 calls at once, fleet-wide …
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> LockRequest {
        LockRequest::with_mode(self.inner.clone(), name.into(), Mode::Permits(permits))
    }

    /// The leader election named `name` (see [`Election`]).
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(self.inner.clone(), name.into())
    }

    /// This client's name, written into every lock it takes (see
    /// [`LockClientBuilder::name`]).
    pub fn name(&self) -> &str {
        &self.inner.config().name
    }

    /// Who holds the lock `key`, since when, with which fencing token, and how many
    /// clients wait; `None` when it is free. A key held in shares — a read lock's
    /// readers, a semaphore's permits — is not free: its [`LockInfo::kind`] says
    /// which, and [`LockInfo::shares`] lists each share's client and remaining lease.
    /// A key holding anything redlock did not write as a lock is not a lock (`None`),
    /// and neither is a key reserved for a waiter that is taking it at this moment.
    ///
    /// With RedLock: the holder a majority of masters agree on (its shortest ttl, its
    /// token the acquire gave it), with `waiting` 0 (RedLock keeps no waitlist). A lock
    /// taken by an older version of redlock (whose value names no client) shows the
    /// holder `(unknown: taken by an older redlock)` and token 0.
    ///
    /// ```no_run
    /// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// if let Some(info) = client.inspect("order:42").await? {
    ///     println!(
    ///         "{} held by {} for {:?} (token {}, {:?} left, {} waiting)",
    ///         info.key(), info.holder(), info.held_for(), info.fencing_token(),
    ///         info.ttl(), info.waiting()
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        operate::inspect(&self.inner, key).await
    }

    /// Every lock whose key matches `pattern` (Redis glob syntax: `order:*`), sorted
    /// by key. Walks the keyspace with `SCAN … TYPE string` — never `KEYS`, so the
    /// server keeps serving — on every primary of a Cluster; redlock's own keys
    /// (counters, waitlists) and application keys that are not locks are left out.
    /// A lock taken or freed during the walk may or may not be listed.
    ///
    /// ```no_run
    /// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// for info in client.locks("order:*").await? {
    ///     if info.held_for() > std::time::Duration::from_secs(600) {
    ///         println!("{} held by {} for {:?}", info.key(), info.holder(), info.held_for());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn locks(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        operate::locks(&self.inner, pattern).await
    }

    /// Frees the lock `key` whoever holds it — every reader of a read lock, every
    /// holder of a semaphore's permits — as its release would: the next client in line
    /// gets it and waiters in every process are woken. Returns `false` when it was
    /// free. Logs a `tracing` warning naming the key, the evicted holder (or how many
    /// shares) and this client.
    ///
    /// The evicted holder (each evicted share's) is not told at once: its guard turns
    /// lost at its next renewal (within `renew_every` in watchdog mode), `extend` or
    /// release, and that release returns [`LockError::Lost`]. Its fencing token stays below the next
    /// holder's, so a resource that checks tokens refuses its late writes.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_runtime::LockError> {
    /// use redlock_runtime::LockClient;
    /// let operator = LockClient::builder("redis://127.0.0.1:6379/")
    ///     .name("oncall-ops")
    ///     .connect()
    ///     .await?;
    /// assert_eq!(operator.name(), "oncall-ops");
    /// if !operator.force_unlock("order:42").await? {
    ///     println!("order:42 was free");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        Ok(self.evict(key).await?.is_some())
    }

    /// Like [`force_unlock`](Self::force_unlock), returning the lock it freed as it
    /// was at that moment (holder, fencing token, how long it had been held), read in
    /// the same atomic step; `None` when it was free.
    ///
    /// ```no_run
    /// # async fn run(client: redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> {
    /// if let Some(evicted) = client.evict("order:42").await? {
    ///     println!("evicted {} (token {})", evicted.holder(), evicted.fencing_token());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn evict(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        operate::evict(&self.inner, key).await
    }

    /// RedLock: vouches for masters that hold no redlock data as a new deployment, so
    /// that they vote at once instead of sitting out [`max_lease`] first; returns how
    /// many it vouched for. The command-line tool does the same: `redlock vouch
    /// redis://a/ redis://b/ redis://c/`.
    ///
    /// A master redlock has never used cannot be told from one that forgot every lock
    /// (restarted without persistence, flushed, replaced by an empty replica): both
    /// hold nothing, so both sit out `max_lease` before they vote, and a first
    /// deployment answers [`LockError::NoQuorum`] for that long. **Running this, you
    /// assert that no lock taken on these masters can still run**: they are new, or
    /// every client that ever used them has been stopped for longer than `max_lease`.
    /// The client cannot check that, only refuse what plainly contradicts it. If a lock
    /// taken before the masters lost their data still runs (a rolling restart without
    /// persistence while it was held), vouching lets a second client take it at once.
    ///
    /// **All or nothing.** Every master of the client must answer, and each must be
    /// blank: no lock under any key (a value redlock writes: held, kept, reserved, or
    /// shares), no other key of redlock's (`redlock:…`: waitlists, eviction markers,
    /// holders), and no restart marker (`redlock:boot`) but the one attempts leave on
    /// a master found blank in its first quarantine — naming its running process, less
    /// than `max_lease` old — beside which the fencing counter may be, as those
    /// attempts leave it too (the vouch drops it: they won nothing, and tokens then
    /// come from the master's clock, as after any restart). So vouching works after a
    /// first deployment's `NoQuorum`, once the failed attempts have been undone. Any
    /// other marker is refused: one naming another Redis process (the master
    /// restarted with redlock's data), one older than `max_lease` (the master has
    /// voted since), or the marker of an earlier vouch with a fencing counter beside it
    /// (locks were taken since). One
    /// master that is not blank refuses them all, with [`LockError::NotBlank`] naming
    /// the master and the key that shows its use ([misconfigured](LockError::is_misconfigured)),
    /// and nothing is written: a trace of redlock on any master says the deployment is
    /// in use, and then its blank masters may be ones that lost their locks. A master
    /// that does not answer fails the call with [`LockError::Connect`] naming it, and
    /// nothing is written either. A master holding more than 100 000 keys is refused
    /// too: each master's keys are looked through in one script, during which it
    /// serves nobody else (about a second per million keys).
    ///
    /// Then each master is marked in one script that looks again before it writes, so
    /// no attempt slips between the check and the write: an attempt that reached a
    /// master after the first look (a client started meanwhile) makes that master
    /// refuse ([`LockError::NotBlank`]), while the others stay vouched for — harmless,
    /// since such an attempt is recorded on the master like any later one. A master
    /// already vouched for by its running process, and unused since, is left as it is
    /// and not counted: calling this again returns 0.
    ///
    /// The mark (`<run_id>:0:vouched` in `redlock:boot`) names the Redis process: a
    /// master that restarts, is replaced or flushed after it sits out `max_lease` as
    /// usual, so a rolling restart stays safe. `max_lease` is this client's: give it
    /// the value the deployment's clients use.
    ///
    /// One server, a Cluster or Sentinel's primary never sits out a quarantine: this
    /// returns [`LockError::InvalidOptions`] for such a client.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_runtime::LockError> {
    /// use redlock_runtime::LockClient;
    /// // A new deployment: nothing has run on these masters yet.
    /// let client = LockClient::redlock(["redis://a:6379/", "redis://b:6379/", "redis://c:6379/"]).await?;
    /// let vouched = client.vouch_for_blank_masters().await?;
    /// println!("vouched for {vouched} masters");
    /// let guard = client.lock("order:42").acquire().await?; // votes at once
    /// # drop(guard); Ok(()) }
    /// ```
    ///
    /// [`max_lease`]: LockClientBuilder::max_lease
    pub async fn vouch_for_blank_masters(&self) -> Result<usize, LockError> {
        operate::vouch_for_blank_masters(&self.inner).await
    }

    /// Ends the client's work, for a clean exit (a rolling deploy, SIGTERM): refuses
    /// new acquisitions from then on, on every clone ([`LockError::ShutDown`]; one
    /// waiting when it is called fails the same way at its next attempt, and one that
    /// acquires meanwhile gives its lock back),
    /// releases every lock the client's guards hold (they turn
    /// [lost](crate::LockGuard::is_lost), and their `release` returns `ShutDown`), and waits for
    /// the releases running in the background (of dropped guards, of interrupted calls).
    /// Each is bounded by the response timeout. Returns the first release that failed,
    /// after trying them all. Calling it again does no harm.
    ///
    /// Without it nothing is left behind either, only later: a guard dropped as `main`
    /// returns (or a task cut short) is released in the background, and if the runtime
    /// shuts down first, its shutdown sends the release on a connection of its own
    /// (at most a second per client); so is a guard held by a task the runtime ends
    /// there. A guard held by a task that keeps running is released by `shutdown` alone.
    ///
    /// ```no_run
    /// # async fn serve(_: &redlock_runtime::LockClient) -> Result<(), redlock_runtime::LockError> { Ok(()) }
    /// # async fn run() -> Result<(), redlock_runtime::LockError> {
    /// use tokio::signal::unix::{signal, SignalKind};
    /// let client = redlock_runtime::LockClient::from_env().await?;
    /// let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    /// tokio::select! {
    ///     result = serve(&client) => result?,
    ///     _ = terminate.recv() => {}
    ///     _ = tokio::signal::ctrl_c() => {}
    /// }
    /// client.shutdown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) -> Result<(), LockError> {
        self.inner.shutdown().await
    }

    /// The lease used when an acquisition names none (watchdog mode).
    pub fn watchdog_lease(&self) -> Duration {
        self.inner.config().watchdog_lease
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id()
    }
}

impl LockClient {
    /// Number of locks this client currently renews in watchdog mode.
    pub fn watched_locks(&self) -> usize {
        self.inner.watchdog().len()
    }

    /// Number of keys this client's tasks hold or wait for.
    pub fn active_keys(&self) -> usize {
        self.inner.turns().len()
    }
}

/// `rediss://` needs the `tls` feature: say so, rather than fail somewhere deeper.
fn check_tls_support(url: &str, shown: &str) -> Result<(), LockError> {
    let tls = url
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("rediss://");
    if tls && !cfg!(feature = "tls") {
        return Err(LockError::Connect {
            url: shown.to_owned(),
            source: redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a rediss:// (TLS) URL needs redlock-runtime's `tls` feature",
                "add `features = [\"tls\"]` to the redlock-runtime dependency".to_owned(),
            )),
        });
    }
    #[cfg(feature = "tls")]
    if tls {
        // rustls needs a crypto provider; ring is compiled in with the feature. Another
        // one installed by the application first is kept.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    Ok(())
}

enum Target {
    Url(String),
    Info(Box<redis::ConnectionInfo>),
}

/// Settings of a [`LockClient`] before it connects.
pub struct LockClientBuilder {
    targets: Vec<Target>,
    config: ClientConfig,
    topology: Topology,
    /// A mistake in a `REDLOCK_URL`-style spec, reported by `connect`.
    spec_problem: Option<String>,
    /// That spec as errors show it (password hidden).
    spec: String,
}

/// The forms a URL spec may take, for error messages.
const SPEC_FORMS: &str = "expected `redis://[user:password@]host[:port][/db]` (or `rediss://` \
     for TLS), several of them comma-separated (or `redlock:URL,URL…`) for RedLock, \
     `cluster:URL,URL…` for a Redis Cluster, or `sentinel:NAME:URL,URL…` for the primary \
     Sentinel names NAME";

/// What the builder's URLs point at.
#[derive(Debug, Clone)]
enum Topology {
    /// One server, or RedLock's independent masters.
    Masters,
    #[cfg(feature = "cluster")]
    Cluster,
    /// Sentinels watching the named primary.
    #[cfg(feature = "sentinel")]
    Sentinel(String),
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LockClientBuilder {
    /// The name written into every lock this client takes, shown by
    /// [`LockClient::inspect`], [`LockClient::locks`] and the `redlock` command
    /// (default `<hostname>:<pid>`). 1 to 200 bytes of printable text.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Lease of locks taken without one, renewed by the watchdog.
    ///
    /// Default: 30 s, or three [`renew_every`](Self::renew_every) intervals if that is
    /// given and longer; with RedLock, at most [`max_lease`](Self::max_lease) when that
    /// is given. Given together, `renew_every` must be shorter and (RedLock)
    /// `max_lease` at least as long; otherwise `connect` fails with
    /// [`LockError::InvalidOptions`] naming them.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.config.given.watchdog_lease = Some(lease);
        self
    }

    /// How often the watchdog renews.
    ///
    /// Default: a third of the watchdog lease (Redisson's rule, at least 1 ms), so
    /// `watchdog_lease(Duration::from_secs(3))` alone renews every second. A value given
    /// must be shorter than the watchdog lease.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.config.given.renew_every = Some(every);
        self
    }

    /// How long any one command may wait for Redis's answer (default 3 s).
    ///
    /// On Linux it also bounds how long a connection to one server (or a RedLock
    /// master, or a Cluster node) outlives a network partition: data it sent that stays
    /// unacknowledged for twice this (at least a second) makes the kernel drop it
    /// (`TCP_USER_TIMEOUT`), and the next command connects anew (a command that finds
    /// its connection dropped so is sent once more on the new one). Without that, the
    /// commands that timed out during a partition would stay queued in the socket and
    /// every command after the network healed would time out too, for up to as long as
    /// the partition lasted.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.config.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Treats the URLs as seed nodes of one Redis Cluster instead of RedLock masters.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster(mut self) -> Self {
        self.topology = Topology::Cluster;
        self
    }

    /// Treats the URLs as Redis Sentinels and locks on the primary they name for
    /// `service`, following it after a failover.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel(mut self, service: &str) -> Self {
        self.topology = Topology::Sentinel(service.to_owned());
        self
    }

    /// After each acquisition, waits (Redis `WAIT`) until `replicas` replicas have the
    /// lock, at most `timeout`; fewer confirmations undo the acquisition and fail with
    /// [`LockError::NotReplicated`] (so does a primary's own refusal for want of
    /// replicas, `NOREPLICAS`, when the server sets `min-replicas-to-write`). Like Redisson's `checkLockSyncedSlaves`, this makes
    /// a lock survive a failover to one of those replicas; it cannot protect against a
    /// failover to a replica that did not confirm, nor replace fencing. One server or
    /// Sentinel only.
    ///
    /// Only the acquisition (of a lock, a read share or a permit, a hand-off included)
    /// is confirmed. Renewals, [`LockGuard::extend`](crate::LockGuard::extend),
    /// releases and forced unlocks are not: after a failover the promoted replica may
    /// hold the lock with the lease it had at the acquisition, or at a later renewal or
    /// extension that reached it. So a released lock may reappear there, held by its
    /// former holder, until that lease ends (waiters get it then, not at the release);
    /// and a renewed or extended lock may end earlier there than its holder believes:
    /// until then `is_lost()` and `lease_remaining()` overstate it, and the holder
    /// finds out only at its first renewal, `extend` or release after that end
    /// ([`LockError::Lost`]; a renewal that reaches the new primary before that end
    /// renews it as usual).
    /// Fencing tokens still order the holders' writes.
    pub fn confirm_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.config.confirm_replicas = Some((replicas, timeout));
        self
    }

    /// How long a release's grant holds the key for the client that has waited longest
    /// until that client confirms it (default 100 ms; a waiter of an older redlock gets
    /// the key reserved for as long). Bounds what a waiter that died, stopped or was cut
    /// off while first in line costs the others: the releasing client passes an
    /// unconfirmed grant on a few milliseconds after it. A granted waiter whose message
    /// arrives after most of it (the process was stopped or starved) attempts again,
    /// which takes the key if it is still granted to it. `shutdown()` waits for the
    /// checks of its releases' grants: about this long, plus the response timeout.
    pub fn reservation_grace(mut self, grace: Duration) -> Self {
        self.config.reservation_grace = grace;
        self
    }

    /// RedLock: the longest lease any lock on these masters may have (default 60 s, or
    /// the watchdog lease if that is given and longer; a watchdog lease not given
    /// follows this one: at most as long). Longer leases are refused with
    /// [`LockError::InvalidOptions`], and so are longer extensions and `hold_at_least`.
    /// A master that may have lost data (restarted, replaced by a promoted replica,
    /// flushed: its marker names another Redis process, or is gone) does not count
    /// toward a majority until this long after a client noticed, because it may have
    /// forgotten locks that are still running: this is RedLock's "delayed restart",
    /// enforced by the client. A master redlock has never used looks the same as one
    /// that forgot everything, so a first deployment costs this long too: its first
    /// acquisitions fail with [`LockError::NoQuorum`] until `max_lease` has passed
    /// since the first of them, unless an operator vouches for its masters
    /// ([`LockClient::vouch_for_blank_masters`], `redlock vouch`). Give every client of the same masters a value at least
    /// as long as any lease any of them takes, and no longer than needed. Unused with
    /// one server.
    pub fn max_lease(mut self, lease: Duration) -> Self {
        self.config.max_lease = Some(lease);
        self
    }

    /// Per-master timeout of a RedLock acquisition (default: a tenth of the lease,
    /// between 50 ms and the response timeout). Unused with one server.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = Some(timeout);
        self
    }

    /// Trusts `pem` (one or more PEM certificates: a private CA) for the `rediss://`
    /// servers of this client, in every mode, instead of the system's roots. Needs the
    /// `tls` feature.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), redlock_runtime::LockError> {
    /// let ca = std::fs::read("/etc/redis/ca.pem").expect("the CA");
    /// let client = redlock_runtime::LockClient::builder("rediss://locks:s3cret@redis.internal:6380/")
    ///     .tls_root_certificate(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.config.tls_root_certificate = Some(pem.into());
        self
    }

    /// A spec this build cannot serve: reported by `connect`, naming the feature.
    #[cfg(not(all(feature = "cluster", feature = "sentinel")))]
    fn needs_feature(mut self, what: &str, feature: &str) -> Self {
        self.spec_problem = Some(format!(
            "{what} needs redlock-runtime's `{feature}` feature: add `features = [\"{feature}\"]` \
             to the redlock-runtime dependency"
        ));
        self
    }

    /// Connects. Fails within about twice the connect timeout when Redis cannot be reached.
    pub async fn connect(self) -> Result<LockClient, LockError> {
        if let Some(problem) = self.spec_problem {
            return Err(LockError::Connect {
                url: self.spec,
                source: redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "invalid Redis URL spec",
                    format!("{problem}; {SPEC_FORMS}"),
                )),
            });
        }
        let config = self.config;
        let mut targets = Vec::with_capacity(self.targets.len());
        for target in self.targets {
            targets.push(match target {
                Target::Url(url) => {
                    let shown = redact(&url);
                    check_tls_support(&url, &shown)?;
                    let info = url.as_str().into_connection_info().map_err(|source| {
                        LockError::Connect {
                            url: shown.clone(),
                            source: redis::RedisError::from((
                                redis::ErrorKind::InvalidClientConfig,
                                "not a Redis URL",
                                // redis-rs's own text says no more than that.
                                if source.to_string().contains("did not parse") {
                                    SPEC_FORMS.to_owned()
                                } else {
                                    format!("{source}; {SPEC_FORMS}")
                                },
                            )),
                        }
                    })?;
                    (info, shown)
                }
                Target::Info(info) => {
                    let shown = info.addr().to_string();
                    (*info, shown)
                }
            });
        }
        let shown: Vec<&str> = targets.iter().map(|(_, url)| url.as_str()).collect();
        let url = shown.join(",");
        let invalid = |reason: String| LockError::Connect {
            url: url.clone(),
            source: redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid client setting",
                reason,
            )),
        };
        if targets.is_empty() {
            return Err(invalid("no Redis server given".into()));
        }
        let redlock = matches!(self.topology, Topology::Masters) && targets.len() > 1;
        if redlock && targets.len() % 2 == 0 {
            tracing::warn!(
                masters = targets.len(),
                "redlock: an even number of RedLock masters tolerates no more failures than one \
                 master fewer ({} of {} needed); use an odd number",
                targets.len() / 2 + 1,
                targets.len()
            );
        }
        let config = config
            .resolve(redlock)
            .map_err(LockError::invalid_settings)?;
        #[cfg(feature = "cluster")]
        if config.confirm_replicas.is_some() && matches!(self.topology, Topology::Cluster) {
            return Err(LockError::invalid_settings(
                "confirm_replicas is for one server or Sentinel, not Redis Cluster",
            ));
        }
        let servers = Servers {
            targets,
            topology: self.topology,
            url: url.clone(),
            config,
        };
        // Boxed: connecting nests deep futures (redis-rs's), and an application's future
        // that awaits `connect()` must stay within the compiler's query depth.
        let nodes = Box::pin(servers.connect()).await?;
        let masters = Masters::new(nodes, &servers.config);
        let config = servers.config.clone();
        // The same servers again, from a runtime of its own: see `Core`'s releases at exit.
        let reconnect: Reconnect = Box::new(move || {
            let servers = servers.clone();
            Box::pin(async move {
                let nodes = servers.connect().await?;
                Ok(Masters::new(nodes, &servers.config))
            })
        });
        Ok(LockClient {
            inner: Core::new(url, masters, config, reconnect),
        })
    }
}

/// Where a client connects, kept to connect again.
#[derive(Clone)]
struct Servers {
    targets: Vec<(redis::ConnectionInfo, String)>,
    topology: Topology,
    /// As shown (passwords hidden): names a Cluster or Sentinel node in its errors.
    #[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
    url: String,
    config: ClientConfig,
}

impl Servers {
    async fn connect(&self) -> Result<Vec<Node>, LockError> {
        let (targets, config) = (self.targets.clone(), &self.config);
        Ok(match &self.topology {
            Topology::Masters => Self::connect_masters(targets, config).await?,
            #[cfg(feature = "cluster")]
            Topology::Cluster => {
                let seeds = targets.into_iter().map(|(info, _)| info).collect();
                vec![connect::cluster(seeds, self.url.clone(), config).await?]
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel(service) => {
                let sentinels = targets.into_iter().map(|(info, _)| info).collect();
                vec![
                    connect::sentinel(
                        sentinels,
                        service,
                        format!("{service}@{}", self.url),
                        config,
                    )
                    .await?,
                ]
            }
        })
    }

    async fn connect_masters(
        targets: Vec<(redis::ConnectionInfo, String)>,
        config: &ClientConfig,
    ) -> Result<Vec<Node>, LockError> {
        let redlock = targets.len() > 1;
        let connected = futures_util::future::join_all(
            targets
                .into_iter()
                .map(|(info, shown)| connect::server(info, shown, config, redlock)),
        )
        .await;
        let masters = connected.len();
        let mut nodes = Vec::with_capacity(masters);
        let mut refused = Vec::new();
        for result in connected {
            let (node, failure) = result?;
            // A master that is down may come back; one that refuses this client's
            // credentials or certificate will not until the configuration changes.
            if let Some(failure) = failure.filter(|failure| !failure.is_outage()) {
                refused.push(failure);
            }
            nodes.push(node);
        }
        // Refused by so many masters that no majority can ever form: the configuration
        // is wrong, say so now rather than `NoQuorum` at every acquire.
        if masters - refused.len() < masters / 2 + 1
            && let Some(first) = refused.into_iter().next()
        {
            return Err(first);
        }
        Ok(nodes)
    }
}

#[cfg(test)]
mod spec_tests {
    use super::LockClient;
    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    use super::Topology;

    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    fn parsed(spec: &str) -> (usize, String) {
        let builder = LockClient::builder_from_spec(spec);
        (builder.targets.len(), format!("{:?}", builder.topology))
    }

    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    #[test]
    fn redlock_url_chooses_the_mode() {
        assert_eq!(parsed("redis://a:6379/"), (1, "Masters".into()));
        assert_eq!(
            parsed("redis://a/, redis://b/,redis://c/"),
            (3, "Masters".into())
        );
        assert_eq!(
            parsed("cluster:redis://a:7000/,redis://b:7000/"),
            (2, "Cluster".into())
        );
        assert_eq!(
            parsed("sentinel:mymaster:redis://s1:26379/,redis://s2:26379/"),
            (2, "Sentinel(\"mymaster\")".into())
        );
        assert!(matches!(
            LockClient::builder_from_spec("redis://a/").topology,
            Topology::Masters
        ));
        assert_eq!(
            parsed("redlock:redis://a/,redis://b/,redis://c/"),
            (3, "Masters".into())
        );
    }

    #[cfg(all(feature = "cluster", feature = "sentinel"))]
    #[test]
    fn spec_mistakes_are_caught_before_connecting() {
        let problem = |spec: &str| LockClient::builder_from_spec(spec).spec_problem;
        assert!(
            problem("sentinel:redis://h:26379/")
                .unwrap()
                .contains("sentinel:NAME:")
        );
        assert!(problem("sentinel::redis://h:26379/").is_some());
        assert!(
            problem("cluster:")
                .unwrap()
                .contains("names no Redis server")
        );
        assert!(problem("").is_some());
        assert!(problem("sentinel:mymaster:redis://s1:26379/").is_none());
        assert!(problem("redis://a/,redis://b/,redis://c/").is_none());
    }

    #[cfg(not(all(feature = "cluster", feature = "sentinel", feature = "tls")))]
    #[tokio::test]
    async fn a_mode_left_out_of_the_build_is_refused_naming_its_feature() {
        for (spec, feature, built) in [
            (
                "cluster:redis://127.0.0.1:1/",
                "cluster",
                cfg!(feature = "cluster"),
            ),
            (
                "sentinel:mymaster:redis://127.0.0.1:1/",
                "sentinel",
                cfg!(feature = "sentinel"),
            ),
            ("rediss://127.0.0.1:1/", "tls", cfg!(feature = "tls")),
        ] {
            if built {
                continue;
            }
            let refused = LockClient::builder_from_spec(spec).connect().await;
            let message = refused.expect_err(spec).chain().to_string();
            assert!(
                message.contains(&format!("`{feature}` feature")),
                "{spec}: {message}"
            );
        }
    }

    #[tokio::test]
    async fn a_bad_url_names_the_accepted_forms() {
        for spec in [
            "localhost:26390",
            "http://h/",
            "redis://h:99999/",
            "cluster:",
            "sentinel:redis://h/",
        ] {
            let error = LockClient::builder_from_spec(spec)
                .connect()
                .await
                .expect_err(spec);
            let message = error.chain().to_string();
            assert!(message.contains("sentinel:NAME:"), "{spec}: {message}");
            assert!(message.contains("rediss://"), "{spec}: {message}");
            // The message names what was given, and no redis-rs boilerplate.
            assert!(error.to_string().contains(spec), "{spec}: {error}");
            assert!(!message.contains("did not parse"), "{spec}: {message}");
            // A mistake, not an outage: retrying will not help.
            assert!(!error.is_unavailable(), "{spec}: {message}");
        }
    }
}
