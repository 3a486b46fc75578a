//! The worker's live settings: ExportBatchRows, ExportNice, ExportUser and
//! ExportPasswordFile applied while it runs, and the credentials the
//! cluster client is made with.

use super::{ExportWorker, WorkerParts, SCAN_INTERVAL};
use crate::export::cluster::Cluster;
use crate::export::ExportSettings;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl ExportWorker {
    /// The live keys: ExportBatchRows, ExportNice, ExportUser,
    /// ExportPasswordFile.
    pub(super) fn apply_live(&mut self) {
        let settings = self.parts.live.get();
        self.ctx.batch_rows = settings.batch_rows;
        self.apply_nice(settings.nice);
        if settings.user != self.parts.settings.user
            || settings.password_file != self.parts.settings.password_file
            || settings.tls != self.parts.settings.tls
            || self.last_scan.is_none_or(|t| t.elapsed() >= SCAN_INTERVAL)
        {
            self.parts.settings = settings;
            match read_credentials(&self.parts.settings, &self.credentials) {
                Ok(c) if c != self.credentials || self.unusable.is_some() => {
                    self.ctx.cluster = make_cluster(&self.parts, &c);
                    self.credentials = c;
                    self.unusable = None;
                    self.refused.remove(Path::new(CREDENTIALS));
                    tracing::info!("export credentials changed; they apply to the next batch");
                }
                Ok(_) => {}
                // Credentials that worked stay in use; none at all: see run.
                Err(e) => {
                    if self.unusable.is_some() {
                        self.unusable = Some(e.clone());
                    }
                    self.say_once(PathBuf::from(CREDENTIALS), e)
                }
            }
        }
    }

    /// Runs this thread (and the insert threads it starts) at `nice`. A
    /// niceness that cannot be had (lowering it needs CAP_SYS_NICE) is said
    /// once; the thread keeps the one it has.
    pub(super) fn apply_nice(&mut self, nice: i32) {
        if self.nice == Some(nice) {
            return;
        }
        match crate::threads::set_own_nice(nice) {
            Ok(()) => {
                self.refused.remove(Path::new("ExportNice"));
                if self.nice.is_some() {
                    tracing::info!(nice, "export threads' niceness changed");
                }
            }
            Err(e) => {
                let have =
                    crate::threads::own_nice().map_or("unknown".to_string(), |n| n.to_string());
                self.say_once(
                    PathBuf::from("ExportNice"),
                    format!(
                        "ExportNice = {nice}: {e} (lowering a thread's niceness needs \
                         CAP_SYS_NICE or RLIMIT_NICE); export keeps niceness {have}"
                    ),
                );
            }
        }
        self.nice = Some(nice);
    }
}

/// What `say_once` files a credentials problem under.
pub(super) const CREDENTIALS: &str = "credentials";

/// Who eventd is at the cluster: ExportUser, the password in
/// ExportPasswordFile (its first line), and for an https:// URL the TLS
/// files as read and the client configuration made of them.
#[derive(Debug, Clone, Default)]
pub(super) struct Credentials {
    user: Option<String>,
    password: Option<String>,
    tls_files: crate::export::tls::TlsMaterial,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Self) -> bool {
        (&self.user, &self.password, &self.tls_files)
            == (&other.user, &other.password, &other.tls_files)
            && self.tls.is_some() == other.tls.is_some()
    }
}

pub(super) fn make_cluster(parts: &WorkerParts, credentials: &Credentials) -> Cluster {
    let endpoint = crate::export::clickhouse::Endpoint {
        url: parts.settings.url.clone(),
        user: credentials.user.clone(),
        password: credentials.password.clone(),
        tls: credentials.tls.clone(),
    };
    let client = crate::export::clickhouse::Client::new(endpoint, parts.timeout);
    Cluster::new(client, &parts.settings.database, &parts.host, parts.timeout)
}

/// The credentials the settings name, read now; the TLS configuration is
/// made again only when its files changed since `previous`.
pub(super) fn read_credentials(
    s: &ExportSettings,
    previous: &Credentials,
) -> Result<Credentials, String> {
    let password = match &s.password_file {
        None => None,
        Some(path) => Some(crate::export::read_password_file(path)?),
    };
    let (tls_files, tls) = if !crate::export::tls::is_https(&s.url) {
        Default::default()
    } else {
        let files = crate::export::tls::read(&s.tls)?;
        match &previous.tls {
            Some(config) if files == previous.tls_files => (files, Some(config.clone())),
            _ => {
                let config = crate::export::tls::client_config(&files)?;
                (files, Some(config))
            }
        }
    };
    Ok(Credentials {
        user: s.user.clone(),
        password,
        tls_files,
        tls,
    })
}
