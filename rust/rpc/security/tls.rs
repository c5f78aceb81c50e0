//! Optional TLS for worker and parameter-server connections (SPEC §7).
//!
//! Servers take a PEM certificate chain and private key ([`ServerTls`]); clients take a PEM
//! CA bundle to verify the server against ([`ClientTls`]). The PEM text is checked here
//! before rustls sees it, so a wrong file (a key where a certificate belongs, DER bytes, an
//! empty file) fails with a message naming the input and what was expected rather than a
//! handshake error at the first call.

use std::fmt;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// Why TLS material was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The input is not PEM text with the expected block.
    #[error("{what} is not a usable PEM file: {problem}; expected {expected}")]
    BadPem {
        /// Which input (e.g. `tls_cert`).
        what: &'static str,
        /// What was seen.
        problem: String,
        /// What a good input holds.
        expected: &'static str,
    },
    /// rustls refused the material (e.g. a key that does not match the certificate).
    #[error("tls_cert/tls_key were refused (does the key belong to the certificate?): {0}")]
    Rejected(String),
}

/// A server's certificate chain and private key, both PEM.
#[derive(Clone)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for ServerTls {
    // The private key never goes into logs or error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a client trusts: a PEM CA bundle, and the name to check in the server certificate.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// PEM CA certificate(s) the server certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// Name to verify instead of the address's host (an IP or DNS name).
    pub domain: Option<String>,
}

const CERT_EXPECTED: &str = "one or more '-----BEGIN CERTIFICATE-----' blocks";
const KEY_EXPECTED: &str = "one '-----BEGIN PRIVATE KEY-----' (or RSA/EC PRIVATE KEY) block";

/// The labels of the PEM blocks in `pem` (`CERTIFICATE`, `PRIVATE KEY`, ...), checking that
/// each block is closed and its body is base64.
fn pem_labels(
    what: &'static str,
    pem: &[u8],
    expected: &'static str,
) -> Result<Vec<String>, TlsError> {
    let bad = |problem: String| TlsError::BadPem {
        what,
        problem,
        expected,
    };
    let text = std::str::from_utf8(pem).map_err(|_| {
        bad(format!(
            "{} bytes that are not text (DER? convert with `openssl x509 -outform PEM`)",
            pem.len()
        ))
    })?;
    let mut labels = Vec::new();
    let mut open: Option<&str> = None;
    for line in text.lines().map(str::trim) {
        if let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            if let Some(current) = open {
                return Err(bad(format!(
                    "block {current:?} is not closed before {label:?}"
                )));
            }
            open = Some(label);
        } else if let Some(label) = line
            .strip_prefix("-----END ")
            .and_then(|l| l.strip_suffix("-----"))
        {
            match open.take() {
                Some(current) if current == label => labels.push(label.to_owned()),
                other => return Err(bad(format!("END {label:?} does not match BEGIN {other:?}"))),
            }
        } else if open.is_some()
            && !line.contains(':')
            && !line
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        {
            return Err(bad(format!("a block body line is not base64: {line:.40?}")));
        }
    }
    if let Some(current) = open {
        return Err(bad(format!("block {current:?} is never closed")));
    }
    if labels.is_empty() {
        return Err(bad(format!("no PEM block in {} bytes", pem.len())));
    }
    Ok(labels)
}

/// Checks that `pem` holds certificates only (at least one).
fn check_certs(what: &'static str, pem: &[u8]) -> Result<(), TlsError> {
    let labels = pem_labels(what, pem, CERT_EXPECTED)?;
    if let Some(other) = labels.iter().find(|l| *l != "CERTIFICATE") {
        return Err(TlsError::BadPem {
            what,
            problem: format!("it holds a {other:?} block"),
            expected: CERT_EXPECTED,
        });
    }
    Ok(())
}

/// Checks that `pem` holds exactly one private key.
fn check_key(what: &'static str, pem: &[u8]) -> Result<(), TlsError> {
    let labels = pem_labels(what, pem, KEY_EXPECTED)?;
    let keys = ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];
    let is_key = |l: &&String| keys.contains(&l.as_str());
    if labels.len() != 1 || !labels.iter().all(|l| is_key(&l)) {
        return Err(TlsError::BadPem {
            what,
            problem: format!("it holds the blocks {labels:?}"),
            expected: KEY_EXPECTED,
        });
    }
    Ok(())
}

/// Pairs `tls_cert` and `tls_key` (PEM bytes) into a [`ServerTls`]: both or neither.
pub fn server_tls(
    cert_pem: Option<Vec<u8>>,
    key_pem: Option<Vec<u8>>,
) -> Result<Option<ServerTls>, String> {
    match (cert_pem, key_pem) {
        (Some(cert_pem), Some(key_pem)) => Ok(Some(ServerTls { cert_pem, key_pem })),
        (None, None) => Ok(None),
        (cert, _) => Err(format!(
            "TLS needs both tls_cert and tls_key; got only {}",
            if cert.is_some() {
                "tls_cert"
            } else {
                "tls_key"
            }
        )),
    }
}

/// A [`ClientTls`] from a PEM CA bundle and an optional name to verify; `tls_domain`
/// without `tls_ca` is refused (it would silently connect in plaintext).
pub fn client_tls(
    ca_pem: Option<Vec<u8>>,
    domain: Option<String>,
) -> Result<Option<ClientTls>, String> {
    match (ca_pem, domain) {
        (Some(ca_pem), domain) => Ok(Some(ClientTls { ca_pem, domain })),
        (None, None) => Ok(None),
        (None, Some(domain)) => Err(format!(
            "tls_domain={domain:?} was given without tls_ca; expected tls_ca (PEM CA bytes) too"
        )),
    }
}

/// A server builder, serving TLS with `tls` when given; plaintext otherwise.
pub fn server_builder(tls: Option<&ServerTls>) -> Result<Server, TlsError> {
    let Some(tls) = tls else {
        return Ok(Server::builder());
    };
    check_certs("tls_cert", &tls.cert_pem)?;
    check_key("tls_key", &tls.key_pem)?;
    let identity = Identity::from_pem(&tls.cert_pem, &tls.key_pem);
    Server::builder()
        .tls_config(ServerTlsConfig::new().identity(identity))
        .map_err(|e| TlsError::Rejected(error_chain(&e)))
}

/// An endpoint for `uri` (`http://host:port`), switched to `https` and verified against
/// `tls` when given.
pub fn endpoint(uri: String, tls: Option<&ClientTls>) -> Result<Endpoint, String> {
    let Some(tls) = tls else {
        return Endpoint::from_shared(uri).map_err(|e| e.to_string());
    };
    check_certs("tls_ca", &tls.ca_pem).map_err(|e| e.to_string())?;
    let uri = match uri.strip_prefix("http://") {
        Some(rest) => format!("https://{rest}"),
        None => uri,
    };
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
    if let Some(domain) = &tls.domain {
        config = config.domain_name(domain.clone());
    }
    Endpoint::from_shared(uri)
        .map_err(|e| e.to_string())?
        .tls_config(config)
        .map_err(|e| format!("TLS setup failed: {}", error_chain(&e)))
}

/// `e` and its sources, joined: tonic's top-level message alone is often just
/// "transport error".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &[u8] = b"-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n";
    const KEY: &[u8] = b"-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----\n";

    #[test]
    fn well_formed_pem_passes_the_checks() {
        check_certs("tls_cert", CERT).unwrap();
        check_certs("tls_ca", &[CERT, CERT].concat()).unwrap();
        check_key("tls_key", KEY).unwrap();
    }

    #[test]
    fn wrong_files_are_refused_naming_the_input_and_the_expectation() {
        let cases: [(&[u8], bool, &str); 7] = [
            (b"", true, "no PEM block"),
            (b"\x30\x82\x01\xff\xfe", true, "not text"),
            (KEY, true, "\"PRIVATE KEY\" block"),
            (CERT, false, "[\"CERTIFICATE\"]"),
            (&[KEY, KEY].concat(), false, "blocks"),
            (b"-----BEGIN CERTIFICATE-----\nQUJD\n", true, "never closed"),
            (
                b"-----BEGIN CERTIFICATE-----\nno spaces!\n-----END CERTIFICATE-----\n",
                true,
                "not base64",
            ),
        ];
        for (pem, as_cert, needle) in cases {
            let (what, e) = if as_cert {
                ("tls_cert", check_certs("tls_cert", pem).unwrap_err())
            } else {
                ("tls_key", check_key("tls_key", pem).unwrap_err())
            };
            let text = e.to_string();
            assert!(text.starts_with(what), "{text}");
            assert!(text.contains(needle), "{needle:?} not in {text}");
            assert!(text.contains("expected"), "{text}");
        }
    }

    #[test]
    fn the_private_key_is_not_in_debug_output() {
        let tls = ServerTls {
            cert_pem: CERT.to_vec(),
            key_pem: KEY.to_vec(),
        };
        assert!(!format!("{tls:?}").contains("QUJD"));
    }

    #[test]
    fn a_client_endpoint_switches_to_https_only_with_tls() {
        let plain = endpoint("http://127.0.0.1:1".into(), None).unwrap();
        assert_eq!(plain.uri().scheme_str(), Some("http"));
        let bad = ClientTls {
            ca_pem: KEY.to_vec(),
            domain: None,
        };
        let e = endpoint("http://127.0.0.1:1".into(), Some(&bad)).unwrap_err();
        assert!(e.starts_with("tls_ca"), "{e}");
    }
}
