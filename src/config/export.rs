//! The export keys (`ExportUrl` and the rest), checked. They are the
//! configuration's own types: the export stage takes them as they are, and
//! the reload hands their live part to the stage's own handle
//! (`export::live`), so that `config` needs nothing of the export.

use super::EXPORT_NICE_RANGE;
use super::{ranged, under, ConfigError, ConfigFile, EXPORT_BATCH_ROWS_DEFAULT};
use super::{EXPORT_BATCH_ROWS_RANGE, EXPORT_DATABASE_DEFAULT, EXPORT_NICE_DEFAULT};
use std::path::{Path, PathBuf};

/// The export keys of the configuration, checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExportSettings {
    /// `ExportUrl`: ClickHouse's HTTP interface (restart-only). It holds no
    /// credentials (the configuration refuses them); shown redacted all
    /// the same.
    #[serde(serialize_with = "crate::redact::serialize_url")]
    pub url: String,
    /// `ExportDatabase` (restart-only).
    pub database: String,
    /// `ExportBatchRows` (live).
    pub batch_rows: u64,
    /// `ExportNice` (live): the export threads' niceness, 0..=19.
    pub nice: i32,
    /// `ExportUser` (live).
    pub user: Option<String>,
    /// `ExportPasswordFile` (live; read again every few seconds).
    pub password_file: Option<PathBuf>,
    /// `ExportCAFile`, `ExportCertFile`, `ExportKeyFile` (live; read again
    /// with the password file).
    #[serde(flatten)]
    pub tls: TlsFiles,
}

/// The TLS keys of the configuration: paths, resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TlsFiles {
    /// `ExportCAFile`: PEM certificates trusted instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// `ExportCertFile`: the client's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// `ExportKeyFile`: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

impl ConfigFile {
    /// The export keys, checked; `None` without `ExportUrl`.
    pub(super) fn export_settings(
        &self,
        data_dir: &Path,
    ) -> Result<Option<ExportSettings>, ConfigError> {
        let range = |key, value: &dyn std::fmt::Debug, allowed: &str| ConfigError::Range {
            key,
            value: format!("{value:?}"),
            allowed: allowed.to_string(),
        };
        let Some(url) = &self.export_url else {
            return Ok(None);
        };
        let url = url.trim();
        if let Some(what) = crate::redact::url_credentials(url) {
            return Err(ConfigError::Credentials {
                key: "ExportUrl",
                value: format!("{:?}", crate::redact::url(url)),
                what,
            });
        }
        // Errors quote the value: shown without credentials all the same.
        let url_shown = crate::redact::url(url);
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| {
                range(
                    "ExportUrl",
                    &url_shown,
                    "an http:// or https:// URL of ClickHouse's HTTP interface, such as \
                     \"http://127.0.0.1:8123/\" or \"https://clickhouse.example:8443/\"",
                )
            })?;
        if rest.is_empty() || rest.starts_with('/') || url.chars().any(char::is_whitespace) {
            return Err(range(
                "ExportUrl",
                &url_shown,
                "an http:// or https:// URL with a host",
            ));
        }
        if self.export_cert_file.is_some() != self.export_key_file.is_some() {
            let (set, unset) = if self.export_cert_file.is_some() {
                ("ExportCertFile", "ExportKeyFile")
            } else {
                ("ExportKeyFile", "ExportCertFile")
            };
            return Err(ConfigError::Range {
                key: set,
                value: "set".to_string(),
                allowed: format!("only together with {unset} (a client certificate and its key)"),
            });
        }
        if self.export_password_file.is_some() && self.export_user.is_none() {
            // The password would go unsent: eventd sends credentials only
            // for a named user.
            return Err(ConfigError::Range {
                key: "ExportPasswordFile",
                value: "set".to_string(),
                allowed: "only together with ExportUser (the ClickHouse user the password is \
                          for; ClickHouse's own is \"default\")"
                    .to_string(),
            });
        }
        let database = self
            .export_database
            .clone()
            .unwrap_or_else(|| EXPORT_DATABASE_DEFAULT.to_string());
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if database.is_empty() || !database.chars().all(plain) {
            return Err(range(
                "ExportDatabase",
                &database,
                "letters, digits and underscores",
            ));
        }
        if let Some(user) = &self.export_user {
            if user.is_empty() || user.chars().any(|c| c.is_control() || c == ':') {
                return Err(range("ExportUser", user, "a ClickHouse user name"));
            }
        }
        Ok(Some(ExportSettings {
            url: url.to_string(),
            database,
            batch_rows: ranged(
                "ExportBatchRows",
                self.export_batch_rows,
                EXPORT_BATCH_ROWS_DEFAULT,
                EXPORT_BATCH_ROWS_RANGE,
            )?,
            nice: ranged(
                "ExportNice",
                self.export_nice,
                EXPORT_NICE_DEFAULT,
                EXPORT_NICE_RANGE,
            )? as i32,
            user: self.export_user.clone(),
            password_file: under(data_dir, &self.export_password_file),
            tls: TlsFiles {
                ca_file: under(data_dir, &self.export_ca_file),
                cert_file: under(data_dir, &self.export_cert_file),
                key_file: under(data_dir, &self.export_key_file),
            },
        }))
    }
}
