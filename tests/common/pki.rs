//! Test certificates made at test time with rcgen (ECDSA P-256, so making
//! them is fast): a CA, server and client certificates it signs, an
//! unrelated CA, an expired server certificate and one for another name.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::double::TlsServer;

/// Names the good server certificate is valid for.
pub const SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "consul.test"];
/// The only name the `elsewhere` certificate is valid for.
pub const ELSEWHERE_NAME: &str = "elsewhere.test";

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct CertKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A small PKI for one test. Every certificate but `other_ca`'s is signed by `ca`.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA certificate (PEM) clients should trust.
    pub ca_pem: String,
    /// An unrelated CA ("wrong CA"): trusting only it must fail.
    pub other_ca_pem: String,
    /// SANs `localhost`, IP `127.0.0.1`, `consul.test`; serverAuth.
    pub server: CertKey,
    /// clientAuth, for mTLS.
    pub client: CertKey,
    /// Same names as `server`, but not_after is in the past.
    pub expired: CertKey,
    /// Valid only for `elsewhere.test`.
    pub elsewhere: CertKey,
    /// A client certificate signed by `other_ca` (mTLS with the wrong CA).
    pub other_client: CertKey,
}

/// The paths `TestPki::write_to` wrote.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server: PathBuf,
    pub server_key: PathBuf,
    pub client: PathBuf,
    pub client_key: PathBuf,
    pub expired: PathBuf,
    pub expired_key: PathBuf,
    pub elsewhere: PathBuf,
    pub elsewhere_key: PathBuf,
    pub other_client: PathBuf,
    pub other_client_key: PathBuf,
    /// Not PEM at all.
    pub not_pem: PathBuf,
}

impl TestPki {
    pub fn new() -> TestPki {
        let ca = make_ca("consem test CA");
        let other_ca = make_ca("consem unrelated CA");
        let server = leaf(&ca, "consul.test", &SERVER_NAMES, Usage::Server, false);
        let expired = leaf(
            &ca,
            "consul.test (expired)",
            &SERVER_NAMES,
            Usage::Server,
            true,
        );
        let elsewhere = leaf(&ca, ELSEWHERE_NAME, &[ELSEWHERE_NAME], Usage::Server, false);
        let client = leaf(
            &ca,
            "consem test client",
            &["client.consul.test"],
            Usage::Client,
            false,
        );
        let other_client = leaf(
            &other_ca,
            "consem stranger client",
            &["client.elsewhere.test"],
            Usage::Client,
            false,
        );
        TestPki {
            ca_pem: ca.pem(),
            other_ca_pem: other_ca.pem(),
            server,
            client,
            expired,
            elsewhere,
            other_client,
        }
    }

    /// Writes every PEM file into `dir` (created if missing) and returns the paths.
    pub fn write_to(&self, dir: &Path) -> PkiFiles {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.join(name);
            fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path
        };
        PkiFiles {
            dir: dir.to_path_buf(),
            ca: write("ca.pem", &self.ca_pem),
            other_ca: write("other-ca.pem", &self.other_ca_pem),
            server: write("server.pem", &self.server.cert_pem),
            server_key: write("server-key.pem", &self.server.key_pem),
            client: write("client.pem", &self.client.cert_pem),
            client_key: write("client-key.pem", &self.client.key_pem),
            expired: write("expired.pem", &self.expired.cert_pem),
            expired_key: write("expired-key.pem", &self.expired.key_pem),
            elsewhere: write("elsewhere.pem", &self.elsewhere.cert_pem),
            elsewhere_key: write("elsewhere-key.pem", &self.elsewhere.key_pem),
            other_client: write("other-client.pem", &self.other_client.cert_pem),
            other_client_key: write("other-client-key.pem", &self.other_client.key_pem),
            not_pem: write(
                "not-pem.pem",
                "this is not a certificate\n\u{1}\u{2}garbage\n-----BEGIN NOTHING\n",
            ),
        }
    }

    /// The double's side: the good server certificate; with `mtls`, clients
    /// must present a certificate signed by the CA.
    pub fn tls_server(&self, mtls: bool) -> TlsServer {
        self.tls_server_with(&self.server, mtls)
    }

    /// Like `tls_server`, presenting `cert` (e.g. `&pki.expired`).
    pub fn tls_server_with(&self, cert: &CertKey, mtls: bool) -> TlsServer {
        TlsServer {
            cert_pem: cert.cert_pem.clone(),
            key_pem: cert.key_pem.clone(),
            client_ca_pem: mtls.then(|| self.ca_pem.clone()),
        }
    }
}

impl Default for TestPki {
    fn default() -> Self {
        TestPki::new()
    }
}

#[derive(Clone, Copy)]
enum Usage {
    Server,
    Client,
}

fn make_ca(common_name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("generate a P-256 key");
    CertifiedIssuer::self_signed(params, key).expect("self-sign the test CA")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    names: &[&str],
    usage: Usage,
    expired: bool,
) -> CertKey {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("valid subject alt names");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![match usage {
        Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate().expect("generate a P-256 key");
    let cert = params
        .signed_by(&key, issuer)
        .expect("sign a test certificate");
    CertKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}
