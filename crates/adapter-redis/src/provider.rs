//! The Redis provider of `EdgeRateLimitPort`.
//!
//! ## Connections
//!
//! The provider holds `connections` multiplexed connections (default 1) to each master it
//! uses (see `pool` for the topologies): every request is pipelined on one socket
//! with the others in flight, so there is no per-call connection setup and no pool checkout.
//! Supervisor tasks connect (with `connect_timeout`), check the server (Redis >= 7.0, a
//! master, its eviction policy), preload the programs with `SCRIPT LOAD`, and replace a
//! connection at once when it ends, is stuck or stops being the master (`connection`).
//!
//! [`RedisProvider::connect`] never fails because the server is unreachable: it waits at most
//! about `connect_timeout` for the first connection and returns either way. Until a connection
//! is up every evaluation is `Unavailable(connect)` (nothing is sent) and `readiness()` says
//! why; a service can therefore start before its Redis and becomes ready when Redis does.
//!
//! ## Least privilege
//!
//! A dedicated ACL user needs only `~<key_prefix>:* +evalsha +eval +script|load +ping +time
//! +get +set` (the programs call `TIME`, `GET` and `SET`); a cluster also `+cluster|slots`,
//! and `min_replicas_ack` `+wait`; a configured fleet heartbeat `+zadd +zremrangebyscore
//! +zcard +pexpire` (only then). `INFO`, `ROLE` and `CONFIG GET` are optional: without
//! them the server version, role and eviction checks are skipped. A refused login leaves the
//! connection down (`Unavailable(connect)`), a refused command or key is
//! `Incompatible(program)`.
//!
//! ## At most once
//!
//! The driver is used without any retry: a command is handed to the connection once, and a
//! timeout or a broken connection after that is reported as `Indeterminate`, never resent
//! (see [`crate::failure`]). A program is sent again only after a reply proving it did not
//! run (`NOSCRIPT`, `MOVED`, `ASK`).
//!
//! ## Multi-limit evaluations and evaluation ids
//!
//! `evaluate_all` sends one call of `lua/rate-multi-v2.lua` with every member's key (and,
//! with an evaluation id, the replay key under the first member's hash tag), so the members
//! are decided at one `TIME` and charged together or not at all, and a retried id answers
//! the stored first decision (`replayed`). `evaluate` with an evaluation id is a one-member
//! `evaluate_all`; without one it runs the single program. On a cluster all keys of a call
//! must share a slot: members of one subject always do; otherwise the request is refused
//! with `RequestError::SpansSlots` before anything is sent. Standalone and Sentinel take any
//! members in one call.
//!
//! ## Batched decisions
//!
//! With `batch_max` > 1 (default 16), evaluations without an evaluation id that are ready at
//! the same moment for one node leave as one call of `lua/rate-batch-v2.lua` (see
//! `batch`): decided in order at one `TIME`, each exactly as its single program
//! would; alone (the only call in flight, or the only one of its group), an evaluation sends
//! its single program as before.
//!
//! ## Concurrency leases
//!
//! `acquire_lease` and `release_lease` run `lua/lease-acquire-v1.lua` and
//! `lua/lease-release-v1.lua` (see [`crate::leases`]) on the subject's leases key, one key
//! per call. The lease programs are preloaded, and their commands (`ZADD`, `ZREM`, `ZSCORE`,
//! `ZCARD`, `ZRANGE`, `ZREMRANGEBYSCORE`, `PEXPIRE`) checked against the ACL user, only
//! when a concurrency policy is configured: a rate-only deployment needs no new grant.
//!
//! ## Fleet membership
//!
//! With [`RedisSettings::fleet`] set, the provider preloads `lua/fleet-heartbeat-v1.lua`
//! (and checks its commands against the ACL user) and starts one background task that runs
//! it every `heartbeat` on the fleet key `<prefix>:fleet:{<name>}`, the first time at once
//! (see [`crate::fleet`]). [`RedisProvider::fleet`] reads the last known number of live
//! instances of the fleet; it stays frozen while Redis does not answer, which is what a
//! local fallback dividing its limits by it needs. The providers a reload makes share the
//! task; it stops with the last of them. Without fleet settings nothing of this runs and no
//! fleet key is written.
//!
//! ## `min_replicas_ack`
//!
//! With `min_replicas_ack = n`, each program's reply is followed by `WAIT n <command_timeout /
//! 2>`, shared by every call whose reply arrived on the same connection meanwhile (group
//! commit: one `WAIT` covers all writes its connection made before it). An allow whose
//! writes fewer than `n` replicas acknowledged is reported `Indeterminate` (it consumed quota
//! on the master, but a failover now could lose that, and an allow that may be forgotten is
//! exactly the over-admission this setting exists to prevent). A denial consumed nothing, so
//! it stands, and does not wait for the replicas.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use redis::Value;
use shared_contract::model::DenialBound;
use shared_contract::multi::replay_window_ms;
use shared_contract::{
    AcquireOutcome, AcquireRequest, AlgorithmKind, CancelOutcome, CancelRequest, ChargeOutcome,
    ChargeRequest, Deadline, EdgeRateLimitPort, IncompatibleCategory, MultiDecision, MultiOutcome,
    MultiRequest, Outcome, PolicyId, PolicySet, RandomTokens, RateLimitOutcome, RateLimitPolicy,
    RateLimitRequest, Readiness, ReleaseOutcome, ReleaseRequest, RequestError, ReserveOutcome,
    ReserveRequest, SettleOutcome, SettleRequest, TokenSource,
};

use crate::acl::Needs;
use crate::batch::{BatchStats, Batcher, Decision};
use crate::deny_cache::DenyCache;
use crate::error::{Error, SettingsProblem};
use crate::failure::Failure;
use crate::fleet::{Fleet, FleetView};
use crate::keys::{ReplayMember, hash_slot, replay_key};
use crate::leases::Leasing;
use crate::placement::Placement;
use crate::plan::Plan;
use crate::pool::{Pool, ScriptReply};
use crate::programs;
use crate::reply;
use crate::reply_multi;
use crate::resp;
use crate::script::{Script, ScriptArgs};
use crate::settings::RedisSettings;
use crate::telemetry::ClockMetrics;

/// One multi-limit program call: `n+r keys... header (code packed-arguments)...` after
/// `EVALSHA sha1`, `r` = 1 with a replay key; the header packs `n` and the replay window.
struct MultiCall<'a> {
    /// Each member's plan, state key and cost.
    members: Vec<(&'a Plan, String, u64)>,
    /// The replay key and its window, with an evaluation id.
    replay: Option<(String, u64)>,
}

impl ScriptArgs for MultiCall<'_> {
    fn count(&self) -> usize {
        let keys = self.members.len() + usize::from(self.replay.is_some());
        1 + keys + 1 + 2 * self.members.len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        let keys = self.members.len() + usize::from(self.replay.is_some());
        resp::write_bulk_u64(out, keys as u64);
        for (_, key, _) in &self.members {
            resp::write_bulk(out, key.as_bytes());
        }
        if let Some((key, _)) = &self.replay {
            resp::write_bulk(out, key.as_bytes());
        }
        let window = self.replay.as_ref().map_or(0, |(_, w)| *w);
        resp::write_bulk(out, &programs::multi_header(self.members.len(), window));
        for (plan, _, cost) in &self.members {
            resp::write_bulk_u64(out, plan.code);
            plan.write_arguments(out, *cost);
        }
    }

    /// Only an allow consumed quota (a replayed allow too: its writes are waited for again,
    /// which costs one shared `WAIT` and never reports a lost charge as durable).
    fn needs_ack(&self, reply: &Value) -> bool {
        reply::is_allowed(reply)
    }
}

/// The Redis provider of [`EdgeRateLimitPort`]: decisions are `global_redis`, one answer
/// across every instance that shares the server.
pub struct RedisProvider {
    settings: RedisSettings,
    policies: PolicySet,
    plans: HashMap<PolicyId, Arc<Plan>>,
    /// Shared with the providers [`Self::with_policies`] makes from this one.
    pool: Arc<Pool>,
    /// Where lease tokens come from ([`RandomTokens`] unless a test fixes them).
    tokens: Arc<dyn TokenSource>,
    /// The exact denial cache, shared with the providers [`Self::with_policies`] makes.
    deny_cache: Arc<DenyCache>,
    /// The groups of evaluations being batched, shared like the denial cache.
    batcher: Arc<Batcher>,
    /// The fleet heartbeat, with fleet settings; shared like the denial cache.
    fleet: Option<Fleet>,
}

/// The plan of every policy of `policies`.
fn plans(prefix: &str, policies: &PolicySet) -> Result<HashMap<PolicyId, Arc<Plan>>, Error> {
    policies
        .iter()
        .map(|p| Ok((p.id().clone(), Arc::new(Plan::new(prefix, p)?))))
        .collect()
}

/// Whether `policy`'s denials are answered from the cache: `deny_cache` (on unless turned
/// off), and not in shadow mode (a shadow policy reports what Redis answers, always).
fn caches(policy: &RateLimitPolicy) -> bool {
    policy.deny_cache() && !policy.shadow()
}

impl fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisProvider")
            .field("settings", &self.settings)
            .field("policies", &self.plans.len())
            .finish_non_exhaustive()
    }
}

impl RedisProvider {
    /// Checks `settings`, starts the connection supervisors (and, per topology, the Sentinel
    /// monitor or the cluster slot map), and waits at most about `connect_timeout` for a
    /// first connection. An unreachable server is not an error: the provider then answers
    /// `Unavailable(connect)` until it connects in the background.
    ///
    /// With [`RedisSettings::fleet`], also starts the fleet heartbeat (its first call at once).
    ///
    /// Must be called inside a Tokio runtime (the supervisors are tasks of it).
    ///
    /// # Errors
    /// [`Error::Settings`] naming every bad setting (timeouts, bounds, key prefix, URLs,
    /// topology, TLS files, credentials).
    pub async fn connect(settings: RedisSettings, policies: PolicySet) -> Result<Self, Error> {
        Self::connect_on(settings, policies, Placement::default()).await
    }

    /// [`Self::connect`], the connections spread over the serving threads' runtimes of
    /// `placement` (thread per core: [`crate::placement`]): at least one per runtime and
    /// node, and a request takes its own thread's connection while it is up.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn connect_on(
        settings: RedisSettings,
        policies: PolicySet,
        placement: Placement,
    ) -> Result<Self, Error> {
        let resolved = settings.resolve().map_err(Error::Settings)?;
        let plans = plans(&settings.key_prefix, &policies)?;
        let mut scripts = programs::scripts();
        if policies
            .iter()
            .any(|p| p.kind() == AlgorithmKind::Concurrency)
        {
            scripts.extend(crate::leases::scripts());
        }
        if settings.fleet.is_some() {
            scripts.push(&crate::fleet::HEARTBEAT);
        }
        let needs = Needs::rate(&settings.key_prefix, &scripts).for_settings(&settings);
        let pool = Arc::new(Pool::start(&settings, resolved, scripts, needs, placement).await);
        let deny_cache = Arc::new(DenyCache::new(settings.deny_cache_max_entries));
        let batcher = Arc::new(Batcher::new(settings.batch_max));
        let fleet = settings.fleet.as_ref().map(|f| {
            Fleet::start(
                pool.clone(),
                &settings.key_prefix,
                f,
                settings.command_timeout,
            )
        });
        Ok(Self {
            settings,
            policies,
            plans,
            pool,
            tokens: Arc::new(RandomTokens::default()),
            deny_cache,
            batcher,
            fleet,
        })
    }

    /// The same provider, taking lease tokens from `tokens` (tests fix them this way).
    #[must_use]
    pub fn with_tokens(mut self, tokens: Arc<dyn TokenSource>) -> Self {
        self.tokens = tokens;
        self
    }

    /// What a lease call of `policy` needs.
    fn leasing(&self, policy: &PolicyId) -> Result<Leasing<'_>, RequestError> {
        let Some(plan) = self.plans.get(policy) else {
            // Every policy of the set has a plan (built in `connect`); this is unreachable.
            return Err(RequestError::UnknownPolicy(policy.clone()));
        };
        Ok(Leasing {
            pool: &self.pool,
            keys: &plan.keys,
            timeout: self.settings.command_timeout,
            retry_after_ms: self.settings.retry_after_ms(),
            min_replicas_ack: self.settings.min_replicas_ack,
        })
    }

    /// A provider of `policies` over this one's connections (a configuration reload): no
    /// new connection, task or script load. The state of a policy lives under its id and
    /// revision, so an unchanged policy keeps its state and a new revision starts empty. Both
    /// providers may run at once (requests in flight on the old one finish there) and share
    /// the `max_in_flight` bound.
    ///
    /// The caller keeps the revision rule: a policy whose parameters change must change its
    /// revision, or its stored state would be read under parameters it was not written with.
    /// The denial cache is shared too; the entries of a policy removed, given a new revision or
    /// no longer cached are dropped.
    ///
    /// # Errors
    /// [`Error::Settings`] when a policy cannot be run by the programs (as in [`Self::connect`]).
    pub fn with_policies(&self, policies: PolicySet) -> Result<Self, Error> {
        let leasing = |set: &PolicySet| set.iter().any(|p| p.kind() == AlgorithmKind::Concurrency);
        if leasing(&policies) && !leasing(&self.policies) {
            // `connect` loads the lease programs, and checks the ACL user may run them, only
            // when a concurrency policy is configured.
            return Err(SettingsProblem::new(
                "policies",
                "a concurrency policy cannot be added by a reload to a provider started without one (its lease programs were not loaded nor checked against the ACL user); restart to add it",
            )
            .into());
        }
        let plans = plans(&self.settings.key_prefix, &policies)?;
        self.deny_cache.retain(|id, revision| {
            policies
                .get(id)
                .is_some_and(|p| p.revision() == revision && caches(p))
        });
        Ok(Self {
            settings: self.settings.clone(),
            policies,
            plans,
            pool: self.pool.clone(),
            tokens: self.tokens.clone(),
            deny_cache: self.deny_cache.clone(),
            batcher: self.batcher.clone(),
            fleet: self.fleet.clone(),
        })
    }

    /// The exact denial cache (shared by the providers a reload makes from this one).
    pub fn deny_cache(&self) -> &DenyCache {
        &self.deny_cache
    }

    /// What batching has done since the provider started (shared by the providers a reload
    /// makes from this one).
    pub fn batch_stats(&self) -> BatchStats {
        self.batcher.stats()
    }

    /// This instance's fleet membership (its name, instance id and the last known size of
    /// the fleet), shared by the providers a reload makes from this one; `None` without
    /// [`RedisSettings::fleet`].
    pub fn fleet(&self) -> Option<FleetView> {
        self.fleet.as_ref().map(Fleet::view)
    }

    /// The settings this provider runs with.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// The physical key of `subject` under `policy` (for tests and operators; never logged).
    pub fn state_key(
        &self,
        policy: &PolicyId,
        subject: &shared_contract::SubjectDigest,
    ) -> Option<String> {
        self.plans.get(policy).map(|p| p.keys.state_key(subject))
    }

    /// The plan of `policy`, one of this provider's.
    pub(crate) fn plan(&self, policy: &RateLimitPolicy) -> Result<&Plan, RequestError> {
        // Every policy of the set has a plan (built in `connect`); the error is unreachable.
        self.plans
            .get(policy.id())
            .map(|p| &**p)
            .ok_or_else(|| RequestError::UnknownPolicy(policy.id().clone()))
    }

    /// The slot of a call of `keys`: on a cluster they must share one (else `SpansSlots`,
    /// and nothing is sent); elsewhere any (every key is on the one master).
    pub(crate) fn one_slot<'k>(
        &self,
        mut keys: impl Iterator<Item = &'k str>,
    ) -> Result<u16, RequestError> {
        let first = keys.next().map_or(0, |k| hash_slot(k.as_bytes()));
        if self.pool.is_cluster() {
            let mut slots: BTreeSet<u16> = keys.map(|k| hash_slot(k.as_bytes())).collect();
            slots.insert(first);
            if slots.len() > 1 {
                return Err(RequestError::SpansSlots { slots: slots.len() });
            }
        }
        Ok(first)
    }

    /// One call of a program of several members (`call` of `script`, on `slot`; `plans`
    /// and `policies` in member order), whose reply has the multi program's shape: what it
    /// means (a decision that wrote without the acknowledgements `min_replicas_ack` asks
    /// for is `Indeterminate`); or, when the call failed or was not sent, what that means.
    pub(crate) async fn call_members<'a, U>(
        &self,
        script: &Script,
        call: &dyn ScriptArgs,
        slot: u16,
        plans: impl Iterator<Item = &'a Plan>,
        policies: &[&RateLimitPolicy],
        deadline: Deadline,
    ) -> Result<MultiOutcome, Outcome<U>> {
        let reply = self
            .run_members(script, call, slot, policies[0], deadline)
            .await?;
        let outcome = self.read_members(&reply, plans, policies);
        let wrote = matches!(outcome, MultiOutcome::Evaluated(_)) && call.needs_ack(&reply.value);
        Ok(self.acknowledged(outcome, wrote, &reply, script, policies[0]))
    }

    /// Sends `call` of `script` on `slot` within `deadline`: its reply, or what the failure
    /// means for `policy`.
    pub(crate) async fn run_members<U>(
        &self,
        script: &Script,
        call: &dyn ScriptArgs,
        slot: u16,
        policy: &RateLimitPolicy,
        deadline: Deadline,
    ) -> Result<ScriptReply, Outcome<U>> {
        let timeout = self.settings.command_timeout;
        let _permit = self
            .pool
            .admit(deadline, timeout)
            .map_err(|category| self.failed(policy, Failure::Unavailable(category)))?;
        self.pool
            .run_script(script, slot, call, timeout)
            .await
            .map_err(|failure| self.failed(policy, failure))
    }

    /// What a reply of the multi program's shape means for `policies` (`plans` in member
    /// order, whose clock metrics it feeds); `Incompatible(reply)` when it makes no sense.
    pub(crate) fn read_members<'a>(
        &self,
        reply: &ScriptReply,
        plans: impl Iterator<Item = &'a Plan>,
        policies: &[&RateLimitPolicy],
    ) -> MultiOutcome {
        reply_multi::observed(&reply.value, policies, |r| {
            ClockMetrics::multi(r, plans.map(|p| &p.clock));
        })
        .unwrap_or(MultiOutcome::Incompatible {
            policy_id: policies[0].id().clone(),
            category: IncompatibleCategory::Reply,
        })
    }

    /// `outcome`, unless its call `wrote` state without the replica acknowledgements
    /// `min_replicas_ack` asks for: then `Indeterminate` of `policy` (never reported as
    /// durable when it may be lost in a failover).
    pub(crate) fn acknowledged(
        &self,
        outcome: MultiOutcome,
        wrote: bool,
        reply: &ScriptReply,
        script: &Script,
        policy: &RateLimitPolicy,
    ) -> MultiOutcome {
        if wrote && !reply.durable(self.settings.min_replicas_ack) {
            tracing::debug!(
                program = script.name,
                wanted = self.settings.min_replicas_ack,
                acked = reply.replicas_acked,
                "a write not acknowledged by enough replicas; reported indeterminate"
            );
            return self.failed(policy, Failure::Indeterminate);
        }
        outcome
    }

    /// The pool every call of this provider goes through.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Where reservation tokens come from (lease tokens' source).
    pub(crate) fn tokens(&self) -> &dyn TokenSource {
        &*self.tokens
    }

    /// The outcome of a call of `policy`'s (or, for several limits, the first one's) that
    /// `failure` stopped, for one limit or several alike.
    pub(crate) fn failed<T>(&self, policy: &RateLimitPolicy, failure: Failure) -> Outcome<T> {
        let policy_id = policy.id().clone();
        let retry_after_ms = self.settings.retry_after_ms();
        match failure {
            Failure::Unavailable(category) => Outcome::Unavailable {
                policy_id,
                retry_after_ms,
                category,
            },
            Failure::Incompatible(category) => Outcome::Incompatible {
                policy_id,
                category,
            },
            // `run_script` answers `NOSCRIPT` itself (it resends the source); were one to
            // arrive here, what it did would be unknown.
            Failure::Indeterminate | Failure::NoScript => Outcome::Indeterminate {
                policy_id,
                retry_after_ms,
            },
        }
    }

    /// Caches each denying member of a multi-limit evaluation whose policy caches; a replayed
    /// answer is the first decision's, whose `retry_after` counted from back then.
    fn remember_denials(
        &self,
        request: &MultiRequest,
        policies: &[&RateLimitPolicy],
        decision: &MultiDecision,
        sent: Instant,
    ) {
        if decision.replayed || decision.allowed {
            return;
        }
        let now = Instant::now();
        for ((limit, policy), member) in
            request.limits.iter().zip(policies).zip(&decision.decisions)
        {
            if caches(policy)
                && let Some(bound) = DenialBound::of_decision(policy, member, limit.cost)
            {
                self.deny_cache
                    .record(policy, &limit.subject, bound, sent, now);
            }
        }
    }
}

#[async_trait::async_trait]
impl EdgeRateLimitPort for RedisProvider {
    async fn evaluate(&self, request: RateLimitRequest) -> Result<RateLimitOutcome, RequestError> {
        if request.evaluation_id.is_some() {
            // Idempotency lives in the multi-limit program: one limit is a one-member call.
            let policy_id = request.policy_id.clone();
            let outcome = self.evaluate_all(MultiRequest::single(request)).await?;
            return Ok(outcome.into_single(&policy_id));
        }
        let policy = self.policies.admit(&request)?;
        let cached = caches(policy);
        if cached
            && let Some(denial) =
                self.deny_cache
                    .lookup(policy, &request.subject, request.cost, Instant::now())
        {
            // A hit awaits nothing: give the runtime its turn now and then, or a caller looping
            // on hits would starve the connections' tasks.
            tokio::task::coop::consume_budget().await;
            return Ok(RateLimitOutcome::Evaluated(denial));
        }
        let Some(plan) = self.plans.get(policy.id()) else {
            // Every policy of the set has a plan (built in `connect`); this is unreachable.
            return Err(RequestError::UnknownPolicy(policy.id().clone()));
        };
        let timeout = self.settings.command_timeout;
        let _permit = match self.pool.admit(request.deadline, timeout) {
            Ok(permit) => permit,
            Err(category) => return Ok(self.failed(policy, Failure::Unavailable(category))),
        };
        let key = plan.keys.state_key(&request.subject);
        let cost = request.cost.get();
        let slot = hash_slot(key.as_bytes());
        // Before the call is written, so never later than the server's reading of its clock.
        let sent = Instant::now();
        // Batch only under load: alone in flight, nobody can join, and the yield a batch
        // waits for costs an idle caller latency for nothing.
        let answer = if self.batcher.enabled() && self.pool.in_flight() > 1 {
            let decision = Decision {
                plan,
                key: &key,
                cost,
                slot,
            };
            self.batcher.decide(&self.pool, decision, timeout).await
        } else {
            plan.run(&self.pool, slot, &key, cost, timeout).await
        };
        let reply = match answer {
            Ok(reply) => reply,
            Err(failure) => return Ok(self.failed(policy, failure)),
        };
        let outcome = reply::observed(&reply.value, policy, |r| plan.clock.single(r));
        if cached
            && let RateLimitOutcome::Evaluated(d) = &outcome
            && let Some(bound) = DenialBound::of_decision(policy, d, request.cost)
        {
            self.deny_cache
                .record(policy, &request.subject, bound, sent, Instant::now());
        }
        let allowed = matches!(&outcome, RateLimitOutcome::Evaluated(d) if d.allowed);
        if allowed && !reply.durable(self.settings.min_replicas_ack) {
            tracing::debug!(
                program = plan.program.script.name,
                wanted = self.settings.min_replicas_ack,
                acked = reply.replicas_acked,
                "allow not acknowledged by enough replicas; reported indeterminate"
            );
            return Ok(self.failed(policy, Failure::Indeterminate));
        }
        Ok(outcome)
    }

    /// One call of `lua/rate-multi-v2.lua` for every member (and the evaluation id's replay
    /// key), so the members are decided and charged together, and a retried id answers the
    /// stored first decision. On a cluster the keys must share one slot (members of one
    /// subject do); otherwise the request is refused before anything is sent.
    async fn evaluate_all(&self, request: MultiRequest) -> Result<MultiOutcome, RequestError> {
        let policies = self.policies.admit_all(&request)?;
        // A retried evaluation id must answer its stored first decision: never the cache.
        let cached = request.evaluation_id.is_none() && policies.iter().any(|p| caches(p));
        if cached {
            let asked = request
                .limits
                .iter()
                .zip(&policies)
                .map(|(l, p)| (*p, &l.subject, l.cost));
            if let Some(denial) = self.deny_cache.lookup_all(asked, caches, Instant::now()) {
                tokio::task::coop::consume_budget().await;
                return Ok(MultiOutcome::Evaluated(denial));
            }
        }
        let mut members = Vec::with_capacity(policies.len());
        for (limit, policy) in request.limits.iter().zip(&policies) {
            let plan = self.plan(policy)?;
            members.push((plan, plan.keys.state_key(&limit.subject), limit.cost.get()));
        }
        let slot = self.one_slot(members.iter().map(|(_, key, _)| key.as_str()))?;
        let replay = match &request.evaluation_id {
            Some(id) => {
                let digested: Vec<ReplayMember<'_>> = request
                    .limits
                    .iter()
                    .zip(&policies)
                    .map(|(l, p)| ReplayMember {
                        policy: p,
                        subject: &l.subject,
                        cost: l.cost.get(),
                    })
                    .collect();
                replay_key(&self.settings.key_prefix, id, &digested)
                    .map(|key| (key, replay_window_ms(policies.iter().copied())))
            }
            None => None,
        };
        let call = MultiCall { members, replay };
        // Before the call is written, so never later than the server's reading of its clock.
        let sent = Instant::now();
        let plans = call.members.iter().map(|(plan, _, _)| *plan);
        let called = self.call_members(
            &programs::MULTI,
            &call,
            slot,
            plans,
            &policies,
            request.deadline,
        );
        let outcome = match called.await {
            Ok(outcome) => outcome,
            Err(failed) => return Ok(failed),
        };
        if cached && let MultiOutcome::Evaluated(d) = &outcome {
            self.remember_denials(&request, &policies, d, sent);
        }
        Ok(outcome)
    }

    async fn acquire_lease(&self, request: AcquireRequest) -> Result<AcquireOutcome, RequestError> {
        let (policy, params) = self.policies.admit_lease(&request.policy_id)?;
        let leasing = self.leasing(policy.id())?;
        Ok(leasing
            .acquire(policy, params, &request, &*self.tokens)
            .await)
    }

    async fn release_lease(&self, request: ReleaseRequest) -> Result<ReleaseOutcome, RequestError> {
        let (policy, _) = self.policies.admit_lease(&request.lease.policy_id)?;
        Ok(self.leasing(policy.id())?.release(&request).await)
    }

    async fn reserve(&self, request: ReserveRequest) -> Result<ReserveOutcome, RequestError> {
        self.reserve_limits(request).await
    }

    async fn settle(&self, request: SettleRequest) -> Result<SettleOutcome, RequestError> {
        self.settle_reservation(request).await
    }

    async fn cancel(&self, request: CancelRequest) -> Result<CancelOutcome, RequestError> {
        self.cancel_reservation(request).await
    }

    async fn charge(&self, request: ChargeRequest) -> Result<ChargeOutcome, RequestError> {
        self.charge_all(request).await
    }

    fn policies(&self) -> &PolicySet {
        &self.policies
    }

    /// `Ready` when a connection is up and answers `PING` within `command_timeout` (on a
    /// cluster: every slot's master).
    async fn readiness(&self) -> Readiness {
        self.pool.readiness(self.settings.command_timeout).await
    }
}
