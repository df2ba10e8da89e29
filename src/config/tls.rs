//! TLS settings of a service or an endpoint: which authorities to trust.
//!
//! ```json
//! "tls": { "ca_file": "/etc/inference/ca.pem", "insecure_skip_verify": false }
//! ```
//!
//! - `ca_file`: PEM certificates trusted on top of the webpki roots (a
//!   private CA). It is read and parsed **when the config is loaded**, so a
//!   missing, unreadable or invalid file is a config error naming the field,
//!   not a failed attempt later; a changed file takes effect on the next
//!   load (reload).
//! - `insecure_skip_verify`: no certificate check at all (a lab, never
//!   production). Each node that runs with it logs a warning when it starts.
//!   It cannot be combined with `ca_file`.
//!
//! An endpoint's `tls` replaces its service's whole (not field by field).
//! The settings apply to `https://` endpoints; they need the `tls` cargo
//! feature, and a build without it refuses them with a config error.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

/// TLS settings as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// Validated TLS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// Extra trusted authorities, loaded from `ca_file`.
    pub ca: Option<CaFile>,
    /// Skip certificate verification (logged loudly at start).
    pub insecure_skip_verify: bool,
}

/// The certificates of a `ca_file`, read when the config was loaded.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaFile {
    /// The path given.
    pub path: String,
    /// Its certificates, DER-encoded.
    pub certs: Arc<[Vec<u8>]>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CaFile({:?}, {} certificates)",
            self.path,
            self.certs.len()
        )
    }
}

/// Validates `raw`; errors are `(field, message)`, `field` relative to the
/// `tls` object given as `at`.
pub(crate) fn validate(at: &str, raw: &RawTls) -> Result<TlsConfig, (String, String)> {
    if !cfg!(feature = "tls") {
        return Err((
            at.to_owned(),
            "TLS settings need the `tls` cargo feature, which this build does not have".into(),
        ));
    }
    if raw.insecure_skip_verify && raw.ca_file.is_some() {
        return Err((
            at.to_owned(),
            "give `ca_file` or `insecure_skip_verify`, not both".into(),
        ));
    }
    let ca = match &raw.ca_file {
        None => None,
        Some(path) => {
            let field = format!("{at}.ca_file");
            let certs = load_ca(path).map_err(|m| (field, m))?;
            Some(CaFile {
                path: path.clone(),
                certs: certs.into(),
            })
        }
    };
    Ok(TlsConfig {
        ca,
        insecure_skip_verify: raw.insecure_skip_verify,
    })
}

/// Reads the PEM certificates of `path`, checking each as a trust anchor
/// (the HTTP side's `tls.ca_file` and Redis's `redis.ca_file`).
#[cfg(feature = "tls")]
fn load_ca(path: &str) -> Result<Vec<Vec<u8>>, String> {
    read_ca_pem(path)
}

/// Reads the PEM certificates of `path`, checking each as a trust anchor.
#[cfg(any(feature = "tls", feature = "redis"))]
pub(crate) fn read_ca_pem(path: &str) -> Result<Vec<Vec<u8>>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let pem = std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let mut certs = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("{path:?} is not valid PEM: {e}"))?;
        roots
            .add(cert.clone())
            .map_err(|e| format!("{path:?}: certificate {} is invalid: {e}", certs.len() + 1))?;
        certs.push(cert.to_vec());
    }
    if certs.is_empty() {
        return Err(format!("{path:?} holds no PEM certificate"));
    }
    Ok(certs)
}

#[cfg(not(feature = "tls"))]
fn load_ca(_path: &str) -> Result<Vec<Vec<u8>>, String> {
    Err("TLS settings need the `tls` cargo feature".into())
}
