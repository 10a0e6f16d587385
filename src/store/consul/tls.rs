//! TLS for the Consul client: the CA, client certificate and server name
//! settings the consul CLI takes, loaded into ureq's rustls configuration,
//! and handshake failures explained in terms of those settings.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

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

impl TlsSettings {
    /// Builds ureq's TLS configuration, reading every file now so that a bad
    /// one is reported at start, by name.
    pub fn load(&self) -> Result<TlsConfig, String> {
        let mut builder = TlsConfig::builder().provider(TlsProvider::Rustls);
        let mut roots = Vec::new();
        if let Some(file) = &self.ca_file {
            roots.extend(read_certificates(file, "--ca-file/CONSUL_CACERT")?);
        }
        if let Some(dir) = &self.ca_path {
            roots.extend(read_certificate_dir(dir)?);
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
                    &format!("--ca-file/--ca-path ({} certificates)", roots.len()),
                )],
            );
        }
        if !roots.is_empty() {
            builder = builder.root_certs(RootCerts::Specific(Arc::new(roots)));
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let chain = read_certificates(cert, "--client-cert/CONSUL_CLIENT_CERT")?;
                let key = read_private_key(key)?;
                builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
            }
            (None, None) => {}
            _ => {
                return Err(
                    "a client certificate needs its key and the other way round: set both --client-cert and --client-key"
                        .into(),
                )
            }
        }
        Ok(builder.disable_verification(!self.verify).build())
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {} ({what}): {e}", path.display()))
}

fn read_certificates(path: &Path, what: &str) -> Result<Vec<Certificate<'static>>, String> {
    let pem = read(path, what)?;
    let certificates: Vec<Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(certificate)) => Some(certificate),
            _ => None,
        })
        .collect();
    if certificates.is_empty() {
        return Err(format!(
            "{} ({what}) holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certificates)
}

fn read_certificate_dir(dir: &Path) -> Result<Vec<Certificate<'static>>, String> {
    let what = "--ca-path/CONSUL_CAPATH";
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {} ({what}): {e}", dir.display()))?;
    let mut certificates = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // Like Go's rootcerts: every file in the directory that parses.
        if path.is_file() {
            if let Ok(found) = read_certificates(&path, what) {
                certificates.extend(found);
            }
        }
    }
    if certificates.is_empty() {
        return Err(format!(
            "{} ({what}) holds no PEM certificate",
            dir.display()
        ));
    }
    Ok(certificates)
}

fn read_private_key(path: &Path) -> Result<PrivateKey<'static>, String> {
    let what = "--client-key/CONSUL_CLIENT_KEY";
    let pem = read(path, what)?;
    PrivateKey::from_pem(&pem).map_err(|_| {
        format!(
            "{} ({what}) holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)",
            path.display()
        )
    })
}

/// Says what a failed TLS exchange means for the settings, or `None` when
/// the error is not about TLS. `no_client_cert` is true on https when no
/// client certificate was offered.
pub fn explain(error: &ureq::Error, host: &str, no_client_cert: bool) -> Option<String> {
    use rustls::{AlertDescription, CertificateError, Error as Tls};
    const CLIENT_CERT_HINT: &str = "the agent verifies clients: set --client-cert and --client-key (CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY) to a certificate its CA signed";
    // ureq reports handshake failures as I/O errors wrapping rustls's.
    let tls = match error {
        ureq::Error::Rustls(tls) => tls,
        ureq::Error::Io(io) => match io.get_ref().and_then(|inner| inner.downcast_ref::<Tls>()) {
            Some(tls) => tls,
            // Under TLS 1.3 the client's handshake ends before the agent
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
                    "the agent closed the connection ({io}); if {CLIENT_CERT_HINT}"
                ));
            }
            None => return None,
        },
        _ => return None,
    };
    Some(match tls {
        Tls::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "the agent's certificate is not signed by a trusted CA: set --ca-file (CONSUL_CACERT) to the CA that signs it".into()
        }
        Tls::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            "the agent's certificate has expired: renew it on the agent".into()
        }
        Tls::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "the agent's certificate is not valid for '{host}': use the name it was issued for in --http-addr, or set --tls-server-name (CONSUL_TLS_SERVER_NAME)"
        ),
        Tls::AlertReceived(
            AlertDescription::CertificateRequired | AlertDescription::HandshakeFailure | AlertDescription::BadCertificate,
        ) => format!("the agent refused the TLS handshake; {CLIENT_CERT_HINT}"),
        other => format!("TLS failed: {other}"),
    })
}
