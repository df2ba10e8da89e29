//! Shared limits with a tenant scope: one rate per tenant across every
//! instance.
//!
//! A tenant's bucket is a GCRA bucket of `gcra.lua` like a service's, at
//! `prefix:{service}:tn:<tenant>:rl`: under the prefix (an ACL user limited
//! to `~prefix:*` reaches it), on the service's hash slot (the `{service}`
//! tag comes first, so braces in a tenant key do not move it), and apart
//! from the service's `rl` and its nodes' `rl:<address>` keys. Every
//! instance that takes from it shares the one rate; two tenants never
//! share a bucket.
//!
//! Tenant keys come from callers, so they are bounded before they reach
//! Redis: a key that fails [`check_key`] (1 to 128 printable ASCII bytes,
//! no space) is refused without a call, and a bucket's key expires once
//! the bucket is full again (at most `burst / rate` after its last token),
//! so Redis holds a key only for the tenants that took a token within that
//! time. [`SharedLimits::take_tenant`] keeps no state per tenant; the
//! queue's `tenants.shared` leases each tracked tenant's tokens through it
//! in batches (see `actors::share::tenant_tokens`). The calls are counted
//! in [`SharedStats::tenant_calls`](super::SharedStats::tenant_calls).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::gcra::{gcra_args, gcra_decode, Ask};
use super::health::Kind;
use super::SharedLimits;
use crate::actors::share::{Settings, TenantGranted, TenantStore, TokenStore};
use crate::algo::tenants::check_key;
use crate::config::BucketConfig;

/// The key of `tenant`'s shared bucket in `service`,
/// `prefix:{service}:tn:<tenant>:rl`; an error (the key's fault) for a
/// tenant key that is not 1 to 128 printable ASCII bytes.
pub fn tenant_key(prefix: &str, service: &str, tenant: &str) -> Result<String, String> {
    check_key(tenant)?;
    Ok(format!("{prefix}:{{{service}}}:tn:{tenant}:rl"))
}

/// What a tenant's shared bucket gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantGrant {
    /// Tokens granted (`0..=want`).
    pub granted: u32,
    /// When the wanted tokens are there again (zero: now); asking before
    /// then gets less.
    pub retry_in: Duration,
}

/// The queue's side: a tenant's tokens taken in a batch, the answer sent
/// back as a message (the queue never waits on Redis).
impl TenantStore for SharedLimits {
    fn settings(&self) -> Settings {
        TokenStore::settings(self)
    }

    fn lease_tenant(
        &self,
        service: &str,
        tenant: Arc<str>,
        flow: u16,
        bucket: BucketConfig,
        want: u32,
        reply: Recipient<TenantGranted>,
    ) {
        let s = self.clone();
        let svc = service.to_owned();
        let asked = Instant::now();
        actix::spawn(async move {
            // The queue checked the key when the task came in.
            let got = s
                .take_tenant(&svc, &tenant, bucket, want)
                .await
                .ok()
                .flatten()
                .map(|g| (g.granted, g.retry_in));
            let live = s.live();
            reply.do_send(TenantGranted {
                tenant,
                flow,
                got,
                live,
                asked,
            });
        });
    }
}

impl SharedLimits {
    /// Takes up to `want` tokens (at least 1) of `tenant`'s shared bucket
    /// in `service`, configured `bucket` (the same on every instance).
    /// `Err` for a tenant key that is not 1 to 128 printable ASCII bytes (no call is made);
    /// `Ok(None)` when Redis did not answer within `timeout` (the call is
    /// counted down as the service's token calls are, and the caller's
    /// `on_down` policy applies).
    pub async fn take_tenant(
        &self,
        service: &str,
        tenant: &str,
        bucket: BucketConfig,
        want: u32,
    ) -> Result<Option<TenantGrant>, String> {
        let key = tenant_key(&self.inner.cfg.prefix, service, tenant)?;
        self.inner.tenant_calls.fetch_add(1, Ordering::Relaxed);
        let keys = [(key, bucket)];
        let asks = [Ask {
            buckets: vec![0],
            want: want.max(1),
        }];
        let mut con = self.inner.conn.clone();
        let mut inv = self.inner.gcra.prepare_invoke();
        gcra_args(&mut inv, &keys, &asks, None);
        let answer = self
            .call(Kind::Tokens, service, async move {
                let v: Vec<redis::Value> = inv.invoke_async(&mut con).await?;
                Ok(v)
            })
            .await;
        Ok(answer.map(|v| {
            let (got, _, repaired) = gcra_decode(&v, &asks);
            self.log_bucket_repairs(service, &keys, &repaired);
            TenantGrant {
                granted: got[0].granted,
                retry_in: got[0].due,
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_key_is_checked_and_on_the_service_slot() {
        assert_eq!(
            tenant_key("ad", "api", "acme-1").unwrap(),
            "ad:{api}:tn:acme-1:rl"
        );
        // Braces in the tenant key do not move the key off `{api}`'s slot.
        assert_eq!(
            tenant_key("ad", "api", "{x}").unwrap(),
            "ad:{api}:tn:{x}:rl"
        );
        assert!(tenant_key("ad", "api", "").is_err());
        assert!(tenant_key("ad", "api", "a b").is_err());
        assert!(tenant_key("ad", "api", &"k".repeat(129))
            .unwrap_err()
            .contains("over the limit"));
    }
}
