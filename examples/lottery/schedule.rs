//! The lottery's schedule: a cron expression, as the classic job has it, parsed by the
//! `cron` crate (seconds first, UTC): `0 0 12 * * *` is every day at noon, the demo's
//! `*/5 * * * * *` every five seconds. The workers sleep until each fire time with
//! tokio: no scheduler thread, nothing to shut down.

use std::str::FromStr;

use chrono::{DateTime, Utc};

#[derive(Debug, Clone)]
pub struct Schedule {
    expression: String,
    cron: cron::Schedule,
}

impl Schedule {
    pub fn parse(expression: &str) -> Result<Self, String> {
        let cron = cron::Schedule::from_str(expression)
            .map_err(|error| format!("--cron {expression:?}: {error}"))?;
        Ok(Schedule {
            expression: expression.to_owned(),
            cron,
        })
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The first `rounds` fire times at or after `from` (Unix seconds).
    pub fn times(&self, from: u64, rounds: u32) -> Vec<u64> {
        let Some(start) = DateTime::<Utc>::from_timestamp(from as i64 - 1, 0) else {
            return Vec::new();
        };
        self.cron
            .after(&start)
            .take(rounds as usize)
            .map(|at| at.timestamp() as u64)
            .collect()
    }
}
