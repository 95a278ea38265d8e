//! Delays between retries of a store, a database or a stream: exponential with jitter
//! (backon), so the pods of a fleet that lost one dependency do not come back in step.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// An endless sequence of delays from `first` doubling (or `factor`) to `max`, each plus a
/// random jitter below itself; [`Backoff::reset`] starts over after a success.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self::with_factor(first, max, 2.0)
    }

    pub fn with_factor(first: Duration, max: Duration, factor: f32) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(factor.max(1.0))
            .with_jitter()
            .without_max_times();
        Backoff {
            delays: builder.build(),
            builder,
            max,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        // Without max times the sequence never ends; `max` is the fallback all the same.
        self.delays.next().unwrap_or(self.max)
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_with_jitter_and_start_over_after_a_reset() {
        let first = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let mut b = Backoff::new(first, max);
        let delays: Vec<Duration> = (0..12).map(|_| b.next_delay()).collect();
        // Each delay is its nominal value (100ms, 200ms, … capped at 2s) plus under itself.
        for (i, d) in delays.iter().enumerate() {
            let nominal = (first * 2u32.pow(i as u32)).min(max);
            assert!(
                *d >= nominal && *d < nominal * 2,
                "delay {i}: {d:?} for {nominal:?}"
            );
        }
        // Jitter: twelve delays drawn at random are not all their nominal values.
        assert!(
            delays
                .iter()
                .enumerate()
                .any(|(i, d)| *d != (first * 2u32.pow(i as u32)).min(max))
        );
        b.reset();
        let again = b.next_delay();
        assert!(again >= first && again < first * 2, "{again:?}");
    }
}
