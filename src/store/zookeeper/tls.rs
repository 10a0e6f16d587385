//! TLS for `zks://`: ZooKeeper's secure client port (`secureClientPort`,
//! served by its Netty connection factory), over the rustls already in the
//! binary. The files are `--cacert`, `--cert` and `--key`, as for
//! `etcds://` and `rediss://`; without `--cacert`, the system's roots (or
//! the file `SSL_CERT_FILE` names). Read and checked when the options are
//! read, so that a bad file is a usage error before anything is sent; a
//! failed handshake is explained in terms of those options.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The client's TLS configuration, and what messages say of it.
#[derive(Clone)]
pub struct ZkTls {
    pub config: Arc<rustls::ClientConfig>,
    /// A client certificate is presented: a refused handshake is about it.
    pub presents_certificate: bool,
    /// A CA of our own replaces the system's roots: messages name it.
    pub own_ca: bool,
}

/// Never the key.
impl std::fmt::Debug for ZkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkTls")
            .field("presents_certificate", &self.presents_certificate)
            .field("own_ca", &self.own_ca)
            .finish()
    }
}

/// Why the TLS files cannot be used; each message names the file and the
/// option, and the fix. Exit 2.
#[derive(Debug)]
pub enum ZkTlsError {
    /// A file that cannot be read, holds no certificate, or no key; or a
    /// certificate without its key.
    File(TlsError),
    /// The key is not the certificate's.
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// TLS files with `zk://`, which speaks no TLS.
    NotZks { option: &'static str },
    /// rustls refused the configuration (a certificate it cannot use).
    Unusable(rustls::Error),
}

impl std::fmt::Display for ZkTlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZkTlsError::File(error @ TlsError::Unreadable { setting, .. }) => {
                write!(f, "{error}: point {setting} at a readable PEM file")
            }
            ZkTlsError::File(error) => error.fmt(f),
            ZkTlsError::KeyMismatch { cert, key } => write!(
                f,
                "{} (--key) is not the private key of the certificate in {} (--cert): give the key the certificate was made for",
                key.display(),
                cert.display()
            ),
            ZkTlsError::NotZks { option } => write!(
                f,
                "{option} is for TLS, and --store is zk://: write zks://host:port for ZooKeeper's secure client port, or drop {option}"
            ),
            ZkTlsError::Unusable(error) => write!(f, "the TLS files cannot be used: {error}"),
        }
    }
}

impl std::error::Error for ZkTlsError {}

impl From<TlsError> for ZkTlsError {
    fn from(error: TlsError) -> ZkTlsError {
        ZkTlsError::File(error)
    }
}

impl ZkTls {
    /// Reads the files given; `None` without `zks://` (`tls` false), where
    /// a file given is an error.
    pub fn load(files: &TlsFiles<'_>, tls: bool) -> Result<Option<ZkTls>, ZkTlsError> {
        let given = [
            ("--cacert", files.cacert),
            ("--cert", files.cert),
            ("--key", files.key),
        ];
        if !tls {
            return match given.iter().find(|(_, path)| path.is_some()) {
                Some((option, _)) => Err(ZkTlsError::NotZks { option }),
                None => Ok(None),
            };
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        match files.cacert {
            Some(path) => {
                for certificate in certificates(&read(path, "--cacert")?, path, "--cacert")? {
                    roots.add(certificate).map_err(ZkTlsError::Unusable)?;
                }
            }
            // As OpenSSL and the other stores: the system's store, or the
            // file SSL_CERT_FILE names.
            None => {
                for certificate in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(certificate);
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(ZkTlsError::Unusable)?
            .with_root_certificates(roots);
        let config = match (files.cert, files.key) {
            (Some(cert), Some(key)) => {
                let chain = certificates(&read(cert, "--cert")?, cert, "--cert")?;
                let private_key =
                    PrivateKeyDer::from_pem_slice(&read(key, "--key")?).map_err(|_| {
                        TlsError::NoPrivateKey {
                            path: key.to_path_buf(),
                            setting: "--key",
                        }
                    })?;
                let mismatch = || ZkTlsError::KeyMismatch {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                };
                // rustls checks that the key is the certificate's as it
                // connects; checked here, it is a usage error at start.
                rustls::sign::CertifiedKey::from_der(
                    chain.clone(),
                    private_key.clone_key(),
                    &provider,
                )
                .map_err(|_| mismatch())?;
                builder
                    .with_client_auth_cert(chain, private_key)
                    .map_err(|_| mismatch())?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError::HalfAClientCertificate {
                    cert: "--cert",
                    key: "--key",
                }
                .into())
            }
        };
        Ok(Some(ZkTls {
            config: Arc::new(config),
            presents_certificate: files.cert.is_some(),
            own_ca: files.cacert.is_some(),
        }))
    }

    /// What a TLS failure with the server at `address` (host `host`) means
    /// for the options.
    pub fn explain(&self, error: &rustls::Error, address: &str, host: &str) -> String {
        use rustls::{AlertDescription, CertificateError, Error as Tls};
        let trust_hint = if self.own_ca {
            "--cacert does not name the CA that signs it"
        } else {
            "pass --cacert with the CA that signs it (or point SSL_CERT_FILE at it)"
        };
        match error {
            Tls::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                "the certificate of ZooKeeper at {address} is not signed by a CA consem trusts: {trust_hint}"
            ),
            Tls::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => format!(
                "the certificate of ZooKeeper at {address} has expired: renew it on the server"
            ),
            Tls::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "the certificate of ZooKeeper at {address} is not valid for '{host}': use a name it was issued for in --store"
            ),
            Tls::AlertReceived(
                AlertDescription::CertificateRequired
                | AlertDescription::HandshakeFailure
                | AlertDescription::BadCertificate,
            ) if !self.presents_certificate => self.wants_certificate(address),
            Tls::AlertReceived(
                AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::HandshakeFailure
                | AlertDescription::DecryptError,
            ) => format!(
                "ZooKeeper at {address} refused our client certificate (--cert): give one signed by a CA of its ssl.trustStore, and still valid"
            ),
            // The first bytes back were no TLS record: a plain port.
            Tls::InvalidMessage(_) => format!(
                "ZooKeeper at {address} did not answer in TLS: if that is its plain clientPort, write zk://, or give its secureClientPort"
            ),
            other => format!("TLS with ZooKeeper at {address} failed: {other}"),
        }
    }

    /// A server that closed the connection during or right after the
    /// handshake: under TLS 1.3 that is how a server refuses a client
    /// certificate, or the lack of one; a plain port closes it too.
    pub fn closed_early(&self, address: &str, cause: &str) -> String {
        if self.presents_certificate {
            format!(
                "ZooKeeper at {address} closed the TLS connection ({cause}): it may refuse our client certificate (--cert: give one signed by a CA of its ssl.trustStore), or that port is its plain clientPort (write zk://)"
            )
        } else {
            format!(
                "ZooKeeper at {address} closed the TLS connection ({cause}): if it wants a client certificate (ssl.clientAuth=need, its default), pass --cert and --key, signed by a CA of its ssl.trustStore; if that port is its plain clientPort, write zk://"
            )
        }
    }

    fn wants_certificate(&self, address: &str) -> String {
        format!(
            "ZooKeeper at {address} wants a client certificate (ssl.clientAuth=need, its default): pass --cert and --key, a certificate signed by a CA of its ssl.trustStore, or have it set ssl.clientAuth=none"
        )
    }
}
