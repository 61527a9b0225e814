//! Waiting for something that becomes true in real time (a server back up, an event
//! published, a decision after a heal): one bounded poll for every test, so each wait says
//! how long it may take and what it waited for, and a timeout names the last thing seen.
//!
//! An attempt returns `Ok(value)` when the wait is over, or `Err(seen)` with what it saw
//! instead (the outcome, the status and body); it may also panic on something that must
//! never be seen while waiting. The first attempt runs at once; after a failed one the
//! deadline is checked, then the poll pauses `every` before the next.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// Runs `attempt` until it returns `Ok`, for at most `within`; `async` attempts.
///
/// # Panics
/// When `within` passes first: the message names `what`, the bound and the last `Err`.
pub async fn eventually<T, E: Debug>(
    what: &str,
    within: Duration,
    every: Duration,
    mut attempt: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(seen) if started.elapsed() >= within => timed_out(what, within, &seen),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// [`eventually`] for blocking attempts, sleeping the thread between them (harness and
/// proxy tests that run without an async runtime).
///
/// # Panics
/// As [`eventually`].
pub fn eventually_blocking<T, E: Debug>(
    what: &str,
    within: Duration,
    every: Duration,
    attempt: impl FnMut() -> Result<T, E>,
) -> T {
    poll_blocking(within, every, attempt).unwrap_or_else(|seen| timed_out(what, within, &seen))
}

/// Runs the blocking `attempt` until it returns `Ok`, for at most `within`, and returns the
/// last `Err` once `within` has passed (for callers that build their own message, such as a
/// topology that reports why it is not ready).
///
/// # Errors
/// The last `Err` of `attempt` once `within` has passed.
pub fn poll_blocking<T, E>(
    within: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(seen) if started.elapsed() >= within => return Err(seen),
            Err(_) => std::thread::sleep(every),
        }
    }
}

fn timed_out(what: &str, within: Duration, seen: &dyn Debug) -> ! {
    panic!("{what}: not within {within:?}; last seen: {seen:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    #[test]
    fn a_blocking_poll_returns_the_first_success_and_the_last_failure_after_the_bound() {
        let mut n = 0;
        let got: Result<u32, u32> = poll_blocking(Duration::from_secs(5), TICK, || {
            n += 1;
            if n == 3 { Ok(n) } else { Err(n) }
        });
        assert_eq!(got, Ok(3));
        let started = Instant::now();
        let mut n = 0;
        let got: Result<(), u32> = poll_blocking(Duration::from_millis(30), TICK, || {
            n += 1;
            Err(n)
        });
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert_eq!(got, Err(n), "the last failure is returned");
    }

    #[test]
    #[should_panic(expected = "the answer: not within 20ms; last seen: \"still no\"")]
    fn a_timeout_names_what_was_awaited_and_the_last_thing_seen() {
        eventually_blocking("the answer", Duration::from_millis(20), TICK, || {
            Err::<(), _>("still no")
        });
    }

    #[tokio::test]
    async fn an_async_wait_returns_the_value_of_the_first_success() {
        let mut n = 0;
        let got = eventually("the third try", Duration::from_secs(5), TICK, async || {
            n += 1;
            if n == 3 { Ok(n) } else { Err(n) }
        })
        .await;
        assert_eq!(got, 3);
    }
}
