//! TLS files for `rediss://`, named as redis-cli names them (`--cacert`,
//! `--cert`, `--key`): read and checked when the options are read, so that
//! a bad file is a usage error before anything is sent, and kept in the
//! store's settings for whichever way the store connects. Handshake
//! failures are explained in terms of those options.

use std::path::{Path, PathBuf};

use redis::{ClientTlsConfig, RedisError, TlsCertificates};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::PrivateKeyDer;

use crate::store::tls::{certificates, read, TlsError};

/// The files given, as paths.
#[derive(Debug, Default)]
pub struct TlsFiles<'a> {
    pub cacert: Option<&'a Path>,
    pub cert: Option<&'a Path>,
    pub key: Option<&'a Path>,
}

/// What was read from them: the PEM texts the client presents and trusts.
/// Its `Debug` shows no key (the `redis` crate's redacts it).
#[derive(Debug, Clone)]
pub struct ClientTls {
    certificates: TlsCertificates,
    /// A client certificate is presented: a refused handshake is about it.
    pub presents_certificate: bool,
    /// A CA of our own replaces the system's roots: messages name it.
    pub own_ca: bool,
}

/// Why the TLS files cannot be used; each message names the file and the
/// option, and the fix. Exit 2.
#[derive(Debug)]
pub enum ClientTlsError {
    /// A file that cannot be read, holds no certificate, or no key; or a
    /// certificate without its key.
    File(TlsError),
    /// The key is not the certificate's.
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// TLS files with `redis://`, which speaks no TLS.
    NotRediss { option: &'static str },
}

impl std::fmt::Display for ClientTlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientTlsError::File(error @ TlsError::Unreadable { setting, .. }) => {
                write!(f, "{error}: point {setting} at a readable PEM file")
            }
            ClientTlsError::File(error) => error.fmt(f),
            ClientTlsError::KeyMismatch { cert, key } => write!(
                f,
                "{} (--key) is not the private key of the certificate in {} (--cert): give the key the certificate was made for",
                key.display(),
                cert.display()
            ),
            ClientTlsError::NotRediss { option } => write!(
                f,
                "{option} is for TLS, and --store is redis://: write rediss://host:port for a server with TLS, or drop {option}"
            ),
        }
    }
}

impl std::error::Error for ClientTlsError {}

impl From<TlsError> for ClientTlsError {
    fn from(error: TlsError) -> ClientTlsError {
        ClientTlsError::File(error)
    }
}

impl ClientTls {
    /// Reads the files given; `None` when none was. `tls` says whether the
    /// store was given as `rediss://`.
    pub fn load(files: &TlsFiles<'_>, tls: bool) -> Result<Option<ClientTls>, ClientTlsError> {
        let given = [
            ("--cacert", files.cacert),
            ("--cert", files.cert),
            ("--key", files.key),
        ];
        if !tls {
            return match given.iter().find(|(_, path)| path.is_some()) {
                Some((option, _)) => Err(ClientTlsError::NotRediss { option }),
                None => Ok(None),
            };
        }
        let client_tls = match (files.cert, files.key) {
            (Some(cert), Some(key)) => Some(client_certificate(cert, key)?),
            (None, None) => None,
            _ => {
                return Err(TlsError::HalfAClientCertificate {
                    cert: "--cert",
                    key: "--key",
                }
                .into())
            }
        };
        let root_cert = match files.cacert {
            Some(path) => {
                let pem = read(path, "--cacert")?;
                certificates(&pem, path, "--cacert")?;
                Some(pem)
            }
            None => None,
        };
        if client_tls.is_none() && root_cert.is_none() {
            return Ok(None);
        }
        Ok(Some(ClientTls {
            presents_certificate: client_tls.is_some(),
            own_ca: root_cert.is_some(),
            certificates: TlsCertificates {
                client_tls,
                root_cert,
            },
        }))
    }

    /// For the `redis` crate's `build_with_tls` (and its cluster and
    /// Sentinel builders, which take the same).
    pub fn certificates(&self) -> TlsCertificates {
        self.certificates.clone()
    }
}

/// Reads a certificate and its key, checking that the key is a key and is
/// the certificate's, as the TLS library will when it connects.
fn client_certificate(cert: &Path, key: &Path) -> Result<ClientTlsConfig, ClientTlsError> {
    let client_cert = read(cert, "--cert")?;
    let chain = certificates(&client_cert, cert, "--cert")?;
    let client_key = read(key, "--key")?;
    let private_key =
        PrivateKeyDer::from_pem_slice(&client_key).map_err(|_| TlsError::NoPrivateKey {
            path: key.to_path_buf(),
            setting: "--key",
        })?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, private_key, &provider).map_err(|_| {
        ClientTlsError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        }
    })?;
    Ok(ClientTlsConfig {
        client_cert,
        client_key,
    })
}

/// The TLS library's error behind a failed call, if TLS is what failed:
/// the `redis` crate keeps the I/O error it wraps in an `Arc`, which is
/// what it gives as the source.
fn tls_cause(error: &RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let source = std::error::Error::source(error)?;
    let inner: &(dyn std::error::Error + 'static) = match source.downcast_ref::<Shared>() {
        Some(shared) => shared.as_ref(),
        None => source,
    };
    if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    inner
        .downcast_ref::<std::io::Error>()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
}

/// Says what a failed TLS exchange with the server at `shown` (host
/// `host`) means for the options, or `None` when TLS is not what failed.
pub fn explain(
    error: &RedisError,
    shown: &str,
    host: &str,
    tls: Option<&ClientTls>,
) -> Option<String> {
    use rustls::{AlertDescription, CertificateError, Error as Tls};
    let trust_hint = if tls.is_some_and(|tls| tls.own_ca) {
        "--cacert does not name the CA that signs it"
    } else {
        "pass --cacert with the CA that signs it (or point SSL_CERT_FILE at it)"
    };
    let presents = tls.is_some_and(|tls| tls.presents_certificate);
    Some(match tls_cause(error)? {
        Tls::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "the certificate of Redis at {shown} is not signed by a CA consem trusts: {trust_hint}"
        ),
        Tls::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => format!("the certificate of Redis at {shown} has expired: renew it on the server"),
        Tls::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the certificate of Redis at {shown} is not valid for '{host}': use a name it was issued for in --store"
        ),
        Tls::AlertReceived(
            AlertDescription::CertificateRequired | AlertDescription::HandshakeFailure,
        ) if !presents => format!(
            "Redis at {shown} wants a client certificate (tls-auth-clients): pass --cert and --key, a certificate signed by the CA it trusts (tls-ca-cert-file)"
        ),
        Tls::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::HandshakeFailure
            | AlertDescription::DecryptError,
        ) if presents => format!(
            "Redis at {shown} refused our client certificate (--cert): give one signed by the CA it trusts (tls-ca-cert-file), and still valid"
        ),
        other => format!("TLS with Redis at {shown} failed: {other}"),
    })
}
