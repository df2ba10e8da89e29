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
use crate::outcome::{AttemptOutcome, Outcome, Rejection, TaskResult};
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
