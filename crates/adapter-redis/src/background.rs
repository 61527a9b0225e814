//! What the provider's background tasks (connection supervisors, the Sentinel monitor, the
//! cluster map) share: their handles, aborted with their owner, and the last reason one could
//! not do its job, for readiness messages.

use std::sync::Mutex;

use tokio::task::JoinHandle;

/// Aborts tasks when dropped (supervisors, monitors).
pub(crate) struct Tasks(pub(crate) Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// The last reason a background task (Sentinel monitor, cluster map) could not do its job,
/// for readiness messages.
pub(crate) struct LastError(Mutex<String>);

impl LastError {
    pub(crate) fn new(initial: &str) -> Self {
        Self(Mutex::new(initial.to_owned()))
    }

    pub(crate) fn get(&self) -> String {
        match self.0.lock() {
            Ok(e) => e.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn set(&self, error: String) {
        match self.0.lock() {
            Ok(mut e) => *e = error,
            Err(p) => *p.into_inner() = error,
        }
    }
}
