//! A scripted in-process transport: each request's fate is decided by a
//! rule the test sets (and may change mid-run) from the node's address, the
//! request's path and how many times that path was asked before. Every
//! request is logged with its paused-clock send time, so a test can assert
//! exactly when and where each attempt went.
//!
//! Used under paused tokio time (`tokio::time::pause()`): waits are timers,
//! so a run takes no real time and repeats exactly.

#![allow(dead_code)]

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use actix_dispatch::{ErrorKind, Instant};
use awc::http::header::{HeaderName, HeaderValue};
use futures::future::LocalBoxFuture;

/// What one request gets.
#[derive(Debug, Clone)]
pub enum Act {
    /// Answers `status` with `headers` after `after`.
    Answer {
        status: u16,
        after: Duration,
        headers: Vec<(&'static str, String)>,
    },
    /// Fails with `kind` after `after` (connect error, reset, ...).
    Fail { kind: ErrorKind, after: Duration },
    /// Never answers: the attempt's timeout (or a cancel) ends it.
    Hang,
    /// Panics inside the attempt, when first polled.
    Panic,
    /// Panics in the transport's `send` itself, before any future.
    PanicNow,
}

impl Act {
    /// 200 after `ms`.
    pub fn ok(ms: u64) -> Act {
        Act::status(200, ms)
    }

    /// `status` after `ms`, no headers.
    pub fn status(status: u16, ms: u64) -> Act {
        Act::Answer {
            status,
            after: Duration::from_millis(ms),
            headers: Vec::new(),
        }
    }
}

/// One request as the rule sees it.
#[derive(Debug, Clone)]
pub struct Req {
    /// The node's address (`http://127.0.0.1:9/`).
    pub addr: String,
    /// The path below it (`/a/1`), the query included.
    pub path: String,
    /// How many requests for this path came before this one (any node).
    pub nth: u32,
}

/// One request sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub addr: String,
    pub path: String,
    pub at: Instant,
}

type Rule = Arc<dyn Fn(&Req) -> Act + Send + Sync>;

#[derive(Default)]
struct Inner {
    rule: Option<Rule>,
    sent: Vec<Sent>,
    seen: HashMap<String, u32>,
}

/// The backends of a test: one rule for every node, and the log.
#[derive(Clone, Default)]
pub struct Backends(Arc<Mutex<Inner>>);

impl Backends {
    /// Backends answering by `rule`.
    pub fn new(rule: impl Fn(&Req) -> Act + Send + Sync + 'static) -> Backends {
        let b = Backends::default();
        b.set(rule);
        b
    }

    /// Replaces the rule (for requests from now on).
    pub fn set(&self, rule: impl Fn(&Req) -> Act + Send + Sync + 'static) {
        self.0.lock().unwrap().rule = Some(Arc::new(rule));
    }

    /// Every request so far, in order.
    pub fn sent(&self) -> Vec<Sent> {
        self.0.lock().unwrap().sent.clone()
    }

    /// How many requests went to `addr` whose path starts with `prefix`.
    pub fn count(&self, addr: &str, prefix: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .sent
            .iter()
            .filter(|s| s.addr == addr && s.path.starts_with(prefix))
            .count()
    }

    /// When each request for `path` was sent.
    pub fn times(&self, path: &str) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .sent
            .iter()
            .filter(|s| s.path == path)
            .map(|s| s.at)
            .collect()
    }

    /// The engine's transport factory.
    pub fn factory(&self) -> TransportFactory {
        let b = self.clone();
        Arc::new(move |addr: &str| {
            Rc::new(Node {
                addr: addr.to_owned(),
                backends: b.clone(),
            }) as Rc<dyn Transport>
        })
    }
}

struct Node {
    addr: String,
    backends: Backends,
}

impl Transport for Node {
    fn send(&self, req: HttpRequest) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        let path = req
            .url
            .strip_prefix(self.addr.trim_end_matches('/'))
            .unwrap_or(&req.url)
            .to_owned();
        let act = {
            let mut inner = self.backends.0.lock().unwrap();
            let seen = inner.seen.entry(path.clone()).or_default();
            let nth = *seen;
            *seen += 1;
            inner.sent.push(Sent {
                addr: self.addr.clone(),
                path: path.clone(),
                at: Instant::now(),
            });
            let rule = inner.rule.clone();
            let r = Req {
                addr: self.addr.clone(),
                path,
                nth,
            };
            rule.map_or_else(|| Act::ok(0), |rule| rule(&r))
        };
        if matches!(act, Act::PanicNow) {
            panic!("scripted panic in send");
        }
        Box::pin(async move {
            match act {
                Act::Answer {
                    status,
                    after,
                    headers,
                } => {
                    pause(after).await;
                    let mut map = actix_dispatch::HeaderMap::new();
                    for (k, v) in headers {
                        map.append(
                            HeaderName::from_static(k),
                            HeaderValue::from_str(&v).expect("a valid header value"),
                        );
                    }
                    Ok(HttpReply::new(status).with_headers(map))
                }
                Act::Fail { kind, after } => {
                    pause(after).await;
                    Err(TransportError::new(kind, "scripted"))
                }
                Act::Hang => std::future::pending().await,
                Act::Panic | Act::PanicNow => panic!("scripted panic"),
            }
        })
    }
}

/// Waits `d`; no wait at all for zero (a zero sleep still rounds up to the
/// timer's next millisecond tick).
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
