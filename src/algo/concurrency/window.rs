//! A learned limit's windows: the requests sent at one level (a
//! [`Cohort`]) and the outcomes of those that ended (a [`Window`]).

use tokio::time::Instant;

use crate::algo::knee::Acc;

/// Outcomes of the current window.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    pub(super) latencies: Acc,
    /// Instants at which answers ended, and those of them at which the
    /// node was at (or over) the level before they ended. By instant, not
    /// by answer: the answers that end together count down from the level
    /// one by one.
    pub(super) instants: u32,
    pub(super) binding: u32,
    /// The in-flight counts at those instants (each at most the level),
    /// summed.
    pub(super) held: u64,
    /// The instant being counted, and the most in flight at it.
    pub(super) current: Option<(Instant, u32)>,
    pub(super) successes: u32,
    pub(super) timeouts: u32,
    pub(super) failures: u32,
    /// For a probe's window: the instants at which the node held more
    /// than the limit outside the probe (`over_at` or more; 0: not counted).
    pub(super) over_at: u32,
    pub(super) over: u32,
}

impl Window {
    pub(super) fn outcomes(&self) -> u32 {
        self.successes + self.timeouts + self.failures
    }

    /// Notes an answer that ended at `now` with `in_flight` (counting it).
    pub(super) fn at(&mut self, now: Instant, in_flight: u32, level: u32) {
        match &mut self.current {
            Some((t, most)) if *t == now => *most = (*most).max(in_flight),
            _ => {
                self.close_instant(level);
                self.current = Some((now, in_flight));
            }
        }
    }

    pub(super) fn close_instant(&mut self, level: u32) {
        if let Some((_, most)) = self.current.take() {
            self.instants += 1;
            self.binding += u32::from(most >= level);
            self.held += u64::from(most.min(level));
            self.over += u32::from(self.over_at > 0 && most >= self.over_at);
        }
    }

    /// Whether the node held `over_at` or more at two thirds of the
    /// instants or more (call after [`bound`](Self::bound)).
    pub(super) fn held_over(&self) -> bool {
        self.over_at > 0 && self.instants > 0 && self.over * 3 >= self.instants * 2
    }

    /// The concurrency the answers met: the node's in-flight count at
    /// their instants (at most `level`), on average, rounded; `level`
    /// with none counted (call after [`bound`](Self::bound)).
    pub(super) fn met(&self, level: u32) -> u32 {
        if self.instants == 0 {
            return level;
        }
        let mean = self.held as f64 / f64::from(self.instants);
        // `as` saturates.
        (mean.round() as u32).clamp(1, level)
    }

    /// Whether the limit bound at two thirds of the instants or more.
    pub(super) fn bound(&mut self, level: u32) -> bool {
        self.close_instant(level);
        self.instants > 0 && self.binding * 3 >= self.instants * 2
    }
}

/// The requests sent at one level from `from` on (until `to`, once the
/// cohort is cut), and the outcomes of those that ended. A window is a
/// cohort: it is judged once every request it sent has ended, so a slow
/// answer is never left out of the mean it belongs to (a window closed
/// at its n-th answer keeps the fast ones and leaves the slow ones to
/// the next, and reads a noisy service as faster than it is).
#[derive(Debug, Clone)]
pub(super) struct Cohort {
    pub(super) from: Instant,
    /// Cut from the one before at `from`: the sends of that instant are
    /// the one before's.
    pub(super) after: bool,
    pub(super) to: Option<Instant>,
    pub(super) sent: u32,
    pub(super) ended: u32,
    pub(super) window: Window,
}

impl Cohort {
    pub(super) fn new(from: Instant) -> Self {
        Cohort {
            from,
            after: false,
            to: None,
            sent: 0,
            ended: 0,
            window: Window::default(),
        }
    }

    /// Whether a request sent at `sent` is one of this cohort's.
    pub(super) fn holds(&self, sent: Instant) -> bool {
        let started = if self.after {
            sent > self.from
        } else {
            sent >= self.from
        };
        started && self.to.is_none_or(|t| sent <= t)
    }
}

/// Which cohort an outcome belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    Sending,
    Waiting,
}
