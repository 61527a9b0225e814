//! TLS for `rediss://` endpoints: the server is checked against the configured CA and the
//! URL's host name (or IP address); a client certificate and key give mutual TLS.
//!
//! Built once from [`TlsFiles`] when the settings are checked, so a bad file is a settings
//! problem naming its key, never a connection that silently runs without verification.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

use crate::error::SettingsProblem;

/// PEM files for `rediss://` (`tls_ca_file`, `tls_cert_file`, `tls_key_file`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) the server's certificate must chain to. Required for `rediss://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain, for servers that require mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PKCS#8, PKCS#1 or SEC1 PEM).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is configured (a `redis://` URL with TLS files is a mistake).
    pub fn any(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// The name a server's certificate must carry: the host as it is connected to (a DNS name or
/// an IP address). Every node of a topology is checked against its own host.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned())
        .map_err(|e| format!("host {host:?} is not a valid TLS server name: {e}"))
}

fn tls_error(key: &'static str, path: &Path, reason: impl std::fmt::Display) -> SettingsProblem {
    SettingsProblem::new(key, format!("{}: {reason}", path.display()))
}

/// Reads the files and builds the client configuration (shared by every node of a topology).
///
/// # Errors
/// The problem, on the key of the file that is missing or cannot be used.
pub(crate) fn build(files: &TlsFiles) -> Result<TlsConnector, SettingsProblem> {
    let Some(ca_file) = &files.ca_file else {
        return Err(SettingsProblem::new(
            "tls_ca_file",
            "required with rediss:// (the CA that signed the server's certificate)",
        ));
    };
    let mut roots = RootCertStore::empty();
    let mut n = 0usize;
    for cert in
        CertificateDer::pem_file_iter(ca_file).map_err(|e| tls_error("tls_ca_file", ca_file, e))?
    {
        let cert = cert.map_err(|e| tls_error("tls_ca_file", ca_file, e))?;
        roots
            .add(cert)
            .map_err(|e| tls_error("tls_ca_file", ca_file, e))?;
        n += 1;
    }
    if n == 0 {
        return Err(tls_error("tls_ca_file", ca_file, "no certificate in it"));
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(crypto::aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| SettingsProblem::new("tls_ca_file", e.to_string()))?
            .with_root_certificates(roots);
    let config = match (&files.cert_file, &files.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert_file), Some(key_file)) => {
            let chain = CertificateDer::pem_file_iter(cert_file)
                .map_err(|e| tls_error("tls_cert_file", cert_file, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| tls_error("tls_cert_file", cert_file, e))?;
            if chain.is_empty() {
                return Err(tls_error(
                    "tls_cert_file",
                    cert_file,
                    "no certificate in it",
                ));
            }
            let key = PrivateKeyDer::from_pem_file(key_file)
                .map_err(|e| tls_error("tls_key_file", key_file, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error("tls_key_file", key_file, e))?
        }
        (Some(_), None) => {
            return Err(SettingsProblem::new(
                "tls_key_file",
                "required when tls_cert_file is set",
            ));
        }
        (None, Some(_)) => {
            return Err(SettingsProblem::new(
                "tls_cert_file",
                "required when tls_key_file is set",
            ));
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}
