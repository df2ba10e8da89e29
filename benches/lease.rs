//! A lease's in-process cost next to a task's, in one run: one `submit`
//! answered by an in-process transport (no I/O), one `lease` completed
//! with an outcome, and one `lease` dropped unused. Each is measured from
//! the call to its end as the caller sees it (the task's result; the lease
//! in hand, then its outcome or drop sent), over one service with one
//! node, on one thread.
//!
//! `cargo bench --bench lease` runs them (about a minute).

use std::hint::black_box;
use std::time::Duration;

use actix_dispatch::{Config, Dispatcher, Instant, LeaseOptions, LeaseOutcome, Task};
use criterion::{criterion_group, criterion_main, Criterion};

#[path = "../examples/loadbench/immediate.rs"]
mod immediate;

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(30)
        .without_plots()
}

fn lease_vs_submit(c: &mut Criterion) {
    let sys = actix_rt::System::new();
    let cfg = Config::from_json(
        r#"{"services":[{"name":"svc","mode":"round_robin",
            "endpoints":[{"address":"http://10.0.0.1:8080/","max_concurrent":1000}]}]}"#,
    )
    .expect("bench config");
    let d = sys.block_on(async {
        Dispatcher::builder(cfg)
            .transport(immediate::immediate_factory())
            .without_metrics()
            .start()
            .expect("started")
    });
    let mut g = c.benchmark_group("in_process");
    g.bench_function("submit", |b| {
        b.iter_custom(|n| {
            sys.block_on(async {
                let t0 = Instant::now();
                for _ in 0..n {
                    black_box(d.submit(Task::get("svc", "/x")).await);
                }
                t0.elapsed()
            })
        })
    });
    g.bench_function("lease_complete", |b| {
        b.iter_custom(|n| {
            sys.block_on(async {
                let t0 = Instant::now();
                for _ in 0..n {
                    let lease = d.lease("svc", LeaseOptions::new()).await.expect("lent");
                    lease.complete(LeaseOutcome::Success);
                }
                t0.elapsed()
            })
        })
    });
    g.bench_function("lease_drop", |b| {
        b.iter_custom(|n| {
            sys.block_on(async {
                let t0 = Instant::now();
                for _ in 0..n {
                    drop(d.lease("svc", LeaseOptions::new()).await.expect("lent"));
                }
                t0.elapsed()
            })
        })
    });
    g.finish();
    sys.block_on(async { d.shutdown(Duration::from_secs(1)).await });
}

criterion_group! {
    name = benches;
    config = config();
    targets = lease_vs_submit
}
criterion_main!(benches);
