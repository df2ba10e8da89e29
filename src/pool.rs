//! What a runtime pool change answers: [`PoolError`] when it is refused,
//! [`ReloadSummary`] for what a reload changed.
//!
//! A leaf module: the balancer that makes these values and the
//! [`crate::Dispatcher`] that returns them both import it, and it imports
//! neither.

/// Why a pool change was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No node with that address.
    #[error("no endpoint {0:?} in this service")]
    UnknownEndpoint(String),
    /// The address is already in the pool.
    #[error("endpoint {0:?} is already in this service")]
    Duplicate(String),
    /// A bad value; names the field.
    #[error("field `{field}`: {message}")]
    #[non_exhaustive]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The change would leave the service without any endpoint.
    #[error("a service must keep at least one endpoint")]
    LastEndpoint,
    /// No service of that name.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// The service's balancer is gone (shut down).
    #[error("service stopped")]
    Stopped,
}

/// What a reload changed in one service's endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadSummary {
    /// Endpoints added.
    pub added: Vec<String>,
    /// Endpoints removed (draining).
    pub removed: Vec<String>,
    /// Endpoints kept whose settings changed.
    pub updated: Vec<String>,
    /// Endpoints kept unchanged.
    pub kept: Vec<String>,
}
