//! A test CA and server certificates, made at test time with rcgen: no
//! certificate is checked in. The CA's PEM is written to a fresh temporary
//! directory, removed when the [`Pki`] is dropped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority of its own, and a directory for its files.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    dir: PathBuf,
}

/// What a server certificate is like.
pub enum Leaf<'a> {
    /// Valid now, for these names (`127.0.0.1` becomes an IP address SAN).
    For(&'a [&'a str]),
    /// For 127.0.0.1, but expired in 2001.
    Expired,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        static N: AtomicU32 = AtomicU32::new(0);
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        let dir = std::env::temp_dir().join(format!(
            "actix-dispatch-pki-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Pki {
            issuer: Issuer::new(params, key),
            ca_der: cert.der().clone(),
            ca_pem: cert.pem(),
            dir,
        }
    }

    /// Writes the CA certificate as PEM and returns its path.
    pub fn ca_file(&self) -> String {
        let path = self.dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem).expect("write ca.pem");
        path.display().to_string()
    }

    /// A file in the directory with `text`, for bad-file tests.
    pub fn file(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).expect("write file");
        path.display().to_string()
    }

    /// A rustls server config with a certificate `leaf` signed by this CA.
    pub fn server_config(&self, leaf: Leaf<'_>) -> Arc<rustls::ServerConfig> {
        let (names, expired): (Vec<String>, bool) = match leaf {
            Leaf::For(names) => (names.iter().map(|s| s.to_string()).collect(), false),
            Leaf::Expired => (vec!["127.0.0.1".into()], true),
        };
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "test server");
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("server certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.ca_der.clone()], key)
            .expect("server config");
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
