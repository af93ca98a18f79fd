//! Release notifications: how a waiter learns, without polling, that a lock was freed.
//!
//! A release publishes on the key's channel (`scripts::RELEASE_CHANNEL_PREFIX` and the key);
//! a grant, on the granted client's own channel for the key (see
//! `scripts::GRANT_CHANNEL_PREFIX`), which only that client subscribes to.
//! The client's connection speaks RESP3, so published messages arrive on it as push
//! frames; one server and Sentinel need no second connection. A Cluster's sharded
//! subscriptions have a connection of their own (see `connect::cluster`: a node losing a
//! slot would otherwise put the commands' replies out of step). Per channel the client keeps one
//! subscription and one [`Notify`], shared by every listener of that key, and a
//! message wakes one listener (`notify_one`), never all of them.
//!
//! SUBSCRIBE and UNSUBSCRIBE go through one task, in the order they were asked for, so
//! that an UNSUBSCRIBE for a listener that just left can never overtake the SUBSCRIBE of
//! one that just arrived. When the connection drops, every channel is woken: the
//! waiters re-check the lock, since a release may have happened while they were deaf.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use redis::{PushInfo, PushKind, RedisResult, Value};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::connection::Connection;
use crate::grant::{Grant, GrantFloor, Unclaimed, is_member, millis};

enum Request {
    Subscribe(String, oneshot::Sender<RedisResult<()>>),
    /// The server dropped this subscription (on a cluster, its slot moved to another
    /// node): subscribe anew, where the channel lives now, and wake its listeners.
    Renew(String),
    /// The connection moved to another server (a Sentinel failover): subscribe anew.
    #[cfg(feature = "sentinel")]
    Resubscribe,
}

/// How long a channel nobody listens to stays subscribed. A key that is contended
/// again soon finds its subscription live: no SUBSCRIBE, and no extra attempt to
/// cover a release that a fresh subscription could have missed.
const LINGER: Duration = Duration::from_secs(2);

struct Channel {
    wake: Arc<Notify>,
    listeners: usize,
    /// When Redis confirmed the subscription (cleared when the connection drops or
    /// moves, until it is confirmed again).
    confirmed_at: Option<Instant>,
    /// Since when nobody listens (swept after [`LINGER`]).
    idle_since: Option<Instant>,
    /// Waitlist ids of this client's waiters on the channel.
    waiter_ids: Vec<String>,
    /// The last grant that came for none of them (see [`Unclaimed`]).
    unclaimed: Option<Unclaimed<Grant>>,
    /// The last `N` (the grant ahead lapses unless confirmed) that came for none of them.
    unclaimed_next: Option<Unclaimed<Duration>>,
    /// What the messages said, for the listeners.
    news: Arc<Mutex<Mailbox>>,
    /// Wakes every listener to look for a grant of its own in the mailbox.
    granted: Arc<Notify>,
}

/// What a channel's messages said, waiting to be read by its listeners.
#[derive(Default)]
struct Mailbox {
    /// The last message for whichever listener the wake-up reaches, and when it came.
    last: Option<(Release, Instant)>,
    /// Grants not read yet, each with the waitlist member it names: only that waiter
    /// may read it. Read by another waiter of the client (the next in line once the
    /// granted one gave up, say), it would hold a lock made for someone else, whose
    /// leaving has passed it on.
    grants: Vec<(String, Grant)>,
}

/// What a release message says to this client's waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The key is free: try.
    Free,
    /// The key is reserved for this client's waiter: take it.
    ForUs,
    /// The key is reserved for another client's waiter: wait (a little, in case it died).
    ForAnother,
    /// A reserved key was taken (or handed off), with the new holder's lease when
    /// the message says it, or its holder cut its lease short with `extend`: keep
    /// waiting, but not past that lease.
    Taken(Option<Duration>),
    /// The holder released early but keeps the key this much longer (`hold_at_least`):
    /// try when that ends.
    Kept(Duration),
    /// A release granted the key to this client's waiter (see `scripts`'
    /// `free_for_next`): it holds it, with this fencing token, since a moment `after`
    /// its registration (by the server's clock).
    Granted(Grant),
    /// The key was granted to the waiter ahead of this one, and lapses this long after
    /// the message unless its grantee confirms (see `scripts`' `free_for_next`): try
    /// then, unless [`Release::Confirmed`] comes first.
    Next(Duration),
    /// The grant ahead of this waiter was confirmed: no need to try when it would have
    /// lapsed.
    Confirmed,
}

impl Release {
    fn parse(payload: &[u8], ours: &[String]) -> Self {
        match payload {
            b"T" => Release::Taken(None),
            [b'T', b':', rest @ ..] => Release::Taken(millis(rest)),
            [b'K', b':', rest @ ..] => millis(rest).map_or(Release::Free, Release::Kept),
            [b'R', b':', id @ ..] if ours.iter().any(|ours| ours.as_bytes() == id) => {
                Release::ForUs
            }
            [b'R', b':', ..] => Release::ForAnother,
            [b'G', b' ', grant @ ..] => Release::grant(grant, ours),
            _ => Release::Free,
        }
    }

    /// `<id> <token> <ms after registration> <ms it lasts unconfirmed>`: ours when one
    /// of `ours` (waitlist
    /// members, `<id> <lease> <name>`) has that id. A grant for a waiter of this client
    /// that is gone is no news for the others: the waiter's leaving passes it on.
    fn grant(text: &[u8], ours: &[String]) -> Self {
        match Grant::parse_message(text) {
            Some((id, grant)) if member_named(id, ours).is_some() => Release::Granted(grant),
            _ => Release::Taken(None),
        }
    }

    /// A message that asks the waiter to try outlives later ones until it is read.
    fn merge(earlier: Option<Release>, later: Release) -> Release {
        match earlier {
            _ if matches!(later, Release::Granted(_)) => later,
            Some(urgent @ (Release::Free | Release::ForUs | Release::Granted(_))) => urgent,
            _ => later,
        }
    }
}

/// The member of `ours` that a message names by its waiter's `id`, if any.
fn member_named<'a>(id: &[u8], ours: &'a [String]) -> Option<&'a String> {
    ours.iter().find(|member| is_member(id, member.as_bytes()))
}

/// A message for the next in line (`N <id> <ms>`, `C <id>`): the waiter's id it names,
/// and what it tells that waiter.
fn next_message(payload: &[u8]) -> Option<(&[u8], Release)> {
    let (kind, rest) = (payload.first()?, payload.get(2..)?);
    if payload.get(1) != Some(&b' ') {
        return None;
    }
    let mut words = rest.split(|&byte| byte == b' ');
    let id = words.next()?;
    match kind {
        b'N' => Some((id, Release::Next(millis(words.next()?)?))),
        b'C' => Some((id, Release::Confirmed)),
        _ => None,
    }
}

/// What a message for the next in line tells the waiter it names, when that is one of
/// `ours`.
#[cfg(test)]
fn next_in_line(payload: &[u8], ours: &[String]) -> Option<Release> {
    let (id, news) = next_message(payload)?;
    member_named(id, ours).map(|_| news)
}

/// The channels some waiter of this client listens to.
pub(crate) struct ReleaseNotifications {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
    requests: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for ReleaseNotifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseNotifications")
            .finish_non_exhaustive()
    }
}

/// Where the connection's push frames go; holds the notifications weakly so that the
/// connection does not keep its own client alive.
pub(crate) type PushHandler = Arc<Mutex<Weak<ReleaseNotifications>>>;

pub(crate) fn push_handler() -> PushHandler {
    Arc::new(Mutex::new(Weak::new()))
}

/// Routes one push frame from the connection.
pub(crate) fn on_push(handler: &PushHandler, push: PushInfo) {
    let Some(notifications) = handler.lock().ok().and_then(|weak| weak.upgrade()) else {
        return;
    };
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(channel)) = push.data.first() {
                let payload = match push.data.get(1) {
                    Some(Value::BulkString(payload)) => payload.as_slice(),
                    _ => &[],
                };
                notifications.tell(channel, payload);
            }
        }
        PushKind::Disconnection => notifications.wake_every_channel(),
        PushKind::SUnsubscribe | PushKind::Unsubscribe => {
            if let Some(Value::BulkString(channel)) = push.data.first() {
                notifications.subscription_dropped(channel);
            }
        }
        _ => {}
    }
}

impl ReleaseNotifications {
    /// Starts the subscription task on `connection` and connects `handler` to it.
    pub(crate) fn start(connection: Connection, handler: &PushHandler) -> Arc<Self> {
        let (requests, receiver) = mpsc::unbounded_channel();
        let notifications = Arc::new(ReleaseNotifications {
            channels: Mutex::new(HashMap::new()),
            requests,
        });
        if let Ok(mut slot) = handler.lock() {
            *slot = Arc::downgrade(&notifications);
        }
        tokio::spawn(run_subscriptions(
            connection,
            receiver,
            Arc::downgrade(&notifications),
        ));
        notifications
    }

    /// Registers a listener of `channel`, interested in messages that came after
    /// `since`. The returned future resolves once Redis has confirmed the subscription;
    /// the flag says it was live already (so no message since `since` can have been
    /// missed).
    pub(crate) fn listen(
        self: &Arc<Self>,
        channel: String,
        waiter_id: Option<String>,
        since: Instant,
    ) -> (
        Listener,
        impl Future<Output = RedisResult<()>> + use<>,
        bool,
    ) {
        let (wake, news, live) = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            let entry = channels
                .entry(channel.clone().into_bytes())
                .or_insert_with(|| Channel {
                    wake: Arc::new(Notify::new()),
                    listeners: 0,
                    confirmed_at: None,
                    idle_since: None,
                    waiter_ids: Vec::new(),
                    unclaimed: None,
                    unclaimed_next: None,
                    news: Arc::new(Mutex::new(Mailbox::default())),
                    granted: Arc::new(Notify::new()),
                });
            entry.listeners += 1;
            entry.idle_since = None;
            if let Some(id) = &waiter_id {
                entry.waiter_ids.push(id.clone());
                // Granted between its attempt and now: the grant is its news.
                let now = Instant::now();
                let claimed = entry
                    .unclaimed
                    .as_ref()
                    .and_then(|u| u.claim_grant(id, now));
                if let Some(grant) = claimed {
                    entry.unclaimed = None;
                    entry.grant(id.clone(), grant);
                }
                // Told, before it listened, when the grant ahead lapses.
                let lapse = entry
                    .unclaimed_next
                    .as_ref()
                    .and_then(|u| u.claim_lapse(id, now));
                if let Some(lasts) = lapse {
                    entry.unclaimed_next = None;
                    entry.post(Release::Next(lasts));
                }
            }
            let live = entry.confirmed_at.is_some_and(|at| at <= since);
            (
                (entry.wake.clone(), entry.granted.clone()),
                entry.news.clone(),
                live,
            )
        };
        let (confirm, confirmed) = oneshot::channel();
        let _ = self
            .requests
            .send(Request::Subscribe(channel.clone(), confirm));
        let listener = Listener {
            notifications: self.clone(),
            channel,
            waiter_id,
            since,
            wake: wake.0,
            granted: wake.1,
            news,
        };
        let confirmed = async move {
            confirmed.await.unwrap_or_else(|_| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the client's subscription task has stopped",
                )))
            })
        };
        (listener, confirmed, live)
    }

    /// After the connection moved to another server: renew every subscription there
    /// and wake every waiter, since releases on the old server were never seen.
    #[cfg(feature = "sentinel")]
    pub(crate) fn connection_moved(&self) {
        let _ = self.requests.send(Request::Resubscribe);
        self.wake_every_channel();
    }

    fn tell(&self, channel: &[u8], payload: &[u8]) {
        tracing::trace!(name: "news_received", target: crate::metrics::TIMING, "redlock: message received");
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = channels.get_mut(channel) {
            // For one waiter of this client (`N <id> <ms>`, `C <id>`): no news for the
            // others, nor for a waiter that left.
            if let Some((id, news)) = next_message(payload) {
                if member_named(id, &entry.waiter_ids).is_some() {
                    entry.post(news);
                } else if let Release::Next(lasts) = news {
                    // For a waiter of this client that does not listen yet, or that left.
                    entry.unclaimed_next = Some(Unclaimed::new(id, lasts, Instant::now()));
                } else if entry.unclaimed_next.as_ref().is_some_and(|u| u.names(id)) {
                    entry.unclaimed_next = None;
                }
                return;
            }
            if payload.starts_with(b"N ") || payload.starts_with(b"C ") {
                // Garbled: no news.
                return;
            }
            let granted = payload.strip_prefix(b"G ").and_then(Grant::parse_message);
            match granted {
                Some((id, grant)) => match member_named(id, &entry.waiter_ids) {
                    Some(member) => {
                        let member = member.clone();
                        entry.grant(member, grant);
                    }
                    // A grant for none of the current waiters (one that left, or one
                    // that has not listened yet) is no news for the others: posted, it
                    // would wipe a shorter wake-up one of them was told.
                    None => entry.unclaimed = Some(Unclaimed::new(id, grant, Instant::now())),
                },
                // A garbled grant: no news.
                None if payload.starts_with(b"G ") => {}
                None => entry.post(Release::parse(payload, &entry.waiter_ids)),
            }
        }
    }

    /// The server ended the subscription of `channel`: when the client did not ask for
    /// that (it forgets a channel before it unsubscribes), the channel's slot moved to
    /// another node of a cluster. Its listeners are woken, since messages may have been
    /// missed, and again once the subscription is renewed.
    fn subscription_dropped(&self, channel: &[u8]) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = channels.get_mut(channel) else {
            return;
        };
        entry.confirmed_at = None;
        entry.post(Release::Free);
        if let Ok(channel) = String::from_utf8(channel.to_vec()) {
            let _ = self.requests.send(Request::Renew(channel));
        }
    }

    /// Wakes the listeners of `channel` (to re-check the lock).
    fn wake(&self, channel: &str) {
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = channels.get(channel.as_bytes()) {
            entry.post(Release::Free);
        }
    }

    /// The connection dropped or moved: messages may have been missed, and the
    /// subscriptions are not live until confirmed again.
    fn wake_every_channel(&self) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        for entry in channels.values_mut() {
            entry.confirmed_at = None;
            entry.post(Release::Free);
        }
    }

    fn confirm(&self, channel: &str) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = channels.get_mut(channel.as_bytes()) {
            entry.confirmed_at.get_or_insert_with(Instant::now);
        }
    }

    /// Forgets the channels nobody has listened to for [`LINGER`]; returns them.
    fn sweep(&self) -> Vec<String> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let idle: Vec<Vec<u8>> = channels
            .iter()
            .filter(|(_, entry)| {
                entry
                    .idle_since
                    .is_some_and(|since| since.elapsed() >= LINGER)
            })
            .map(|(name, _)| name.clone())
            .collect();
        idle.into_iter()
            .filter_map(|name| {
                channels.remove(&name);
                String::from_utf8(name).ok()
            })
            .collect()
    }
}

impl Channel {
    fn post(&self, news: Release) {
        let mut mailbox = self.news.lock().unwrap_or_else(|e| e.into_inner());
        mailbox.last = Some((
            Release::merge(mailbox.last.map(|(earlier, _)| earlier), news),
            Instant::now(),
        ));
        drop(mailbox);
        self.wake.notify_one();
    }

    /// A grant for the waiter registered as `member`: kept for it alone, and every
    /// listener woken to look (the one it is for may not be the one a `notify_one`
    /// would reach).
    fn grant(&self, member: String, grant: Grant) {
        let mut mailbox = self.news.lock().unwrap_or_else(|e| e.into_inner());
        if mailbox
            .grants
            .iter()
            .any(|(ours, kept)| *ours == member && !grant.supersedes(kept))
        {
            return;
        }
        mailbox.grants.retain(|(ours, _)| *ours != member);
        mailbox.grants.push((member, grant));
        drop(mailbox);
        self.granted.notify_waiters();
    }
}

/// One waiter's interest in a key's releases; unsubscribes when the last one goes.
pub(crate) struct Listener {
    notifications: Arc<ReleaseNotifications>,
    channel: String,
    waiter_id: Option<String>,
    since: Instant,
    wake: Arc<Notify>,
    granted: Arc<Notify>,
    news: Arc<Mutex<Mailbox>>,
}

impl Listener {
    /// Resolves at the next release message (or at once if one came since the last
    /// call) with what it said. Messages from before `since` are stale: skipped. So is
    /// a grant the waiter's `floor` does not admit (see [`GrantFloor`]).
    pub(crate) async fn released(&self, floor: GrantFloor) -> Release {
        loop {
            // Registered before looking, so that a grant posted in between still wakes it.
            let granted = self.granted.notified();
            tokio::pin!(granted);
            granted.as_mut().enable();
            if let Some(grant) = self.own_grant(floor) {
                return grant;
            }
            tokio::select! {
                // A grant for some waiter of the client: ours, if any, is read above.
                _ = &mut granted => continue,
                _ = self.wake.notified() => {
                    if let Some(grant) = self.own_grant(floor) {
                        return grant;
                    }
                    let news = self.news.lock().unwrap_or_else(|e| e.into_inner()).last.take();
                    match news {
                        Some((_, at)) if at < self.since => continue,
                        Some((news, _)) => return news,
                        None => return Release::Free,
                    }
                }
            }
        }
    }

    /// The grant made to this listener's waiter, if one came that `floor` admits: read
    /// once. Those it does not admit are dropped.
    fn own_grant(&self, floor: GrantFloor) -> Option<Release> {
        let member = self.waiter_id.as_ref()?;
        let mut mailbox = self.news.lock().unwrap_or_else(|e| e.into_inner());
        mailbox
            .grants
            .retain(|(ours, grant)| ours != member || floor.admits(grant));
        let at = mailbox.grants.iter().position(|(ours, _)| ours == member)?;
        Some(Release::Granted(mailbox.grants.swap_remove(at).1))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut channels = self
            .notifications
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = self.channel.as_bytes();
        if let Some(entry) = channels.get_mut(key) {
            entry.listeners -= 1;
            if let Some(id) = &self.waiter_id {
                entry.waiter_ids.retain(|ours| ours != id);
                // Its unread grant goes with it: its leaving passes the grant on.
                let mut mailbox = self.news.lock().unwrap_or_else(|e| e.into_inner());
                mailbox.grants.retain(|(ours, _)| ours != id);
            }
            if entry.listeners == 0 {
                // Stays subscribed for a while: see `LINGER`.
                entry.idle_since = Some(Instant::now());
            }
        }
    }
}

async fn run_subscriptions(
    mut connection: Connection,
    mut requests: mpsc::UnboundedReceiver<Request>,
    notifications: Weak<ReleaseNotifications>,
) {
    // Channels Redis has confirmed; the connection manager resubscribes them after a reconnect.
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut sweeps = tokio::time::interval(LINGER);
    sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let request = tokio::select! {
            request = requests.recv() => match request {
                Some(request) => request,
                None => return,
            },
            _ = sweeps.tick() => {
                let Some(notifications) = notifications.upgrade() else {
                    return;
                };
                for channel in notifications.sweep() {
                    if subscribed.remove(&channel) {
                        let _ = connection.unsubscribe(&channel).await;
                    }
                }
                continue;
            }
        };
        match request {
            Request::Subscribe(channel, confirm) => {
                let result = if subscribed.contains(&channel) {
                    Ok(())
                } else {
                    let result = connection.subscribe(&channel).await;
                    if result.is_ok() {
                        subscribed.insert(channel.clone());
                    }
                    result
                };
                if result.is_ok()
                    && let Some(notifications) = notifications.upgrade()
                {
                    notifications.confirm(&channel);
                }
                let _ = confirm.send(result);
            }
            Request::Renew(channel) => {
                subscribed.remove(&channel);
                match connection.subscribe(&channel).await {
                    Ok(()) => {
                        subscribed.insert(channel.clone());
                        if let Some(notifications) = notifications.upgrade() {
                            notifications.confirm(&channel);
                            notifications.wake(&channel);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, %channel, "redlock: renewing a dropped subscription failed; waiters fall back on their lease timers")
                    }
                }
            }
            #[cfg(feature = "sentinel")]
            Request::Resubscribe => {
                for channel in &subscribed {
                    match connection.subscribe(channel).await {
                        Ok(()) => {
                            if let Some(notifications) = notifications.upgrade() {
                                notifications.confirm(channel);
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, %channel, "redlock: resubscription failed")
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notifications with no connection behind them: what `tell` is given is what
    /// arrived.
    fn unconnected() -> Arc<ReleaseNotifications> {
        Arc::new(ReleaseNotifications {
            channels: Mutex::new(HashMap::new()),
            requests: mpsc::unbounded_channel().0,
        })
    }

    const SOON: Duration = Duration::from_millis(50);

    /// The floor a busy reply that answered `token` leaves.
    fn floor(token: u64) -> GrantFloor {
        let mut floor = GrantFloor::default();
        floor.raise(token);
        floor
    }

    #[tokio::test]
    async fn a_grant_is_read_only_by_the_waiter_it_names() {
        let notifications = unconnected();
        let since = Instant::now();
        let channel = "redlock:granted:c:k".to_owned();
        let (first, _, _) =
            notifications.listen(channel.clone(), Some("a:1 5000 web".into()), since);
        let (next, _, _) =
            notifications.listen(channel.clone(), Some("b:2 5000 web".into()), since);
        // The next waiter in line listens first; the grant names the first one.
        let next_hears = tokio::spawn(async move {
            let news = tokio::time::timeout(SOON, next.released(GrantFloor::default())).await;
            (next, news)
        });
        tokio::task::yield_now().await;
        notifications.tell(channel.as_bytes(), b"G a:1 17 5 100");
        let (next, news) = next_hears.await.unwrap();
        assert!(
            !matches!(news, Ok(Release::Granted(_))),
            "the next waiter read the first one's grant: {news:?}"
        );
        assert!(matches!(
            tokio::time::timeout(SOON, first.released(GrantFloor::default())).await,
            Ok(Release::Granted(Grant {
                fencing_token: 17,
                ..
            }))
        ));

        // A grant whose waiter gave up before reading it goes with it.
        let (gone, _, _) =
            notifications.listen(channel.clone(), Some("c:3 5000 web".into()), since);
        notifications.tell(channel.as_bytes(), b"G c:3 18 5 100");
        drop(gone);
        let news = tokio::time::timeout(SOON, next.released(GrantFloor::default())).await;
        assert!(
            !matches!(news, Ok(Release::Granted(_))),
            "a grant outlived the waiter it named: {news:?}"
        );
        assert!(
            notifications.channels.lock().unwrap()[channel.as_bytes()]
                .news
                .lock()
                .unwrap()
                .grants
                .is_empty()
        );
    }

    #[test]
    fn news_for_the_next_in_line_is_for_the_waiter_it_names_alone() {
        let ours = ["a:1 5000 web".to_owned(), "b:2 5000 web".to_owned()];
        assert_eq!(
            next_in_line(b"N b:2 100", &ours),
            Some(Release::Next(Duration::from_millis(100)))
        );
        assert_eq!(next_in_line(b"C a:1", &ours), Some(Release::Confirmed));
        // Another client's waiter, one of ours that left, a prefix of an id, a grant.
        assert_eq!(next_in_line(b"N c:3 100", &ours), None);
        assert_eq!(next_in_line(b"C a:", &ours), None);
        assert_eq!(next_in_line(b"G a:1 17 5 100", &ours), None);
        assert_eq!(next_in_line(b"N b:2 x", &ours), None);
        assert_eq!(next_in_line(b"N", &ours), None);
    }

    #[tokio::test]
    async fn news_for_the_next_in_line_reaches_its_waiter_and_no_other() {
        let notifications = unconnected();
        let since = Instant::now();
        let channel = "redlock:granted:c:k".to_owned();
        let (named, _, _) =
            notifications.listen(channel.clone(), Some("a:1 5000 web".into()), since);
        notifications.tell(channel.as_bytes(), b"N z:9 100");
        notifications.tell(channel.as_bytes(), b"C z:9");
        assert!(
            tokio::time::timeout(SOON, named.released(GrantFloor::default()))
                .await
                .is_err(),
            "a message for another waiter woke this one"
        );
        notifications.tell(channel.as_bytes(), b"N a:1 100");
        assert_eq!(
            tokio::time::timeout(SOON, named.released(GrantFloor::default()))
                .await
                .ok(),
            Some(Release::Next(Duration::from_millis(100)))
        );
        notifications.tell(channel.as_bytes(), b"C a:1");
        assert_eq!(
            tokio::time::timeout(SOON, named.released(GrantFloor::default()))
                .await
                .ok(),
            Some(Release::Confirmed)
        );
    }

    /// The releasing client checks nothing once a client heard `N`: a waiter whose
    /// attempt put it in line, told before it listens, must still be told.
    #[tokio::test]
    async fn news_for_the_next_in_line_that_came_before_it_listened_is_kept_for_it() {
        let notifications = unconnected();
        let since = Instant::now();
        let channel = "redlock:granted:c:k".to_owned();
        // The client's subscription is there for another of its waiters.
        let (_another, _, _) =
            notifications.listen(channel.clone(), Some("z:9 5000 web".into()), since);
        notifications.tell(channel.as_bytes(), b"N a:1 100");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let (named, _, _) =
            notifications.listen(channel.clone(), Some("a:1 5000 web".into()), since);
        // The lapse counts from the message's arrival, 30 ms before the waiter listened.
        match tokio::time::timeout(SOON, named.released(GrantFloor::default())).await {
            Ok(Release::Next(lasts)) => assert!(lasts <= Duration::from_millis(70), "{lasts:?}"),
            other => panic!("the early N was not kept for its waiter: {other:?}"),
        }
        drop(named);
        // Confirmed before its waiter listened: nothing to try at.
        notifications.tell(channel.as_bytes(), b"N b:2 100");
        notifications.tell(channel.as_bytes(), b"C b:2");
        let (other, _, _) =
            notifications.listen(channel.clone(), Some("b:2 5000 web".into()), since);
        assert!(
            tokio::time::timeout(SOON, other.released(GrantFloor::default()))
                .await
                .is_err(),
            "an N confirmed before its waiter listened was still delivered"
        );
    }

    #[tokio::test]
    async fn a_grant_made_before_a_busy_attempt_is_never_read() {
        let notifications = unconnected();
        let channel = "redlock:granted:c:k".to_owned();
        let (waiter, _, _) =
            notifications.listen(channel.clone(), Some("a:1 5000 web".into()), Instant::now());
        // Granted under token 17, unread while the waiter's next attempt ran and found
        // the key busy (its floor: 20): dead, whether it lapsed or was evicted.
        notifications.tell(channel.as_bytes(), b"G a:1 17 5 100");
        let news = tokio::time::timeout(SOON, waiter.released(floor(20))).await;
        assert!(
            !matches!(news, Ok(Release::Granted(_))),
            "a grant from before a busy attempt was read: {news:?}"
        );
        // A grant made after that attempt (a higher token) is the waiter's.
        notifications.tell(channel.as_bytes(), b"G a:1 23 9 100");
        assert!(matches!(
            tokio::time::timeout(SOON, waiter.released(floor(20))).await,
            Ok(Release::Granted(Grant {
                fencing_token: 23,
                ..
            }))
        ));
        // Of two grants, the one with the higher token stays, whatever order they came
        // in (an older one brought late by a resubscription would be dropped as stale).
        notifications.tell(channel.as_bytes(), b"G a:1 27 9 100");
        notifications.tell(channel.as_bytes(), b"G a:1 25 9 100");
        assert!(matches!(
            tokio::time::timeout(SOON, waiter.released(floor(20))).await,
            Ok(Release::Granted(Grant {
                fencing_token: 27,
                ..
            }))
        ));
        // So is one parked before the waiter listened, unless a busy reply came since.
        notifications.tell(channel.as_bytes(), b"G b:2 30 5 100");
        let (late, _, _) =
            notifications.listen(channel.clone(), Some("b:2 5000 web".into()), Instant::now());
        let news = tokio::time::timeout(SOON, late.released(floor(31))).await;
        assert!(!matches!(news, Ok(Release::Granted(_))), "{news:?}");
    }

    #[tokio::test]
    async fn a_grant_for_no_current_waiter_leaves_the_others_wake_up_alone() {
        let notifications = unconnected();
        let channel = "redlock:granted:c:k".to_owned();
        let (waiter, _, _) =
            notifications.listen(channel.clone(), Some("a:1 5000 web".into()), Instant::now());
        // Another waiter of this client left; its grant arrives: nothing for `a:1`.
        notifications.tell(channel.as_bytes(), b"G z:9 17 5 100");
        let news = tokio::time::timeout(SOON, waiter.released(GrantFloor::default())).await;
        assert!(
            news.is_err(),
            "a grant for a waiter that left was news: {news:?}"
        );
    }

    #[test]
    fn release_messages_say_who_may_try_and_until_when() {
        let ours = vec!["a:1".to_owned()];
        assert_eq!(Release::parse(b"", &ours), Release::Free);
        assert_eq!(Release::parse(b"R:a:1", &ours), Release::ForUs);
        assert_eq!(Release::parse(b"R:b:7", &ours), Release::ForAnother);
        let members = vec!["a:1 5000 web-1".to_owned()];
        assert_eq!(
            Release::parse(b"G a:1 1700000000000001 42 100", &members),
            Release::Granted(Grant {
                fencing_token: 1_700_000_000_000_001,
                after: Duration::from_millis(42),
                lasts: Duration::from_millis(100),
            })
        );
        // Another waiter's grant (gone from this client), or a garbled one: no news.
        assert_eq!(
            Release::parse(b"G a:2 17 42 100", &members),
            Release::Taken(None)
        );
        assert_eq!(
            Release::parse(b"G a:1 x 42", &members),
            Release::Taken(None)
        );
        assert_eq!(
            Release::merge(
                Some(Release::Granted(Grant {
                    fencing_token: 7,
                    after: Duration::ZERO,
                    lasts: Duration::ZERO,
                })),
                Release::Taken(None)
            ),
            Release::Granted(Grant {
                fencing_token: 7,
                after: Duration::ZERO,
                lasts: Duration::ZERO,
            })
        );
        assert_eq!(Release::parse(b"T", &ours), Release::Taken(None));
        assert_eq!(
            Release::parse(b"T:250", &ours),
            Release::Taken(Some(Duration::from_millis(250)))
        );
        assert_eq!(
            Release::parse(b"K:1000", &ours),
            Release::Kept(Duration::from_secs(1))
        );
        // Garbage after K: is treated as a plain release: trying costs one attempt.
        assert_eq!(Release::parse(b"K:x", &ours), Release::Free);
        // A message that asks to try outlives later news until it is read.
        assert_eq!(
            Release::merge(Some(Release::Free), Release::Taken(None)),
            Release::Free
        );
        assert_eq!(
            Release::merge(Some(Release::ForAnother), Release::Taken(None)),
            Release::Taken(None)
        );
    }
}
