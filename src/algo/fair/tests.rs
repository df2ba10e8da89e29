use super::*;
use crate::algo::priority::ClassQueues;
use proptest::prelude::*;

use Priority::{Critical, Default as Normal, Sheddable};

fn drain<T>(q: &mut Drr<T>, order: Order) -> Vec<(Flow, T)> {
    std::iter::from_fn(|| q.pop(order)).collect()
}

#[test]
fn weights_give_that_many_items_per_turn() {
    let mut q = Drr::default();
    q.set_weight(1, 2);
    q.set_weight(2, 4);
    for i in 0..8u32 {
        for f in 0..3 {
            q.push(f, i);
        }
    }
    let flows: String = (0..14)
        .map(|_| char::from(b'a' + q.pop(Order::Fifo).unwrap().0 as u8))
        .collect();
    assert_eq!(flows, "abbccccabbcccc");
}

#[test]
fn backlogged_shares_follow_the_weights_1_2_4() {
    let mut q = Drr::default();
    for (f, w) in [(0, 1), (1, 2), (2, 4)] {
        q.set_weight(f, w);
        for i in 0..10_000u32 {
            q.push(f, i);
        }
    }
    // Over whole rounds (7 items each) the shares are exact; after any
    // number of pops each flow is within one turn of its share.
    for n in [7usize, 70, 700, 7_000, 6_999, 1_000, 123] {
        let mut q2 = Drr::default();
        for (f, w) in [(0, 1), (1, 2), (2, 4)] {
            q2.set_weight(f, w);
            for i in 0..10_000u32 {
                q2.push(f, i);
            }
        }
        let mut got = [0usize; 3];
        for _ in 0..n {
            got[usize::from(q2.pop(Order::Fifo).unwrap().0)] += 1;
        }
        for (f, w) in [1usize, 2, 4].into_iter().enumerate() {
            let want = n as f64 * w as f64 / 7.0;
            assert!((got[f] as f64 - want).abs() <= w as f64, "{n}: {got:?}");
            if n >= 700 {
                assert!((got[f] as f64 / want - 1.0).abs() < 0.05, "{n}: {got:?}");
            }
        }
        if n % 7 == 0 {
            assert_eq!(got, [n / 7, 2 * n / 7, 4 * n / 7]);
        }
    }
    assert_eq!(q.len(), 30_000);
}

#[test]
fn a_flood_from_one_flow_cannot_starve_the_others() {
    // Flow 0 holds 100 000 items; flows 1..=9 each add one item every 10
    // pops. Each of theirs is served within one round of the ring (at most
    // 10 pops after it came), and flow 0 gets the rest.
    let mut q = Drr::default();
    for i in 0..100_000u32 {
        q.push(0, i);
    }
    let mut waited = Vec::new();
    let mut pending: Vec<Option<usize>> = vec![None; 10];
    let mut served = [0usize; 10];
    for step in 0..10_000usize {
        if step % 10 == 0 {
            for f in 1..10u16 {
                q.push(f, step as u32);
                pending[usize::from(f)] = Some(step);
            }
        }
        let (f, _) = q.pop(Order::Fifo).unwrap();
        served[usize::from(f)] += 1;
        if let Some(at) = pending[usize::from(f)].take() {
            waited.push(step - at);
        }
    }
    assert!(waited.iter().all(|&w| w < 10), "{:?}", waited.iter().max());
    assert_eq!(&served[1..], &[1000; 9]);
    assert_eq!(served[0], 1000);
}

#[test]
fn one_flow_is_a_plain_list_in_either_order() {
    let mut q = Drr::default();
    q.set_weight(3, 5);
    for i in 0..5 {
        q.push(3, i);
    }
    q.push_front(3, 9);
    assert_eq!(q.pop(Order::Lifo), Some((3, 4)));
    assert_eq!(q.pop(Order::Fifo), Some((3, 9)));
    assert_eq!(
        drain(&mut q, Order::Fifo),
        vec![(3, 0), (3, 1), (3, 2), (3, 3)]
    );
    assert!(q.is_empty() && !q.waits());
}

#[test]
fn an_idle_flow_banks_no_deficit() {
    let mut q = Drr::default();
    q.set_weight(0, 3);
    q.push(0, 0);
    q.push(1, 0);
    // Flow 0 empties after one of its three: it leaves the ring and
    // forgets the two it had left.
    assert_eq!(q.pop(Order::Fifo), Some((0, 0)));
    q.push(0, 1);
    q.push(0, 2);
    assert_eq!(q.pop(Order::Fifo), Some((1, 0)));
    assert_eq!(drain(&mut q, Order::Fifo), vec![(0, 1), (0, 2)]);
}

#[test]
fn gone_items_are_skipped_and_cost_no_deficit() {
    let mut q = Drr::default();
    for i in 0..4u32 {
        q.push(0, i);
        q.push(1, 10 + i);
    }
    let live = |t: &u32| *t != 0 && *t != 1 && *t != 12;
    assert_eq!(q.pop_live(Order::Fifo, live), Some((0, 2)));
    assert_eq!(q.pop_live(Order::Fifo, live), Some((1, 10)));
    assert_eq!(q.pop_live(Order::Fifo, live), Some((0, 3)));
    assert_eq!(q.pop_live(Order::Fifo, live), Some((1, 11)));
    assert_eq!(q.pop_live(Order::Fifo, live), Some((1, 13)));
    assert_eq!(q.pop_live(Order::Fifo, live), None);
    assert!(q.is_empty() && !q.waits());
}

#[test]
fn oldest_is_the_least_key_over_the_flows() {
    let mut q = Drr::default();
    q.push(0, 5u32);
    q.push(0, 6);
    q.push(1, 3);
    q.push(2, 4);
    assert_eq!(q.oldest(|_| true, |t| *t), Some((1, &3)));
    assert_eq!(q.oldest(|t| *t != 3, |t| *t), Some((2, &4)));
    assert_eq!(q.pop_oldest_of(2), Some(4));
    assert_eq!(q.oldest(|_| true, |t| *t), Some((0, &5)));
    // One flow: its front, whatever the key.
    let mut one = Drr::default();
    one.push(7, 9u32);
    one.push(7, 1);
    assert_eq!(one.oldest(|_| true, |t| *t), Some((7, &9)));
}

#[test]
fn ahead_counts_the_turns_of_the_others() {
    let mut q = FairClasses::new(&PriorityConfig::default());
    q.set_weight(1, 2);
    for i in 0..100u32 {
        q.push(Normal, 0, i, false);
    }
    // Alone: the class's live count, oldest first; none newest first.
    assert_eq!(q.ahead(Normal, 0, Order::Fifo), 100);
    assert_eq!(q.ahead(Normal, 0, Order::Lifo), 0);
    // Flow 1 (weight 2) with 3 items: its own 3, then 4 turns of flow 0's
    // weight 1 over weight 2: 2 of flow 0's.
    for i in 0..3 {
        q.push(Normal, 1, 200 + i, false);
    }
    assert_eq!(q.ahead(Normal, 1, Order::Fifo), 3 + 2);
    assert_eq!(q.ahead(Normal, 1, Order::Lifo), 1);
    // Flow 0 waits behind its 100 and 101 turns of flow 1's 2: all 3.
    assert_eq!(q.ahead(Normal, 0, Order::Fifo), 103);
    // A new flow (weight 1): one turn of each busy flow.
    assert_eq!(q.ahead(Normal, 5, Order::Fifo), 1 + 2);
    assert_eq!(q.ahead(Critical, 5, Order::Fifo), 0);
    assert_eq!(q.most_over(Normal), Some(0));
    assert!(q.less_over(Normal, 1, 0) && !q.less_over(Normal, 0, 1));
    for _ in 0..3 {
        q.unlive(Normal, 1);
    }
    assert_eq!(q.ahead(Normal, 0, Order::Fifo), 100);
}

#[test]
fn most_over_weighs_the_backlogs() {
    let mut q = FairClasses::new(&PriorityConfig::default());
    q.set_weight(1, 4);
    for i in 0..3u32 {
        q.push(Sheddable, 0, i, false);
    }
    for i in 0..10u32 {
        q.push(Sheddable, 1, i, false);
    }
    // 3 / 1 > 10 / 4.
    assert_eq!(q.most_over(Sheddable), Some(0));
    q.push(Sheddable, 1, 10, false);
    q.push(Sheddable, 1, 11, false);
    // 12 / 4 = 3 / 1: the first in the ring.
    assert_eq!(q.most_over(Sheddable), Some(0));
    q.push(Sheddable, 1, 12, false);
    assert_eq!(q.most_over(Sheddable), Some(1));
    assert_eq!(q.most_over(Normal), None);
}

#[test]
fn the_flow_most_over_gives_its_oldest_for_shedding() {
    let mut q = FairClasses::new(&PriorityConfig::default());
    // Flow 2 came first with the oldest item; flow 3 floods.
    q.push(Normal, 2, 1u32, false);
    for i in 10..15u32 {
        q.push(Normal, 3, i, false);
    }
    assert_eq!(q.oldest(Normal, |_| true, |t| *t), Some((2, &1)));
    // The flood's oldest goes, not the quiet flow's older one.
    assert_eq!(q.oldest_of_most_over(Normal, |_| true), Some((3, &10)));
    // Gone items of that flow are dropped on the way.
    assert_eq!(q.oldest_of_most_over(Normal, |t| *t > 11), Some((3, &12)));
    assert_eq!(q.pop_oldest_of(Normal, 3), Some(12));
    assert_eq!(q.oldest_of_most_over(Critical, |_| true), None);
    // One flow: its oldest, as `oldest` gives.
    let mut one = FairClasses::new(&PriorityConfig::default());
    one.push(Normal, 0, 7u32, false);
    one.push(Normal, 0, 3, false);
    assert_eq!(one.oldest_of_most_over(Normal, |_| true), Some((0, &7)));
    assert_eq!(one.oldest(Normal, |_| true, |t| *t), Some((0, &7)));
}

#[test]
fn among_equals_the_flow_that_pushed_last_sheds() {
    let mut q = FairClasses::new(&PriorityConfig::default());
    // Two items each; flow 4 first in the ring, flow 5 pushed last.
    q.push(Normal, 4, 1u32, false);
    q.push(Normal, 5, 2, false);
    q.push(Normal, 4, 3, false);
    q.push(Normal, 5, 4, false);
    assert_eq!(q.most_over(Normal), Some(4));
    assert_eq!(q.oldest_of_most_over(Normal, |_| true), Some((5, &2)));
    // A flow more over its share still goes first.
    q.push(Normal, 4, 5, false);
    q.push(Normal, 6, 6, false);
    assert_eq!(q.oldest_of_most_over(Normal, |_| true), Some((4, &1)));
    // An item put back at a flow's front is no push of news: flow 5 now
    // ties with flow 4, which is first in the ring.
    q.push(Normal, 5, 7, true);
    assert_eq!(q.oldest_of_most_over(Normal, |_| true), Some((4, &1)));
}

#[derive(Debug, Clone)]
enum Op {
    Push(usize),
    Front(usize),
    Pop(bool, usize),
    Oldest(usize),
    Drop(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..3).prop_map(Op::Push),
        1 => (0usize..3).prop_map(Op::Front),
        4 => (any::<bool>(), 0usize..3).prop_map(|(l, c)| Op::Pop(l, c)),
        1 => (0usize..3).prop_map(Op::Oldest),
        1 => (0u32..50).prop_map(Op::Drop),
    ]
}

proptest! {
    /// With one flow the fair lists give exactly the plain class lists'
    /// order, whatever the pushes, fronts, pops in either order, sweeps
    /// and gone items.
    #[test]
    fn one_flow_serves_exactly_as_the_class_lists(
        weight in 1u32..8,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let config = PriorityConfig::default();
        let mut plain: ClassQueues<u32> = ClassQueues::new(config.clone());
        let mut fair: FairClasses<u32> = FairClasses::new(&config);
        fair.set_weight(4, weight);
        let mut gone = std::collections::HashSet::new();
        let mut next = 0u32;
        for op in ops {
            match op {
                Op::Push(c) | Op::Front(c) => {
                    let front = matches!(op, Op::Front(_));
                    let p = Priority::ALL[c];
                    if front { plain.push_front(p, next) } else { plain.push(p, next) }
                    fair.push(p, 4, next, front);
                    next += 1;
                }
                Op::Pop(lifo, lowest) => {
                    let order = if lifo { Order::Lifo } else { Order::Fifo };
                    let lowest = Priority::ALL[lowest];
                    let a = plain.pop_live_within(order, lowest, |t| !gone.contains(t));
                    let b = fair.pop_live_within(order, lowest, |t| !gone.contains(t));
                    prop_assert_eq!(a, b.map(|(p, f, t)| { assert_eq!(f, 4); (p, t) }));
                    if let Some((p, _, _)) = b { fair.unlive(p, 4) }
                }
                Op::Oldest(c) => {
                    let p = Priority::ALL[c];
                    let a = plain.oldest_live(p, |t| !gone.contains(t)).copied();
                    let b = fair.oldest(p, |t| !gone.contains(t), |t| *t).map(|(_, t)| *t);
                    prop_assert_eq!(a, b);
                    if let Some(t) = a {
                        prop_assert_eq!(plain.pop_oldest(p), Some(t));
                        prop_assert_eq!(fair.pop_oldest_of(p, 4), Some(t));
                        fair.unlive(p, 4);
                    }
                }
                Op::Drop(k) => {
                    // An item answered while listed: gone, found later.
                    if k < next && gone.insert(k) {
                        // Count it gone in its class, if still listed there.
                        for p in Priority::ALL {
                            let mut listed = false;
                            fair.retain(|q, _, &t| { listed |= q == p && t == k; true });
                            if listed { fair.unlive(p, 4) }
                        }
                    }
                }
            }
        }
        loop {
            let a = plain.pop_live(Order::Fifo, |t| !gone.contains(t));
            let b = fair.pop_live_within(Order::Fifo, Sheddable, |t| !gone.contains(t));
            prop_assert_eq!(a, b.map(|(p, _, t)| (p, t)));
            if a.is_none() { break }
        }
    }

    /// Every item pushed leaves exactly once, and while flows stay
    /// backlogged each gets its weight's share to within one turn.
    #[test]
    fn every_item_leaves_once_and_shares_hold(
        weights in prop::collection::vec(1u32..6, 1..6),
        pops in 1usize..400,
    ) {
        let mut q = Drr::default();
        for (f, &w) in weights.iter().enumerate() {
            q.set_weight(f as Flow, w);
            for i in 0..500u32 {
                q.push(f as Flow, (f as u32) * 1000 + i);
            }
        }
        let total: u32 = weights.iter().sum();
        let mut got = vec![0usize; weights.len()];
        for _ in 0..pops {
            got[usize::from(q.pop(Order::Fifo).unwrap().0)] += 1;
        }
        for (f, &w) in weights.iter().enumerate() {
            let want = pops as f64 * f64::from(w) / f64::from(total);
            prop_assert!((got[f] as f64 - want).abs() <= f64::from(total), "{:?} {:?}", got, weights);
        }
        let mut rest: Vec<u32> = drain(&mut q, Order::Lifo).into_iter().map(|(_, t)| t).collect();
        prop_assert_eq!(rest.len() + pops, weights.len() * 500);
        rest.sort_unstable();
        rest.dedup();
        prop_assert_eq!(rest.len() + pops, weights.len() * 500);
    }
}
