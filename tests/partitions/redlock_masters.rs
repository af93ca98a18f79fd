//! Scenario 2: RedLock over five masters.
