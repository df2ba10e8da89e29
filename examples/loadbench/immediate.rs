//! The in-process transport of the scheduling benchmarks: `200 ok` at
//! once, without I/O. Shared with `benches/lease.rs` (by `#[path]`).

use std::rc::Rc;
use std::sync::Arc;

use actix_dispatch::transport::{
    HttpReply, HttpRequest, Transport, TransportError, TransportFactory,
};
use bytes::Bytes;
use futures::future::LocalBoxFuture;

/// A transport that answers `200 ok` at once, without I/O.
pub struct ImmediateTransport;

impl Transport for ImmediateTransport {
    fn send(
        &self,
        _req: HttpRequest,
    ) -> LocalBoxFuture<'static, Result<HttpReply, TransportError>> {
        Box::pin(std::future::ready(Ok(
            HttpReply::new(200).with_body(Bytes::from_static(b"ok"))
        )))
    }
}

/// Factory of [`ImmediateTransport`]s.
pub fn immediate_factory() -> TransportFactory {
    Arc::new(|_addr: &str| Rc::new(ImmediateTransport) as Rc<dyn Transport>)
}
