//! The in-process Rust peer of the `peers` scenario: what a Rust developer
//! would write instead of the engine.
//!
//! tower's power-of-two-choices balancer (`tower::balance::p2c::Balance`,
//! Mitzenmacher's "two random choices", the balancer linkerd2-proxy is built
//! on) over peak-EWMA load (`tower::load::PeakEwmaDiscover`, Finagle's
//! latency-aware cost: RTT estimate times outstanding requests), one
//! `hyper_util::client::legacy::Client` with an `HttpConnector` (keep-alive
//! pool, `TCP_NODELAY`) under every backend, and a timeout per request. It
//! does no queueing, no breaking, no rate limiting and no retries: the peer
//! the engine has to match while doing those.
//!
//! It runs on the caller's thread, like the engine and bare awc: the
//! balancer lives in an `Rc<RefCell<_>>`, and each request takes it for one
//! synchronous `poll_ready` + `call` (never across an await), so there is no
//! `Buffer` task and no channel hop in its way. Every backend service is
//! always ready (the client has no connection cap), so `poll_ready` never
//! parks a waiter.
//!
//! [`ShedPeer`] is the peer of the `overload` scenario: the same balancer
//! with a `ConcurrencyLimit` per backend and `LoadShed` in front.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;
use tower::limit::ConcurrencyLimit;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::load_shed::error::Overloaded;
use tower::load_shed::LoadShed;
use tower::Service;

/// Peak-EWMA's RTT estimate for a backend before its first answer (tower's
/// own examples use 30 ms; loopback answers in well under 1 ms).
const DEFAULT_RTT: Duration = Duration::from_millis(1);
/// Peak-EWMA's decay window (linkerd2-proxy's default).
const DECAY: Duration = Duration::from_secs(10);

type HyperClient = Client<HttpConnector, Empty<Bytes>>;

/// One backend: `GET {base}bench/{i}` with the shared hyper client.
pub struct Backend {
    client: HyperClient,
    base: String,
}

impl Service<usize> for Backend {
    type Response = hyper::Response<hyper::body::Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The client's pool has no cap: always ready, like awc with limit(0).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, i: usize) -> Self::Future {
        let uri: Uri = format!("{}bench/{i}", self.base)
            .parse()
            .expect("a valid loopback URI");
        self.client.get(uri)
    }
}

type Balancer = Balance<PeakEwmaDiscover<ServiceList<Vec<Backend>>>, usize>;

/// tower p2c + peak EWMA over hyper-util, shared by the requests of one thread.
#[derive(Clone)]
pub struct TowerPeer {
    balance: Rc<RefCell<Balancer>>,
    timeout: Duration,
}

impl TowerPeer {
    /// A balancer over `urls` (`http://127.0.0.1:port/`), `timeout` per
    /// request (headers and body). Must be called inside a tokio runtime
    /// (actix's is one): hyper-util spawns its connection tasks there.
    pub fn new(urls: &[String], timeout: Duration) -> TowerPeer {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: HyperClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let backends = urls
            .iter()
            .map(|u| Backend {
                client: client.clone(),
                base: u.clone(),
            })
            .collect::<Vec<_>>();
        let discover = PeakEwmaDiscover::new::<usize>(
            ServiceList::new::<usize>(backends),
            DEFAULT_RTT,
            DECAY,
            CompleteOnResponse::default(),
        );
        TowerPeer {
            balance: Rc::new(RefCell::new(Balance::new(discover))),
            timeout,
        }
    }

    /// One GET of task `i`; true for a 2xx with its body read in time.
    pub async fn get(&self, i: usize) -> bool {
        let ready = poll_fn(|cx| self.balance.borrow_mut().poll_ready(cx)).await;
        if ready.is_err() {
            return false;
        }
        // No await between the ready check and the call: no other request
        // can take the endpoint this one was given.
        let response = self.balance.borrow_mut().call(i);
        let work = async move {
            let res = response.await.ok()?;
            let ok = res.status().is_success();
            let body = res.into_body().collect().await.ok()?;
            Some(ok && body.to_bytes().len() <= 2 * 1024 * 1024)
        };
        matches!(
            tokio::time::timeout(self.timeout, work).await,
            Ok(Some(true))
        )
    }
}

// === impl ShedPeer ===

/// What became of one request of the [`ShedPeer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedAnswer {
    /// A 2xx with its body read in time.
    Success,
    /// Refused at once by `LoadShed`: no backend had a free slot.
    Refused,
    /// Any other answer, an error or the timeout.
    Failed,
}

type Limited = ConcurrencyLimit<Backend>;
type ShedBalancer = LoadShed<Balance<PeakEwmaDiscover<ServiceList<Vec<Limited>>>, usize>>;

/// The `overload` scenario's tower peer: what a Rust developer would build
/// to protect fixed-capacity backends with tower's own parts. Each backend
/// is a `limit::ConcurrencyLimit` of `per_backend` requests (an operator
/// who knows the backends' capacity sets it), p2c with peak EWMA picks
/// among the backends with a free slot, and `load_shed::LoadShed` in front
/// refuses a request at once (`Overloaded`) when none has one: no queue
/// anywhere in the client. Shared on one thread like [`TowerPeer`].
#[derive(Clone)]
pub struct ShedPeer {
    balance: Rc<RefCell<ShedBalancer>>,
    timeout: Duration,
}

impl ShedPeer {
    /// A shedding balancer over `urls`, `per_backend[i]` requests at once
    /// on backend `i` (the last count repeats), `timeout` per request. Must
    /// be called inside a tokio runtime.
    pub fn new(urls: &[String], per_backend: &[usize], timeout: Duration) -> ShedPeer {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: HyperClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let backends = urls
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let limit = per_backend.get(i).or(per_backend.last()).copied();
                ConcurrencyLimit::new(
                    Backend {
                        client: client.clone(),
                        base: u.clone(),
                    },
                    limit.unwrap_or(1).max(1),
                )
            })
            .collect::<Vec<_>>();
        let discover = PeakEwmaDiscover::new::<usize>(
            ServiceList::new::<usize>(backends),
            DEFAULT_RTT,
            DECAY,
            CompleteOnResponse::default(),
        );
        ShedPeer {
            balance: Rc::new(RefCell::new(LoadShed::new(Balance::new(discover)))),
            timeout,
        }
    }

    /// One GET of task `i`.
    pub async fn get(&self, i: usize) -> ShedAnswer {
        // LoadShed is always ready: it records whether the balancer is.
        let ready = poll_fn(|cx| self.balance.borrow_mut().poll_ready(cx)).await;
        if ready.is_err() {
            return ShedAnswer::Failed;
        }
        let response = self.balance.borrow_mut().call(i);
        let work = async move {
            let res = match response.await {
                Ok(res) => res,
                Err(e) if e.is::<Overloaded>() => return ShedAnswer::Refused,
                Err(_) => return ShedAnswer::Failed,
            };
            let ok = res.status().is_success();
            let size = res.into_body().collect().await.map(|b| b.to_bytes().len());
            match size {
                Ok(n) if ok && n <= 2 * 1024 * 1024 => ShedAnswer::Success,
                _ => ShedAnswer::Failed,
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or(ShedAnswer::Failed)
    }
}
