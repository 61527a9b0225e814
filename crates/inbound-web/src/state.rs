//! What the API handlers share ([`ApiState`]): the limiter and its policies by name, the
//! `/metrics` recorder's handle and the configuration view; and the check of one evaluation's
//! policy, subject and cost against them, before anything is evaluated.

use std::collections::HashMap;
use std::sync::Arc;

use edge_middleware::{Limiter, PolicyIndex};
use metrics_exporter_prometheus::PrometheusHandle;
use shared_contract::Cost;

use crate::body::{Refused, checked_subject};
use crate::config_view::ConfigView;

/// What the API handlers share.
#[derive(Debug)]
pub struct ApiState {
    limiter: Option<Arc<Limiter>>,
    by_name: HashMap<Box<str>, PolicyIndex>,
    prometheus: Option<PrometheusHandle>,
    config: Option<ConfigView>,
}

impl ApiState {
    /// `limiter` is `None` when rate limiting is disabled.
    pub fn new(limiter: Option<Arc<Limiter>>, prometheus: Option<PrometheusHandle>) -> Self {
        let by_name = limiter
            .iter()
            .flat_map(|l| l.indexed())
            .map(|(i, p)| (Box::from(p.id().as_str()), i))
            .collect();
        Self {
            limiter,
            by_name,
            prometheus,
            config: None,
        }
    }

    /// What `GET /v1/config` shows.
    #[must_use]
    pub fn with_config_view(mut self, view: ConfigView) -> Self {
        self.config = Some(view);
        self
    }

    /// What `GET /v1/config` shows; `None` (that route then answers 404) until
    /// [`Self::with_config_view`].
    pub fn config_view(&self) -> Option<&ConfigView> {
        self.config.as_ref()
    }

    /// The limiter; `None` when rate limiting is disabled.
    pub fn limiter(&self) -> Option<&Arc<Limiter>> {
        self.limiter.as_ref()
    }

    /// The `/metrics` recorder's handle; `None` when none could be installed.
    pub(crate) fn prometheus(&self) -> Option<&PrometheusHandle> {
        self.prometheus.as_ref()
    }

    /// The policy named `name`, if the limiter has one.
    pub(crate) fn policy_index(&self, name: &str) -> Option<PolicyIndex> {
        self.by_name.get(name).copied()
    }
}

impl ApiState {
    /// The policy and cost of one evaluation (`at` prefixes every problem's detail: the list
    /// form's `requests[1]: `), or the 400 that refuses it. `subject` must pass
    /// [`checked_subject`].
    pub(crate) fn admit(
        &self,
        limiter: &Limiter,
        policy: Option<&str>,
        subject: Option<&str>,
        cost: Option<i64>,
        at: &str,
    ) -> Result<(PolicyIndex, Cost), Refused> {
        let index = match policy {
            None => limiter.default_policy(),
            Some(name) => match self.by_name.get(name) {
                Some(&i) => i,
                None => {
                    return Err(Refused::new(
                        "unknown_policy",
                        &format!(
                            "{at}unknown policy {:?}",
                            name.chars().take(80).collect::<String>()
                        ),
                    ));
                }
            },
        };
        checked_subject(subject, at)?;
        let policy = limiter.policy(index);
        let policy_id = policy.id();
        let max_cost = policy.max_cost().get();
        let cost = match cost.unwrap_or(1) {
            c if c >= 1 && (c as u64) <= max_cost => Cost::new(c as u64),
            c => {
                return Err(Refused::new(
                    "invalid_cost",
                    &format!(
                        "{at}cost must be between 1 and max_cost {max_cost} of policy {policy_id}, got {c}"
                    ),
                ));
            }
        };
        match cost {
            Ok(cost) => Ok((index, cost)),
            Err(_) => Err(Refused::new(
                "invalid_cost",
                &format!("{at}cost is out of range"),
            )),
        }
    }
}
