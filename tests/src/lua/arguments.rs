//! The programs' arguments as the tests build them: a single program's `ARGV[1]` (with a
//! calendar window's bounds around a given time), and the multi-limit and settlement
//! programs' ARGV.

use shared_contract::{Algorithm, RateLimitPolicy};

use super::{Program, argument_fields, pack};

/// What the settlement program does with one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOp {
    /// Evaluates `cost` and writes nothing (the provider checks a cost of 1).
    Check(u64),
    /// Settles a hold of `estimate` charged at `at_ms` with the `actual` cost.
    Settle {
        actual: u64,
        estimate: u64,
        at_ms: u64,
    },
}

/// ARGV of the settlement program for `members` (without the test build's trailing `now`):
/// the packed member count, then per member its operation, its algorithm code and its
/// packed arguments (a settlement's: the actual cost in the cost's place, then the hold,
/// `<I7I6` estimate and at_ms). Calendar bounds around this machine's clock.
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn settle_arguments(members: &[(&RateLimitPolicy, SettleOp)]) -> Vec<Vec<u8>> {
    settle_arguments_at(&at_now(members))
}

/// [`settle_arguments`] with each member's calendar bounds around its time (its effective
/// time: the program picks the window holding it among the bounds).
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn settle_arguments_at(members: &[(&RateLimitPolicy, SettleOp, u64)]) -> Vec<Vec<u8>> {
    let mut args = vec![pack(&[(members.len() as u64, 1), (0, 1)])];
    for &(policy, op, t) in members {
        let program = Program::for_kind(policy.kind()).expect("a program for the algorithm");
        let (name, packed) = match op {
            SettleOp::Check(cost) => ("check", packed_at(policy, cost, t)),
            SettleOp::Settle {
                actual,
                estimate,
                at_ms,
            } => {
                let mut packed = packed_at(policy, actual, t);
                packed.extend(pack(&[(estimate, 7), (at_ms, 6)]));
                ("settle", packed)
            }
        };
        args.push(name.as_bytes().to_vec());
        args.push(program.algorithm_code().to_string().into_bytes());
        args.push(packed);
    }
    args
}

/// This machine's clock, Unix ms.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Members with this machine's clock as their time.
fn at_now<'p, X: Copy>(members: &[(&'p RateLimitPolicy, X)]) -> Vec<(&'p RateLimitPolicy, X, u64)> {
    let now = now_ms();
    members.iter().map(|&(p, x)| (p, x, now)).collect()
}

/// ARGV of the settlement program's reserve operation for `members` (policy, estimate),
/// `ttl_ms` and the caller's `blob` (without the test build's trailing `now`).
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn reserve_arguments(
    members: &[(&RateLimitPolicy, u64)],
    ttl_ms: u64,
    blob: &[u8],
) -> Vec<Vec<u8>> {
    reserve_arguments_at(&at_now(members), ttl_ms, blob)
}

/// [`reserve_arguments`] with each member's calendar bounds around its time.
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn reserve_arguments_at(
    members: &[(&RateLimitPolicy, u64, u64)],
    ttl_ms: u64,
    blob: &[u8],
) -> Vec<Vec<u8>> {
    let mut args = vec![
        pack(&[(members.len() as u64, 1), (1, 1)]),
        pack(&[(ttl_ms, 4)]),
        blob.to_vec(),
    ];
    args.extend(coded(members));
    args
}

/// ARGV of the settlement program's settle (`cancel` false) or cancel operation for
/// `members` (policy, actual cost; a cancel's are 0).
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn end_arguments(members: &[(&RateLimitPolicy, u64)], cancel: bool) -> Vec<Vec<u8>> {
    end_arguments_at(&at_now(members), cancel)
}

/// [`end_arguments`] with each member's calendar bounds around its time.
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn end_arguments_at(members: &[(&RateLimitPolicy, u64, u64)], cancel: bool) -> Vec<Vec<u8>> {
    let op = if cancel { 3 } else { 2 };
    let mut args = vec![pack(&[(members.len() as u64, 1), (op, 1)])];
    args.extend(coded(members));
    args
}

/// Per member its algorithm code and its single-program arguments.
fn coded(members: &[(&RateLimitPolicy, u64, u64)]) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    for &(policy, cost, t) in members {
        let program = Program::for_kind(policy.kind()).expect("a program for the algorithm");
        args.push(program.algorithm_code().to_string().into_bytes());
        args.push(packed_at(policy, cost, t));
    }
    args
}

/// ARGV of the multi-limit program for `members` (policy, cost) and a replay window (0: no
/// evaluation id), in the order of its header (without the test build's trailing `now`):
/// the packed header, then per member its algorithm code and its packed arguments.
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn multi_arguments(members: &[(&RateLimitPolicy, u64)], replay_window_ms: u64) -> Vec<Vec<u8>> {
    multi_arguments_at(&at_now(members), replay_window_ms)
}

/// [`multi_arguments`] with each member's calendar bounds around its time.
///
/// # Panics
/// For a policy of an algorithm without a program.
pub fn multi_arguments_at(
    members: &[(&RateLimitPolicy, u64, u64)],
    replay_window_ms: u64,
) -> Vec<Vec<u8>> {
    let mut args = vec![pack(&[(members.len() as u64, 1), (replay_window_ms, 4)])];
    args.extend(coded(members));
    args
}

/// The four calendar bounds a fixed window of calendar periods sends around `t`: the
/// previous, current and next period's `[b0, b1)`, `[b1, b2)`, `[b2, b3)`. `None` for
/// another policy (or a time the calendar cannot place).
pub fn calendar_bounds(policy: &RateLimitPolicy, t: u64) -> Option<[u64; 4]> {
    let Algorithm::FixedWindow(p) = policy.algorithm() else {
        return None;
    };
    let c = p.calendar()?;
    let (start, end) = c.bounds(t)?;
    let (previous, _) = c.bounds(start.checked_sub(1)?)?;
    let (_, next) = c.bounds(end)?;
    Some([previous, start, end, next])
}

/// ARGV for `policy` and `cost` (one packed string, `docs/lua-programs.md`), without the
/// test build's trailing `now`; a calendar window's bounds around this machine's clock, as
/// the provider sends them.
pub fn arguments(policy: &RateLimitPolicy, cost: u64) -> Vec<Vec<u8>> {
    arguments_at(policy, cost, now_ms())
}

/// [`arguments`] with a calendar window's bounds around `t`.
pub fn arguments_at(policy: &RateLimitPolicy, cost: u64, t: u64) -> Vec<Vec<u8>> {
    vec![packed_at(policy, cost, t)]
}

/// `ARGV[1]` of `policy` for `cost`, with a calendar window's bounds around `t` (none when
/// the calendar cannot place the periods around `t`: the program then refuses it).
pub fn packed_at(policy: &RateLimitPolicy, cost: u64, t: u64) -> Vec<u8> {
    let mut fields = argument_fields(policy, cost);
    if let Some(bounds) = calendar_bounds(policy, t) {
        fields.extend(bounds.map(|b| (b, 6)));
    }
    pack(&fields)
}

/// The time a member's program decides at: the stored `last_ms` when the clock is behind
/// it (within or beyond the allowed regression; beyond, nothing is decided anyway), else
/// `now`. Calendar bounds around it always hold the window the program needs.
pub fn effective_time(last_ms: Option<u64>, now: u64) -> u64 {
    last_ms.map_or(now, |last| last.max(now))
}
