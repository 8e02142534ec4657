//! The life of one store partition once its store is open, as a state machine: which phase it is in,
//! and which phase an event leads to. Pure, so every transition is a unit test; the worker performs
//! what a transition asks for (assign to a lane, give the turn back, flush) and reports the next
//! event.
//!
//! ```text
//!  opened/wiped, far behind ──> Waiting ──turn granted──> CatchingUp{turn} ──caught up──┐
//!  opened/wiped, near the end ───────────> CatchingUp{no turn} ──caught up──> Tailing <──┘
//!                                                  ^──────── fell behind ────────┘
//!  out of range (any lane) ──> Wiping ──> (as opened)       stop or Kafka failure ──> Closing
//! ```
//!
//! Opening (the dirty rules) comes before the machine, and a failed attempt is retried from
//! Opening by the worker's backoff loop; neither needs a phase of its own here.

use std::time::Duration;

/// Longest a catching-up partition keeps commits unflushed (the configured `flush_interval`
/// applies if tighter). With the WAL off only flushed commits survive a kill, so a process killed
/// again and again mid-restore (an OOM loop, a crash loop) still moves forward.
pub const CATCHING_UP_FLUSH_BOUND: Duration = Duration::from_secs(5);

/// Where a store partition is, once its store is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Further behind than `ready_max_lag`: open, not assigned, waiting for a turn of memory.
    Waiting,
    /// Behind and fetching. With a `turn` it is fetched by the catching-up consumer and holds a
    /// share of the memory budget; without one (a lag within `ready_max_lag`, or one that grew
    /// while tailing) it is topped up by the tailing consumer. `first` is the first catch-up since
    /// the store was opened or wiped, which is flushed the moment it completes.
    CatchingUp { turn: bool, first: bool },
    /// Caught up and following the changelog.
    Tailing,
    /// Out of range: the store is being wiped, to be rebuilt from log-start. A turn held before
    /// stays held for the rebuild.
    Wiping { turn: bool },
    /// Commit what was taken, flush, write `status` 0: the end of the attempt.
    Closing,
    /// The store failed; it is dropped unclosed and the attempt ends (the retry reopens it through
    /// the dirty rules).
    Dropped,
}

/// The two consumers a partition can be assigned to (`kafka` says why there are two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Tailing,
    CatchingUp,
}

/// What happened to the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The store is open (or wiped) at a position; `far_behind` is `policy::needs_turn`.
    Positioned {
        far_behind: bool,
    },
    TurnGranted,
    /// The consumer position reached the end offset.
    CaughtUp,
    /// The end offset moved past the position of a tailing partition.
    FellBehind,
    /// The next offset is no longer in the log.
    OutOfRange,
    StopRequested,
    /// The partition cannot be read; the store is healthy and is closed cleanly.
    KafkaFailed,
    StoreFailed,
}

/// What the worker does on a transition, besides moving to `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub to: Phase,
    /// Leave the current lane: on a wipe, on close, and before moving to another lane.
    pub unassign: bool,
    /// Assign the partition to this lane at its position.
    pub assign: Option<Lane>,
    /// Give the turn back, so the next partition waiting can catch up.
    pub release_turn: bool,
    /// Flush now: the first catch-up after open or wipe is made durable at once.
    pub flush: bool,
}

impl Transition {
    fn to(to: Phase) -> Self {
        Transition {
            to,
            unassign: false,
            assign: None,
            release_turn: false,
            flush: false,
        }
    }
}

impl Phase {
    /// The lane the partition is assigned to in this phase, if any.
    pub fn lane(self) -> Option<Lane> {
        match self {
            Phase::CatchingUp { turn: true, .. } => Some(Lane::CatchingUp),
            Phase::CatchingUp { turn: false, .. } | Phase::Tailing => Some(Lane::Tailing),
            Phase::Waiting | Phase::Wiping { .. } | Phase::Closing | Phase::Dropped => None,
        }
    }

    /// Whether the phase holds a turn of the catch-up memory budget.
    pub fn holds_turn(self) -> bool {
        matches!(
            self,
            Phase::CatchingUp { turn: true, .. } | Phase::Wiping { turn: true }
        )
    }

    /// The longest a commit may stay unflushed in this phase: tight while catching up (kill loops
    /// must still move forward), the configured `flush_interval` once tailing (a warm standby makes
    /// no tiny tables).
    pub fn flush_bound(self, flush_interval: Duration) -> Duration {
        match self {
            Phase::CatchingUp { .. } => CATCHING_UP_FLUSH_BOUND.min(flush_interval),
            _ => flush_interval,
        }
    }

    /// Whether the attempt is over: the worker closes (or drops) the store and returns.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Closing | Phase::Dropped)
    }

    /// The phase an event leads to, and what to do on the way; `None` when the event changes
    /// nothing in this phase (for example `CaughtUp` while tailing).
    pub fn on(self, event: Event) -> Option<Transition> {
        use Event as E;
        use Phase as P;
        let lane = self.lane();
        let leave = |to: Phase| Transition {
            unassign: lane.is_some(),
            release_turn: self.holds_turn(),
            ..Transition::to(to)
        };
        Some(match (self, event) {
            (P::Dropped | P::Closing, _) => return None,
            (_, E::StoreFailed) => leave(P::Dropped),
            (_, E::StopRequested | E::KafkaFailed) => leave(P::Closing),

            (P::Waiting, E::TurnGranted) => Transition {
                assign: Some(Lane::CatchingUp),
                ..Transition::to(P::CatchingUp {
                    turn: true,
                    first: true,
                })
            },
            (P::Wiping { turn: true }, E::Positioned { .. }) => Transition {
                assign: Some(Lane::CatchingUp),
                ..Transition::to(P::CatchingUp {
                    turn: true,
                    first: true,
                })
            },
            // Without a turn, a rebuilt store starts as a freshly opened one does.
            (P::Wiping { turn: false }, E::Positioned { far_behind }) => opened(far_behind),
            (P::CatchingUp { turn, first }, E::CaughtUp) => Transition {
                unassign: turn,
                assign: turn.then_some(Lane::Tailing),
                release_turn: turn,
                flush: first,
                ..Transition::to(P::Tailing)
            },
            (P::Tailing, E::FellBehind) => Transition::to(P::CatchingUp {
                turn: false,
                first: false,
            }),
            (P::CatchingUp { turn, .. }, E::OutOfRange) => Transition {
                unassign: true,
                ..Transition::to(P::Wiping { turn })
            },
            (P::Tailing, E::OutOfRange) => Transition {
                unassign: true,
                ..Transition::to(P::Wiping { turn: false })
            },
            _ => return None,
        })
    }
}

/// The phase a freshly opened store starts in: far behind, it waits for a turn; otherwise it is
/// topped up by the tailing consumer at once.
pub fn opened(far_behind: bool) -> Transition {
    if far_behind {
        Transition::to(Phase::Waiting)
    } else {
        Transition {
            assign: Some(Lane::Tailing),
            ..Transition::to(Phase::CatchingUp {
                turn: false,
                first: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event as E;
    use Phase as P;

    const LOADING_FIRST: Phase = P::CatchingUp {
        turn: true,
        first: true,
    };
    const TOPPING_UP_FIRST: Phase = P::CatchingUp {
        turn: false,
        first: true,
    };
    const TOPPING_UP_LATER: Phase = P::CatchingUp {
        turn: false,
        first: false,
    };

    fn to(phase: Phase, event: Event) -> Transition {
        phase
            .on(event)
            .unwrap_or_else(|| panic!("{phase:?} ignores {event:?}"))
    }

    #[test]
    fn an_open_store_far_behind_waits_unassigned() {
        let t = opened(true);
        assert_eq!(t.to, P::Waiting);
        assert_eq!(t.assign, None);
    }

    #[test]
    fn an_open_store_near_the_end_is_topped_up_by_the_tailing_consumer_without_a_turn() {
        let t = opened(false);
        assert_eq!(t.to, TOPPING_UP_FIRST);
        assert_eq!(t.assign, Some(Lane::Tailing));
    }

    #[test]
    fn a_granted_turn_assigns_to_the_catching_up_consumer() {
        let t = to(P::Waiting, E::TurnGranted);
        assert_eq!(t.to, LOADING_FIRST);
        assert_eq!((t.assign, t.unassign), (Some(Lane::CatchingUp), false));
        assert!(t.to.holds_turn());
    }

    #[test]
    fn catching_up_with_a_turn_gives_it_back_and_moves_to_the_tailing_consumer() {
        let t = to(LOADING_FIRST, E::CaughtUp);
        assert_eq!(t.to, P::Tailing);
        assert!(t.release_turn && t.unassign);
        assert_eq!(t.assign, Some(Lane::Tailing));
    }

    #[test]
    fn the_first_catch_up_is_flushed_at_once_and_later_ones_are_not() {
        assert!(to(LOADING_FIRST, E::CaughtUp).flush);
        assert!(to(TOPPING_UP_FIRST, E::CaughtUp).flush);
        let later = to(TOPPING_UP_LATER, E::CaughtUp);
        assert!(!later.flush);
        assert_eq!(later.to, P::Tailing);
    }

    #[test]
    fn topping_up_stays_on_the_tailing_consumer_when_it_catches_up() {
        let t = to(TOPPING_UP_FIRST, E::CaughtUp);
        assert_eq!((t.unassign, t.assign, t.release_turn), (false, None, false));
    }

    #[test]
    fn a_tailing_partition_that_falls_behind_tops_up_without_a_turn() {
        let t = to(P::Tailing, E::FellBehind);
        assert_eq!(t.to, TOPPING_UP_LATER);
        assert_eq!((t.unassign, t.assign), (false, None));
    }

    #[test]
    fn events_that_change_nothing_are_ignored() {
        assert_eq!(P::Tailing.on(E::CaughtUp), None);
        assert_eq!(LOADING_FIRST.on(E::FellBehind), None);
        assert_eq!(P::Waiting.on(E::CaughtUp), None);
        assert_eq!(P::Tailing.on(E::TurnGranted), None);
        assert_eq!(P::Closing.on(E::StopRequested), None);
        assert_eq!(P::Dropped.on(E::KafkaFailed), None);
    }

    #[test]
    fn out_of_range_wipes_and_keeps_a_turn_held_for_the_rebuild() {
        let t = to(LOADING_FIRST, E::OutOfRange);
        assert_eq!(t.to, P::Wiping { turn: true });
        assert!(t.unassign && !t.release_turn);
        let t = to(P::Wiping { turn: true }, E::Positioned { far_behind: true });
        assert_eq!(t.to, LOADING_FIRST);
        assert_eq!(t.assign, Some(Lane::CatchingUp));
    }

    #[test]
    fn out_of_range_while_tailing_wipes_then_waits_or_tops_up_as_at_open() {
        let t = to(P::Tailing, E::OutOfRange);
        assert_eq!(t.to, P::Wiping { turn: false });
        assert!(t.unassign);
        let far = to(
            P::Wiping { turn: false },
            E::Positioned { far_behind: true },
        );
        assert_eq!((far.to, far.assign), (P::Waiting, None));
        let near = to(
            P::Wiping { turn: false },
            E::Positioned { far_behind: false },
        );
        assert_eq!(
            (near.to, near.assign),
            (TOPPING_UP_FIRST, Some(Lane::Tailing))
        );
        let t = to(TOPPING_UP_LATER, E::OutOfRange);
        assert_eq!(t.to, P::Wiping { turn: false });
    }

    #[test]
    fn stop_and_kafka_failures_close_cleanly_from_every_phase() {
        for phase in [
            P::Waiting,
            LOADING_FIRST,
            TOPPING_UP_LATER,
            P::Tailing,
            P::Wiping { turn: true },
        ] {
            for event in [E::StopRequested, E::KafkaFailed] {
                let t = to(phase, event);
                assert_eq!(t.to, P::Closing, "{phase:?} {event:?}");
                assert_eq!(t.unassign, phase.lane().is_some(), "{phase:?}");
                assert_eq!(t.release_turn, phase.holds_turn(), "{phase:?}");
                assert!(t.to.is_final());
            }
        }
    }

    #[test]
    fn a_store_failure_drops_the_store_from_every_phase() {
        for phase in [
            P::Waiting,
            LOADING_FIRST,
            P::Tailing,
            P::Wiping { turn: false },
        ] {
            let t = to(phase, E::StoreFailed);
            assert_eq!(t.to, P::Dropped);
            assert!(t.to.is_final());
        }
    }

    /// The worker fetches from the lane it was assigned; a phase with a lane entered without an
    /// assignment would leave it nothing to fetch from and spin unseen. So every transition into
    /// such a phase either assigns that lane or stays on the lane it has.
    #[test]
    fn every_phase_with_a_lane_is_entered_on_that_lane() {
        let phases = [
            P::Waiting,
            LOADING_FIRST,
            TOPPING_UP_FIRST,
            TOPPING_UP_LATER,
            P::Tailing,
            P::Wiping { turn: true },
            P::Wiping { turn: false },
        ];
        let events = [
            E::Positioned { far_behind: true },
            E::Positioned { far_behind: false },
            E::TurnGranted,
            E::CaughtUp,
            E::FellBehind,
            E::OutOfRange,
            E::StopRequested,
            E::KafkaFailed,
            E::StoreFailed,
        ];
        for t in [opened(true), opened(false)] {
            assert_eq!(t.assign, t.to.lane(), "{t:?}");
        }
        for phase in phases {
            for event in events {
                let Some(t) = phase.on(event) else { continue };
                let Some(lane) = t.to.lane() else { continue };
                let kept = !t.unassign && phase.lane() == Some(lane);
                assert!(
                    t.assign == Some(lane) || kept,
                    "{phase:?} on {event:?} enters {:?} without its lane",
                    t.to
                );
            }
        }
    }

    #[test]
    fn each_phase_has_its_lane_and_flush_bound() {
        let interval = Duration::from_secs(60);
        assert_eq!(LOADING_FIRST.lane(), Some(Lane::CatchingUp));
        assert_eq!(TOPPING_UP_LATER.lane(), Some(Lane::Tailing));
        assert_eq!(P::Tailing.lane(), Some(Lane::Tailing));
        assert_eq!(P::Waiting.lane(), None);
        assert_eq!(LOADING_FIRST.flush_bound(interval), CATCHING_UP_FLUSH_BOUND);
        assert_eq!(
            TOPPING_UP_LATER.flush_bound(interval),
            CATCHING_UP_FLUSH_BOUND
        );
        assert_eq!(P::Tailing.flush_bound(interval), interval);
        // A configured bound tighter than the catch-up one applies everywhere.
        let tight = Duration::from_secs(1);
        assert_eq!(LOADING_FIRST.flush_bound(tight), tight);
    }
}
