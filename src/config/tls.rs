//! `[http.tls]` and `[rls.tls]`: TLS on a port, with an optional client-certificate check.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::ensure;
use super::ConfigError;

/// The certificate a port presents and, for mutual TLS, the CA its clients' certificates must
/// chain to. Unset (the default): the port speaks plain TCP.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of that certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM CA certificates; set, every client must present a certificate that chains to one of
    /// them (mutual TLS), and a connection without one is refused in the handshake.
    pub client_ca_file: Option<PathBuf>,
    /// How often the files are read to see whether they changed (SIGHUP reads them at once). A
    /// change that does not load keeps the certificate in force (logged,
    /// `tally_tls_reloads_total{result="error"}`); new connections get the new one, open ones
    /// keep theirs.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
}

impl Default for TlsFiles {
    fn default() -> Self {
        TlsFiles {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            reload_interval: Duration::from_secs(10),
        }
    }
}

impl TlsFiles {
    /// Whether the port speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Both of certificate and key or neither; a client CA only with them. `section` is
    /// `http.tls` or `rls.tls`, for the error. The files are read by the port before it binds.
    pub fn validate(&self, section: &'static str) -> Result<(), ConfigError> {
        let field = |name: &str| format!("{section}.{name}");
        ensure(
            self.cert_file.is_some() == self.key_file.is_some(),
            field("key_file"),
            "set cert_file and key_file together",
        )?;
        ensure(
            self.client_ca_file.is_none() || self.cert_file.is_some(),
            field("client_ca_file"),
            "mutual TLS needs cert_file and key_file too",
        )?;
        ensure(
            !self.reload_interval.is_zero(),
            field("reload_interval"),
            "must be positive",
        )
    }
}
