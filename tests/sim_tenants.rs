//! Fair shares between tenants in the deterministic simulator (see
//! `tests/sim`): the real engine on a paused clock against modelled
//! backends, each task naming its tenant.

mod sim;

use std::time::Duration;

use sim::model::{BackendSpec, ServiceTime};
use sim::run::Kind;
use sim::tenants::{per_tenant, run_tenants, table, TenantLoad, TenantScenario};

const DEADLINE: Duration = Duration::from_millis(250);

/// Two backends of 10 workers, 20 ms on average (exponential): 1000
/// tasks a second.
fn backends() -> Vec<BackendSpec> {
    vec![BackendSpec::new(10, ServiceTime::Exp(20.0)); 2]
}
const CAPACITY: f64 = 1000.0;

fn load(names_rates: &[(&str, f64)]) -> Vec<TenantLoad> {
    names_rates
        .iter()
        .map(|&(n, r)| TenantLoad {
            name: n.into(),
            rate: r,
        })
        .collect()
}

/// Ten tenants of equal weight: nine offer 90 % of their share (a tenth of
/// the capacity), one the rest of twice the capacity (13 shares); every
/// task has a 250 ms deadline. With fair shares each
/// well-behaved tenant gets at least 95 % of what it offered in time and
/// the noisy one the rest of the capacity; without (the same arrivals,
/// no tenant named) everyone loses about half.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_noisy_tenant_cannot_take_the_others_capacity() {
    let mut mix: Vec<(String, f64)> = (1..=9)
        .map(|i| (format!("t{i}"), 0.9 * CAPACITY / 10.0))
        .collect();
    mix.push(("noisy".into(), 2.0 * CAPACITY - 9.0 * 0.9 * CAPACITY / 10.0));
    let mix: Vec<(&str, f64)> = mix.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    let mut s = TenantScenario {
        backends: backends(),
        tenants: load(&mix),
        length: Duration::from_secs(6),
        deadline: Some(DEADLINE),
        named: true,
        extra: String::new(),
    };
    // `SIM_SEED=N` runs another seed (the assertions hold for seed 1).
    let seed = std::env::var("SIM_SEED").map_or(1, |s| s.parse().unwrap_or(1));
    let fair = run_tenants(&s, seed).await;
    s.named = false;
    let plain = run_tenants(&s, seed).await;
    let f = per_tenant(&fair.records, 10, s.deadline);
    let p = per_tenant(&plain.records, 10, s.deadline);
    let names: Vec<String> = s.tenants.iter().map(|t| t.name.clone()).collect();
    println!("{}", table(&names, &f, &p));
    // The target: 95 %. The queue kept to the depth its deadlines allow
    // sheds from the tenant most over its share, so the quiet tenants'
    // few waiting tasks stay (this seed: 98.3-99.8 %; over seeds 1 to 8
    // the worst quiet tenant is at 95.4 %, seed 6: a burst of a quiet
    // tenant sometimes holds more tasks than the noisy one at a depth of
    // about 20).
    for (i, t) in f[..9].iter().enumerate() {
        assert!(
            t.share_in_time() >= 0.95,
            "t{}: {t:?}\n{}",
            i + 1,
            table(&names, &f, &p)
        );
    }
    // The noisy tenant gets the rest of the capacity, not more: what the
    // backends serve in time over the run (and the last deadline's worth
    // after it) less what the others got.
    let total_in_time: usize = f.iter().map(|t| t.in_time).sum();
    let well: usize = f[..9].iter().map(|t| t.in_time).sum();
    let capacity = CAPACITY * s.length.as_secs_f64();
    // Exponential service times drawn for about 6000 tasks: their sum
    // strays a few percent (3 standard deviations is 4 %) from the mean's.
    let at_most = 1.04 * CAPACITY * (s.length + DEADLINE).as_secs_f64();
    assert!(
        total_in_time as f64 >= 0.85 * capacity,
        "{total_in_time} of {capacity}"
    );
    assert!((f[9].in_time as f64) <= at_most - well as f64, "{f:?}");
    assert!(
        f[9].in_time as f64 >= 0.85 * capacity - well as f64,
        "{f:?}"
    );
    // Without fair shares the well-behaved tenants lose with the noisy one.
    let worst_fair = f[..9].iter().map(|t| t.share_in_time()).fold(1.0, f64::min);
    let best_plain = p[..9].iter().map(|t| t.share_in_time()).fold(0.0, f64::max);
    assert!(best_plain < worst_fair - 0.2, "{}", table(&names, &f, &p));
    // The stats count per tenant: the noisy one's sheds dwarf the others'.
    let rows = &fair.stats.queue.tenants;
    assert_eq!(rows.len(), 10);
    let noisy = rows
        .iter()
        .find(|r| r.tenant.as_deref() == Some("noisy"))
        .unwrap();
    assert_eq!(noisy.offered, f[9].offered as u64);
    for r in rows.iter().filter(|r| r.tenant.as_deref() != Some("noisy")) {
        assert!(r.shed * 20 < noisy.shed, "{rows:?}");
        assert!(r.served * 100 >= r.offered * 95, "{r:?}");
    }
    assert!(fair.stats.is_balanced() && plain.stats.is_balanced());
    assert!(plain.stats.queue.tenants.is_empty());
}

/// Three backlogged tenants weighted 1:2:4 get the dispatches in those
/// shares (within 5 %), also while the full queue displaces the tasks of
/// the tenant most over its share.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn weights_1_2_4_share_the_dispatches() {
    let s = TenantScenario {
        backends: backends(),
        tenants: load(&[("a", CAPACITY), ("b", CAPACITY), ("c", CAPACITY)]),
        length: Duration::from_secs(4),
        deadline: None,
        named: true,
        extra: r#","queue":{"capacity":2000},"tenants":{"weights":{"a":1,"b":2,"c":4}}"#.into(),
    };
    let run = run_tenants(&s, 2).await;
    // Successes that ended while all three were backlogged (after the
    // first second, before the arrivals stop).
    let mut done = [0usize; 3];
    for r in &run.records {
        let steady = r.done >= Duration::from_secs(1) && r.done < s.length;
        if r.kind == Kind::Success && steady {
            done[r.tenant] += 1;
        }
    }
    let total: usize = done.iter().sum();
    assert!(total as f64 > 0.9 * CAPACITY * 3.0, "{done:?}");
    for (i, w) in [1.0, 2.0, 4.0].into_iter().enumerate() {
        let share = done[i] as f64 / total as f64;
        let want = w / 7.0;
        assert!(
            (share / want - 1.0).abs() < 0.05,
            "{done:?}: {share} vs {want}"
        );
    }
    // The full queue refused or displaced tasks, and every task ended once.
    let q = &run.stats.queue;
    assert!(q.rejected > 0, "{q:?}");
    assert!(run.stats.is_balanced());
    let shed = |name: &str| {
        q.tenants
            .iter()
            .find(|r| r.tenant.as_deref() == Some(name))
            .map_or(0, |r| r.shed)
    };
    // Displaced: the lightest weight's backlog grows fastest relative to
    // its weight, so its tasks give way most.
    assert!(
        shed("a") > shed("b") && shed("a") > shed("c"),
        "{:?}",
        q.tenants
    );
}

/// A hostile caller names 100 000 distinct tenants: the queue tracks at
/// most `max_tracked` of them (the rest share the overflow queue), and
/// every task is still served and answered once.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn a_hundred_thousand_tenant_keys_keep_the_book_bounded() {
    use actix_dispatch::{Dispatcher, Instant, Outcome, Task};
    let s = TenantScenario {
        backends: vec![BackendSpec::new(50, ServiceTime::Fixed(1.0)); 4],
        tenants: Vec::new(),
        length: Duration::from_secs(5),
        deadline: None,
        named: true,
        extra: r#","tenants":{"max_tracked":64}"#.into(),
    };
    let scenario = sim::run::Scenario {
        name: "keys".into(),
        backends: s.backends.clone(),
        arrivals: sim::load::Arrivals::Constant(1.0),
        length: s.length,
        deadline: None,
        critical: 0.0,
        extra: s.extra.clone(),
    };
    let _backends = sim::model::Backends::start(&s.backends, 3);
    let d = Dispatcher::builder(scenario.config(sim::run::Limit::True, 3))
        .transport(sim::model::Backends::factory())
        .start()
        .unwrap();
    let t0 = Instant::now();
    let mut subs = Vec::new();
    let mut most = 0;
    for i in 0..100_000u32 {
        if i % 1000 == 0 {
            tokio::time::sleep_until(t0 + Duration::from_millis(u64::from(i / 20))).await;
            let st = d.stats().await;
            most = most.max(st.services[0].queue.tenants.len());
        }
        subs.push(d.submit(Task::get("sim", "/x").tenant(format!("hostile-{i}"))));
    }
    let mut ok = 0;
    for s in subs {
        ok += usize::from(matches!(s.await.outcome, Outcome::Success(_)));
    }
    let st = d.stats().await.services.remove(0);
    assert_eq!(ok, 100_000);
    assert!(st.is_balanced());
    // 64 tracked tenants and the overflow row, at every look.
    let rows = &st.queue.tenants;
    assert!(most <= 65 && rows.len() <= 65, "{most} {}", rows.len());
    assert_eq!(rows.iter().filter(|r| r.tenant.is_none()).count(), 1);
    let offered: u64 = rows.iter().map(|r| r.offered).sum();
    assert!(offered <= 100_000);
    d.shutdown(Duration::from_secs(1)).await;
}

/// Tasks that all name one tenant are served exactly as tasks naming none:
/// the same fate at the same instant for every task of an overloaded run.
#[actix_rt::test(system = "sim::PausedSystem")]
async fn one_tenant_runs_exactly_as_no_tenant() {
    let mut s = TenantScenario {
        backends: backends(),
        tenants: load(&[("only", 2.0 * CAPACITY)]),
        length: Duration::from_secs(3),
        deadline: Some(DEADLINE),
        named: true,
        extra: String::new(),
    };
    let named = run_tenants(&s, 4).await;
    s.named = false;
    let plain = run_tenants(&s, 4).await;
    assert_eq!(named.records, plain.records);
    let refused = plain
        .records
        .iter()
        .filter(|r| r.kind == Kind::Refused)
        .count();
    assert!(refused > 1000, "the run is overloaded: {refused} refused");
}
