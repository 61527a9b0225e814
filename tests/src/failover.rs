//! Load across a fault: workers evaluate a fixed set of subjects under one policy, in a
//! closed loop, while the test kills or cuts something; every outcome is kept with its start
//! time and subject, so the test can measure the outage, check what was answered meanwhile,
//! and count over-admission per key.
//!
//! Over-admission is measured with a policy that never refills during the run (a token
//! bucket refilling its capacity over a day; not a fixed window, which rolls over at its
//! boundary): each subject may be admitted `limit` times in all, so anything beyond that was
//! admitted on state the fault lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shared_contract::{
    Cost, Deadline, EdgeRateLimitPort, PolicyId, RateLimitOutcome, RateLimitRequest, SubjectDigest,
};

use crate::eventually::eventually;

/// What one evaluation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Allowed,
    Denied,
    Unavailable,
    Indeterminate,
    Incompatible,
}

impl Answer {
    fn of(outcome: &RateLimitOutcome) -> Self {
        match outcome {
            RateLimitOutcome::Evaluated(d) if d.allowed => Answer::Allowed,
            RateLimitOutcome::Evaluated(_) => Answer::Denied,
            RateLimitOutcome::Unavailable { .. } => Answer::Unavailable,
            RateLimitOutcome::Indeterminate { .. } => Answer::Indeterminate,
            RateLimitOutcome::Incompatible { .. } => Answer::Incompatible,
        }
    }

    /// A decision (allow or deny), as opposed to a failure.
    pub fn is_decision(self) -> bool {
        matches!(self, Answer::Allowed | Answer::Denied)
    }
}

/// One evaluation: when it started (since the run began), for which subject, what it said.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub at: Duration,
    pub subject: usize,
    pub answer: Answer,
}

/// A running load; [`Load::stop`] ends it and returns every record.
#[derive(Debug)]
pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    allowed: Arc<AtomicU64>,
    /// Per subject, when (ms on the load's clock, plus one) a request that got a denial
    /// started; 0 for never.
    last_denied: Arc<Vec<AtomicU64>>,
    workers: Vec<tokio::task::JoinHandle<Vec<Record>>>,
}

impl Load {
    /// Starts `concurrency` workers evaluating `policy` for `subjects` (round robin from a
    /// different offset each), each with a `budget` deadline.
    pub fn start(
        port: Arc<dyn EdgeRateLimitPort>,
        policy: PolicyId,
        subjects: Arc<Vec<SubjectDigest>>,
        concurrency: usize,
        budget: Duration,
    ) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let allowed = Arc::new(AtomicU64::new(0));
        let last_denied: Arc<Vec<AtomicU64>> =
            Arc::new((0..subjects.len()).map(|_| AtomicU64::new(0)).collect());
        let workers = (0..concurrency)
            .map(|w| {
                let (port, policy, subjects) = (port.clone(), policy.clone(), subjects.clone());
                let (stop, allowed) = (stop.clone(), allowed.clone());
                let last_denied = last_denied.clone();
                tokio::spawn(async move {
                    let mut records = Vec::new();
                    let mut i = w * 7919;
                    while !stop.load(Ordering::Relaxed) {
                        let subject = i % subjects.len();
                        i += 1;
                        let at = started.elapsed();
                        let request = RateLimitRequest {
                            policy_id: policy.clone(),
                            subject: subjects[subject],
                            cost: Cost::ONE,
                            evaluation_id: None,
                            deadline: Deadline::within(budget).expect("a valid deadline"),
                        };
                        let answer = match port.evaluate(request).await {
                            Ok(outcome) => Answer::of(&outcome),
                            Err(e) => panic!("a valid request was refused: {e}"),
                        };
                        if answer == Answer::Allowed {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                        if answer == Answer::Denied {
                            let ms = u64::try_from(at.as_millis()).unwrap_or(u64::MAX);
                            last_denied[subject].fetch_max(ms + 1, Ordering::Relaxed);
                        }
                        if !answer.is_decision() {
                            // A failing provider answers at once; do not spin on it.
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        records.push(Record {
                            at,
                            subject,
                            answer,
                        });
                    }
                    records
                })
            })
            .collect();
        Self {
            started,
            stop,
            allowed,
            last_denied,
            workers,
        }
    }

    /// Time since the load started (the clock of [`Record::at`]).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Allowed evaluations so far.
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` evaluations were allowed, at most `timeout`.
    ///
    /// # Panics
    /// When that takes longer than `timeout`.
    pub async fn wait_allowed(&self, n: u64, timeout: Duration) {
        let what = format!("{n} allowed");
        eventually(&what, timeout, Duration::from_millis(10), async || {
            let allowed = self.allowed();
            if allowed >= n { Ok(()) } else { Err(allowed) }
        })
        .await;
    }

    /// Waits until every subject for which `watched` holds got a denial for a request started
    /// at or after `since` (its quota is used up), at most `timeout`.
    ///
    /// # Panics
    /// When that takes longer than `timeout`.
    pub async fn wait_exhausted(
        &self,
        since: Duration,
        watched: impl Fn(usize) -> bool,
        timeout: Duration,
    ) {
        let since = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        let what = format!("every watched subject denied since {since} ms");
        eventually(&what, timeout, Duration::from_millis(20), async || {
            let left = (0..self.last_denied.len())
                .filter(|&s| watched(s) && self.last_denied[s].load(Ordering::Relaxed) <= since)
                .count();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} subjects left"))
            }
        })
        .await;
    }

    /// Stops the workers and returns every record, in start order.
    ///
    /// # Panics
    /// When a worker panicked.
    pub async fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("a load worker"));
        }
        all.sort_by_key(|r| r.at);
        all
    }
}

/// What happened around a fault at `fault` (on the load's clock), for the subjects `watched`
/// (those whose master was hit).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// From the fault to the start of the first decision after the last failure, among
    /// requests started after the fault (`None`: never recovered, or never failed).
    pub outage: Option<Duration>,
    pub allowed: u64,
    pub denied: u64,
    pub unavailable: u64,
    pub indeterminate: u64,
    pub incompatible: u64,
    /// Admitted beyond `limit`, summed over the watched subjects.
    pub over_admitted: u64,
    /// Watched subjects admitted beyond `limit`.
    pub over_admitted_subjects: usize,
}

/// Summarizes `records` for the subjects for which `watched(subject)` holds.
pub fn summarize(
    records: &[Record],
    fault: Duration,
    limit: u64,
    subjects: usize,
    watched: impl Fn(usize) -> bool,
) -> Summary {
    let mut per_subject = vec![0u64; subjects];
    let mut s = Summary {
        outage: None,
        allowed: 0,
        denied: 0,
        unavailable: 0,
        indeterminate: 0,
        incompatible: 0,
        over_admitted: 0,
        over_admitted_subjects: 0,
    };
    let mut last_failure: Option<Duration> = None;
    for r in records.iter().filter(|r| watched(r.subject)) {
        match r.answer {
            Answer::Allowed => {
                s.allowed += 1;
                per_subject[r.subject] += 1;
            }
            Answer::Denied => s.denied += 1,
            Answer::Unavailable => s.unavailable += 1,
            Answer::Indeterminate => s.indeterminate += 1,
            Answer::Incompatible => s.incompatible += 1,
        }
        if !r.answer.is_decision() && r.at >= fault {
            last_failure = Some(r.at);
        }
    }
    if let Some(last) = last_failure {
        s.outage = records
            .iter()
            .filter(|r| watched(r.subject) && r.at > last && r.answer.is_decision())
            .map(|r| r.at - fault)
            .next();
    }
    for &n in &per_subject {
        if n > limit {
            s.over_admitted += n - limit;
            s.over_admitted_subjects += 1;
        }
    }
    s
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.outage {
            Some(o) => write!(f, "outage {:.2} s", o.as_secs_f64())?,
            None => write!(f, "no outage seen")?,
        }
        write!(
            f,
            "; answers: {} allowed, {} denied, {} unavailable, {} indeterminate, {} incompatible; \
             over-admission {} on {} subjects",
            self.allowed,
            self.denied,
            self.unavailable,
            self.indeterminate,
            self.incompatible,
            self.over_admitted,
            self.over_admitted_subjects
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ms: u64, subject: usize, answer: Answer) -> Record {
        Record {
            at: Duration::from_millis(ms),
            subject,
            answer,
        }
    }

    #[test]
    fn the_outage_ends_at_the_first_decision_after_the_last_failure() {
        let records = [
            r(0, 0, Answer::Allowed),
            r(10, 1, Answer::Allowed),
            r(20, 0, Answer::Unavailable),
            r(30, 0, Answer::Allowed),
            r(40, 0, Answer::Indeterminate),
            r(50, 1, Answer::Denied),
            r(60, 0, Answer::Allowed),
            r(70, 0, Answer::Allowed),
        ];
        let s = summarize(&records, Duration::from_millis(15), 2, 2, |_| true);
        assert_eq!(s.outage, Some(Duration::from_millis(35)));
        assert_eq!((s.allowed, s.denied), (5, 1));
        assert_eq!((s.unavailable, s.indeterminate), (1, 1));
        // Subject 0 was allowed 4 times against a limit of 2.
        assert_eq!((s.over_admitted, s.over_admitted_subjects), (2, 1));
        let only_1 = summarize(&records, Duration::from_millis(15), 2, 2, |s| s == 1);
        assert_eq!(only_1.outage, None);
        assert_eq!(only_1.over_admitted, 0);
    }
}
