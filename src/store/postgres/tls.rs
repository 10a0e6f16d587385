//! TLS for the PostgreSQL store: libpq's `sslmode` over the rustls the
//! binary already has. `disable` speaks plain; `allow` and `prefer` try TLS
//! and speak plain to a server without it; `require` insists on TLS and,
//! as libpq, verifies the server's chain only when a root certificate is
//! given (`sslrootcert`, `PGSSLROOTCERT`, else `~/.postgresql/root.crt`
//! where it exists); `verify-ca` verifies the chain; `verify-full` the chain
//! and the host name.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(text: &str) -> Option<SslMode> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// What the client asks of the server: TLS never, if it has it, or
    /// always.
    pub fn client_mode(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Client;
        match self {
            SslMode::Disable => Client::Disable,
            SslMode::Allow | SslMode::Prefer => Client::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Client::Require,
        }
    }
}

/// Where the root certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// A PEM file.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's store.
    System,
    /// None given, and no `~/.postgresql/root.crt`.
    None,
}

/// A TLS setting that cannot be used.
#[derive(Debug)]
pub enum TlsSetupError {
    Unreadable { path: PathBuf, error: io::Error },
    NoCertificate { path: PathBuf },
    NoRoots { mode: &'static str },
    Rustls(rustls::Error),
}

impl std::fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsSetupError::Unreadable { path, error } => {
                write!(f, "cannot read {} (sslrootcert): {error}", path.display())
            }
            TlsSetupError::NoCertificate { path } => write!(
                f,
                "{} (sslrootcert) holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
            TlsSetupError::NoRoots { mode } => write!(
                f,
                "sslmode={mode} verifies the server's certificate, and no root certificate is given: set sslrootcert (or PGSSLROOTCERT) to the CA's PEM file, or sslrootcert=system, or put it in ~/.postgresql/root.crt"
            ),
            TlsSetupError::Rustls(error) => write!(f, "TLS: {error}"),
        }
    }
}

impl std::error::Error for TlsSetupError {}

/// The connector: plain where the mode allows it, else rustls with the
/// verification the mode asks for.
#[derive(Clone)]
pub struct Tls {
    config: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("tls", &self.config.is_some())
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_roots(path: &Path) -> Result<rustls::RootCertStore, TlsSetupError> {
    let text = std::fs::read(path).map_err(|error| TlsSetupError::Unreadable {
        path: path.to_path_buf(),
        error,
    })?;
    let mut roots = rustls::RootCertStore::empty();
    for item in rustls::pki_types::pem::PemObject::pem_slice_iter(&text) {
        let item: CertificateDer<'static> = match item {
            Ok(item) => item,
            Err(_) => continue,
        };
        roots.add(item).map_err(TlsSetupError::Rustls)?;
    }
    if roots.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(roots)
}

impl Tls {
    /// The connector for `mode` with the roots of `roots`; files are read
    /// now, so that a bad one is reported at start.
    pub fn new(mode: SslMode, roots: &Roots) -> Result<Tls, TlsSetupError> {
        if mode == SslMode::Disable {
            return Ok(Tls { config: None });
        }
        let store = match roots {
            Roots::File(path) => Some(read_roots(path)?),
            Roots::System => {
                let mut store = rustls::RootCertStore::empty();
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = store.add(cert);
                }
                Some(store)
            }
            Roots::None => None,
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Rustls)?;
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, store) {
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(TlsSetupError::NoRoots {
                    mode: if mode == SslMode::VerifyCa {
                        "verify-ca"
                    } else {
                        "verify-full"
                    },
                })
            }
            // libpq's require, allow and prefer without a root
            // certificate: encrypted, not verified.
            (_, None) => Arc::new(Unverified(provider())),
            (mode, Some(store)) => {
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider())
                        .build()
                        .map_err(|e| {
                            TlsSetupError::Rustls(rustls::Error::General(e.to_string()))
                        })?;
                if mode == SslMode::VerifyFull {
                    webpki
                } else {
                    Arc::new(AnyName(webpki))
                }
            }
        };
        let config = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Tls {
            config: Some(Arc::new(config)),
        })
    }
}

/// The chain verified, the name not (`verify-ca`).
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// No verification of the certificate (libpq's `require` without a root
/// certificate); the handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
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
        rustls::crypto::verify_tls13_signature(
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

/// One connection's handshake: the configuration and the host's name
/// (none for a Unix socket, over which nothing asks for TLS).
pub struct Connect {
    config: Option<Arc<rustls::ClientConfig>>,
    name: Option<ServerName<'static>>,
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = Connect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connect, Self::Error> {
        Ok(Connect {
            config: self.config.clone(),
            // The client names no host for a Unix socket.
            name: match domain {
                "" => None,
                domain => Some(ServerName::try_from(domain.to_string())?),
            },
        })
    }
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is disabled (sslmode=disable)"))?;
            let name = self
                .name
                .ok_or_else(|| io::Error::other("no host name to check the certificate against"))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await?;
            Ok(RustlsStream(stream))
        })
    }
}

/// The TLS stream the client reads and writes.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// No channel binding: SCRAM is done without it (SCRAM-SHA-256, not
    /// -PLUS), as libpq does with `channel_binding=prefer` when it cannot.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
