//! TLS to ClickHouse: an `https://` `ExportUrl` (or `--url` of `eventctl`).
//!
//! The server's certificate is always verified, chain and host name: by
//! the system's roots (`/etc/ssl/certs`, or what `SSL_CERT_FILE` and
//! `SSL_CERT_DIR` name), or, when `ExportCAFile` is set, by the
//! certificates in that file only. There is no setting that turns either
//! check off. A client certificate and its key (`ExportCertFile`,
//! `ExportKeyFile`, both or neither) are offered when the server asks.
//!
//! The files are read like the password file (`password.rs`): regular
//! files of bounded size, opened without waiting, the key refused when
//! every local user may read it. They are read at start and again with
//! the password (about every 2 s), so a renewed certificate applies to the
//! next batch without a restart; a file that cannot be read or parsed is
//! said once and the certificates that worked stay in use.

use super::password::Guard;
use crate::config::TlsFiles;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest CA file taken (a whole system bundle is about 200 KiB).
pub const CA_FILE_BYTES_MAX: u64 = 4 << 20;
/// The largest certificate file taken (a chain of a few certificates).
pub const CERT_FILE_BYTES_MAX: u64 = 1 << 20;
/// The largest key file taken.
pub const KEY_FILE_BYTES_MAX: u64 = 64 << 10;

/// What the files held when read: compared with the next reading to see a
/// change, and made into a client configuration.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    ca: Option<(PathBuf, Vec<u8>)>,
    cert: Option<(PathBuf, Vec<u8>)>,
    key: Option<(PathBuf, Vec<u8>)>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key's bytes.
        let path = |x: &Option<(PathBuf, Vec<u8>)>| x.as_ref().map(|(p, _)| p.clone());
        f.debug_struct("TlsMaterial")
            .field("ca", &path(&self.ca))
            .field("cert", &path(&self.cert))
            .field("key", &path(&self.key))
            .finish()
    }
}

/// Reads the files of `files` that are set.
pub fn read(files: &TlsFiles) -> Result<TlsMaterial, String> {
    let read_one = |path: &Option<PathBuf>, guard: Guard| -> Result<_, String> {
        match path {
            None => Ok(None),
            Some(p) => Ok(Some((p.clone(), guard.read(p)?))),
        }
    };
    if files.cert_file.is_some() != files.key_file.is_some() {
        return Err(
            "ExportCertFile and ExportKeyFile go together: set both (a client \
                        certificate and its key) or neither"
                .to_string(),
        );
    }
    Ok(TlsMaterial {
        ca: read_one(
            &files.ca_file,
            Guard {
                key: "ExportCAFile",
                holds: "PEM certificates",
                max_bytes: CA_FILE_BYTES_MAX,
                secret: false,
            },
        )?,
        cert: read_one(
            &files.cert_file,
            Guard {
                key: "ExportCertFile",
                holds: "a PEM certificate chain",
                max_bytes: CERT_FILE_BYTES_MAX,
                secret: false,
            },
        )?,
        key: read_one(
            &files.key_file,
            Guard {
                key: "ExportKeyFile",
                holds: "one PEM private key",
                max_bytes: KEY_FILE_BYTES_MAX,
                secret: true,
            },
        )?,
    })
}

/// Whether `url` asks for TLS.
pub fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

fn certificates(
    key: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{key} {}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} {}: no certificate in it (a PEM file with \"-----BEGIN CERTIFICATE-----\" \
             sections)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The trusted roots: the CA file's, or the system's.
fn roots(material: &TlsMaterial) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some((path, pem)) = &material.ca {
        for cert in certificates("ExportCAFile", path, pem)? {
            roots.add(cert).map_err(|e| {
                format!(
                    "ExportCAFile {}: a certificate is not usable: {e}",
                    path.display()
                )
            })?;
        }
        return Ok(roots);
    }
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
        return Err(format!(
            "no system CA certificates could be read for an https:// URL{}; install the \
             ca-certificates package, or name the CA's certificate with ExportCAFile",
            if why.is_empty() {
                String::new()
            } else {
                format!(" ({})", why.join("; "))
            }
        ));
    }
    Ok(roots)
}

/// The client configuration for `material`: roots as above, TLS 1.2 and
/// 1.3, the client certificate if any. Verification is rustls's own,
/// never replaced.
pub fn client_config(material: &TlsMaterial) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots(material)?);
    let config = match (&material.cert, &material.key) {
        (Some((cert_path, cert)), Some((key_path, key))) => {
            let chain = certificates("ExportCertFile", cert_path, cert)?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                format!(
                    "ExportKeyFile {}: no usable PEM private key in it: {e}",
                    key_path.display()
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!(
                    "ExportCertFile {} and ExportKeyFile {}: {e}",
                    cert_path.display(),
                    key_path.display()
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The configuration for `url`: None for `http://`.
pub fn for_url(
    url: &str,
    files: &TlsFiles,
) -> Result<(Option<Arc<rustls::ClientConfig>>, TlsMaterial), String> {
    if !is_https(url) {
        return Ok((None, TlsMaterial::default()));
    }
    let material = read(files)?;
    Ok((Some(client_config(&material)?), material))
}

/// A configuration that trusts nothing: what a client is given for an
/// `https://` URL when it was made without one, so that it can never fall
/// back on roots nobody chose.
pub fn trusting_nothing() -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions();
    match builder {
        Ok(b) => Arc::new(
            b.with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        ),
        // The ring provider supports the default versions; kept total.
        Err(_) => Arc::new(
            rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        ),
    }
}

/// Why a TLS connection failed, in words, when `error` (or what it
/// wraps) is a TLS error: which check refused the server, or that the
/// server refused this client.
pub fn explain(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        let found = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = found {
            return Some(words(tls));
        }
        next = e.source();
    }
    None
}

fn words(e: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let trusted = "a CA eventd trusts (ExportCAFile's certificates when it is set, the \
                   system's roots otherwise)";
    match e {
        E::InvalidCertificate(C::UnknownIssuer) => {
            format!("TLS: the server's certificate is not signed by {trusted} ({e})")
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            format!("TLS: the server's certificate does not name the host of the URL ({e})")
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            format!("TLS: the server's certificate has expired ({e})")
        }
        E::InvalidCertificate(_) => format!("TLS: the server's certificate was refused: {e}"),
        E::AlertReceived(A::CertificateRequired | A::BadCertificate | A::UnknownCA) => format!(
            "TLS: the server refused this client's certificate or wants one \
             (ExportCertFile, ExportKeyFile): {e}"
        ),
        _ => format!("TLS: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_without_its_key_is_refused_by_name() {
        let files = TlsFiles {
            cert_file: Some(PathBuf::from("/nonexistent/client.pem")),
            ..TlsFiles::default()
        };
        let e = read(&files).unwrap_err();
        assert!(
            e.contains("ExportCertFile") && e.contains("ExportKeyFile"),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let files = TlsFiles {
            ca_file: Some(path.clone()),
            ..TlsFiles::default()
        };
        let e = client_config(&read(&files).unwrap()).unwrap_err();
        assert!(
            e.contains("ExportCAFile") && e.contains(&path.display().to_string()),
            "{e}"
        );
        assert!(e.contains("no certificate"), "{e}");
    }

    #[test]
    fn http_needs_no_tls_and_https_is_told_apart_in_any_case() {
        assert!(for_url("http://127.0.0.1:8123/", &TlsFiles::default())
            .unwrap()
            .0
            .is_none());
        assert!(is_https("HTTPS://clickhouse:8443/"));
        assert!(!is_https("http://h/"));
    }

    #[test]
    fn tls_errors_are_found_inside_io_errors() {
        let inner = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        let text = explain(&io).unwrap();
        assert!(text.contains("not signed by"), "{text}");
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(explain(&plain), None);
    }
}
