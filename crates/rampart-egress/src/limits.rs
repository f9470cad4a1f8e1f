//! Token buckets for `connections_per_second` and `egress_mbps`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug)]
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    fn refill(&self, s: &mut (f64, Instant)) {
        let now = Instant::now();
        let dt = now.duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + dt * self.rate).min(self.burst);
        s.1 = now;
    }

    /// Takes one token if there is one.
    pub fn try_take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut s);
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, going into debt; returns how long the caller should wait so the
    /// average stays at the rate.
    pub fn take_debt(&self, n: f64) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut s);
        s.0 -= n;
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-s.0 / self.rate).min(60.0))
        }
    }
}

/// The limiters of one sandbox, built from its policy's limits.
#[derive(Debug, Default)]
pub(crate) struct Limiters {
    pub connections: Option<Bucket>,
    /// Bytes per second, sandbox -> upstream.
    pub egress: Option<Bucket>,
}

impl Limiters {
    pub fn from_policy(l: &rampart_types::network::NetworkLimits) -> Self {
        Limiters {
            connections: l
                .connections_per_second
                .filter(|r| *r > 0)
                .map(|r| Bucket::new(r as f64, r as f64)),
            egress: l.egress_mbps.filter(|m| *m > 0).map(|m| {
                let bps = m as f64 * 1_000_000.0 / 8.0;
                // A burst of 50 ms worth of bytes, at least 64 KiB.
                Bucket::new(bps, (bps / 20.0).max(65536.0))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refuses_past_burst() {
        let b = Bucket::new(1.0, 3.0);
        assert!(b.try_take());
        assert!(b.try_take());
        assert!(b.try_take());
        assert!(!b.try_take());
        let d = Bucket::new(100.0, 100.0);
        assert_eq!(d.take_debt(50.0), Duration::ZERO);
        assert!(d.take_debt(150.0) > Duration::ZERO);
    }
}
