//! What `GET /v1/config` shows: the configuration in force (rendered as `--check` renders it,
//! secrets redacted), since when and from which file, and the last reload that was refused.
//! The reloader updates it; the handler is in [`crate::api`].

use std::sync::Arc;
use std::time::SystemTime;

use app_bootstrap::Settings;
use arc_swap::ArcSwap;

/// What `GET /v1/config` shows: the settings in force (secrets redacted) and since when, and
/// the last refused reload, if one came after them.
#[derive(Debug, Clone)]
pub struct ConfigView(Arc<ArcSwap<ViewState>>);

#[derive(Debug)]
struct ViewState {
    body: serde_json::Value,
    refused: Option<serde_json::Value>,
}

impl ConfigView {
    /// The view of `settings`, loaded now from `file` (generation 1).
    pub fn new(settings: &Settings, file: Option<&std::path::Path>) -> Self {
        let body = in_force(settings, file, 1, SystemTime::now());
        Self(Arc::new(ArcSwap::from_pointee(ViewState {
            body,
            refused: None,
        })))
    }

    pub(crate) fn applied(&self, body: serde_json::Value) {
        self.0.store(Arc::new(ViewState {
            body,
            refused: None,
        }));
    }

    pub(crate) fn refused(&self, problems: &[String]) {
        let now = self.0.load();
        let refused = serde_json::json!({
            "at": rfc3339(SystemTime::now()),
            "problems": problems,
        });
        self.0.store(Arc::new(ViewState {
            body: now.body.clone(),
            refused: Some(refused),
        }));
    }

    /// Forgets the last refused reload: the file is back to the configuration in force, so
    /// what was refused is no longer in it. Whether there was one to forget.
    pub(crate) fn file_back_in_force(&self) -> bool {
        let now = self.0.load();
        if now.refused.is_none() {
            return false;
        }
        self.0.store(Arc::new(ViewState {
            body: now.body.clone(),
            refused: None,
        }));
        true
    }

    /// The `GET /v1/config` body.
    pub fn body(&self) -> serde_json::Value {
        let state = self.0.load();
        let mut body = state.body.clone();
        body["last_refused_reload"] = state.refused.clone().unwrap_or(serde_json::Value::Null);
        body
    }
}

/// The view's body for `settings` loaded from `file` as `generation` at `loaded_at`.
pub(crate) fn in_force(
    settings: &Settings,
    file: Option<&std::path::Path>,
    generation: u64,
    loaded_at: SystemTime,
) -> serde_json::Value {
    // The rendering is `--check`'s: defaults filled in, secrets redacted.
    let config = settings
        .render()
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or(serde_json::Value::Null);
    serde_json::json!({
        "generation": generation,
        "loaded_at": rfc3339(loaded_at),
        "file": file.map(|f| f.display().to_string()),
        "config": config,
    })
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}
