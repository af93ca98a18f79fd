//! What a request may ask for, checked before anything is sent: the key, the
//! durations, and (with RedLock) `max_lease`. Plain functions over plain values.

use std::time::Duration;

use crate::config::MAX_KEY_LEN;
use crate::error::LockError;
use crate::masters::Masters;
use crate::scripts::RESERVED_PREFIX;

/// Longest lease or wait accepted: Redis keeps expiries in milliseconds as a signed
/// 64-bit count from the epoch, and an instant that far ahead overflows the clock.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Checks a lock's name: not empty, not one of redlock's own keys, not too long.
pub(crate) fn check_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "the key is empty".into(),
        });
    }
    if is_reserved(key) {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "keys starting with `{RESERVED_PREFIX}`, or with `{RESERVED_PREFIX}` after a \
                 `{{…}}` hash tag, are reserved for redlock's own state (fencing counters, \
                 waitlists, holders); choose another prefix"
            ),
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::InvalidKey {
            key: key.to_owned(),
            reason: format!(
                "the key is {} bytes long; the limit is {MAX_KEY_LEN}",
                key.len()
            ),
        });
    }
    Ok(())
}

/// A name in redlock's own namespace: `redlock:…`, or `{tag}redlock:…`, the shape of
/// a lock's companion keys on a Cluster (`{<slot tag>}redlock:waitlist:<key>`). Refused
/// in every mode, so that a name that works on one server works on a Cluster too.
fn is_reserved(key: &str) -> bool {
    let after_tag = key
        .strip_prefix('{')
        .and_then(|rest| rest.split_once('}'))
        .map(|(_, rest)| rest);
    key.starts_with(RESERVED_PREFIX)
        || after_tag.is_some_and(|rest| rest.starts_with(RESERVED_PREFIX))
}

/// Checks a request before anything is sent.
pub(crate) fn validate(
    key: &str,
    wait: Duration,
    lease: Option<Duration>,
    hold_at_least: Option<Duration>,
) -> Result<(), LockError> {
    check_key(key)?;
    if wait > MAX_DURATION {
        return Err(LockError::invalid_options(
            key,
            format!("wait of {wait:?} is longer than the limit of 100 years"),
        ));
    }
    if let Some(lease) = lease {
        lease_millis(key, lease)?;
        if let Some(hold) = hold_at_least
            && hold > lease
        {
            return Err(LockError::invalid_options(
                key,
                format!("hold_at_least ({hold:?}) is longer than the lease ({lease:?})"),
            ));
        }
    }
    if let Some(hold) = hold_at_least
        && hold > MAX_DURATION
    {
        return Err(LockError::invalid_options(
            key,
            format!("hold_at_least of {hold:?} is longer than the limit of 100 years"),
        ));
    }
    Ok(())
}

/// With RedLock, nothing may keep a key longer than `max_lease`: a restarted master's
/// quarantine is that long (see `masters`).
pub(crate) fn check_max_lease(
    masters: &Masters,
    key: &str,
    what: &str,
    value: Duration,
) -> Result<(), LockError> {
    match masters.max_lease() {
        Some(max_lease) if value > max_lease => Err(LockError::invalid_options(
            key,
            format!(
                "{what} of {value:?} is longer than the client's max_lease ({max_lease:?}), \
                 which RedLock needs to know how long a restarted master stays out of the vote; \
                 raise it with LockClientBuilder::max_lease"
            ),
        )),
        _ => Ok(()),
    }
}

/// A lease in whole milliseconds, as Redis counts it; below one millisecond is refused.
pub(crate) fn lease_millis(key: &str, lease: Duration) -> Result<u64, LockError> {
    if lease < Duration::from_millis(1) {
        return Err(LockError::invalid_options(
            key,
            format!("lease of {lease:?} is shorter than Redis's 1 ms resolution"),
        ));
    }
    if lease > MAX_DURATION {
        return Err(LockError::invalid_options(
            key,
            format!("lease of {lease:?} is longer than the limit of 100 years"),
        ));
    }
    Ok(lease.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_durations_are_checked_before_anything_is_sent() {
        let second = Duration::from_secs(1);
        assert!(validate("order:1", second, Some(second), None).is_ok());
        assert!(matches!(
            validate("", second, None, None),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            validate(&"k".repeat(MAX_KEY_LEN + 1), second, None, None),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            validate("redlock:fence", second, None, None),
            Err(LockError::InvalidKey { .. })
        ));
        // A Cluster's companion keys carry a hash tag before the prefix.
        for reserved in [
            "{x1}redlock:waitlist:job",
            "{tag}redlock:",
            "{}redlock:fence",
        ] {
            match validate(reserved, second, None, None) {
                Err(LockError::InvalidKey { key, reason }) => {
                    assert_eq!(key, reserved);
                    assert!(reason.contains("redlock:"), "{reason}");
                }
                other => panic!("{reserved}: {other:?}"),
            }
        }
        for fine in ["{tag}order:1", "{redlock:}x", "order:{x}redlock:", "{tag"] {
            assert!(validate(fine, second, None, None).is_ok(), "{fine}");
        }
        assert!(validate("k", Duration::MAX, None, None).is_err());
        assert!(validate("k", second, Some(second), Some(second * 2)).is_err());
        assert!(lease_millis("k", Duration::from_micros(999)).is_err());
        assert_eq!(
            lease_millis("k", Duration::from_millis(1500)).unwrap(),
            1500
        );
        assert!(lease_millis("k", Duration::MAX).is_err());
    }
}
