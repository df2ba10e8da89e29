//! Headers the config adds to every attempt to an endpoint: credentials, an
//! organisation id, a model name.
//!
//! In the file, `headers` is a map from header name to either a plain
//! string or `{"value": "...", "fixed": true}`, on a service and on each
//! endpoint:
//!
//! ```json
//! "headers": {
//!     "authorization": { "value": "Bearer ${INFERENCE_KEY}", "fixed": true },
//!     "x-team": "search"
//! }
//! ```
//!
//! - An endpoint's header replaces the service's header of the same name.
//! - A task's own header of that name wins over a configured one, unless
//!   the configured one is `fixed`: then the task's is dropped. (A task
//!   cannot swap in another tenant's key for a fixed `authorization`.)
//! - `${NAME}` is replaced by the environment variable `NAME` when the config
//!   is loaded (`$${` writes a literal `${`). A variable that is not set is a
//!   config error naming the field and the variable, never a value.
//! - Names are checked as a task's are ([`crate::syntax::check_header_name`]):
//!   routing and framing headers (`Host`, `Content-Length`, `Proxy-*`, ...)
//!   are refused here too. Values must be valid header values.
//!
//! Every configured value is treated as a secret: [`Secret`] prints as
//! `<redacted>` in `Debug`, the `HeaderValue` it holds is marked sensitive
//! (so a request's `Debug` says `Sensitive`), and no error message repeats
//! it. Values never reach logs, `stats()` or results.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use awc::http::header::{HeaderName, HeaderValue};
use serde::Deserialize;

// === impl Secret ===

/// A configured header value: usable by the transport, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(HeaderValue);

impl Secret {
    /// The value, to put on a request (marked sensitive).
    pub fn expose(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

// === impl ConfigHeader ===

/// One configured header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigHeader {
    /// Its name.
    pub name: HeaderName,
    /// Its value (redacted in `Debug`).
    pub value: Secret,
    /// Whether it replaces a task's header of the same name (otherwise the
    /// task's wins).
    pub fixed: bool,
}

// === impl HeaderSet ===

/// The headers added to every attempt to one endpoint (cheap to clone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderSet(Arc<[ConfigHeader]>);

impl HeaderSet {
    /// No headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The headers, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &ConfigHeader> {
        self.0.iter()
    }

    /// `service`'s headers with `endpoint`'s over them (by name).
    pub fn merged(service: &HeaderSet, endpoint: &HeaderSet) -> HeaderSet {
        if endpoint.is_empty() {
            return service.clone();
        }
        if service.is_empty() {
            return endpoint.clone();
        }
        let mut out: Vec<ConfigHeader> = service
            .iter()
            .filter(|s| !endpoint.iter().any(|e| e.name == s.name))
            .cloned()
            .collect();
        out.extend(endpoint.iter().cloned());
        HeaderSet(out.into())
    }

    /// A task's headers with these added: a task's header wins over a
    /// configured one of the same name, unless that one is fixed.
    pub fn apply(&self, task: &[(HeaderName, HeaderValue)]) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(task.len() + self.0.len());
        for (k, v) in task {
            if !self.0.iter().any(|h| h.fixed && h.name == *k) {
                out.push((k.clone(), v.clone()));
            }
        }
        for h in self.0.iter() {
            if h.fixed || !task.iter().any(|(k, _)| *k == h.name) {
                out.push((h.name.clone(), h.value.0.clone()));
            }
        }
        out
    }
}

/// A header as written: a plain string, or a value with `fixed`.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawHeader {
    Plain(String),
    Full {
        value: String,
        #[serde(default)]
        fixed: bool,
    },
}

impl fmt::Debug for RawHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Checks and resolves a `headers` map; `field` is its path
/// (`headers`, `endpoints[2].headers`), `env` looks variables up.
pub(crate) fn resolve(
    field: &str,
    raw: &BTreeMap<String, RawHeader>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HeaderSet, (String, String)> {
    let mut out: Vec<ConfigHeader> = Vec::with_capacity(raw.len());
    for (name, h) in raw {
        let at = format!("{field}.{name}");
        let header = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| (at.clone(), "invalid header name".to_owned()))?;
        crate::syntax::check_header_name(name).map_err(|m| (at.clone(), m))?;
        if out.iter().any(|o| o.name == header) {
            return Err((at, "header given twice (names are case-insensitive)".into()));
        }
        let (text, fixed) = match h {
            RawHeader::Plain(v) => (v.as_str(), false),
            RawHeader::Full { value, fixed } => (value.as_str(), *fixed),
        };
        let value = substitute(text, env).map_err(|m| (at.clone(), m))?;
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            (
                at.clone(),
                "invalid header value (control characters or non-visible bytes; value not shown)"
                    .to_owned(),
            )
        })?;
        value.set_sensitive(true);
        out.push(ConfigHeader {
            name: header,
            value: Secret(value),
            fixed,
        });
    }
    Ok(HeaderSet(out.into()))
}

/// Replaces each `${NAME}` in `text` by the variable's value (`$${` is a
/// literal `${`). Errors name the variable, never a value.
fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let end = tail
                .find('}')
                .ok_or_else(|| "unterminated `${` (write `$${` for a literal)".to_owned())?;
            let name = &tail[..end];
            let valid = name
                .chars()
                .enumerate()
                .all(|(j, c)| c == '_' || c.is_ascii_alphabetic() || (j > 0 && c.is_ascii_digit()));
            if name.is_empty() || !valid {
                return Err(format!("`${{{name}}}` is not a variable name"));
            }
            let value =
                env(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
            out.push_str(&value);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Looks a variable up in the process environment (not Unicode: not set).
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "KEY" => Some("s3cr3t".into()),
            "NL" => Some("a\r\nx-evil: 1".into()),
            _ => None,
        }
    }

    fn raw(json: &str) -> BTreeMap<String, RawHeader> {
        serde_json::from_str(json).unwrap()
    }

    fn set(json: &str) -> HeaderSet {
        resolve("headers", &raw(json), &env).unwrap()
    }

    fn pairs(h: &[(HeaderName, HeaderValue)]) -> Vec<(String, String)> {
        h.iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn variables_are_substituted_and_literals_kept() {
        assert_eq!(substitute("Bearer ${KEY}", &env).unwrap(), "Bearer s3cr3t");
        assert_eq!(substitute("$5 and $${KEY}", &env).unwrap(), "$5 and ${KEY}");
        assert_eq!(substitute("${KEY}${KEY}", &env).unwrap(), "s3cr3ts3cr3t");
    }

    #[test]
    fn a_missing_variable_names_field_and_variable_never_a_value() {
        let (field, msg) = resolve(
            "endpoints[1].headers",
            &raw(r#"{"authorization":"Bearer ${MISSING_KEY}"}"#),
            &env,
        )
        .unwrap_err();
        assert_eq!(field, "endpoints[1].headers.authorization");
        assert!(msg.contains("MISSING_KEY"), "{msg}");
        // A value that is not a valid header (CR/LF) is refused without it.
        let (_, msg) = resolve("headers", &raw(r#"{"x-k":"${NL}"}"#), &env).unwrap_err();
        assert!(!msg.contains("evil"), "{msg}");
        for bad in ["${", "${1A}", "${}", "${A-B}"] {
            let json = format!(r#"{{"x-k":"{bad}"}}"#);
            assert!(resolve("headers", &raw(&json), &env).is_err(), "{bad}");
        }
    }

    #[test]
    fn routing_and_framing_headers_are_refused() {
        for name in ["host", "Content-Length", "proxy-authorization", "bad name"] {
            let json = format!(r#"{{"{name}":"x"}}"#);
            let (field, _) = resolve("headers", &raw(&json), &env).unwrap_err();
            assert_eq!(field, format!("headers.{name}"));
        }
        let (_, msg) = resolve("headers", &raw(r#"{"X-A":"1","x-a":"2"}"#), &env).unwrap_err();
        assert!(msg.contains("twice"), "{msg}");
    }

    #[test]
    fn a_tasks_header_wins_unless_the_config_fixes_it() {
        let h =
            set(r#"{"authorization":{"value":"Bearer ${KEY}","fixed":true},"x-team":"search"}"#);
        let task = vec![
            (
                HeaderName::from_static("authorization"),
                HeaderValue::from_static("Bearer theirs"),
            ),
            (
                HeaderName::from_static("x-team"),
                HeaderValue::from_static("mine"),
            ),
            (
                HeaderName::from_static("accept"),
                HeaderValue::from_static("a"),
            ),
        ];
        let want = [
            ("x-team", "mine"),
            ("accept", "a"),
            ("authorization", "Bearer s3cr3t"),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs(&h.apply(&task)), want);
        assert_eq!(pairs(&h.apply(&[])).len(), 2);
    }

    #[test]
    fn an_endpoints_header_replaces_the_services() {
        let service = set(r#"{"authorization":"Bearer ${KEY}","x-team":"search"}"#);
        let endpoint = set(r#"{"Authorization":"Bearer other"}"#);
        let m = HeaderSet::merged(&service, &endpoint);
        let got = pairs(&m.apply(&[]));
        assert_eq!(got.len(), 2);
        assert!(got.contains(&("authorization".into(), "Bearer other".into())));
        assert!(got.contains(&("x-team".into(), "search".into())));
        assert_eq!(HeaderSet::merged(&service, &HeaderSet::default()), service);
    }

    #[test]
    fn debug_never_shows_a_value() {
        let h = set(r#"{"authorization":"Bearer ${KEY}"}"#);
        let dbg = format!("{h:?} {:?}", h.apply(&[]));
        assert!(!dbg.contains("s3cr3t"), "{dbg}");
        assert!(dbg.contains("authorization"), "{dbg}");
        let r = raw(r#"{"a":"plain-secret"}"#);
        assert!(!format!("{r:?}").contains("plain-secret"));
    }
}
