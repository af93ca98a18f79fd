//! The client's settings, their limits, and how they are checked; what may be shown
//! of a URL. Plain data and plain functions: everything above reads them from here.

use std::time::Duration;

/// The URL `LockClient::from_env` uses when `REDLOCK_URL` is not set.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

/// Longest key accepted, in bytes. Redis would take far longer ones, but a lock name
/// that long is a bug (a whole payload formatted into the key), and it would be copied
/// into every command and message.
pub const MAX_KEY_LEN: usize = 1024;

/// Settings of a `LockClient`; see `LockClientBuilder`.
#[derive(Clone)]
pub(crate) struct ClientConfig {
    /// The lease of watchdog-mode locks and how often it is renewed, as used: what the
    /// user gave, or what follows from it (`resolve`, `watchdog_timing`).
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_every: Duration,
    /// What the user gave for the two above; `None` follows the other settings.
    pub(crate) given: Given,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) confirm_replicas: Option<(usize, Duration)>,
    pub(crate) reservation_grace: Duration,
    pub(crate) max_lease: Option<Duration>,
    /// Written into every lock this client takes, for `inspect` and the CLI.
    pub(crate) name: String,
    /// A private CA (PEM) that `rediss://` servers' certificates are checked against,
    /// instead of the system's roots.
    pub(crate) tls_root_certificate: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("watchdog_lease", &self.watchdog_lease)
            .field("renew_every", &self.renew_every)
            .field("given", &self.given)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("confirm_replicas", &self.confirm_replicas)
            .field("reservation_grace", &self.reservation_grace)
            .field("max_lease", &self.max_lease)
            .field("name", &self.name)
            // Its size only: a certificate's bytes say nothing in a log line.
            .field(
                "tls_root_certificate",
                &self
                    .tls_root_certificate
                    .as_ref()
                    .map(|pem| format!("<PEM, {} bytes>", pem.len())),
            )
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            renew_every: DEFAULT_WATCHDOG_LEASE / 3,
            given: Given::default(),
            response_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(3),
            node_timeout: None,
            confirm_replicas: None,
            reservation_grace: DEFAULT_RESERVATION_GRACE,
            max_lease: None,
            name: default_name(),
            tls_root_certificate: None,
        }
    }
}

/// The settings whose defaults follow the others: what the user gave for them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Given {
    pub(crate) watchdog_lease: Option<Duration>,
    pub(crate) renew_every: Option<Duration>,
}

/// The watchdog lease when neither it nor anything it follows is given.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// Shortest renewal interval a default gives: below it the watchdog would only spin.
const MIN_RENEW_EVERY: Duration = Duration::from_millis(1);

/// The watchdog lease and renewal interval, from what the user gave; `max_lease` only
/// with RedLock (elsewhere it is unused). A setting not given follows those given:
/// `renew_every` is a third of the watchdog lease (Redisson's rule, at least 1 ms);
/// the watchdog lease is [`DEFAULT_WATCHDOG_LEASE`], or three renewal intervals if
/// longer, and at most `max_lease`. Only given settings that contradict each other
/// are refused, naming them.
pub(crate) fn watchdog_timing(
    given: Given,
    max_lease: Option<Duration>,
) -> Result<(Duration, Duration), String> {
    let follows_max_lease = |lease: Duration| max_lease.map_or(lease, |max| lease.min(max));
    match (given.watchdog_lease, given.renew_every) {
        (Some(lease), Some(every)) => {
            if every >= lease {
                return Err(format!(
                    "renew_every ({every:?}) must be shorter than watchdog_lease ({lease:?})"
                ));
            }
            Ok((lease, every))
        }
        (Some(lease), None) => {
            let every = (lease / 3).max(MIN_RENEW_EVERY);
            if every >= lease {
                return Err(format!(
                    "watchdog_lease of {lease:?} leaves no time to renew it (renew_every \
                     follows it at a third, at least {MIN_RENEW_EVERY:?}); use at least 2 ms"
                ));
            }
            Ok((lease, every))
        }
        (None, Some(every)) => {
            let lease = follows_max_lease(DEFAULT_WATCHDOG_LEASE.max(every.saturating_mul(3)));
            if every >= lease {
                // Only a given max_lease makes the lease this short.
                return Err(format!(
                    "renew_every ({every:?}) must be shorter than max_lease ({lease:?}), \
                     which the watchdog lease may not exceed"
                ));
            }
            Ok((lease, every))
        }
        (None, None) => {
            let lease = follows_max_lease(DEFAULT_WATCHDOG_LEASE);
            let every = (lease / 3).max(MIN_RENEW_EVERY);
            if every >= lease {
                return Err(format!(
                    "max_lease of {lease:?} leaves the watchdog lease, which may not exceed \
                     it, no time to renew (renew_every follows it at a third, at least \
                     {MIN_RENEW_EVERY:?}); use at least 2 ms"
                ));
            }
            Ok((lease, every))
        }
    }
}

/// Longest client name accepted, in bytes: it is copied into every lock's value.
pub const MAX_NAME_LEN: usize = 200;

/// `<hostname>:<pid>`: tells the instances of a service apart on a dashboard.
pub(crate) fn default_name() -> String {
    let host = gethostname::gethostname();
    let host = host.to_string_lossy();
    let host = if host.is_empty() { "localhost" } else { &host };
    format!("{host}:{}", std::process::id())
}

/// Longest value any duration setting accepts (as for leases and waits: an instant
/// that far ahead would overflow the clock).
const MAX_SETTING: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The default of `LockClientBuilder::max_lease` (or the watchdog lease, if longer).
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(60);

/// Longest accepted `LockClientBuilder::reservation_grace`: a waiter that died while
/// first in line makes every other waiter wait that long.
pub(crate) const MAX_RESERVATION_GRACE: Duration = Duration::from_secs(60);

/// The grace a grant lasts unconfirmed unless the client sets another (see
/// `LockClientBuilder::reservation_grace`); the release script assumes it when the
/// client leaves it out (`scripts::RELEASE`).
pub(crate) const DEFAULT_RESERVATION_GRACE: Duration = Duration::from_millis(100);

impl ClientConfig {
    /// The settings as used: the watchdog lease and renewal interval follow what the
    /// user gave (`watchdog_timing`), then every setting is checked (`validate`).
    pub(crate) fn resolve(mut self, redlock: bool) -> Result<Self, String> {
        // The given values' own limits first, so that the error names them.
        if let Some(lease) = self.given.watchdog_lease {
            at_least_a_millisecond("watchdog_lease", lease)?;
        }
        if let Some(every) = self.given.renew_every {
            at_least_a_millisecond("renew_every", every)?;
        }
        if let Some(max_lease) = self.max_lease {
            at_least_a_millisecond("max_lease", max_lease)?;
        }
        let max_lease = if redlock { self.max_lease } else { None };
        (self.watchdog_lease, self.renew_every) = watchdog_timing(self.given, max_lease)?;
        self.validate(redlock)?;
        Ok(self)
    }

    /// The longest lease a lock may have on RedLock masters, and so how long a master
    /// that restarted stays out of the vote.
    pub(crate) fn max_lease(&self) -> Duration {
        self.max_lease
            .unwrap_or_else(|| DEFAULT_MAX_LEASE.max(self.watchdog_lease))
    }

    /// Checks every setting at its edges; the error names the setting.
    pub(crate) fn validate(&self, redlock: bool) -> Result<(), String> {
        at_least_a_millisecond("watchdog_lease", self.watchdog_lease)?;
        at_least_a_millisecond("renew_every", self.renew_every)?;
        at_least_a_millisecond("response_timeout", self.response_timeout)?;
        at_least_a_millisecond("connect_timeout", self.connect_timeout)?;
        if let Some(node_timeout) = self.node_timeout {
            at_least_a_millisecond("node_timeout", node_timeout)?;
        }
        if let Some(max_lease) = self.max_lease {
            at_least_a_millisecond("max_lease", max_lease)?;
        }
        if self.name.is_empty() || self.name.len() > MAX_NAME_LEN {
            return Err(format!(
                "name must be 1 to {MAX_NAME_LEN} bytes long (it is copied into every lock), not {}",
                self.name.len()
            ));
        }
        if self.name.chars().any(char::is_control) {
            return Err(format!(
                "name {:?} holds a control character; use printable text",
                self.name
            ));
        }
        if self.renew_every >= self.watchdog_lease {
            return Err(format!(
                "renew_every ({:?}) must be shorter than watchdog_lease ({:?})",
                self.renew_every, self.watchdog_lease
            ));
        }
        if self.reservation_grace > MAX_RESERVATION_GRACE {
            return Err(format!(
                "reservation_grace of {:?} is longer than the limit of {MAX_RESERVATION_GRACE:?} \
                 (a waiter that died first in line would hold up every other waiter that long)",
                self.reservation_grace
            ));
        }
        if let Some((replicas, timeout)) = self.confirm_replicas {
            if replicas == 0 {
                return Err("confirm_replicas needs at least one replica".into());
            }
            // `WAIT` with 0 ms would block forever.
            at_least_a_millisecond("the confirm_replicas timeout", timeout)?;
            if timeout >= self.response_timeout {
                return Err(format!(
                    "the confirm_replicas timeout ({timeout:?}) must be shorter than the response_timeout ({:?})",
                    self.response_timeout
                ));
            }
            if redlock {
                return Err(
                    "confirm_replicas is for one server or Sentinel, not RedLock (a majority of masters is the confirmation there)".into(),
                );
            }
        }
        if redlock && self.watchdog_lease > self.max_lease() {
            return Err(format!(
                "watchdog_lease ({:?}) must not be longer than max_lease ({:?})",
                self.watchdog_lease,
                self.max_lease()
            ));
        }
        Ok(())
    }
}

/// A duration setting within Redis's 1 ms resolution and the clock's range.
fn at_least_a_millisecond(what: &str, value: Duration) -> Result<(), String> {
    if value < Duration::from_millis(1) {
        Err(format!(
            "{what} of {value:?} is below Redis's 1 ms resolution; use at least 1 ms"
        ))
    } else if value > MAX_SETTING {
        Err(format!(
            "{what} of {value:?} is longer than the limit of 100 years"
        ))
    } else {
        Ok(())
    }
}

/// Hides the credentials of a URL, or of each URL of a comma-separated spec, shown in
/// errors and logs: everything before the last `@` after the scheme's `://` — or, in a
/// mistyped URL without `://` (`redis:/user:pw@h`, `:pw@h`), from its start.
pub(crate) fn redact(url: &str) -> String {
    url.split(',')
        .map(|part| match part.rfind('@') {
            None => part.to_owned(),
            Some(at) => {
                let start = part
                    .find("://")
                    .map(|scheme_end| scheme_end + 3)
                    .filter(|&start| start <= at)
                    .unwrap_or(0);
                format!("{}***{}", &part[..start], &part[at..])
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_at_their_edges_are_refused_by_name() {
        let refused = |config: ClientConfig, redlock: bool, name: &str| {
            let reason = config.validate(redlock).expect_err(name);
            assert!(reason.contains(name), "{reason}");
        };
        assert!(ClientConfig::default().validate(false).is_ok());
        assert!(ClientConfig::default().validate(true).is_ok());
        for tiny in [Duration::ZERO, Duration::from_nanos(1)] {
            let config = |f: fn(&mut ClientConfig, Duration)| {
                let mut config = ClientConfig::default();
                f(&mut config, tiny);
                config
            };
            refused(
                config(|c, d| c.response_timeout = d),
                false,
                "response_timeout",
            );
            refused(
                config(|c, d| c.connect_timeout = d),
                false,
                "connect_timeout",
            );
            refused(config(|c, d| c.watchdog_lease = d), false, "watchdog_lease");
            refused(config(|c, d| c.renew_every = d), false, "renew_every");
            refused(
                config(|c, d| c.node_timeout = Some(d)),
                true,
                "node_timeout",
            );
            refused(config(|c, d| c.max_lease = Some(d)), true, "max_lease");
            // `WAIT 0` would block forever.
            refused(
                config(|c, d| c.confirm_replicas = Some((1, d))),
                false,
                "confirm_replicas",
            );
        }
        let huge = ClientConfig {
            reservation_grace: Duration::MAX,
            ..ClientConfig::default()
        };
        refused(huge, false, "reservation_grace");
        let huge = ClientConfig {
            response_timeout: Duration::MAX,
            ..ClientConfig::default()
        };
        refused(huge, false, "response_timeout");
        let redlock = ClientConfig {
            confirm_replicas: Some((1, Duration::from_secs(1))),
            ..ClientConfig::default()
        };
        refused(redlock, true, "confirm_replicas");
        let short = ClientConfig {
            max_lease: Some(Duration::from_secs(5)),
            ..ClientConfig::default()
        };
        refused(short.clone(), true, "max_lease");
        assert!(short.validate(false).is_ok(), "max_lease is RedLock's");
        for name in [String::new(), "x".repeat(MAX_NAME_LEN + 1), "a\nb".into()] {
            let named = ClientConfig {
                name,
                ..ClientConfig::default()
            };
            refused(named, false, "name");
        }
        let default = ClientConfig::default().name;
        assert!(
            default.ends_with(&format!(":{}", std::process::id())),
            "{default}"
        );
    }

    fn given(lease: Option<u64>, every: Option<u64>) -> Given {
        Given {
            watchdog_lease: lease.map(Duration::from_millis),
            renew_every: every.map(Duration::from_millis),
        }
    }

    fn timing(lease: Option<u64>, every: Option<u64>, max: Option<u64>) -> (u128, u128) {
        let (lease, every) =
            watchdog_timing(given(lease, every), max.map(Duration::from_millis)).unwrap();
        (lease.as_millis(), every.as_millis())
    }

    #[test]
    fn settings_not_given_follow_those_given() {
        assert_eq!(timing(None, None, None), (30_000, 10_000));
        // renew_every follows the watchdog lease at a third (Redisson's rule).
        assert_eq!(timing(Some(2_000), None, None), (2_000, 666));
        assert_eq!(timing(Some(2), None, None), (2, 1), "at least 1 ms");
        // The watchdog lease follows max_lease (RedLock) and a long renew_every.
        assert_eq!(timing(None, None, Some(10_000)), (10_000, 3_333));
        assert_eq!(timing(None, None, Some(60_000)), (30_000, 10_000));
        assert_eq!(timing(None, Some(20_000), None), (60_000, 20_000));
        assert_eq!(timing(None, Some(1_000), None), (30_000, 1_000));
        assert_eq!(timing(None, Some(20_000), Some(40_000)), (40_000, 20_000));
        // Given ones are kept as given.
        assert_eq!(timing(Some(3_000), Some(2_000), None), (3_000, 2_000));
        assert_eq!(timing(Some(50_000), None, Some(10_000)), (50_000, 16_666));
    }

    #[test]
    fn only_given_settings_that_contradict_each_other_are_refused() {
        let refused = |lease: Option<u64>, every: Option<u64>, max: Option<u64>, names: &[&str]| {
            let reason = watchdog_timing(given(lease, every), max.map(Duration::from_millis))
                .expect_err(&format!("{lease:?} {every:?} {max:?}"));
            for name in names {
                assert!(reason.contains(name), "{name}: {reason}");
            }
        };
        refused(
            Some(2_000),
            Some(10_000),
            None,
            &["renew_every", "watchdog_lease"],
        );
        refused(Some(1), None, None, &["watchdog_lease"]);
        refused(
            None,
            Some(10_000),
            Some(5_000),
            &["renew_every", "max_lease"],
        );
        refused(None, None, Some(1), &["max_lease"]);

        let client = |lease: Option<u64>, every: Option<u64>, max: Option<u64>| ClientConfig {
            given: given(lease, every),
            max_lease: max.map(Duration::from_millis),
            ..ClientConfig::default()
        };
        // One setting alone: what the others follow.
        let alone = client(Some(2_000), None, None).resolve(false).unwrap();
        assert_eq!(
            (alone.watchdog_lease, alone.renew_every.as_millis()),
            (Duration::from_secs(2), 666)
        );
        let alone = client(None, None, Some(10_000)).resolve(true).unwrap();
        assert_eq!(alone.watchdog_lease, Duration::from_secs(10));
        assert_eq!(alone.max_lease(), Duration::from_secs(10));
        // max_lease is RedLock's: elsewhere it leaves the watchdog lease alone.
        let alone = client(None, None, Some(10_000)).resolve(false).unwrap();
        assert_eq!(alone.watchdog_lease, DEFAULT_WATCHDOG_LEASE);
        // Both given and contradicting: refused, naming both.
        let reason = client(Some(30_000), None, Some(10_000))
            .resolve(true)
            .unwrap_err();
        assert!(
            reason.contains("watchdog_lease") && reason.contains("max_lease"),
            "{reason}"
        );
        for tiny in [Duration::ZERO, Duration::from_nanos(1)] {
            let config = ClientConfig {
                given: Given {
                    watchdog_lease: Some(tiny),
                    renew_every: None,
                },
                ..ClientConfig::default()
            };
            assert!(
                config
                    .resolve(false)
                    .unwrap_err()
                    .contains("watchdog_lease")
            );
            let config = ClientConfig {
                given: Given {
                    watchdog_lease: None,
                    renew_every: Some(tiny),
                },
                ..ClientConfig::default()
            };
            assert!(config.resolve(false).unwrap_err().contains("renew_every"));
        }
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://:s3cret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1/"), "redis://127.0.0.1/");
        assert_eq!(
            redact("cluster:redis://u:pw1@a:7000/,redis://:pw2@b:7000/"),
            "cluster:redis://***@a:7000/,redis://***@b:7000/"
        );
        // Mistyped URLs keep nothing before the `@`.
        for mistyped in ["redis:/u:pw@h:1/", "redis//:pw@h", "u:pw@h:1", ":pw@h:1"] {
            let shown = redact(mistyped);
            assert!(!shown.contains("pw"), "{mistyped} -> {shown}");
            assert!(shown.ends_with("@h:1/") || shown.ends_with("@h") || shown.ends_with("@h:1"));
        }
    }
}
