//! Name resolution for the stores spoken to over HTTP (Consul, etcd).

use ureq::http;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// Resolves a server's address. An IP address is used as it is: ureq's
/// default resolver starts a thread for every request to bound a name
/// lookup by the timeout, which costs more than the request on loopback.
/// With `pinned` (Consul's `--tls-server-name`), every URL resolves to the
/// agent's address, while URLs carry the name its certificate is checked
/// against.
#[derive(Debug)]
pub struct DirectResolver {
    pub pinned: Option<http::Uri>,
}

impl Resolver for DirectResolver {
    fn resolve(
        &self,
        uri: &http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let uri = self.pinned.as_ref().unwrap_or(uri);
        let ip = uri
            .host()
            .map(|host| host.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|host| host.parse::<std::net::IpAddr>().ok());
        let https = uri.scheme_str() == Some("https");
        match ip {
            Some(ip) => {
                let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
                let mut addresses = self.empty();
                addresses.push(std::net::SocketAddr::new(ip, port));
                Ok(addresses)
            }
            None => DefaultResolver::default().resolve(uri, config, timeout),
        }
    }
}
