//! The seam for state shared by several instances: what the balancer asks
//! of a shared store, and what it keeps of the answers.
//!
//! Two traits name what a store does, shaped from the balancer's calls:
//! a [`TokenStore`] hands out the tokens of a service's bucket and of its
//! nodes' buckets, a [`SharedBreaker`] records trips, probe claims and
//! their ends, and reads each node's state back. The balancer holds the
//! store as a value ([`Store`]), handed to it once by the dispatcher
//! ([`UseShared`]), and never waits on it: every answer comes back as a
//! message ([`Granted`], [`NodesGranted`], [`SharedBreakers`],
//! [`ProbeClaimed`]). The one store the engine builds is Redis's
//! (`crate::redis::SharedLimits`, feature `redis`): the dispatcher's
//! builder is the only place that picks it, so the `redis` feature switch
//! appears there and not in the balancer. Without the feature (or without
//! `rate_limit.shared` / `breaker.shared`) a service has no
//! [`ServiceShare`] and its nodes' [`NodeTokens`] are `Off`: every hook is
//! then a no-op, and the local buckets and breakers alone decide.
//!
//! What the balancer keeps between answers is pure and takes `now`:
//! [`ServiceShare`] (one service's leased tokens, held routes, `on_down`
//! fallback and probe claims) and [`NodeTokens`] (a node's shared bucket as
//! this instance holds it, which caps the node's room).
//!
//! # Who owns a node's bucket
//!
//! The balancer's view of the node ([`NodeView`](super::view::NodeView))
//! owns it: its local [`TokenBucket`](crate::algo::limiter::TokenBucket)
//! (`rate_limit.per_node`) and, when that bucket is shared, the
//! [`NodeTokens`] this instance holds of it. The balancer decides admission
//! from them (a node without a token has no room and is not picked) and
//! takes the token when it places a dispatch, at the dispatch's own
//! instant. The node actor keeps no bucket of its own: it is sent only
//! what the balancer paid for, a lease included (a lease is admitted as a
//! task). The bucket in Redis is the cluster's; the view keeps only the
//! tokens this instance was handed.

#[cfg(test)]
pub(crate) mod local;
mod node_tokens;
mod service;
mod tenant_tokens;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::config::{BucketConfig, OnDown, SharedMode};

pub(crate) use crate::actors::protocol::TenantGranted;
#[cfg(any(feature = "redis", test))]
pub(crate) use crate::actors::protocol::{Grant, UseShared};
pub(crate) use crate::actors::protocol::{
    Granted, NodesGranted, ProbeClaimed, SharedBreakers, SharedState,
};
pub(crate) use node_tokens::NodeTokens;
pub(crate) use service::ServiceShare;
pub(crate) use tenant_tokens::{TenantLease, TenantStore};
/// The tenant store as the queue receives it.
pub(crate) type UseTenantStore = crate::actors::protocol::UseTenantStore<dyn TenantStore>;

/// What to do with a route, given a shared bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A token is in hand: place it.
    Go,
    /// Wait for this turn's call to the store.
    Hold,
    /// No token: back to the queue.
    Bounce,
}

/// The store's settings the balancer's bookkeeping follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    /// Lease or exact admissions.
    pub mode: SharedMode,
    /// What applies while the store does not answer.
    pub on_down: OnDown,
    /// How long leased tokens may be used.
    pub lease: Duration,
    /// Longest wait for an answer before `on_down` applies.
    pub timeout: Duration,
}

/// Shared token buckets: a service's and its nodes'.
pub(crate) trait TokenStore {
    /// The settings the store runs on.
    fn settings(&self) -> Settings;

    /// Instances sharing the buckets, as last counted (at least 1): the
    /// local fallback divides each rate by it.
    fn live(&self) -> u64;

    /// Takes up to `want` tokens of `service`'s bucket; the answer goes to
    /// `reply` as [`Granted`].
    fn take(&self, service: &str, bucket: BucketConfig, want: u32, reply: Recipient<Granted>);

    /// Takes tokens for several nodes in one call: for each `(node, want)`,
    /// up to `want` each from the node's bucket and, when `service` is
    /// set, the service's bucket together. The answer goes to `reply` as
    /// [`NodesGranted`]. An ask of 0 only checks that the store answers.
    fn take_nodes(
        &self,
        service: &str,
        service_bucket: Option<BucketConfig>,
        node_bucket: BucketConfig,
        asks: Vec<(Arc<str>, u32)>,
        reply: Recipient<NodesGranted>,
    );
}

/// Breakers shared by the instances: trips, and one probe for all.
pub(crate) trait SharedBreaker {
    /// This instance's breaker of `node` tripped, open for `open_for`
    /// (open for all once `quorum` instances reported it).
    fn trip(&self, service: &str, node: &str, open_for: Duration, quorum: u32);

    /// The probe this instance sent to `node` failed: open again, longer.
    fn reopen(&self, service: &str, node: &str, open_for: Duration, max: Duration);

    /// A probe to `node` succeeded: closed for every instance.
    fn close(&self, service: &str, node: &str);

    /// Asks for the half-open probe claim of `node` for `ttl`; the answer
    /// goes to `reply`.
    fn claim(&self, service: &str, node: Arc<str>, ttl: Duration, reply: Recipient<ProbeClaimed>);

    /// Reads the shared breakers of `nodes`; the answer goes to `reply`
    /// (nothing when the store does not answer: the views keep theirs).
    fn poll(&self, service: &str, nodes: Vec<Arc<str>>, reply: Recipient<SharedBreakers>);
}

/// A shared store: tokens and breakers.
pub(crate) trait SharedStore: TokenStore + SharedBreaker + Send + Sync {}

impl<T: TokenStore + SharedBreaker + Send + Sync> SharedStore for T {}

/// The store a balancer holds.
pub(crate) type Store = Arc<dyn SharedStore>;
