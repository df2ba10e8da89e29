use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tokio::time::Instant;

use super::state::Stamp;
use super::*;
use crate::task::{ReplyTx, Task};

fn pending() -> Pending {
    let job = Arc::new(Task::get("s", "/x").prepare(1, Instant::now()).unwrap());
    Pending::new(ReplyTx::new(job), Stamp::default())
}

#[derive(Debug, Clone)]
enum Op {
    Enter { parked: bool },
    AdmitParked,
    SendNext,
    AnswerNextReady,
    AnswerNextParked,
    Bounce(usize),
    BackOff(usize),
    BackoffOver(usize),
    Answer(usize),
    Compact,
    SendNewest,
    AnswerOldestReady,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<bool>().prop_map(|parked| Op::Enter { parked }),
        1 => Just(Op::AdmitParked),
        3 => Just(Op::SendNext),
        1 => Just(Op::AnswerNextReady),
        1 => Just(Op::AnswerNextParked),
        1 => any::<usize>().prop_map(Op::Bounce),
        1 => any::<usize>().prop_map(Op::BackOff),
        1 => any::<usize>().prop_map(Op::BackoffOver),
        2 => any::<usize>().prop_map(Op::Answer),
        1 => Just(Op::Compact),
        1 => Just(Op::SendNewest),
        1 => Just(Op::AnswerOldestReady),
    ]
}

/// The counts a model of every live task's state gives.
fn model_counts(model: &BTreeMap<TaskNo, State>) -> Counts {
    let mut c = Counts::default();
    for s in model.values() {
        match s {
            State::Waiting => c.parked += 1,
            State::Ready => {
                c.queued += 1;
                c.ready += 1;
            }
            State::Backoff => c.queued += 1,
            State::InFlight => c.in_flight += 1,
        }
    }
    c
}

/// The `k`-th live task (mod their number) in `state`, if any.
fn pick(model: &BTreeMap<TaskNo, State>, state: State, k: usize) -> Option<TaskNo> {
    let of: Vec<TaskNo> = model
        .iter()
        .filter(|(_, s)| **s == state)
        .map(|(no, _)| *no)
        .collect();
    (!of.is_empty()).then(|| of[k % of.len()])
}

proptest! {
    /// Whatever happens to the tasks, the counts agree with the states in
    /// the table, ready and parked tasks come out in their lists' order,
    /// and every task leaves exactly once.
    #[test]
    fn counts_always_agree_and_every_task_leaves_once(ops in proptest::collection::vec(op(), 1..200)) {
        let mut t = TaskTable::default();
        let mut model: BTreeMap<TaskNo, State> = BTreeMap::new();
        let mut entered = 0usize;
        let mut left = 0usize;
        for op in ops {
            match op {
                Op::Enter { parked } => {
                    let no = t.enter(pending(), parked);
                    let state = if parked { State::Waiting } else { State::Ready };
                    prop_assert!(model.insert(no, state).is_none());
                    entered += 1;
                }
                Op::AdmitParked => {
                    let oldest = model.iter().find(|(_, s)| **s == State::Waiting).map(|(no, _)| *no);
                    let got = t.admit_parked();
                    prop_assert_eq!(got, oldest, "the oldest parked task first");
                    if let Some(no) = got {
                        model.insert(no, State::Ready);
                    }
                }
                Op::SendNext => {
                    if let Some(no) = t.next_ready() {
                        prop_assert_eq!(model.get(&no), Some(&State::Ready));
                        prop_assert!(t.send(no).is_some());
                        model.insert(no, State::InFlight);
                    } else {
                        prop_assert!(!model.values().any(|s| *s == State::Ready));
                    }
                }
                Op::AnswerNextReady => {
                    if let Some(no) = t.next_ready() {
                        prop_assert!(t.remove(no).is_some());
                        prop_assert_eq!(model.remove(&no), Some(State::Ready));
                        left += 1;
                    }
                }
                Op::AnswerNextParked => {
                    let oldest = model.iter().find(|(_, s)| **s == State::Waiting).map(|(no, _)| *no);
                    let got = t.next_parked();
                    prop_assert_eq!(got, oldest);
                    if let Some(no) = got {
                        prop_assert!(t.remove(no).is_some());
                        model.remove(&no);
                        left += 1;
                    }
                }
                Op::Bounce(k) => {
                    if let Some(no) = pick(&model, State::InFlight, k) {
                        t.bounce(no);
                        model.insert(no, State::Ready);
                        // At the front: the next ready task.
                        prop_assert_eq!(t.next_ready(), Some(no));
                        prop_assert!(t.send(no).is_some());
                        model.insert(no, State::InFlight);
                    }
                }
                Op::BackOff(k) => {
                    if let Some(no) = pick(&model, State::InFlight, k) {
                        t.back_off(no);
                        model.insert(no, State::Backoff);
                    }
                }
                Op::BackoffOver(k) => {
                    if let Some(no) = pick(&model, State::Backoff, k) {
                        prop_assert!(t.backoff_over(no));
                        prop_assert!(!t.backoff_over(no), "only a backing-off task");
                        model.insert(no, State::Ready);
                    }
                }
                Op::Answer(k) => {
                    if model.is_empty() {
                        continue;
                    }
                    let no = *model.keys().nth(k % model.len()).unwrap();
                    prop_assert!(t.remove(no).is_some());
                    prop_assert!(t.remove(no).is_none(), "answered once");
                    model.remove(&no);
                    left += 1;
                }
                Op::Compact => t.compact(),
                Op::SendNewest => {
                    if let Some(no) = t.next_ready_newest() {
                        prop_assert_eq!(model.get(&no), Some(&State::Ready));
                        prop_assert!(t.send(no).is_some());
                        model.insert(no, State::InFlight);
                    }
                }
                Op::AnswerOldestReady => {
                    if let Some(no) = t.oldest_ready() {
                        prop_assert_eq!(t.oldest_ready(), Some(no), "left on the list");
                        prop_assert_eq!(t.next_ready(), Some(no));
                        prop_assert!(t.remove(no).is_some());
                        prop_assert_eq!(model.remove(&no), Some(State::Ready));
                        left += 1;
                    }
                }
            }
            prop_assert_eq!(t.counts(), model_counts(&model));
            prop_assert_eq!(t.len(), model.len());
            for (no, s) in &model {
                prop_assert_eq!(t.get(no).map(Pending::state), Some(*s));
            }
        }
        // What is left leaves once each, and the table is empty after.
        for no in t.in_arrival_order() {
            prop_assert!(model.remove(&no).is_some());
            prop_assert!(t.remove(no).is_some());
            left += 1;
        }
        prop_assert!(model.is_empty());
        prop_assert_eq!(left, entered);
        prop_assert!(t.is_empty());
        prop_assert_eq!(t.counts(), Counts::default());
    }
}
