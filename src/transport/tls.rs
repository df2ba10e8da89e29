//! The node's rustls client config (feature `tls`).
//!
//! Each node builds its own `ClientConfig` from its
//! [`ConnectionSettings::tls`](super::ConnectionSettings::tls) (the
//! endpoint's settings, else the service's): the webpki roots plus the
//! certificates of the configured `ca_file`, or, for
//! `insecure_skip_verify`, a verifier that accepts any certificate but
//! still checks the handshake's signatures against it. ALPN offers `h2`
//! then `http/1.1`, so a server that offers HTTP/2 gets it.
//!
//! A failed handshake reaches the transport as rustls's error inside
//! tokio-rustls's `io::Error` (module `connect`); [`describe`] puts it in
//! words for
//! [`ErrorKind::Tls`](crate::outcome::ErrorKind::Tls) (the transport adds
//! the endpoint).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, SignatureScheme};

use crate::config::TlsConfig;

/// A config for `tls` (the webpki roots, the configured CA, or no
/// verification), offering h2 and http/1.1 over ALPN. `None` only if
/// rustls refuses its own default protocol versions (then the node's
/// `https://` requests fail as TLS errors, and a lease's awc client keeps
/// awc's default config).
pub(super) fn client_config(tls: Option<&TlsConfig>) -> Option<Arc<ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| log::error!("TLS: no usable protocol versions: {e}"))
        .ok()?;
    let mut config = match tls {
        Some(t) if t.insecure_skip_verify => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
        _ => {
            let mut roots = actix_tls::connect::rustls_0_23::webpki_roots_cert_store();
            for der in tls
                .and_then(|t| t.ca.as_ref())
                .iter()
                .flat_map(|c| c.certs.iter())
            {
                // Checked when the config was loaded.
                let _ = roots.add(CertificateDer::from(der.clone()));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Some(Arc::new(config))
}

/// A handshake failure in words, rustls's own message after it.
pub(super) fn describe(e: &rustls::Error) -> String {
    let hint = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => {
                "certificate signed by an unknown authority (trust its CA with `tls.ca_file`)"
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "certificate expired"
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "certificate not valid yet"
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "certificate is for another host name"
            }
            _ => "invalid certificate",
        },
        rustls::Error::NoApplicationProtocol => "no common application protocol (ALPN)",
        rustls::Error::AlertReceived(_) => "the server refused the handshake",
        _ => "handshake failed",
    };
    format!("{hint} ({e})")
}

/// `insecure_skip_verify`: any certificate is accepted, but the
/// handshake's signatures are still checked against it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
