//! The queue's core alone, with no runtime: each input at an instant the
//! test gives, and the output read back exactly.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{QueueCore, State};
use crate::actors::protocol::{
    AttemptEnded, AttemptReport, BalancerTurn, NodeAnswers, NodeId, ReplyTx, Room, Seq, Submit,
    ToQueue,
};
use crate::config::Config;
use crate::outcome::{AttemptOutcome, ErrorKind, Outcome, Rejection, TaskResult};
use crate::task::{Job, Task};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A core for the one service of `json`, started at `t0`.
fn core(json: &str, t0: Instant) -> QueueCore {
    let cfg = Arc::new(Config::from_json(json).unwrap().services.remove(0));
    QueueCore::new(cfg, Default::default(), t0)
}

const ONE: &str = r#"{"services":[{"name":"svc","timeout":"60s",
    "endpoints":[{"address":"http://127.0.0.1:9/"}],
    "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}}]}"#;

/// Task `id` as the dispatcher prepares it at `at`.
fn job(task: Task, id: u64, at: Instant) -> Arc<Job> {
    Arc::new(task.prepare(id, at).unwrap())
}

/// Submits `job` at `at`.
fn submit(q: &mut QueueCore, job: &Arc<Job>, at: Instant) {
    let msg = Submit {
        task: ReplyTx::new(job.clone()),
        wait: false,
    };
    q.submit(msg, at);
}

/// One turn of the balancer's news at `at`.
fn turn(q: &mut QueueCore, news: Vec<ToQueue>, at: Instant) {
    q.on_turn(BalancerTurn(news), at);
}

/// The routes of the output (taken), as their sequence numbers.
fn routes(q: &mut QueueCore) -> Vec<Seq> {
    let turn = std::mem::take(&mut q.output().turn);
    turn.routes.iter().map(|r| r.seq).collect()
}

/// The results of the output (taken), by task id.
fn results(q: &mut QueueCore) -> Vec<(u64, Box<TaskResult>)> {
    q.output()
        .results
        .drain(..)
        .map(|(tx, r)| (tx.job().id, r))
        .collect()
}

/// Attempt `seq` ended at `at` with `status` (and `retry_after`), on node 0.
fn ended(seq: Seq, status: u16, retry_after: Option<Duration>, at: Instant) -> ToQueue {
    ToQueue::Ended(NodeAnswers {
        node: NodeId(0),
        address: "http://127.0.0.1:9/".into(),
        at,
        done: vec![AttemptEnded {
            seq,
            hedge: false,
            report: AttemptReport {
                outcome: AttemptOutcome::Status(status),
                latency: ms(20),
                reply: Some(crate::transport::HttpReply::new(status)),
                retry_after,
                detail: None,
                stream: None,
            },
        }],
    })
}

#[test]
fn a_task_is_routed_against_credit_and_its_answer_is_its_one_result() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let j = job(Task::get("svc", "/x"), 1, t0);
    submit(&mut q, &j, t0);
    assert_eq!(routes(&mut q), vec![], "no credit: nothing is sent");
    assert_eq!(q.stats(t0).queued, 1);

    turn(&mut q, vec![Room::credit(1)], t0 + ms(1));
    let sent = routes(&mut q);
    let no = sent[0].task;
    assert_eq!(sent, vec![Seq { task: no, round: 1 }]);
    assert_eq!(q.tasks.get(&no).map(|p| p.state()), Some(State::InFlight));

    turn(
        &mut q,
        vec![ended(sent[0], 200, None, t0 + ms(30))],
        t0 + ms(31),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 1);
    assert!(r[0].1.is_success(), "{:?}", r[0].1);
    assert_eq!(r[0].1.total, ms(30), "counted to when the attempt ended");
    assert_eq!(r[0].1.attempts.len(), 1);
    assert!(q.output().drained, "nothing held any more");
    let s = q.stats(t0);
    assert_eq!(
        (s.submitted, s.succeeded, s.queued, s.in_flight),
        (1, 1, 0, 0)
    );

    // A late copy of the same answer is stale: no second result.
    turn(
        &mut q,
        vec![ended(sent[0], 200, None, t0 + ms(40))],
        t0 + ms(41),
    );
    assert_eq!(results(&mut q).len(), 0);
    assert_eq!(q.stats(t0).succeeded, 1);
}

#[test]
fn a_failed_attempt_is_retried_after_its_backoff_timer() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let j = job(Task::get("svc", "/x"), 7, t0);
    turn(&mut q, vec![Room::credit(1)], t0);
    submit(&mut q, &j, t0);
    let first = routes(&mut q)[0];

    // A 503 with Retry-After 50 ms: the backoff (at most 1 ms) is raised
    // to it, so the retry is due exactly then.
    let at = t0 + ms(10);
    turn(
        &mut q,
        vec![ended(first, 503, Some(ms(50)), at), Room::credit(1)],
        at,
    );
    assert_eq!(results(&mut q).len(), 0, "retried, not answered");
    assert_eq!(routes(&mut q), vec![]);
    assert_eq!(q.output().wake.take(), Some(at + ms(50)));
    assert_eq!(
        q.tasks.get(&first.task).map(|p| p.state()),
        Some(State::Backoff)
    );
    assert_eq!((q.stats(t0).retried, q.stats(t0).queued), (1, 1));

    // Early: nothing is due.
    q.on_timer(at + ms(49));
    assert_eq!(routes(&mut q), vec![]);
    q.on_timer(at + ms(50));
    let retry = routes(&mut q);
    assert_eq!(
        retry,
        vec![Seq {
            task: first.task,
            round: 2
        }]
    );

    turn(
        &mut q,
        vec![ended(retry[0], 200, None, t0 + ms(80))],
        t0 + ms(80),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    let statuses: Vec<_> = r[0].1.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        statuses,
        vec![AttemptOutcome::Status(503), AttemptOutcome::Status(200)]
    );
    let s = q.stats(t0);
    assert_eq!((s.submitted, s.succeeded, s.retried), (1, 1, 1));
}

#[test]
fn a_task_still_queued_at_its_deadline_is_answered_then() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let j = job(Task::get("svc", "/x").deadline_in(ms(100)), 3, t0);
    submit(&mut q, &j, t0);
    assert_eq!(q.output().wake.take(), Some(t0 + ms(100)), "its deadline");
    q.on_timer(t0 + ms(99));
    assert_eq!(results(&mut q).len(), 0);
    q.on_timer(t0 + ms(100));
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert!(
        matches!(r[0].1.outcome, Outcome::Rejected(Rejection::DeadlinePassed)),
        "{:?}",
        r[0].1.outcome
    );
    assert_eq!(r[0].1.total, ms(100));
    let s = q.stats(t0);
    assert_eq!((s.submitted, s.rejected, s.queued), (1, 1, 0));

    // Credit later sends nothing: the task is gone.
    turn(&mut q, vec![Room::credit(1)], t0 + ms(101));
    assert_eq!(routes(&mut q), vec![]);
}

#[test]
fn a_task_whose_caller_left_is_answered_cancelled_and_never_routed() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let left = job(Task::get("svc", "/x"), 1, t0);
    let stays = job(Task::get("svc", "/y"), 2, t0);
    submit(&mut q, &left, t0);
    submit(&mut q, &stays, t0);
    left.reply.abandon();
    turn(&mut q, vec![Room::credit(2)], t0 + ms(5));
    let sent = routes(&mut q);
    assert_eq!(sent.len(), 1, "only the task still wanted goes");
    assert_eq!(q.tasks.get(&sent[0].task).map(|p| p.job().id), Some(2));
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 1);
    assert!(matches!(
        r[0].1.outcome,
        Outcome::Rejected(Rejection::Cancelled)
    ));
    let s = q.stats(t0);
    assert_eq!((s.cancelled, s.rejected, s.in_flight), (1, 1, 1));
}

#[test]
fn a_full_queue_refuses_a_new_task_at_once() {
    let t0 = Instant::now();
    let mut q = core(
        r#"{"services":[{"name":"svc","endpoints":[{"address":"http://127.0.0.1:9/"}],
            "queue":{"capacity":2}}]}"#,
        t0,
    );
    for id in 1..=3 {
        submit(&mut q, &job(Task::get("svc", "/x"), id, t0), t0 + ms(id));
    }
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 3, "the third finds no room");
    assert!(matches!(
        r[0].1.outcome,
        Outcome::Rejected(Rejection::QueueFull)
    ));
    assert_eq!(
        r[0].1.total,
        ms(3),
        "answered on arrival, 3 ms after submission"
    );
    let s = q.stats(t0);
    assert_eq!(
        (s.submitted, s.rejected, s.queued, s.peak_queued),
        (3, 1, 2, 2)
    );
    assert!(!q.has_room());

    // One is sent: in flight, it no longer counts against the capacity.
    turn(&mut q, vec![Room::credit(1)], t0 + ms(10));
    assert_eq!(routes(&mut q).len(), 1);
    assert!(q.has_room());
    submit(&mut q, &job(Task::get("svc", "/x"), 4, t0), t0 + ms(11));
    assert_eq!(results(&mut q).len(), 0, "the fourth is taken");
    let s = q.stats(t0);
    assert_eq!((s.submitted, s.queued, s.in_flight), (4, 2, 1));
}

#[test]
fn a_panic_recovery_answers_every_task_internal_and_voids_the_timers() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    for id in 1..=2 {
        submit(
            &mut q,
            &job(Task::get("svc", "/x").deadline_in(ms(100)), id, t0),
            t0,
        );
    }
    assert!(q.output().wake.is_some());
    q.recover("a bug");
    let r = results(&mut q);
    let ids: Vec<_> = r.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![1, 2], "in arrival order");
    assert!(r
        .iter()
        .all(|(_, r)| matches!(r.outcome, Outcome::Rejected(Rejection::Internal(_)))));
    let out = q.output();
    assert_eq!((out.wake, out.disarm, out.drained), (None, true, true));
    assert!(q.is_empty());
}

/// Attempt `seq` (the hedge if `hedge`) ended at `at` on node `node` with
/// `outcome` (a reply if it is a status).
fn ended_on(node: u32, seq: Seq, hedge: bool, outcome: AttemptOutcome, at: Instant) -> ToQueue {
    let reply = match outcome {
        AttemptOutcome::Status(status) => Some(crate::transport::HttpReply {
            status,
            headers: Default::default(),
            body: Default::default(),
            protocol: None,
        }),
        AttemptOutcome::Error(_) => None,
    };
    ToQueue::Ended(NodeAnswers {
        node: NodeId(node),
        address: format!("http://node{node}/").into(),
        at,
        done: vec![AttemptEnded {
            seq,
            hedge,
            report: AttemptReport {
                outcome,
                latency: ms(20),
                reply,
                retry_after: None,
                detail: None,
                stream: None,
            },
        }],
    })
}

/// The routes of the output (taken), whole.
fn full_routes(q: &mut QueueCore) -> Vec<crate::actors::protocol::Route> {
    std::mem::take(&mut q.output().turn.routes)
}

/// Each attempt of a result as (node, outcome, hedge, latency).
fn attempts_of(r: &TaskResult) -> Vec<(String, AttemptOutcome, bool, Duration)> {
    r.attempts
        .iter()
        .map(|a| (a.node.to_string(), a.outcome, a.hedge, a.latency))
        .collect()
}

#[test]
fn a_late_answer_of_an_earlier_round_is_stale_in_the_backoff_and_in_the_retry() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let j = job(Task::get("svc", "/x"), 7, t0);
    turn(&mut q, vec![Room::credit(1)], t0);
    submit(&mut q, &j, t0);
    let first = routes(&mut q)[0];
    let at = t0 + ms(10);
    turn(
        &mut q,
        vec![ended(first, 503, Some(ms(50)), at), Room::credit(1)],
        at,
    );
    // A copy of the first answer while the task backs off.
    turn(
        &mut q,
        vec![ended(first, 200, None, at + ms(5))],
        at + ms(5),
    );
    assert_eq!(results(&mut q).len(), 0, "stale: the task backs off");
    q.on_timer(at + ms(50));
    let retry = routes(&mut q);
    assert_eq!(
        retry,
        vec![Seq {
            task: first.task,
            round: 2
        }]
    );
    // A copy of the first round's answer while the second is out.
    turn(
        &mut q,
        vec![ended(first, 200, None, at + ms(55))],
        at + ms(55),
    );
    assert_eq!(results(&mut q).len(), 0, "stale: round 2 is out");
    let p = q.tasks.get(&first.task).expect("held");
    assert_eq!(
        (p.state(), p.outstanding, p.attempts.len()),
        (State::InFlight, 1, 1)
    );
    turn(
        &mut q,
        vec![ended(retry[0], 200, None, at + ms(70))],
        at + ms(70),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    let statuses: Vec<_> = r[0].1.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        statuses,
        vec![AttemptOutcome::Status(503), AttemptOutcome::Status(200)]
    );
    let s = q.stats(t0);
    assert_eq!(
        (s.submitted, s.succeeded, s.retried, s.in_flight),
        (1, 1, 1, 0)
    );
}

#[test]
fn a_failed_node_is_avoided_by_the_retry_and_one_that_failed_its_handshake_excluded() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    turn(&mut q, vec![Room::credit(2)], t0);
    submit(&mut q, &job(Task::get("svc", "/a"), 1, t0), t0);
    submit(&mut q, &job(Task::get("svc", "/b"), 2, t0), t0);
    let sent = routes(&mut q);
    assert_eq!(sent.len(), 2);
    let at = t0 + ms(10);
    turn(
        &mut q,
        vec![
            ended_on(3, sent[0], false, AttemptOutcome::Status(503), at),
            ended_on(4, sent[1], false, AttemptOutcome::Error(ErrorKind::Tls), at),
            Room::credit(2),
        ],
        at,
    );
    // Both backoffs are at most 1 ms.
    q.on_timer(at + ms(2));
    let mut retries: Vec<_> = full_routes(&mut q)
        .into_iter()
        .map(|r| (r.seq, r.avoid, r.exclude, r.hedge))
        .collect();
    // Each goes back to the front when its (jittered) backoff ends.
    retries.sort_by_key(|r| r.0);
    assert_eq!(
        retries,
        vec![
            (
                Seq {
                    task: sent[0].task,
                    round: 2
                },
                vec![NodeId(3)],
                vec![],
                false
            ),
            (
                Seq {
                    task: sent[1].task,
                    round: 2
                },
                vec![NodeId(4)],
                vec![NodeId(4)],
                false
            ),
        ]
    );
}

#[test]
fn a_failed_answer_for_a_caller_who_left_ends_the_task_cancelled_and_a_success_still_answers() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    turn(&mut q, vec![Room::credit(2)], t0);
    let fails = job(Task::get("svc", "/a"), 1, t0);
    let works = job(Task::get("svc", "/b"), 2, t0);
    submit(&mut q, &fails, t0);
    submit(&mut q, &works, t0);
    let sent = routes(&mut q);
    fails.reply.abandon();
    works.reply.abandon();
    let at = t0 + ms(10);
    turn(
        &mut q,
        vec![
            ended(sent[0], 503, None, at),
            ended(sent[1], 200, None, at),
            Room::credit(2),
        ],
        at,
    );
    assert_eq!(routes(&mut q), vec![], "no retry for a caller who left");
    let r = results(&mut q);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].0, 1);
    assert!(matches!(
        r[0].1.outcome,
        Outcome::Rejected(Rejection::Cancelled)
    ));
    assert_eq!(r[1].0, 2);
    assert!(r[1].1.is_success(), "{:?}", r[1].1.outcome);
    let s = q.stats(t0);
    assert_eq!(
        (s.cancelled, s.rejected, s.succeeded, s.retried, s.in_flight),
        (1, 1, 1, 0, 0)
    );
}

#[test]
fn latencies_are_kept_only_where_a_deadline_an_slo_or_a_percentile_hedge_reads_them() {
    let t0 = Instant::now();
    for (k, (json, deadline, kept)) in [
        (ONE.to_string(), false, false),
        (ONE.to_string(), true, true),
        (
            ONE.replace(
                r#""timeout":"60s","#,
                r#""timeout":"60s","queue":{"slo":"1s"},"#,
            ),
            false,
            true,
        ),
        (
            ONE.replace(
                r#""timeout":"60s","#,
                r#""timeout":"60s","hedge":{"percentile":90},"#,
            ),
            false,
            true,
        ),
        (
            ONE.replace(
                r#""timeout":"60s","#,
                r#""timeout":"60s","hedge":{"after":"5s"},"#,
            ),
            false,
            false,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut q = core(&json, t0);
        // The window's mean shows once 16 answers are in.
        for id in 0..16 {
            let mut task = Task::get("svc", "/x");
            if deadline {
                task = task.deadline_in(ms(1000));
            }
            let at = t0 + ms(30 * id);
            turn(&mut q, vec![Room::credit(1)], at);
            submit(&mut q, &job(task, id, at), at);
            let sent = routes(&mut q);
            turn(
                &mut q,
                vec![ended(sent[0], 200, None, at + ms(20))],
                at + ms(20),
            );
            assert_eq!(results(&mut q).len(), 1);
        }
        let mean = q.latencies.mean();
        assert_eq!(mean, kept.then_some(ms(20)), "case {k}");
    }
}

const HEDGED: &str = r#"{"services":[{"name":"svc","timeout":"60s",
    "endpoints":[{"address":"http://127.0.0.1:9/"}],"hedge":{"after":"20ms"},
    "retry":{"max_retries":1,"backoff_base":"1ms","backoff_max":"1ms"}}]}"#;

/// A hedged race of one task in `q` at `t0`: its seq and job, the hedge
/// sent at `t0 + 20 ms` and placed (first on node 1, hedge on node 2).
fn race(q: &mut QueueCore, task: Task, t0: Instant) -> (Seq, Arc<Job>) {
    turn(q, vec![Room::credit(2)], t0);
    let j = job(task, 1, t0);
    submit(q, &j, t0);
    let seq = routes(q)[0];
    assert_eq!(
        q.output().wake.take(),
        Some(t0 + ms(20)),
        "the hedge's timer"
    );
    q.on_timer(t0 + ms(20));
    let hedge: Vec<_> = full_routes(q)
        .into_iter()
        .map(|r| (r.seq, r.hedge))
        .collect();
    assert_eq!(hedge, vec![(seq, true)]);
    assert_eq!(q.stats(t0).hedged, 1);
    let placed = crate::actors::protocol::Placed {
        seq,
        first: "http://node1/".into(),
        hedge: "http://node2/".into(),
    };
    turn(q, vec![ToQueue::Placed(placed)], t0 + ms(21));
    (seq, j)
}

#[test]
fn a_hedged_task_answered_first_lists_its_twin_cancelled_and_tells_its_node() {
    let t0 = Instant::now();
    let mut q = core(HEDGED, t0);
    let (seq, _job) = race(&mut q, Task::get("svc", "/x"), t0);
    turn(
        &mut q,
        vec![ended_on(
            1,
            seq,
            false,
            AttemptOutcome::Status(200),
            t0 + ms(30),
        )],
        t0 + ms(30),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert!(r[0].1.is_success());
    let cancelled = AttemptOutcome::Error(ErrorKind::Cancelled);
    assert_eq!(
        attempts_of(&r[0].1),
        vec![
            (
                "http://node1/".into(),
                AttemptOutcome::Status(200),
                false,
                ms(20)
            ),
            ("http://node2/".into(), cancelled, true, ms(10)),
        ]
    );
    assert_eq!(std::mem::take(&mut q.output().turn.cancels), vec![seq]);
    // The hedge's own answer comes too late: no second result.
    turn(
        &mut q,
        vec![ended_on(
            2,
            seq,
            true,
            AttemptOutcome::Status(200),
            t0 + ms(35),
        )],
        t0 + ms(35),
    );
    assert_eq!(results(&mut q).len(), 0);
    assert_eq!(q.stats(t0).succeeded, 1);
}

#[test]
fn a_race_whose_both_attempts_ended_cancels_nothing() {
    let t0 = Instant::now();
    let mut q = core(HEDGED, t0);
    let (seq, _job) = race(&mut q, Task::get("svc", "/x"), t0);
    turn(
        &mut q,
        vec![ended_on(
            2,
            seq,
            true,
            AttemptOutcome::Status(503),
            t0 + ms(25),
        )],
        t0 + ms(25),
    );
    assert_eq!(results(&mut q).len(), 0, "the first is still out");
    turn(
        &mut q,
        vec![ended_on(
            1,
            seq,
            false,
            AttemptOutcome::Status(200),
            t0 + ms(30),
        )],
        t0 + ms(30),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(
        attempts_of(&r[0].1),
        vec![
            (
                "http://node2/".into(),
                AttemptOutcome::Status(503),
                true,
                ms(20)
            ),
            (
                "http://node1/".into(),
                AttemptOutcome::Status(200),
                false,
                ms(20)
            ),
        ]
    );
    assert_eq!(q.output().turn.cancels, vec![], "nothing is out");

    // A task of the same service answered before its hedge: nothing to
    // cancel either.
    turn(&mut q, vec![Room::credit(1)], t0 + ms(40));
    submit(&mut q, &job(Task::get("svc", "/y"), 2, t0), t0 + ms(40));
    let sent = routes(&mut q);
    turn(
        &mut q,
        vec![ended(sent[0], 200, None, t0 + ms(45))],
        t0 + ms(45),
    );
    assert_eq!(results(&mut q).len(), 1);
    assert_eq!(q.output().turn.cancels, vec![]);
}

#[test]
fn a_caller_who_left_when_the_hedge_failed_gets_the_first_attempt_listed_cancelled() {
    let t0 = Instant::now();
    let mut q = core(HEDGED, t0);
    let (seq, j) = race(&mut q, Task::get("svc", "/x"), t0);
    j.reply.abandon();
    turn(
        &mut q,
        vec![ended_on(
            2,
            seq,
            true,
            AttemptOutcome::Status(503),
            t0 + ms(25),
        )],
        t0 + ms(25),
    );
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert!(matches!(
        r[0].1.outcome,
        Outcome::Rejected(Rejection::Cancelled)
    ));
    let cancelled = AttemptOutcome::Error(ErrorKind::Cancelled);
    assert_eq!(
        attempts_of(&r[0].1),
        vec![
            (
                "http://node2/".into(),
                AttemptOutcome::Status(503),
                true,
                ms(20)
            ),
            ("http://node1/".into(), cancelled, false, ms(25)),
        ]
    );
    assert_eq!(std::mem::take(&mut q.output().turn.cancels), vec![seq]);
    let s = q.stats(t0);
    assert_eq!((s.cancelled, s.in_flight, s.queued), (1, 0, 0));
}

#[test]
fn a_task_tried_once_and_still_held_at_its_deadline_fails_with_its_last_answer() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    turn(&mut q, vec![Room::credit(1)], t0);
    submit(
        &mut q,
        &job(Task::get("svc", "/x").deadline_in(ms(100)), 1, t0),
        t0,
    );
    let sent = routes(&mut q);
    turn(
        &mut q,
        vec![ended(sent[0], 503, None, t0 + ms(10))],
        t0 + ms(10),
    );
    // Its backoff (at most 1 ms) ends; no credit: it waits, ready.
    q.on_timer(t0 + ms(12));
    assert_eq!(routes(&mut q), vec![]);
    assert_eq!(
        q.tasks.get(&sent[0].task).map(|p| p.state()),
        Some(State::Ready)
    );
    q.on_timer(t0 + ms(100));
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert!(
        matches!(
            &r[0].1.outcome,
            Outcome::Failure(f) if f.reason == crate::outcome::FailReason::DeadlineExceeded
                && f.last == Some(AttemptOutcome::Status(503))
                && f.response.as_ref().map(|r| r.status) == Some(503)
        ),
        "{:?}",
        r[0].1.outcome
    );
    let s = q.stats(t0);
    assert_eq!((s.failed, s.queued, s.retried), (1, 0, 1));
}

#[test]
fn a_gate_closed_by_the_balancer_answers_the_ready_and_the_parked_and_refuses_new_ones() {
    use crate::actors::protocol::Gate;
    let t0 = Instant::now();
    let mut q = core(
        r#"{"services":[{"name":"svc","endpoints":[{"address":"http://127.0.0.1:9/"}],
            "queue":{"capacity":1,"on_full":"wait"}}]}"#,
        t0,
    );
    submit(&mut q, &job(Task::get("svc", "/x"), 1, t0), t0);
    submit(&mut q, &job(Task::get("svc", "/y"), 2, t0), t0);
    let s = q.stats(t0);
    assert_eq!((s.queued, s.waiting), (1, 1), "one ready, one parked");
    let closed = Room {
        credit: 0,
        reserve: 0,
        gate: Some(Gate::Reject(Rejection::ShuttingDown)),
        room_latency: None,
    };
    turn(&mut q, vec![ToQueue::Room(closed)], t0 + ms(5));
    let r = results(&mut q);
    let ids: Vec<_> = r.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, vec![1, 2]);
    assert!(r
        .iter()
        .all(|(_, r)| matches!(r.outcome, Outcome::Rejected(Rejection::ShuttingDown))));
    submit(&mut q, &job(Task::get("svc", "/z"), 3, t0), t0 + ms(6));
    assert_eq!(results(&mut q).len(), 1, "refused at once");
    let s = q.stats(t0);
    assert_eq!((s.submitted, s.rejected, s.queued, s.waiting), (3, 3, 0, 0));
    assert!(q.output().drained);
}

/// Credit and what the quickest room takes, as the balancer states them.
fn room(credit: usize, latency: Option<Duration>) -> ToQueue {
    ToQueue::Room(Room {
        credit,
        reserve: 0,
        gate: None,
        room_latency: latency,
    })
}

#[test]
fn a_task_with_less_time_left_than_the_quickest_room_takes_waits_for_a_quicker_one() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let due = |t| Task::get("svc", "/x").deadline_in(t);
    // Task 1 is due at 100 ms, task 2 at 140 ms, task 3 at 95 ms.
    submit(&mut q, &job(due(ms(100)), 1, t0), t0);
    submit(&mut q, &job(due(ms(100)), 2, t0 + ms(40)), t0 + ms(40));
    submit(&mut q, &job(due(ms(90)), 3, t0 + ms(5)), t0 + ms(45));
    // At 50 ms the quickest room takes 60 ms: only task 2 ends in time;
    // tasks 1 and 3 are held, not sent to wait inside a backend.
    turn(&mut q, vec![room(3, Some(ms(60)))], t0 + ms(50));
    let sent = full_routes(&mut q);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].job.id, 2);
    assert_eq!(
        sent[0].due,
        Some(t0 + ms(140)),
        "the route carries its due time"
    );
    assert_eq!(q.stats(t0).queued, 2, "held tasks are still queued");
    // A quicker room: task 1 (48 ms left) goes; task 3 (43 ms) waits on.
    turn(&mut q, vec![room(0, Some(ms(45)))], t0 + ms(52));
    let ids: Vec<u64> = full_routes(&mut q).iter().map(|r| r.job.id).collect();
    assert_eq!(ids, vec![1]);
    turn(&mut q, vec![room(0, None)], t0 + ms(53));
    let ids: Vec<u64> = full_routes(&mut q).iter().map(|r| r.job.id).collect();
    assert_eq!(ids, vec![3], "an idle room: no figure, nothing held");
    assert!(results(&mut q).is_empty(), "nothing shed");
}

#[test]
fn a_held_task_is_answered_at_its_deadline_and_by_a_closing_gate_and_never_sent() {
    use crate::actors::protocol::Gate;
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let due = |t| Task::get("svc", "/x").deadline_in(t);
    submit(&mut q, &job(due(ms(100)), 1, t0), t0);
    submit(&mut q, &job(due(ms(200)), 2, t0), t0);
    // No room ends either in time: both held, the credit kept.
    turn(&mut q, vec![room(2, Some(ms(250)))], t0 + ms(10));
    assert!(full_routes(&mut q).is_empty());
    q.on_timer(t0 + ms(100));
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 1);
    assert!(
        matches!(r[0].1.outcome, Outcome::Rejected(Rejection::DeadlinePassed)),
        "{:?}",
        r[0].1.outcome
    );
    assert!(full_routes(&mut q).is_empty(), "never sent");
    let closed = Room {
        credit: 0,
        reserve: 0,
        gate: Some(Gate::Reject(Rejection::ShuttingDown)),
        room_latency: Some(ms(250)),
    };
    turn(&mut q, vec![ToQueue::Room(closed)], t0 + ms(120));
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 2);
    assert!(matches!(
        r[0].1.outcome,
        Outcome::Rejected(Rejection::ShuttingDown)
    ));
    let s = q.stats(t0);
    assert_eq!((s.submitted, s.rejected, s.queued), (2, 2, 0));
    assert!(q.output().drained);
}

#[test]
fn a_task_without_a_due_time_is_never_held() {
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    submit(&mut q, &job(Task::get("svc", "/x"), 1, t0), t0);
    turn(
        &mut q,
        vec![room(1, Some(Duration::from_secs(3600)))],
        t0 + ms(1),
    );
    let sent = full_routes(&mut q);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].due, None);
}

#[test]
fn a_held_task_past_its_slo_is_shed_with_no_credit_in_hand() {
    let t0 = Instant::now();
    let mut q = core(
        r#"{"services":[{"name":"svc","endpoints":[{"address":"http://127.0.0.1:9/"}],
            "queue":{"slo":"100ms"}}]}"#,
        t0,
    );
    submit(&mut q, &job(Task::get("svc", "/x"), 1, t0), t0);
    submit(
        &mut q,
        &job(Task::get("svc", "/y"), 2, t0 + ms(60)),
        t0 + ms(60),
    );
    // One credit, a room that takes 50 ms: task 1 (due at 100 ms) waits,
    // task 2 (due at 160 ms) takes the credit.
    turn(&mut q, vec![room(1, Some(ms(50)))], t0 + ms(70));
    let ids: Vec<u64> = full_routes(&mut q).iter().map(|r| r.job.id).collect();
    assert_eq!(ids, vec![2]);
    // Past its due time, with no credit: shed by the turn, never sent.
    turn(&mut q, vec![room(0, Some(ms(50)))], t0 + ms(101));
    assert!(full_routes(&mut q).is_empty());
    let r = results(&mut q);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, 1);
    assert!(
        matches!(
            r[0].1.outcome,
            Outcome::Rejected(Rejection::Overloaded { .. })
        ),
        "{:?}",
        r[0].1.outcome
    );
}

/// Intake counts the tasks ahead of a new one in the order the queue will
/// serve it: while a caller waits on purpose (a patient task), the queue
/// serves in order even in a standing overload, so a new task that the
/// backlog ahead makes late is refused at once, not admitted as newest
/// first would serve it and shed when its time runs out.
#[test]
fn intake_counts_the_order_the_queue_serves_while_a_patient_task_waits() {
    use crate::algo::priority::Priority;
    // Three tasks due in 50 ms a millisecond, one sent every other
    // millisecond: 200 ms of a standing overload (newest first from
    // 100 ms without a patient task), then one more task; `patient` adds
    // a sheddable task whose caller waits, kept ready below the default
    // ones.
    let refused_last = |patient: bool| {
        let t0 = Instant::now();
        let mut q = core(ONE, t0);
        if patient {
            let j = job(Task::get("svc", "/p").priority(Priority::Sheddable), 0, t0);
            q.submit(
                Submit {
                    task: ReplyTx::new(j),
                    wait: true,
                },
                t0,
            );
        }
        let due = || Task::get("svc", "/x").deadline_in(ms(50));
        let mut id = 1;
        for t in 0..200 {
            let at = t0 + ms(t);
            for _ in 0..3 {
                submit(&mut q, &job(due(), id, at), at);
                id += 1;
            }
            turn(&mut q, vec![room(usize::from(t % 2 == 0), None)], at);
            routes(&mut q);
            results(&mut q);
        }
        let at = t0 + ms(200);
        let before = q.stats(at).shed_at_intake;
        submit(&mut q, &job(due(), id, at), at);
        q.stats(at).shed_at_intake > before
    };
    assert!(!refused_last(false), "newest first: nothing ahead of it");
    assert!(
        refused_last(true),
        "in order: the backlog ahead makes it late"
    );
}

/// The depth that keeps a standing queue shallow sheds from the oldest
/// end, which only newest first leaves unserved: while a caller waits on
/// purpose the queue serves in order, so the depth does not apply, and a
/// task leaves the queue unserved only once its time has run out (the
/// oldest, shed by the depth, were the next to go).
#[test]
fn the_depth_sheds_nothing_the_queue_serves_in_order_while_a_patient_task_waits() {
    use std::collections::HashMap;

    use crate::algo::priority::Priority;
    // As above: three tasks due in 50 ms a millisecond, one sent every
    // other millisecond, for 300 ms (the depth from three windows of
    // standing, 150 ms), beside a patient task: a critical one, sent at
    // once and never answered here (in flight, its caller still waits),
    // which leaves the default class to the depth (the top class of
    // several is never shed by it).
    let t0 = Instant::now();
    let mut q = core(ONE, t0);
    let j = job(Task::get("svc", "/p").priority(Priority::Critical), 0, t0);
    q.submit(
        Submit {
            task: ReplyTx::new(j),
            wait: true,
        },
        t0,
    );
    let (mut submitted, mut early, mut shed) = (HashMap::new(), Vec::new(), 0);
    // Tasks answered `Overloaded` by the queue (not refused at intake),
    // and those of them that had time left.
    let mut check =
        |q: &mut QueueCore, intake: Option<u64>, at: Instant, subm: &HashMap<u64, Instant>| {
            for (id, r) in results(q) {
                let over = matches!(r.outcome, Outcome::Rejected(Rejection::Overloaded { .. }));
                if over && Some(id) != intake {
                    shed += 1;
                    if at - subm[&id] < ms(50) {
                        early.push((id, at - subm[&id]));
                    }
                }
            }
        };
    let mut id = 1;
    for t in 0..300 {
        let at = t0 + ms(t);
        for _ in 0..3 {
            let before = q.stats(at).shed_at_intake;
            submit(
                &mut q,
                &job(Task::get("svc", "/x").deadline_in(ms(50)), id, at),
                at,
            );
            submitted.insert(id, at);
            let refused = q.stats(at).shed_at_intake > before;
            check(&mut q, refused.then_some(id), at, &submitted);
            id += 1;
        }
        turn(&mut q, vec![room(usize::from(t % 2 == 0), None)], at);
        routes(&mut q);
        check(&mut q, None, at, &submitted);
    }
    assert!(shed > 0, "the queue sheds what runs out of time");
    assert!(early.is_empty(), "shed with time left: {early:?}");
}
