//! Configuration reload: on `SIGHUP` and when the configuration file changes (polled,
//! debounced), the whole file is read and validated again and, when every rule holds, its
//! policies, routes and descriptor rules go into force at once.
//!
//! The key design decision: **a reload builds a new router and swaps it in; nothing running
//! is changed.** The HTTP server serves through [`CurrentRouter`], which picks the router in
//! force when a request starts, so a request in flight finishes on the configuration it
//! started with, and connections (and their keep-alive) are kept. The new limiter sits on the
//! same stores and connections ([`app_bootstrap::RateLimitRuntime::with_settings`]): an
//! unchanged policy keeps its state. A file that does not load, or breaks a reload rule
//! ([`app_bootstrap::reload`]), changes nothing: the problems are logged with their key paths,
//! counted (`config_reloads_total{outcome="refused"}`) and shown by `GET /v1/config`.

use std::hash::{Hash as _, Hasher as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use app_bootstrap::{RateLimitRuntime, RateLimitSettings, Settings, Sources};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::config_view::ConfigView;
use crate::gates::GateApi;
use crate::listener::CurrentRouter;
use crate::state::ApiState;

/// How often the configuration file is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long the file must stay unchanged before it is read: an editor or a deploy tool that
/// writes it in several steps is read once, after the last one.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// Everything a reload needs: how to read the configuration, what is in force, and where to
/// put what replaces it.
#[derive(Debug)]
pub struct Reloader {
    sources: Sources,
    prometheus: Option<PrometheusHandle>,
    router: CurrentRouter,
    rls: Option<inbound_grpc::RlsService>,
    view: ConfigView,
    traced: bool,
    /// One reload at a time; what is in force.
    running: tokio::sync::Mutex<Running>,
    /// The file's content (fingerprint) when the configuration in force was read from it.
    applied: std::sync::Mutex<Option<u64>>,
}

#[derive(Debug)]
struct Running {
    settings: Settings,
    runtime: Option<RateLimitRuntime>,
    generation: u64,
    gates: Arc<GateApi>,
    /// The gate metrics observers of `gates`.
    observers: Vec<tokio::task::JoinHandle<()>>,
}

/// The router of one configuration over `state` (see [`app_state`]); `traced`: each request
/// gets a server span (trace export is on).
pub fn build_router(
    state: Arc<ApiState>,
    settings: &Settings,
    gates: Arc<GateApi>,
    traced: bool,
) -> Router {
    let router = crate::app::router_with_gates(state, &settings.routes, gates);
    if !traced {
        return router;
    }
    let prefixes =
        crate::telemetry::RoutePrefixes::new(settings.routes.iter().map(|r| r.path_prefix.clone()));
    router.layer(axum::middleware::from_fn_with_state(
        prefixes,
        crate::telemetry::server_span,
    ))
}

/// The API state of `runtime` (`None`: rate limiting disabled), with the view.
pub fn app_state(
    runtime: Option<&RateLimitRuntime>,
    prometheus: Option<PrometheusHandle>,
    view: &ConfigView,
) -> Arc<ApiState> {
    let limiter = runtime.map(|r| Arc::new(r.clone().into_limiter()));
    Arc::new(ApiState::new(limiter, prometheus).with_config_view(view.clone()))
}

/// The pieces of the running app a [`Reloader`] replaces.
#[derive(Debug)]
pub struct Parts {
    /// Where the configuration is read from, again on each reload.
    pub sources: Sources,
    /// The settings in force.
    pub settings: Settings,
    /// The rate limiter in force; `None` when rate limiting is disabled.
    pub runtime: Option<RateLimitRuntime>,
    /// The `/metrics` recorder's handle; `None` when none could be installed.
    pub prometheus: Option<PrometheusHandle>,
    /// The gate routes' state in force.
    pub gates: Arc<GateApi>,
    /// The gate metrics observers of `gates` (stopped with them).
    pub observers: Vec<tokio::task::JoinHandle<()>>,
    /// The router the server routes by; a reload swaps the new one in.
    pub router: CurrentRouter,
    /// The gRPC rate-limit service, when one is served; a reload gives it the new limiter and
    /// descriptor rules.
    pub rls: Option<inbound_grpc::RlsService>,
    /// What `GET /v1/config` shows; a reload updates it.
    pub view: ConfigView,
    /// Whether spans are exported (each router then gets the server-span layer).
    pub traced: bool,
}

impl Reloader {
    /// A reloader of the app made of `parts`.
    pub fn new(parts: Parts) -> Self {
        Self {
            sources: parts.sources,
            prometheus: parts.prometheus,
            router: parts.router,
            rls: parts.rls,
            view: parts.view,
            traced: parts.traced,
            running: tokio::sync::Mutex::new(Running {
                settings: parts.settings,
                runtime: parts.runtime,
                generation: 1,
                gates: parts.gates,
                observers: parts.observers,
            }),
            applied: std::sync::Mutex::new(None),
        }
    }

    /// Reads the configuration again and puts it in force, or changes nothing. `trigger`
    /// (`"SIGHUP"`, `"file change"`) is logged.
    ///
    /// # Errors
    /// Every problem (key path: what is wrong) when the new configuration is refused.
    pub async fn reload(&self, trigger: &str) -> Result<u64, Vec<String>> {
        let mut running = self.running.lock().await;
        let read = match &self.sources.file {
            Some(path) => fingerprint(path).await,
            None => None,
        };
        let result = self.next(&running).await;
        match result {
            Ok((settings, runtime, gates)) => {
                let generation = running.generation + 1;
                let (gate_api, observers) = match gates {
                    Some(rebuilt) => rebuilt,
                    None => (
                        running.gates.clone(),
                        std::mem::take(&mut running.observers),
                    ),
                };
                let state = app_state(runtime.as_ref(), self.prometheus.clone(), &self.view);
                if let (Some(rls), Some(limiter)) = (&self.rls, state.limiter()) {
                    rls.replace_with(&inbound_grpc::RlsService::new(
                        limiter.clone(),
                        settings.rls.clone(),
                        settings.grpc.unknown_descriptor,
                    ));
                }
                let router = build_router(state, &settings, gate_api.clone(), self.traced);
                self.router.replace(router);
                self.view.applied(crate::config_view::in_force(
                    &settings,
                    self.sources.file.as_deref(),
                    generation,
                    SystemTime::now(),
                ));
                let old_gates = std::mem::replace(&mut running.gates, gate_api);
                // Replaced gates stop (their publishers); the events are the new ones' too.
                let old_observers = std::mem::replace(&mut running.observers, observers);
                if !Arc::ptr_eq(&old_gates, &running.gates) {
                    retire(old_gates, old_observers);
                }
                running.settings = settings;
                running.runtime = runtime;
                running.generation = generation;
                self.set_applied(read);
                metrics::counter!(names::RELOADS, "outcome" => "applied").increment(1);
                metrics::gauge!(names::GENERATION).set(generation as f64);
                tracing::info!(trigger, generation, "configuration reloaded");
                Ok(generation)
            }
            Err(problems) => {
                metrics::counter!(names::RELOADS, "outcome" => "refused").increment(1);
                for p in &problems {
                    tracing::error!(trigger, problem = %p, "configuration reload refused");
                }
                tracing::warn!(
                    trigger,
                    generation = running.generation,
                    problems = problems.len(),
                    "configuration reload refused; the configuration in force is unchanged"
                );
                self.view.refused(&problems);
                Err(problems)
            }
        }
    }

    /// The settings, runtime and (when they changed) gates that would replace `running`, or
    /// why not.
    async fn next(&self, running: &Running) -> Result<Next, Vec<String>> {
        let lines = |e: app_bootstrap::ConfigErrors| -> Vec<String> {
            e.0.iter().map(ToString::to_string).collect()
        };
        let settings = app_bootstrap::load(&self.sources).map_err(lines)?;
        app_bootstrap::reload::check(&running.settings, &settings).map_err(lines)?;
        let runtime = match (&running.runtime, &settings.rate_limit) {
            (Some(rt), RateLimitSettings::Enabled(e)) => Some(
                rt.with_settings(e)
                    .map_err(|e| vec![format!("rate_limit.policies: {e}")])?,
            ),
            // The check refuses a change of `rate_limit.enabled`.
            _ => None,
        };
        let gates = if app_bootstrap::reload::gates_changed(&running.settings, &settings) {
            // Over the same events: local gates share the running provider's, Redis ones
            // read what the old ones wrote.
            let rt = app_bootstrap::rebuild_gates(running.gates.runtime().map(|g| &**g), &settings)
                .await
                .map_err(|e| vec![format!("event_gates: {e}")])?
                .map(Arc::new);
            let observers = rt
                .as_ref()
                .map(crate::gates::metrics::spawn)
                .unwrap_or_default();
            Some((Arc::new(running.gates.with_runtime(rt)), observers))
        } else {
            None
        };
        Ok((settings, runtime, gates))
    }

    /// Stops the gates in force (their publishers and metrics observers), at exit.
    pub async fn shutdown_gates(&self) {
        let mut running = self.running.lock().await;
        for o in running.observers.drain(..) {
            o.abort();
        }
        if let Some(rt) = running.gates.runtime() {
            rt.shutdown().await;
        }
    }

    /// Starts reloading on `SIGHUP` (unix) and on file changes, and registers the reload
    /// metrics (generation 1, no reload yet). The tasks run until aborted.
    pub fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        #[cfg(unix)]
        match self.spawn_on_sighup() {
            Ok(task) => tasks.push(task),
            Err(e) => tracing::warn!(error = %e, "no SIGHUP handler: reload on SIGHUP is off"),
        }
        tasks.extend(self.spawn_watch());
        metrics::gauge!(names::GENERATION).set(1.0);
        for outcome in ["applied", "refused"] {
            metrics::counter!(names::RELOADS, "outcome" => outcome).absolute(0);
        }
        tasks
    }

    /// Reloads on every `SIGHUP` until the process ends. The handler is installed before this
    /// returns (an early `SIGHUP` would otherwise end the process: its default action).
    ///
    /// # Errors
    /// When the signal handler cannot be installed.
    #[cfg(unix)]
    pub fn spawn_on_sighup(self: &Arc<Self>) -> std::io::Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())?;
        let me = self.clone();
        Ok(tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                let _ = me.reload("SIGHUP").await;
            }
        }))
    }

    /// Reloads when the configuration file's content changes (looked at every
    /// [`POLL_INTERVAL`], read once it stayed the same for [`DEBOUNCE`]), while the settings in
    /// force say `reload.watch = true`. `None` without a file.
    pub fn spawn_watch(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.sources.file.clone()?;
        // Read now, before the app says it listens: a change made after that is a change,
        // however late the task first runs.
        let seen = read_fingerprint(&path);
        self.set_applied(seen);
        let me = self.clone();
        Some(tokio::spawn(async move { me.watch(path, seen).await }))
    }

    async fn watch(&self, path: PathBuf, mut seen: Option<u64>) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = fingerprint(&path).await;
            if !self.running.lock().await.settings.reload.watch {
                // Off (`reload.watch = false`) until a SIGHUP reload turns it on; what is
                // seen meanwhile is no change then.
                seen = now;
                continue;
            }
            if now == seen {
                continue;
            }
            // Changed: wait until it holds still.
            let mut settled = now;
            loop {
                tokio::time::sleep(DEBOUNCE).await;
                let again = fingerprint(&path).await;
                if again == settled {
                    break;
                }
                settled = again;
            }
            seen = settled;
            // Back to what is in force (a file briefly unreadable, say for want of
            // descriptors, then readable again, or a refused change written back): nothing to
            // reload, and a refused reload no longer describes the file.
            if settled.is_some() && settled == self.applied() {
                if self.view.file_back_in_force() {
                    tracing::info!(
                        "configuration file back to the configuration in force; the last refused reload is cleared"
                    );
                }
                continue;
            }
            // A file that cannot be read is reported by the reload (on `--config`), once per
            // change.
            let _ = self.reload("file change").await;
        }
    }

    fn applied(&self) -> Option<u64> {
        *self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_applied(&self, read: Option<u64>) {
        *self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = read;
    }
}

/// What a reload would put in force: settings, rate-limit runtime, and the gates with their
/// observers when they were built again.
type Next = (
    Settings,
    Option<RateLimitRuntime>,
    Option<(Arc<GateApi>, Vec<tokio::task::JoinHandle<()>>)>,
);

/// Stops gates a reload replaced: their observers at once, their publishers in the
/// background (requests and streams still on them keep their port; the new gates publish the
/// same events, which the gate programs make safe, as for several instances).
fn retire(gates: Arc<GateApi>, observers: Vec<tokio::task::JoinHandle<()>>) {
    for o in observers {
        o.abort();
    }
    if let Some(rt) = gates.runtime().cloned() {
        tokio::spawn(async move { rt.shutdown().await });
    }
}

/// The file's content as a hash (`None`: it cannot be read). Content, not mtime: a touch or a
/// rewrite with the same bytes is no change.
async fn fingerprint(path: &std::path::Path) -> Option<u64> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || read_fingerprint(&path))
        .await
        .ok()?
}

fn read_fingerprint(path: &std::path::Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// The reload metrics' names.
pub mod names {
    /// Counter, label `outcome` = `applied` | `refused`.
    pub const RELOADS: &str = "config_reloads_total";
    /// Gauge: the generation in force (1 at start).
    pub const GENERATION: &str = "config_generation";
}
