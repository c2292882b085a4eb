//! Waiting for a condition instead of sleeping for a guessed time.

use std::time::{Duration, Instant};

/// How often a condition is polled: often enough that a test does not wait much longer than it
/// must, rarely enough that polling does not load the 2-core machine.
const POLL: Duration = Duration::from_millis(25);

/// Poll `cond` until it holds; false if `timeout` passes first.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// [`wait_until`] for async tests: sleeps on the runtime instead of blocking a worker.
pub async fn wait_until_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Poll `read` until `done` holds for what it read; on timeout, Err with the last value read
/// (for the failure message).
pub fn wait_for_value<T>(
    timeout: Duration,
    every: Duration,
    mut read: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
) -> Result<T, T> {
    let deadline = Instant::now() + timeout;
    loop {
        let value = read();
        if done(&value) {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(value);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_returns_as_soon_as_the_condition_holds() {
        let mut calls = 0;
        assert!(wait_until(Duration::from_secs(5), || {
            calls += 1;
            calls == 3
        }));
        assert_eq!(calls, 3);
        assert!(!wait_until(Duration::from_millis(60), || false));
    }

    #[test]
    fn wait_for_value_gives_the_last_value_on_timeout() {
        let mut n = 0;
        assert_eq!(
            wait_for_value(
                Duration::from_secs(5),
                POLL,
                || {
                    n += 1;
                    n
                },
                |v| *v == 2
            ),
            Ok(2)
        );
        assert_eq!(
            wait_for_value(Duration::ZERO, POLL, || 7, |_| false),
            Err(7)
        );
    }
}
