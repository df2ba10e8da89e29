//! Breakers shared through Redis: a trip seen by every instance, one probe
//! in half-open, and the `quorum` of reports.

use std::thread;
use std::time::{Duration, Instant};

use actix_dispatch::{Task, TaskResult};

use super::helpers::{config, redis_server, start_instances, submit_many};
use crate::support::Backend;

/// A breaker tripped by instance A keeps B and C off the node from their
/// next refresh; in half-open exactly one instance probes; a probe's
/// success closes it for all.
#[test]
fn a_trip_by_one_instance_stops_the_others_and_one_probe_goes() {
    let Some(srv) = redis_server() else {
        return;
    };
    let good = Backend::start();
    let bad = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"br","timeout":"200ms""#,
        &[&good, &bad],
        r#""balancer":{"refresh_interval":"100ms"},
           "retry":{"max_retries":0},
           "breaker":{"consecutive_failures":3,"open_for":"1s","max_open_for":"4s",
                      "probe_timeout":"1s","half_open_probes":1,"shared":true}"#,
    );
    let inst = start_instances(&cfg, 3);
    bad.set_status(Some(500));
    let rt = actix::System::new();
    // A alone trips the bad node (round robin: every other task).
    let rs: Vec<TaskResult> = rt.block_on(futures::future::join_all(submit_many(&inst[0].d, 12)));
    assert_eq!(rs.len(), 12);
    let trip = Instant::now();
    assert!(
        bad.hits() >= 3,
        "A reached the bad node {} times",
        bad.hits()
    );
    // One refresh interval (100 ms) and a margin for a busy machine.
    thread::sleep(Duration::from_millis(250));
    let before = bad.hits();
    for i in &inst[1..] {
        let rs = rt.block_on(futures::future::join_all(submit_many(&i.d, 20)));
        assert!(
            rs.iter().all(|r| r.is_success()),
            "B and C use the good node"
        );
    }
    assert_eq!(
        bad.hits(),
        before,
        "B and C sent nothing to the tripped node"
    );

    // Half-open (1 s after the trip): every instance keeps sending; exactly
    // one probe reaches the node (it fails: open again for 2 s).
    let until = trip + Duration::from_millis(2_600);
    let mut sent = 0;
    while Instant::now() < until && sent < 1_000 {
        for i in &inst {
            drop(rt.block_on(i.d.submit(Task::get("svc", "/p"))));
        }
        sent += 1;
        thread::sleep(Duration::from_millis(20));
    }
    let probes = bad
        .hit_times()
        .into_iter()
        .filter(|t| *t > trip + Duration::from_millis(500))
        .count();
    assert_eq!(probes, 1, "one probe across the three instances");

    // Healthy again: the next probe (after the doubled open time) succeeds
    // and the node is closed for every instance.
    bad.set_status(None);
    let until = trip + Duration::from_millis(5_500);
    let mut sent = 0;
    while Instant::now() < until && sent < 2_000 {
        for i in &inst {
            drop(rt.block_on(i.d.submit(Task::get("svc", "/p"))));
        }
        sent += 1;
        thread::sleep(Duration::from_millis(20));
    }
    let after = bad.hits() - before;
    assert!(
        after >= 10,
        "the node serves again after a good probe ({after} hits)"
    );
}

/// `quorum: 2`: one instance's trip stays its own; the second report shares
/// it, and the third instance stops sending.
#[test]
fn a_trip_is_shared_only_once_the_quorum_reports_it() {
    let Some(srv) = redis_server() else {
        return;
    };
    let good = Backend::start();
    let bad = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"q","timeout":"200ms""#,
        &[&good, &bad],
        r#""balancer":{"refresh_interval":"100ms"},
           "retry":{"max_retries":0},
           "breaker":{"consecutive_failures":3,"open_for":"3s","shared":true,"quorum":2}"#,
    );
    let inst = start_instances(&cfg, 3);
    bad.set_status(Some(500));
    let rt = actix::System::new();
    let send = |i: usize, n: usize| {
        let rs = rt.block_on(futures::future::join_all(submit_many(&inst[i].d, n)));
        assert_eq!(rs.len(), n);
    };
    // A trips alone: below quorum, B still reaches the node (and trips).
    send(0, 12);
    thread::sleep(Duration::from_millis(250));
    let after_a = bad.hits();
    send(1, 12);
    assert!(bad.hits() >= after_a + 3, "one report is not a quorum");
    // Two reports: shared; C stays off the node from its next refresh.
    thread::sleep(Duration::from_millis(250));
    let after_b = bad.hits();
    send(2, 20);
    assert_eq!(bad.hits(), after_b, "the quorum's trip holds for C");
}

/// Failures reported only through leases trip the breaker for the whole
/// cluster: instance A's leases of the bad endpoint fail, and B, which
/// never called it, sends it nothing from its next refresh.
#[test]
fn failures_reported_through_leases_trip_the_shared_breaker() {
    use actix_dispatch::{ErrorKind, LeaseOptions, LeaseOutcome};
    let Some(srv) = redis_server() else {
        return;
    };
    let good = Backend::start();
    let bad = Backend::start();
    let cfg = config(
        &srv,
        r#""prefix":"bl","timeout":"200ms""#,
        &[&good, &bad],
        r#""balancer":{"refresh_interval":"100ms"},
           "retry":{"max_retries":0},
           "breaker":{"consecutive_failures":3,"open_for":"5s","shared":true}"#,
    );
    let inst = start_instances(&cfg, 2);
    let rt = actix::System::new();
    let mut failed = 0;
    for _ in 0..20 {
        let lease = rt
            .block_on(inst[0].d.lease("svc", LeaseOptions::new()))
            .expect("a lease");
        if lease.address() == bad.url() {
            lease.complete(LeaseOutcome::Failure(ErrorKind::Connect));
            failed += 1;
            if failed == 3 {
                break;
            }
        } else {
            lease.complete(LeaseOutcome::Success);
        }
    }
    assert_eq!(failed, 3, "round robin lent the bad endpoint");
    // One refresh interval (100 ms) and a margin for a busy machine.
    thread::sleep(Duration::from_millis(400));
    let rs = rt.block_on(futures::future::join_all(submit_many(&inst[1].d, 20)));
    assert!(rs.iter().all(|r| r.is_success()), "B uses the good node");
    assert_eq!(
        bad.hits(),
        0,
        "B sent nothing to the endpoint A's leases tripped"
    );
    assert_eq!(good.hits(), 20);
}
