//! Whether Redis answers, per kind of call and per service: not one flag.
//!
//! One service's bucket key holding garbage, or one script failing, says
//! nothing of the other calls: a heartbeat that succeeds must not announce
//! "shared limits back" while that service's token calls still fail, and
//! the failing service must not flip the others' state. So each scope
//! (a kind of call, and the service it is for) goes down and comes back on
//! its own, and only its own transitions are logged: once at `warn` when
//! it goes down, once at `info` when it answers again.

use std::collections::HashSet;
use std::fmt;

/// The kinds of calls an instance makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// Token buckets (`gcra.lua`).
    Tokens,
    /// Shared breakers (`breaker.lua`, the state poll).
    Breakers,
    /// The membership heartbeat.
    Members,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Tokens => "token calls",
            Kind::Breakers => "breaker calls",
            Kind::Members => "heartbeats",
        })
    }
}

/// What a call's end changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The scope was up and this call failed.
    WentDown,
    /// The scope was down and this call answered.
    CameBack,
    /// No change.
    Same,
}

/// The scopes that are down.
#[derive(Debug, Default)]
pub(crate) struct Health {
    down: HashSet<(Kind, String)>,
}

impl Health {
    /// Records one call of `kind` for `service` (empty for instance-wide
    /// calls); says whether its scope changed.
    pub fn record(&mut self, kind: Kind, service: &str, ok: bool) -> Change {
        let key = (kind, service.to_owned());
        match ok {
            true if self.down.remove(&key) => Change::CameBack,
            false if self.down.insert(key) => Change::WentDown,
            _ => Change::Same,
        }
    }

    /// Whether any scope is down.
    pub fn any_down(&self) -> bool {
        !self.down.is_empty()
    }

    /// The scopes down, in words, sorted.
    pub fn scopes(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .down
            .iter()
            .map(|(kind, service)| match service.is_empty() {
                true => kind.to_string(),
                false => format!("{kind} of {service}"),
            })
            .collect();
        v.sort();
        v
    }

    /// Whether `kind` for `service` is down.
    #[cfg(test)]
    pub fn is_down(&self, kind: Kind, service: &str) -> bool {
        self.down.contains(&(kind, service.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scope_goes_down_and_comes_back_on_its_own() {
        let mut h = Health::default();
        assert_eq!(h.record(Kind::Tokens, "api", false), Change::WentDown);
        assert_eq!(h.record(Kind::Tokens, "api", false), Change::Same);
        // A heartbeat (or another service's call) that answers is no
        // "back" for the failing scope.
        assert_eq!(h.record(Kind::Members, "", true), Change::Same);
        assert_eq!(h.record(Kind::Tokens, "jobs", true), Change::Same);
        assert!(h.is_down(Kind::Tokens, "api"));
        assert!(!h.is_down(Kind::Tokens, "jobs"));
        assert_eq!(h.record(Kind::Members, "", false), Change::WentDown);
        assert_eq!(
            h.scopes(),
            vec!["heartbeats".to_string(), "token calls of api".to_string()]
        );
        assert_eq!(h.record(Kind::Members, "", true), Change::CameBack);
        assert_eq!(h.record(Kind::Breakers, "api", false), Change::WentDown);
        assert_eq!(h.record(Kind::Tokens, "api", true), Change::CameBack);
        assert!(h.any_down(), "breaker calls of api are still down");
        assert_eq!(h.scopes(), vec!["breaker calls of api".to_string()]);
        assert_eq!(h.record(Kind::Breakers, "api", true), Change::CameBack);
        assert_eq!(h.record(Kind::Breakers, "api", true), Change::Same);
        assert!(!h.any_down());
    }
}
