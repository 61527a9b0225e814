//! The shadow split, the one way every entry point (the middleware, `/v1/evaluate`, the gRPC
//! service) evaluates a request's limits when some are in shadow mode: the enforced limits
//! first, as one all-or-nothing evaluation; then, only when the request goes through, every
//! shadow limit on its own. A shadow limit never refuses the request and is never part of
//! the enforced evaluation (it must not keep the enforced limits from being charged), and a
//! refused request charges no shadow limit.

use shared_contract::{EvaluationId, FailurePolicy, MultiOutcome, RateLimitOutcome, RequestError};

use crate::failure;
use crate::limiter::{Limiter, Member};

/// What became of a request's limits ([`Limiter::evaluate_split`]).
#[derive(Debug)]
pub struct Split {
    /// The enforced members' outcome, as one evaluation in member order; `None` when every
    /// member is in shadow mode.
    pub enforced: Option<MultiOutcome>,
    /// Whether the request goes through: no enforced member, the enforced members admitted
    /// it, or they could not be decided and the policy that decides
    /// ([`failure::deciding_policy`]) fails open.
    pub through: bool,
    /// Each shadow member's position among the members given and its outcome, in order;
    /// empty when the request does not go through (they were not evaluated).
    pub shadow: Vec<(usize, Result<RateLimitOutcome, RequestError>)>,
}

impl Limiter {
    /// Evaluates `members`, of which those marked in `shadow` (by position; missing marks
    /// are enforced) are in shadow mode, by the rule of the module docs.
    ///
    /// The enforced members are one [`Self::evaluate_all`] with `evaluation_id`; a single
    /// enforced member without an evaluation id is evaluated alone (the cheaper single
    /// program), its outcome given as a one-member evaluation. Every evaluation is recorded
    /// in the metrics as [`Self::evaluate_all`] and [`Self::evaluate_shadows`] say.
    ///
    /// # Errors
    /// [`RequestError`] when the enforced evaluation is refused (too many members, a policy
    /// and subject twice, what the port refuses); nothing was charged.
    ///
    /// # Panics
    /// As [`Self::policy`].
    pub async fn evaluate_split(
        &self,
        members: &[Member],
        shadow: &[bool],
        evaluation_id: Option<EvaluationId>,
    ) -> Result<Split, RequestError> {
        let is_shadow = |i: usize| shadow.get(i).copied().unwrap_or(false);
        let enforced: Vec<Member> = (0..members.len())
            .filter(|&i| !is_shadow(i))
            .map(|i| members[i])
            .collect();
        let outcome = match (enforced.as_slice(), evaluation_id) {
            ([], _) => None,
            ([m], None) => Some(MultiOutcome::from_single(
                self.evaluate_as(m.index, m.subject, m.cost, false).await?,
            )),
            (many, id) => Some(self.evaluate_all(many, id).await?),
        };
        let through = match &outcome {
            None => true,
            Some(MultiOutcome::Evaluated(d)) => d.allowed,
            // Undecided: through exactly when the policy that decides fails open.
            Some(_) => failure::deciding_policy(enforced.iter().map(|m| self.policy(m.index)))
                .is_some_and(|i| {
                    self.policy(enforced[i].index).failure_policy() == FailurePolicy::FailOpen
                }),
        };
        let mut shadow_outcomes = Vec::new();
        if through {
            let at: Vec<usize> = (0..members.len()).filter(|&i| is_shadow(i)).collect();
            let ms: Vec<Member> = at.iter().map(|&i| members[i]).collect();
            shadow_outcomes = at
                .into_iter()
                .zip(self.evaluate_shadows(&ms).await)
                .collect();
        }
        Ok(Split {
            enforced: outcome,
            through,
            shadow: shadow_outcomes,
        })
    }
}
