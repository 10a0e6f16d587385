//! TLS for the stores spoken to over HTTPS (Consul, etcd): the CA, client
//! certificate and server name settings their CLIs take, loaded into
//! ureq's rustls configuration, and handshake failures explained in terms
//! of those settings, as each store's users spell them ([`Names`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

/// How a store's users name the server and the TLS settings, for messages.
#[derive(Debug)]
pub struct Names {
    /// "the agent", "the etcd server".
    pub server: &'static str,
    pub ca_file: &'static str,
    pub ca_path: &'static str,
    pub client_cert: &'static str,
    pub client_key: &'static str,
    /// Where the address is given, for a certificate issued for another name.
    pub address: &'static str,
    /// The server name setting, where the store has one.
    pub server_name: Option<&'static str>,
    /// How to reach the server without TLS.
    pub plain: &'static str,
}

/// TLS settings, as given (`--ca-file`, `CONSUL_CACERT`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub ca_file: Option<PathBuf>,
    pub ca_path: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name to verify the agent's certificate against.
    pub server_name: Option<String>,
    /// False with `CONSUL_HTTP_SSL_VERIFY=false`: no verification at all.
    pub verify: bool,
}

/// A TLS setting that cannot be used; the message names the file and the
/// setting that gave it.
#[derive(Debug)]
pub enum TlsError {
    /// A file or directory that cannot be read.
    Unreadable {
        path: PathBuf,
        setting: &'static str,
        error: std::io::Error,
    },
    /// A file, or every file of a directory, without a certificate.
    NoCertificate {
        path: PathBuf,
        setting: &'static str,
        directory: bool,
    },
    NoPrivateKey {
        path: PathBuf,
        setting: &'static str,
    },
    /// A client certificate without its key, or a key without its
    /// certificate.
    HalfAClientCertificate {
        cert: &'static str,
        key: &'static str,
    },
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsError::Unreadable {
                path,
                setting,
                error,
            } => write!(f, "cannot read {} ({setting}): {error}", path.display()),
            TlsError::NoCertificate {
                path,
                setting,
                directory: false,
            } => write!(
                f,
                "{} ({setting}) holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
            TlsError::NoCertificate { path, setting, .. } => {
                write!(f, "{} ({setting}) holds no PEM certificate", path.display())
            }
            TlsError::NoPrivateKey { path, setting } => write!(
                f,
                "{} ({setting}) holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)",
                path.display()
            ),
            TlsError::HalfAClientCertificate { cert, key } => write!(
                f,
                "a client certificate needs its key and the other way round: set both {cert} and {key}"
            ),
        }
    }
}

impl std::error::Error for TlsError {}

impl TlsSettings {
    /// Builds ureq's TLS configuration, reading every file now so that a bad
    /// one is reported at start, by name.
    pub fn load(&self, names: &Names) -> Result<TlsConfig, TlsError> {
        let mut builder = TlsConfig::builder().provider(TlsProvider::Rustls);
        let mut roots = Vec::new();
        if let Some(file) = &self.ca_file {
            roots.extend(read_certificates(file, names.ca_file)?);
        }
        if let Some(dir) = &self.ca_path {
            roots.extend(read_certificate_dir(dir, names.ca_path)?);
        }
        if roots.is_empty() {
            // As the consul CLI does: the operating system's store (where a
            // company CA is installed), or the files SSL_CERT_FILE and
            // SSL_CERT_DIR name; the bundle compiled in if it has none.
            let native = rustls_native_certs::load_native_certs();
            roots.extend(
                native
                    .certs
                    .iter()
                    .map(|der| Certificate::from_der(der.as_ref()).to_owned()),
            );
            crate::report::event(
                "tls-roots",
                &[(
                    "source",
                    &if roots.is_empty() {
                        "bundled (the system has none)".to_string()
                    } else {
                        format!("system ({} certificates)", roots.len())
                    },
                )],
            );
        } else {
            crate::report::event(
                "tls-roots",
                &[(
                    "source",
                    &format!("{} ({} certificates)", names.ca_file, roots.len()),
                )],
            );
        }
        if !roots.is_empty() {
            builder = builder.root_certs(RootCerts::Specific(Arc::new(roots)));
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = read_certificates(cert, names.client_cert)?;
                let key = read_private_key(key, names.client_key)?;
                builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            _ => {
                return Err(TlsError::HalfAClientCertificate {
                    cert: names.client_cert,
                    key: names.client_key,
                })
            }
        }
        Ok(builder.disable_verification(!self.verify).build())
    }
}

/// The bytes of the file a TLS setting names; unreadable is an error
/// naming the setting.
pub fn read(path: &Path, setting: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Unreadable {
        path: path.to_path_buf(),
        setting,
        error,
    })
}

/// The certificates of a PEM text, for the stores that speak rustls
/// themselves; none is an error naming the file.
pub fn certificates(
    pem: &[u8],
    path: &Path,
    setting: &'static str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject as _;
    let found: Vec<rustls::pki_types::CertificateDer<'static>> =
        rustls::pki_types::CertificateDer::pem_slice_iter(pem)
            .filter_map(Result::ok)
            .collect();
    if found.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
            setting,
            directory: false,
        });
    }
    Ok(found)
}

fn read_certificates(
    path: &Path,
    setting: &'static str,
) -> Result<Vec<Certificate<'static>>, TlsError> {
    let pem = read(path, setting)?;
    let certificates: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(certificate)) => Some(certificate),
            _ => None,
        })
        .collect();
    found(certificates, path, setting, false)
}

fn read_certificate_dir(
    dir: &Path,
    setting: &'static str,
) -> Result<Vec<Certificate<'static>>, TlsError> {
    let entries = std::fs::read_dir(dir).map_err(|error| TlsError::Unreadable {
        path: dir.to_path_buf(),
        setting,
        error,
    })?;
    let mut certificates = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // Like Go's rootcerts: every file in the directory that parses.
        if path.is_file() {
            if let Ok(found) = read_certificates(&path, setting) {
                certificates.extend(found);
            }
        }
    }
    found(certificates, dir, setting, true)
}

/// The certificates read from `path`, unless it held none.
fn found(
    certificates: Vec<Certificate<'static>>,
    path: &Path,
    setting: &'static str,
    directory: bool,
) -> Result<Vec<Certificate<'static>>, TlsError> {
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
            setting,
            directory,
        });
    }
    Ok(certificates)
}

fn read_private_key(path: &Path, setting: &'static str) -> Result<PrivateKey<'static>, TlsError> {
    let pem = read(path, setting)?;
    PrivateKey::from_pem(&pem).map_err(|_| TlsError::NoPrivateKey {
        path: path.to_path_buf(),
        setting,
    })
}

/// Says what a failed TLS exchange means for the settings, or `None` when
/// the error is not about TLS. `no_client_cert` is true on https when no
/// client certificate was offered.
pub fn explain(
    error: &ureq::Error,
    host: &str,
    no_client_cert: bool,
    names: &Names,
) -> Option<String> {
    use rustls::{AlertDescription, CertificateError, Error as Tls};
    let server = names.server;
    let client_cert_hint = format!(
        "{server} verifies clients: set {} and {} to a certificate its CA signed",
        names.client_cert, names.client_key
    );
    // ureq reports handshake failures as I/O errors wrapping rustls's.
    let tls = match error {
        ureq::Error::Rustls(tls) => tls,
        ureq::Error::Io(io) => match io.get_ref().and_then(|inner| inner.downcast_ref::<Tls>()) {
            Some(tls) => tls,
            // Under TLS 1.3 the client's handshake ends before the server
            // checks the client: its refusal shows as a closed connection.
            None if no_client_cert
                && matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                return Some(format!(
                    "{server} closed the connection during the TLS handshake ({io}): if it serves plain HTTP, {}; if {client_cert_hint}",
                    names.plain
                ));
            }
            None => return None,
        },
        _ => return None,
    };
    Some(match tls {
        Tls::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
            "{server}'s certificate is not signed by a trusted CA: set {} to the CA that signs it",
            names.ca_file
        ),
        Tls::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            format!("{server}'s certificate has expired: renew it on the server")
        }
        Tls::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "{server}'s certificate is not valid for '{host}': use the name it was issued for in {}{}",
            names.address,
            names
                .server_name
                .map(|setting| format!(", or set {setting}"))
                .unwrap_or_default()
        ),
        Tls::AlertReceived(
            AlertDescription::CertificateRequired | AlertDescription::HandshakeFailure | AlertDescription::BadCertificate,
        ) => format!("{server} refused the TLS handshake; {client_cert_hint}"),
        // The first bytes back were no TLS record: a plain HTTP server's
        // "400 Bad Request".
        Tls::InvalidMessage(_) => format!(
            "{server} did not answer in TLS ({tls}): if it serves plain HTTP, {}",
            names.plain
        ),
        other => format!("TLS failed: {other}"),
    })
}
