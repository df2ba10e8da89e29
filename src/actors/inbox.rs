//! A mailbox beside the actor's own: how many senders hand one actor items
//! at the cost of one message per burst.
//!
//! A sender pushes its item onto a list shared with the actor; only a
//! sender that finds the list empty sends the actor a message
//! ([`InboxReady`]). The actor takes the whole list in that one turn, so a
//! burst of items costs one actor message, not one each, and an item keeps
//! no mailbox envelope while it waits. Nothing waits for a batch to fill:
//! the first item of a burst wakes the actor at once.
//!
//! The queue takes its submits this way (from `Dispatcher::submit`), and
//! the balancer its nodes' reports (a large pool, where each node holds
//! about one task, finishes many nodes in the same turn).
//!
//! The list belongs to the actor; senders hold it weakly. When the actor
//! goes away the list and the items in it go with it, exactly as messages
//! to a dead actor are dropped: a submit's caller sees its reply slot close
//! (answered `Internal`), and a lost report is answered `Lost` by the
//! queue's watchdog.

use std::sync::{Arc, Mutex, Weak};

use actix::prelude::*;

pub(crate) use super::protocol::InboxReady;

/// Items waiting for the actor's next [`InboxReady`] turn.
pub(crate) struct Inbox<T> {
    list: Mutex<Vec<T>>,
}

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox {
            list: Mutex::new(Vec::new()),
        }
    }
}

/// A sender's side of an actor's inbox.
pub(crate) struct InboxSender<T> {
    inbox: Weak<Inbox<T>>,
    wake: Recipient<InboxReady>,
}

impl<T> Clone for InboxSender<T> {
    fn clone(&self) -> Self {
        InboxSender {
            inbox: self.inbox.clone(),
            wake: self.wake.clone(),
        }
    }
}

impl<T> InboxSender<T> {
    pub(crate) fn new(inbox: &Arc<Inbox<T>>, wake: Recipient<InboxReady>) -> Self {
        InboxSender {
            inbox: Arc::downgrade(inbox),
            wake,
        }
    }

    /// Hands `item` to the actor (dropped with the inbox if the actor is
    /// gone).
    pub(crate) fn send(&self, item: T) {
        let Some(inbox) = self.inbox.upgrade() else {
            return;
        };
        let first = {
            let mut list = inbox.list.lock().unwrap_or_else(|e| e.into_inner());
            list.push(item);
            list.len() == 1
        };
        if first {
            self.wake.do_send(InboxReady);
        }
    }
}

impl<T> Inbox<T> {
    /// Swaps the waiting items into `batch` (which must be empty: its room
    /// is given to the inbox for the next burst).
    pub(crate) fn take_into(&self, batch: &mut Vec<T>) {
        debug_assert!(batch.is_empty());
        std::mem::swap(
            batch,
            &mut *self.list.lock().unwrap_or_else(|e| e.into_inner()),
        );
    }

    /// Takes every item waiting here.
    pub(crate) fn take_all(&self) -> Vec<T> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counter {
        wakes: usize,
        items: Vec<u32>,
        inbox: Arc<Inbox<u32>>,
    }

    impl Actor for Counter {
        type Context = Context<Self>;
    }

    impl Handler<InboxReady> for Counter {
        type Result = ();

        fn handle(&mut self, _msg: InboxReady, _ctx: &mut Self::Context) {
            self.wakes += 1;
            let mut batch = Vec::new();
            self.inbox.take_into(&mut batch);
            self.items.extend(batch);
        }
    }

    struct Get;

    impl Message for Get {
        type Result = (usize, Vec<u32>);
    }

    impl Handler<Get> for Counter {
        type Result = MessageResult<Get>;

        fn handle(&mut self, _msg: Get, _ctx: &mut Self::Context) -> Self::Result {
            MessageResult((self.wakes, self.items.clone()))
        }
    }

    #[actix::test]
    async fn a_burst_wakes_the_actor_once_and_keeps_its_order() {
        let inbox = Arc::new(Inbox::default());
        let c = Counter {
            inbox: inbox.clone(),
            ..Default::default()
        }
        .start();
        let tx = InboxSender::new(&inbox, c.clone().recipient());
        for i in 0..100 {
            tx.send(i);
        }
        let (wakes, items) = c.send(Get).await.unwrap();
        assert_eq!(wakes, 1);
        assert_eq!(items, (0..100).collect::<Vec<_>>());
        tx.send(7);
        let (wakes, items) = c.send(Get).await.unwrap();
        assert_eq!((wakes, items.len()), (2, 101));
    }

    #[test]
    fn items_sent_after_the_inbox_is_gone_are_dropped() {
        let inbox: Arc<Inbox<u32>> = Arc::default();
        assert_eq!(inbox.take_all(), Vec::<u32>::new());
        let weak = Arc::downgrade(&inbox);
        drop(inbox);
        assert!(weak.upgrade().is_none());
    }
}
