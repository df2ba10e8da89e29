use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use tokio::time::Instant;

use super::state::Stamp;
use super::*;
use crate::algo::codel::Order;
use crate::algo::priority::{Priority, PriorityConfig};
use crate::algo::tenants::TenantsConfig;
use crate::task::{ReplyTx, Task};

fn pending(class: Priority, at: u64) -> Pending {
    let task = Task::get("s", "/x").priority(class);
    let job = Arc::new(task.prepare(1, Instant::now()).unwrap());
    Pending::new(ReplyTx::new(job), Stamp(at))
}

fn class() -> impl Strategy<Value = Priority> {
    prop_oneof![
        Just(Priority::Critical),
        Just(Priority::Default),
        Just(Priority::Sheddable)
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Enter { parked: bool, class: Priority },
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
    Displace(Priority),
    Hold,
    SendHeld,
    AnswerHeld,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<bool>(), class()).prop_map(|(parked, class)| Op::Enter { parked, class }),
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
        1 => class().prop_map(Op::Displace),
        1 => Just(Op::Hold),
        1 => Just(Op::SendHeld),
        1 => Just(Op::AnswerHeld),
    ]
}

/// A live task in the model: its state and class.
type Model = BTreeMap<TaskNo, (State, Priority)>;

/// The counts a model of every live task's state gives.
fn model_counts(model: &Model) -> Counts {
    let mut c = Counts::default();
    for (s, class) in model.values() {
        match s {
            State::Waiting => c.waiting += 1,
            State::Ready => {
                c.queued += 1;
                c.ready += 1;
                c.ready_in[class.index()] += 1;
            }
            State::Backoff => c.queued += 1,
            State::InFlight => c.in_flight += 1,
        }
    }
    c
}

/// The `k`-th live task (mod their number) in `state`, if any.
fn pick(model: &Model, state: State, k: usize) -> Option<TaskNo> {
    let of: Vec<TaskNo> = model
        .iter()
        .filter(|(_, (s, _))| *s == state)
        .map(|(no, _)| *no)
        .collect();
    (!of.is_empty()).then(|| of[k % of.len()])
}

proptest! {
    /// Whatever happens to the tasks, the counts (by class too) agree with
    /// the states in the table, parked tasks come out in arrival order, a
    /// class's ready tasks at the ends asked for, and every task leaves
    /// exactly once.
    #[test]
    fn counts_always_agree_and_every_task_leaves_once(ops in proptest::collection::vec(op(), 1..200)) {
        let mut t = TaskTable::default();
        let mut model: Model = BTreeMap::new();
        let mut entered = 0usize;
        let mut left = 0usize;
        let mut clock = 0u64;
        // Tasks held back, first held first (some may have left since).
        let mut held: Vec<TaskNo> = Vec::new();
        let set = |model: &mut Model, no: TaskNo, s: State| {
            if let Some(e) = model.get_mut(&no) {
                e.0 = s;
            }
        };
        for op in ops {
            clock += 1;
            match op {
                Op::Enter { parked, class } => {
                    let no = t.enter(pending(class, clock), parked);
                    let state = if parked { State::Waiting } else { State::Ready };
                    prop_assert!(model.insert(no, (state, class)).is_none());
                    entered += 1;
                }
                Op::AdmitParked => {
                    let oldest = model.iter().find(|(_, (s, _))| *s == State::Waiting).map(|(no, _)| *no);
                    let got = t.admit_waiting();
                    prop_assert_eq!(got, oldest, "the oldest parked task first");
                    if let Some(no) = got {
                        set(&mut model, no, State::Ready);
                    }
                }
                Op::SendNext | Op::SendNewest => {
                    let order = if matches!(op, Op::SendNext) { Order::Fifo } else { Order::Lifo };
                    if let Some(no) = t.next_ready(order) {
                        prop_assert_eq!(model.get(&no).map(|e| e.0), Some(State::Ready));
                        prop_assert!(t.send(no).is_some());
                        set(&mut model, no, State::InFlight);
                    } else {
                        let listed = |(no, (s, _)): (&TaskNo, &(State, Priority))| *s == State::Ready && !held.contains(no);
                        prop_assert!(!model.iter().any(listed));
                    }
                }
                Op::AnswerNextReady => {
                    if let Some(no) = t.next_ready(Order::Fifo) {
                        prop_assert!(t.remove(no).is_some());
                        prop_assert_eq!(model.remove(&no).map(|e| e.0), Some(State::Ready));
                        left += 1;
                    }
                }
                Op::AnswerNextParked => {
                    let oldest = model.iter().find(|(_, (s, _))| *s == State::Waiting).map(|(no, _)| *no);
                    let got = t.next_waiting();
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
                        set(&mut model, no, State::Ready);
                        // At the front of its class.
                        let class = model[&no].1;
                        prop_assert_eq!(t.oldest_ready_in(class), Some(no));
                        prop_assert_eq!(t.take_oldest_ready_in(class), Some(no));
                        prop_assert!(t.send(no).is_some());
                        set(&mut model, no, State::InFlight);
                    }
                }
                Op::BackOff(k) => {
                    if let Some(no) = pick(&model, State::InFlight, k) {
                        t.back_off(no);
                        set(&mut model, no, State::Backoff);
                    }
                }
                Op::BackoffOver(k) => {
                    if let Some(no) = pick(&model, State::Backoff, k) {
                        prop_assert!(t.backoff_over(no));
                        prop_assert!(!t.backoff_over(no), "only a backing-off task");
                        set(&mut model, no, State::Ready);
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
                Op::AnswerOldestReady => {
                    if let Some(no) = t.oldest_ready() {
                        prop_assert_eq!(t.oldest_ready(), Some(no), "left on the list");
                        let class = model[&no].1;
                        prop_assert_eq!(t.take_oldest_ready_in(class), Some(no));
                        prop_assert!(t.remove(no).is_some());
                        prop_assert_eq!(model.remove(&no).map(|e| e.0), Some(State::Ready));
                        left += 1;
                    } else {
                        let listed = |(no, (s, _)): (&TaskNo, &(State, Priority))| *s == State::Ready && !held.contains(no);
                        prop_assert!(!model.iter().any(listed));
                    }
                }
                Op::Hold => {
                    if let Some(no) = t.next_ready(Order::Fifo) {
                        t.hold(no);
                        held.push(no);
                    }
                }
                Op::SendHeld | Op::AnswerHeld => {
                    // The first held task still ready, held no longer.
                    held.retain(|no| model.get(no).is_some_and(|e| e.0 == State::Ready));
                    let first = (!held.is_empty()).then(|| held.remove(0));
                    prop_assert_eq!(t.held_front(), first);
                    prop_assert_eq!(t.take_held(), first);
                    if let Some(no) = first {
                        if matches!(op, Op::SendHeld) {
                            prop_assert!(t.send(no).is_some());
                            set(&mut model, no, State::InFlight);
                        } else {
                            prop_assert!(t.remove(no).is_some());
                            model.remove(&no);
                            left += 1;
                        }
                    }
                }
                Op::Displace(class) => {
                    // Only a ready task of a strictly lower class, the
                    // least important class first (one held back is not
                    // on its list: it is about to go or to be shed).
                    let lowest = model
                        .iter()
                        .filter(|(no, (s, c))| *s == State::Ready && c.index() > class.index() && !held.contains(no))
                        .map(|(_, (_, c))| c.index())
                        .max();
                    let got = t.displaceable(class, crate::algo::tenants::UNNAMED);
                    prop_assert_eq!(got.map(|no| model[&no].1.index()), lowest);
                    if let Some(no) = got {
                        prop_assert!(t.remove(no).is_some());
                        model.remove(&no);
                        left += 1;
                    }
                }
            }
            prop_assert_eq!(t.counts(), model_counts(&model));
            prop_assert_eq!(t.len(), model.len());
            for (no, (s, _)) in &model {
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

/// Within one class, ready tasks leave oldest first (FIFO) or newest first
/// (LIFO), a bounced task at the oldest end; across classes, critical first.
#[test]
fn ready_tasks_leave_by_class_then_order() {
    let mut t = TaskTable::default();
    let a = t.enter(pending(Priority::Default, 1), false);
    let b = t.enter(pending(Priority::Default, 2), false);
    let c = t.enter(pending(Priority::Critical, 3), false);
    let d = t.enter(pending(Priority::Sheddable, 4), false);
    assert_eq!(t.counts().ready_from(Priority::Critical), 1);
    assert_eq!(t.counts().ready_from(Priority::Default), 3);
    assert_eq!(t.counts().ready_from(Priority::Sheddable), 4);
    assert_eq!(t.oldest_ready(), Some(a));
    assert_eq!(t.next_ready(Order::Fifo), Some(c));
    t.send(c);
    assert_eq!(t.next_ready(Order::Lifo), Some(b));
    t.send(b);
    t.bounce(b);
    assert_eq!(t.next_ready(Order::Fifo), Some(b));
    t.send(b);
    assert_eq!(
        t.displaceable(Priority::Sheddable, crate::algo::tenants::UNNAMED),
        None
    );
    assert_eq!(
        t.displaceable(Priority::Critical, crate::algo::tenants::UNNAMED),
        Some(d)
    );
    assert_eq!(t.next_ready(Order::Fifo), Some(a));
    t.send(a);
    assert_eq!(t.next_ready(Order::Fifo), Some(d));
}

fn pending_of(class: Priority, tenant: Option<u8>, at: u64) -> Pending {
    let mut task = Task::get("s", "/x").priority(class);
    if let Some(k) = tenant {
        task = task.tenant(format!("t{k}"));
    }
    let job = Arc::new(task.prepare(1, Instant::now()).unwrap());
    Pending::new(ReplyTx::new(job), Stamp(at))
}

#[derive(Debug, Clone)]
enum TenantOp {
    Enter(Priority, Option<u8>),
    Send(bool),
    Answer(usize),
    Bounce(usize),
    Oldest,
    Displace(Priority, Option<u8>),
    Compact,
}

fn tenant_op() -> impl Strategy<Value = TenantOp> {
    let tenant = prop::option::of(0u8..6);
    prop_oneof![
        4 => (class(), tenant.clone()).prop_map(|(c, t)| TenantOp::Enter(c, t)),
        3 => any::<bool>().prop_map(TenantOp::Send),
        2 => any::<usize>().prop_map(TenantOp::Answer),
        1 => any::<usize>().prop_map(TenantOp::Bounce),
        1 => Just(TenantOp::Oldest),
        1 => (class(), tenant).prop_map(|(c, t)| TenantOp::Displace(c, t)),
        1 => Just(TenantOp::Compact),
    ]
}

proptest! {
    /// With tasks of several tenants (more than the two tracked, so that
    /// flows overflow and are handed on), the counts agree with the
    /// states, a displaced task is of a lower class or of the same class's
    /// tenant most over its share, the tracked tenants stay within the
    /// bound, and every task leaves exactly once.
    #[test]
    fn with_tenants_counts_agree_and_every_task_leaves_once(
        ops in proptest::collection::vec(tenant_op(), 1..200),
    ) {
        let tenants = TenantsConfig { max_tracked: 2, ..Default::default() };
        let mut t = TaskTable::new(PriorityConfig::default(), &tenants);
        let mut model: Model = BTreeMap::new();
        let (mut entered, mut left, mut clock) = (0usize, 0usize, 0u64);
        for op in ops {
            clock += 1;
            match op {
                TenantOp::Enter(class, tenant) => {
                    let no = t.enter(pending_of(class, tenant, clock), false);
                    prop_assert!(model.insert(no, (State::Ready, class)).is_none());
                    entered += 1;
                }
                TenantOp::Send(lifo) => {
                    let order = if lifo { Order::Lifo } else { Order::Fifo };
                    match t.next_ready(order) {
                        Some(no) => {
                            prop_assert!(t.send(no).is_some());
                            model.get_mut(&no).unwrap().0 = State::InFlight;
                        }
                        None => prop_assert!(!model.values().any(|(s, _)| *s == State::Ready)),
                    }
                }
                TenantOp::Answer(k) => {
                    if !model.is_empty() {
                        let no = *model.keys().nth(k % model.len()).unwrap();
                        prop_assert!(t.remove(no).is_some());
                        model.remove(&no);
                        left += 1;
                    }
                }
                TenantOp::Bounce(k) => {
                    if let Some(no) = pick(&model, State::InFlight, k) {
                        t.bounce(no);
                        model.get_mut(&no).unwrap().0 = State::Ready;
                    }
                }
                TenantOp::Oldest => {
                    if let Some(no) = t.oldest_ready() {
                        let class = model[&no].1;
                        prop_assert_eq!(t.take_oldest_ready_in(class), Some(no));
                        prop_assert!(t.remove(no).is_some());
                        prop_assert_eq!(model.remove(&no).map(|e| e.0), Some(State::Ready));
                        left += 1;
                    }
                }
                TenantOp::Displace(class, tenant) => {
                    let flow = t.flow_of(tenant.map(|k| format!("t{k}")).as_deref());
                    if let Some(no) = t.displaceable(class, flow) {
                        let (s, c) = model[&no];
                        prop_assert_eq!(s, State::Ready);
                        prop_assert!(c.index() >= class.index());
                        if c == class {
                            prop_assert!(t.flow_of_task(no) != Some(flow));
                        }
                        prop_assert!(t.remove(no).is_some());
                        model.remove(&no);
                        left += 1;
                    }
                }
                TenantOp::Compact => t.compact(),
            }
            prop_assert_eq!(t.counts(), model_counts(&model));
            prop_assert!(t.tenants().tracked() <= 2);
        }
        for no in t.in_arrival_order() {
            prop_assert!(model.remove(&no).is_some());
            prop_assert!(t.remove(no).is_some());
            left += 1;
        }
        prop_assert_eq!(left, entered);
        prop_assert_eq!(t.counts(), Counts::default());
        prop_assert!(t.next_ready(Order::Fifo).is_none());
    }
}

/// Within a class, two tenants' tasks alternate (equal weights), each
/// tenant's oldest first; the full queue's victim is the oldest task of the
/// tenant most over its share, for a newcomer of a tenant under it.
#[test]
fn tenants_alternate_and_the_most_over_gives_way() {
    let mut t = TaskTable::default();
    let d = Priority::Default;
    let a: Vec<TaskNo> = (0..4)
        .map(|i| t.enter(pending_of(d, Some(0), i), false))
        .collect();
    let b: Vec<TaskNo> = (0..2)
        .map(|i| t.enter(pending_of(d, Some(1), 10 + i), false))
        .collect();
    let fa = t.flow_of(Some("t0"));
    let fb = t.flow_of(Some("t1"));
    let fc = t.flow_of(Some("t2"));
    // t0 holds 4, t1 2: a newcomer of t1 (3 of weight 1) or t2 displaces
    // t0's oldest; one of t0 does not.
    assert_eq!(t.displaceable(d, fa), None);
    assert_eq!(t.displaceable(d, fb), Some(a[0]));
    assert_eq!(t.displaceable(d, fc), Some(a[0]));
    // A more important class displaces from the lower class's most over.
    assert_eq!(t.displaceable(Priority::Critical, fb), Some(a[0]));
    let order: Vec<TaskNo> = std::iter::from_fn(|| {
        let no = t.next_ready(Order::Fifo)?;
        t.send(no);
        Some(no)
    })
    .collect();
    assert_eq!(order, vec![a[0], b[0], a[1], b[1], a[2], a[3]]);
    let served: Vec<_> = t.tenants().counts().map(|(k, c)| (k, c.served)).collect();
    assert_eq!(
        served,
        vec![(Some("t0"), 4), (Some("t1"), 2), (Some("t2"), 0)]
    );
}

#[test]
fn a_patient_task_counts_while_it_is_held_and_not_after() {
    let mut t = TaskTable::default();
    let mut p = pending(Priority::Default, 0);
    p.patient = true;
    let patient = t.enter(p, false);
    let parked = t.enter(pending(Priority::Default, 1), true);
    assert_eq!(t.counts().patient, 1);
    assert!(t.remove(parked).is_some());
    assert_eq!(t.counts().patient, 1, "the other was not patient");
    assert!(t.remove(patient).is_some());
    assert_eq!(t.counts(), Counts::default());
}

#[test]
fn a_cleared_table_holds_nothing_in_any_state() {
    let mut t = TaskTable::default();
    let ready = t.enter(pending(Priority::Critical, 0), false);
    t.enter(pending(Priority::Default, 1), false);
    let parked = t.enter(pending(Priority::Sheddable, 2), true);
    assert!(t.send(ready).is_some());
    assert_eq!(t.len(), 3);
    t.clear();
    assert_eq!((t.len(), t.is_empty()), (0, true));
    assert_eq!(t.counts(), Counts::default());
    assert_eq!(t.next_ready(Order::Fifo), None);
    assert!(t.get(&ready).is_none() && t.get(&parked).is_none());
}

#[test]
fn the_task_shed_first_is_the_oldest_ready_of_its_class_and_taking_it_moves_on() {
    let mut t = TaskTable::default();
    let d = Priority::Default;
    let a = t.enter(pending(d, 0), false);
    let b = t.enter(pending(d, 1), false);
    let c = t.enter(pending(Priority::Critical, 2), false);
    let (flow, no) = t.sheddable_in(d).expect("two ready");
    assert_eq!(no, a);
    t.take_sheddable(d, flow);
    assert_eq!(t.sheddable_in(d).map(|(_, no)| no), Some(b));
    assert_eq!(
        t.sheddable_in(Priority::Critical).map(|(_, no)| no),
        Some(c)
    );
    assert_eq!(t.sheddable_in(Priority::Sheddable), None);
    // One sent is no longer there to shed.
    assert!(t.send(b).is_some());
    assert_eq!(t.sheddable_in(d), None);
}

#[test]
fn a_newcomer_whose_tenant_would_not_be_less_over_displaces_nothing_of_its_class() {
    let mut t = TaskTable::default();
    let d = Priority::Default;
    let a: Vec<TaskNo> = (0..3)
        .map(|i| t.enter(pending_of(d, Some(0), i), false))
        .collect();
    for i in 0..2 {
        t.enter(pending_of(d, Some(1), 10 + i), false);
    }
    let fb = t.flow_of(Some("t1"));
    let fc = t.flow_of(Some("t2"));
    // t0 holds 3, t1 2: a third of t1 would be as over as t0, not less.
    assert_eq!(t.displaceable(d, fb), None);
    assert_eq!(t.displaceable(d, fc), Some(a[0]));
}

#[test]
fn compaction_drops_the_stale_numbers_once_they_outnumber_the_live_ones() {
    let mut t = TaskTable::default();
    let d = Priority::Default;
    let sent: Vec<TaskNo> = (0..1025).map(|i| t.enter(pending(d, i), false)).collect();
    let kept = t.enter(pending(d, 2000), false);
    for no in &sent {
        assert!(t.send(*no).is_some());
    }
    assert_eq!(t.ready_listed(), 1026, "a sent task's number stays listed");
    // At twice the live ones plus 1024, not yet.
    t.compact();
    assert_eq!(t.ready_listed(), 1026);
    let one_more = t.enter(pending(d, 2001), false);
    assert!(t.send(one_more).is_some());
    t.compact();
    assert_eq!(t.ready_listed(), 1);
    assert_eq!(t.next_ready(Order::Fifo), Some(kept));
}

#[test]
fn compaction_drops_the_stale_numbers_of_the_parked_too() {
    let mut t = TaskTable::default();
    let d = Priority::Default;
    let gone: Vec<TaskNo> = (0..1025).map(|i| t.enter(pending(d, i), true)).collect();
    let last = t.enter(pending(d, 2000), true);
    for no in &gone {
        assert!(t.remove(*no).is_some());
    }
    assert_eq!(
        t.waiting.len(),
        1026,
        "an answered task's number stays listed"
    );
    t.compact();
    assert_eq!(
        t.waiting.len(),
        1026,
        "at twice the live ones plus 1024, not yet"
    );
    let one_more = t.enter(pending(d, 2001), true);
    assert!(t.remove(one_more).is_some());
    t.compact();
    assert_eq!(t.waiting.len(), 1);
    assert!(t.remove(last).is_some());
    t.compact();
    assert!(t.waiting.is_empty());
}
