//! The health of one editor link, as a value: when to ping, when to mark it unhealthy or drop it.
//!
//! When to ping, when a silence makes the link unhealthy, when it is dropped. The link task
//! feeds it ticks and pongs and acts on what it says; it holds no socket and reads no clock
//! (every call is given `now`), so it is tested with made-up instants.

use crate::sys::config::HealthConfig;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Pings remembered at most (older unanswered ones are forgotten).
const MAX_OUTSTANDING: usize = 16;

/// What the link must do after a tick.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Send a ping with this payload.
    Ping(Vec<u8>),
    /// The editor stopped answering: mark the link unhealthy (keep it; nothing is lost yet).
    Unhealthy,
    /// Silent for too long: drop the link and redial (the reason, for the log).
    Drop(String),
}

/// What a pong meant.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Pong {
    /// The round trip of the ping it answers, if it answers one of ours.
    pub rtt: Option<Duration>,
    /// The link was unhealthy and is healthy again.
    pub recovered: bool,
}

/// Ping schedule and silence accounting of one link.
pub(super) struct Health {
    /// Interval, timeout and drop delay (replaced on reload).
    settings: HealthConfig,
    /// When the next ping is due.
    next_ping: Instant,
    /// The last ping's sequence number (its payload).
    seq: u64,
    /// Pings not answered yet, oldest first.
    outstanding: VecDeque<(u64, Instant)>,
    /// Since when the editor has been silent past the timeout.
    unhealthy_since: Option<Instant>,
}

impl Health {
    /// A new link's health: its first ping is due at once (status shows an RTT from the start).
    pub(super) fn new(settings: HealthConfig, now: Instant) -> Self {
        Health {
            settings,
            next_ping: now,
            seq: 0,
            outstanding: VecDeque::new(),
            unhealthy_since: None,
        }
    }

    /// Takes reloaded settings.
    pub(super) fn set_settings(&mut self, settings: HealthConfig) {
        self.settings = settings;
    }

    #[cfg(test)]
    /// True while the editor is silent past the timeout.
    pub(crate) fn is_unhealthy(&self) -> bool {
        self.unhealthy_since.is_some()
    }

    /// When [`Health::on_tick`] must run next.
    pub(super) fn next_wake(&self) -> Instant {
        match (self.outstanding.front(), self.unhealthy_since) {
            (Some((_, sent)), None) => self.next_ping.min(*sent + self.timeout()),
            (_, Some(since)) => self.next_ping.min(since + self.drop_after()),
            _ => self.next_ping,
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.timeout_ms)
    }

    fn drop_after(&self) -> Duration {
        Duration::from_millis(self.settings.drop_after_ms)
    }

    /// Time passed: what to do now.
    pub(super) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if let (Some((_, sent)), None) = (self.outstanding.front(), self.unhealthy_since) {
            if now >= *sent + self.timeout() {
                self.unhealthy_since = Some(*sent);
                out.push(Action::Unhealthy);
            }
        }
        if let Some(since) = self.unhealthy_since {
            if now >= since + self.drop_after() {
                out.push(Action::Drop(format!(
                    "no pong for {} ms",
                    self.settings.drop_after_ms
                )));
                return out;
            }
        }
        if now >= self.next_ping {
            self.seq += 1;
            if self.outstanding.len() >= MAX_OUTSTANDING {
                self.outstanding.pop_back();
            }
            self.outstanding.push_back((self.seq, now));
            self.next_ping = now + Duration::from_millis(self.settings.interval_ms);
            out.push(Action::Ping(self.seq.to_be_bytes().to_vec()));
        }
        out
    }

    /// A pong arrived. Any pong of ours proves the editor reads now: older unanswered pings
    /// (queued while it was frozen) no longer count against it.
    pub(super) fn on_pong(&mut self, payload: &[u8], now: Instant) -> Pong {
        let Some(n) = <[u8; 8]>::try_from(payload).ok().map(u64::from_be_bytes) else {
            return Pong {
                rtt: None,
                recovered: false,
            };
        };
        let Some(&(_, sent)) = self.outstanding.iter().find(|(s, _)| *s == n) else {
            return Pong {
                rtt: None,
                recovered: false,
            };
        };
        self.outstanding.clear();
        Pong {
            rtt: Some(now - sent),
            recovered: self.unhealthy_since.take().is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthConfig {
        HealthConfig {
            interval_ms: 1000,
            timeout_ms: 300,
            drop_after_ms: 5000,
        }
    }

    fn ping_of(actions: &[Action]) -> Option<Vec<u8>> {
        actions.iter().find_map(|a| match a {
            Action::Ping(p) => Some(p.clone()),
            _ => None,
        })
    }

    #[test]
    fn pings_on_schedule_and_measures_the_round_trip() {
        let t0 = Instant::now();
        let mut h = Health::new(settings(), t0);
        assert_eq!(h.next_wake(), t0);
        let p = ping_of(&h.on_tick(t0)).expect("a ping at once");
        let pong = h.on_pong(&p, t0 + Duration::from_millis(40));
        assert_eq!(pong.rtt, Some(Duration::from_millis(40)));
        assert!(!pong.recovered);
        assert_eq!(h.next_wake(), t0 + Duration::from_millis(1000));
        assert!(h.on_tick(t0 + Duration::from_millis(999)).is_empty());
        assert!(ping_of(&h.on_tick(t0 + Duration::from_millis(1000))).is_some());
        // Junk and foreign pongs change nothing.
        let now = t0 + Duration::from_millis(40);
        assert_eq!(h.on_pong(b"ping", now).rtt, None);
        assert_eq!(h.on_pong(&99u64.to_be_bytes(), now).rtt, None);
    }

    #[test]
    fn silence_makes_it_unhealthy_then_dropped_unless_a_pong_comes() {
        let t0 = Instant::now();
        let mut h = Health::new(settings(), t0);
        let first = ping_of(&h.on_tick(t0)).unwrap();
        let wake = h.next_wake();
        assert_eq!(wake, t0 + Duration::from_millis(300));
        assert_eq!(h.on_tick(wake), vec![Action::Unhealthy]);
        assert!(h.is_unhealthy());
        // Pings go on while unhealthy; a pong to any of them recovers the link.
        let later = ping_of(&h.on_tick(t0 + Duration::from_millis(1000))).unwrap();
        let pong = h.on_pong(&later, t0 + Duration::from_millis(1100));
        assert!(pong.recovered && !h.is_unhealthy());
        assert_eq!(
            h.on_pong(&first, t0 + Duration::from_millis(1200)).rtt,
            None
        );
        // Silent again, this time for good.
        let t1 = t0 + Duration::from_millis(2000);
        ping_of(&h.on_tick(t1)).unwrap();
        assert_eq!(
            h.on_tick(t1 + Duration::from_millis(300)),
            vec![Action::Unhealthy]
        );
        assert_eq!(h.next_wake(), t1 + Duration::from_millis(1000));
        let end = t1 + Duration::from_millis(5000);
        assert_eq!(
            h.on_tick(end),
            vec![Action::Drop("no pong for 5000 ms".into())]
        );
    }
}
