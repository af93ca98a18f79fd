//! Scenario 5: a flapping link.
