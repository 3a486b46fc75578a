//! The export stage's live settings: the handle a configuration reload
//! writes into and the workers read before each batch (ExportBatchRows,
//! ExportNice, ExportUser, ExportPasswordFile and the TLS files). The
//! workers never see the configuration loader; the daemon connects the two
//! (`LiveConfig::on_reload`), as it gives the writers MaxBatchSize as one
//! atomic value.

use super::ExportSettings;
use std::sync::Mutex;

/// The export keys as they apply now.
#[derive(Debug)]
pub struct LiveExport {
    keys: Mutex<ExportSettings>,
}

impl LiveExport {
    pub fn new(settings: ExportSettings) -> LiveExport {
        LiveExport {
            keys: Mutex::new(settings),
        }
    }

    /// The keys now (a copy: a few short strings and paths).
    pub fn get(&self) -> ExportSettings {
        self.lock().clone()
    }

    /// What a reload says the keys are now.
    pub fn set(&self, settings: ExportSettings) {
        *self.lock() = settings;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ExportSettings> {
        // Every update is a whole assignment: a poisoned lock still holds
        // a consistent value.
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_value_is_what_the_next_get_reads() {
        let settings = ExportSettings {
            url: "http://127.0.0.1:8123/".into(),
            database: "eventd".into(),
            batch_rows: 100,
            nice: 10,
            user: None,
            password_file: None,
            tls: Default::default(),
        };
        let live = LiveExport::new(settings.clone());
        assert_eq!(live.get().batch_rows, 100);
        live.set(ExportSettings {
            batch_rows: 7,
            ..settings
        });
        assert_eq!(live.get().batch_rows, 7);
    }
}
