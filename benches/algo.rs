//! Micro benchmarks of the pure core: one pick of every strategy at pool
//! sizes 3, 100 and 1000, breaker admit/record, token-bucket acquire and the
//! peak-EWMA update.
//!
//! `cargo bench --features internals --bench algo` runs them (a few
//! minutes; the unstable feature `internals` makes the algorithms public for
//! them); then `cargo run --release --example loadbench -- micro` turns
//! criterion's estimates into `bench/results/micro.json` and a table checked
//! against the targets (round robin and p2c under 100 ns per pick at 1000 nodes, smooth
//! weighted and least load under 10 ns per node, breaker and bucket under
//! 50 ns). `learned_limit` feeds one learned limit 20 000 answers of a
//! modelled bimodal backend (per answer: its windows, fits and probes
//! amortised). `ready_lists` compares a push and a pop of the queue's ready
//! lists without tenants (`ClassQueues`) against the tenants' fair lists
//! with one tenant and with ten (`FairClasses`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::Duration;

use actix_dispatch::algo::breaker::{Breaker, BreakerConfig, CallOutcome};
use actix_dispatch::algo::concurrency::{LearnedLimit, LearnedLimitConfig, SampleKind};
use actix_dispatch::algo::ewma::PeakEwma;
use actix_dispatch::algo::fair::FairClasses;
use actix_dispatch::algo::limiter::TokenBucket;
use actix_dispatch::algo::priority::{ClassQueues, Order, Priority, PriorityConfig};
use actix_dispatch::algo::strategy::{
    hash_key, Candidate, ConsistentHash, LeastLoad, LeastLoadWeights, Member, P2c, RoundRobin,
    SmoothWeighted, Strategy,
};
use actix_dispatch::Instant;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

/// Pool sizes of the strategy benchmarks.
const SIZES: [usize; 3] = [3, 100, 1000];

/// Short measurement so that the whole `cargo bench` takes a few minutes.
fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(30)
        .without_plots()
}

/// One of each strategy, its random draws seeded.
fn each() -> [Box<dyn Strategy>; 5] {
    [
        Box::new(RoundRobin::new()),
        Box::new(SmoothWeighted::new()),
        Box::new(LeastLoad::new(LeastLoadWeights::default())),
        Box::new(P2c::with_seed(42)),
        Box::new(ConsistentHash::with_seed(42)),
    ]
}

/// A small deterministic generator (xorshift), so every run sees the same pool.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` members of weights 1..=5 and their candidates, every one eligible,
/// with varied load so that the scoring strategies have real work to do.
fn pool(n: usize) -> (Vec<Member>, Vec<Candidate>) {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    let mut members = Vec::with_capacity(n);
    let mut cands = Vec::with_capacity(n);
    for i in 0..n {
        let weight = 1 + g.below(5) as u32;
        members.push(Member {
            key: format!("http://10.0.{}.{}:8080/", i / 250, i % 250),
            weight,
        });
        cands.push(Candidate {
            eligible: true,
            weight,
            in_flight: g.below(16) as u32,
            max_concurrent: 64,
            latency_ewma: 0.005 + g.below(1000) as f64 * 1e-5,
            error_rate: g.below(10) as f64 * 0.01,
            rtt_estimate: 0.005 + g.below(1000) as f64 * 1e-5,
        });
    }
    (members, cands)
}

fn strategies(c: &mut Criterion) {
    let keys: Vec<u64> = (0..1024).map(|i| hash_key(&format!("user-{i}"))).collect();
    for name in each().map(|s| s.name()) {
        let mut group = c.benchmark_group(format!("pick/{name}"));
        for n in SIZES {
            let (members, cands) = pool(n);
            let mut s = each()
                .into_iter()
                .find(|s| s.name() == name)
                .expect("one strategy of each name");
            s.rebuild(&members);
            let mut k = 0usize;
            group.bench_with_input(BenchmarkId::from_parameter(n), &cands, |b, cands| {
                b.iter(|| {
                    // Only consistent hashing reads the affinity; the others
                    // ignore it, so passing one costs them nothing.
                    k = (k + 1) & 1023;
                    black_box(s.pick(black_box(cands), Some(keys[k])))
                })
            });
        }
        group.finish();
    }
}

fn breaker(c: &mut Criterion) {
    let mut group = c.benchmark_group("breaker");
    let t0 = Instant::now();
    let mut b = Breaker::new(BreakerConfig::default());
    group.bench_function("admit", |bench| {
        bench.iter(|| black_box(b.admit(black_box(t0))))
    });
    let mut b = Breaker::new(BreakerConfig::default());
    let mut i = 0u32;
    group.bench_function("admit_record", |bench| {
        bench.iter(|| {
            // One failure in 16: the sliding window and the consecutive
            // counter both move, but the breaker never trips.
            i = i.wrapping_add(1);
            let outcome = if i % 16 == 0 {
                CallOutcome::Failure
            } else {
                CallOutcome::Success
            };
            let permit = b.admit(t0).expect("closed");
            black_box(b.record(permit, outcome, Duration::from_millis(3), black_box(t0)))
        })
    });
    group.finish();
}

fn bucket(c: &mut Criterion) {
    let mut group = c.benchmark_group("bucket");
    let t0 = Instant::now();
    // 1e9 tokens/s: with `now` moving 1 µs per call, every acquire succeeds.
    let mut ok = TokenBucket::new(1e9, 100, t0);
    let mut now = t0;
    group.bench_function("acquire", |b| {
        b.iter(|| {
            now += Duration::from_micros(1);
            black_box(ok.try_acquire(black_box(now)))
        })
    });
    // An empty bucket at a fixed instant: every call is refused.
    let mut empty = TokenBucket::new(1.0, 1, t0);
    let _ = empty.try_acquire(t0);
    group.bench_function("refused", |b| {
        b.iter(|| black_box(empty.try_acquire(black_box(t0))))
    });
    group.finish();
}

fn ewma(c: &mut Criterion) {
    let mut group = c.benchmark_group("peak_ewma");
    let t0 = Instant::now();
    let mut e = PeakEwma::new(Duration::from_millis(30), Duration::from_secs(10), t0);
    let mut now = t0;
    let mut i = 0u64;
    group.bench_function("observe", |b| {
        b.iter(|| {
            // Mostly samples below the estimate (the exp() decay path), one
            // peak in eight.
            i += 1;
            now += Duration::from_micros(50);
            let rtt = Duration::from_micros(if i % 8 == 0 { 40_000 } else { 5_000 + i % 1000 });
            e.observe(black_box(rtt), black_box(now));
            black_box(e.get_secs())
        })
    });
    group.finish();
}

/// One push and one pop of the ready lists, 1000 tasks deep, in the
/// `default` class: the plain class lists, the fair lists with every task
/// of one tenant, and with ten tenants in turn.
fn ready_lists(c: &mut Criterion) {
    let mut group = c.benchmark_group("ready_lists");
    let depth = 1000u64;
    let mut plain = ClassQueues::new(PriorityConfig::default());
    for i in 0..depth {
        plain.push(Priority::Default, i);
    }
    let mut i = depth;
    group.bench_function("class_lists", |b| {
        b.iter(|| {
            i += 1;
            plain.push(Priority::Default, black_box(i));
            black_box(plain.pop_live(Order::Fifo, |_| true))
        })
    });
    for tenants in [1u16, 10] {
        let mut fair = FairClasses::new(&PriorityConfig::default());
        for i in 0..depth {
            fair.push(Priority::Default, (i % u64::from(tenants)) as u16, i, false);
        }
        let mut i = depth;
        group.bench_function(BenchmarkId::new("fair_lists", tenants), |b| {
            b.iter(|| {
                i += 1;
                let f = (i % u64::from(tenants)) as u16;
                fair.push(Priority::Default, f, black_box(i), false);
                let got = fair.pop_live_within(Order::Fifo, Priority::Sheddable, |_| true);
                if let Some((p, f, _)) = got {
                    fair.unlive(p, f);
                }
                black_box(got)
            })
        });
    }
    group.finish();
}

/// Answers of one learned limit (`max_concurrent: "auto"`) in front of a
/// modelled backend of 4 workers, its service bimodal (90 % at 10 ms, 10 %
/// at 110 ms), under a backlog that always fills the limit: what the limit
/// costs per answer (`on_send` and `on_sample`, the windows' fits and
/// probes amortised over them), the model's own queue included.
fn learned_limit(c: &mut Criterion) {
    const ANSWERS: u64 = 20_000;
    let mut group = c.benchmark_group("learned_limit");
    group.throughput(criterion::Throughput::Elements(ANSWERS));
    group.bench_function("bimodal_backlog", |b| {
        b.iter(|| {
            let t0 = Instant::now();
            let mut l = LearnedLimit::with_seed(LearnedLimitConfig::default(), 7, t0);
            let mut g = Gen(0x9E37_79B9_7F4A_7C15);
            let mut workers: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
            let mut pending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
            let mut answer_at = |t: u64, g: &mut Gen| {
                let start = if workers.len() < 4 {
                    t
                } else {
                    let Reverse(free) = workers.pop().expect("a worker");
                    t.max(free)
                };
                let end = start + if g.next() % 10 == 0 { 110_000 } else { 10_000 };
                workers.push(Reverse(end));
                end
            };
            let mut in_flight = 0u32;
            while in_flight < l.limit() {
                in_flight += 1;
                pending.push(Reverse((answer_at(0, &mut g), 0)));
            }
            for _ in 0..ANSWERS {
                let Some(Reverse((at, from))) = pending.pop() else {
                    break;
                };
                let now = t0 + Duration::from_micros(at);
                l.on_sample(
                    Duration::from_micros(at - from),
                    in_flight,
                    SampleKind::Success,
                    now,
                );
                in_flight -= 1;
                while in_flight < l.limit() {
                    in_flight += 1;
                    l.on_send(now);
                    pending.push(Reverse((answer_at(at, &mut g), at)));
                }
            }
            black_box(l.limit())
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = strategies, breaker, bucket, ewma, ready_lists, learned_limit
}
criterion_main!(benches);
