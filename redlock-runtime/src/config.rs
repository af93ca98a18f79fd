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
    pub(crate) watchdog_lease: Duration,
    pub(crate) renew_every: Duration,
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
            watchdog_lease: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            response_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(3),
            node_timeout: None,
            confirm_replicas: None,
            reservation_grace: Duration::from_millis(100),
            max_lease: None,
            name: default_name(),
            tls_root_certificate: None,
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
const MAX_RESERVATION_GRACE: Duration = Duration::from_secs(60);

impl ClientConfig {
    /// The longest lease a lock may have on RedLock masters, and so how long a master
    /// that restarted stays out of the vote.
    pub(crate) fn max_lease(&self) -> Duration {
        self.max_lease
            .unwrap_or_else(|| DEFAULT_MAX_LEASE.max(self.watchdog_lease))
    }

    /// Checks every setting at its edges; the error names the setting.
    pub(crate) fn validate(&self, redlock: bool) -> Result<(), String> {
        let at_least_a_millisecond = |what: &str, value: Duration| {
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
        };
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
