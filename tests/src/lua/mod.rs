//! The Lua programs of `lua/` as the tests drive them: the production source, the test build
//! that takes `now` from ARGV, the arguments a policy sends, the seven-field reply, and the
//! state encoding (so tests can plant state and compare it with the reference models).
//!
//! This is an independent reading of `docs/lua-programs.md` and of the programs' header
//! comments, not a re-export of `adapter-redis`: when the two disagree, a test fails.

use redis::Value;
use shared_contract::model::{
    AlgorithmState, Evaluation, FixedWindowState, GcraState, SlidingLogState, SlidingWindowState,
    TokenBucketState, Verdict,
};
use shared_contract::{Algorithm, AlgorithmKind, RateLimitPolicy};

/// The replacement of the `@time-source` block in the test build.
pub const TEST_TIME_SOURCE: &str = "local now = tonumber(ARGV[#ARGV])";
const BEGIN: &str = "-- @time-source begin";
const END: &str = "-- @time-source end";

/// Schema version of every program's state (bits 4-6 of the tag byte).
pub const SCHEMA_VERSION: u8 = 1;
/// Bit 7 of the tag byte: the compact layout.
pub const COMPACT: u8 = 0x80;

/// The layouts of a state value (see the State section of each program's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Narrow fields; the writer's choice whenever the values fit.
    Compact,
    /// Fields wide enough for every valid state.
    Wide,
    /// The wide fields and an overdraft (a settlement above its estimate), schema 2; not for
    /// a sliding log.
    Overdraft,
}

/// Schema version of the overdraft layout (bits 4-6 of the tag byte).
pub const OVERDRAFT_SCHEMA: u8 = 2;

/// One program of `lua/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Program {
    FixedWindow,
    SlidingCounter,
    TokenBucket,
    Gcra,
    SlidingLog,
}

impl Program {
    pub const ALL: [Program; 5] = [
        Program::FixedWindow,
        Program::SlidingCounter,
        Program::TokenBucket,
        Program::Gcra,
        Program::SlidingLog,
    ];

    /// The program of an algorithm (`None` for one this build has no program for).
    pub fn for_kind(kind: AlgorithmKind) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.kind() == kind)
    }

    pub fn kind(self) -> AlgorithmKind {
        match self {
            Program::FixedWindow => AlgorithmKind::FixedWindow,
            Program::SlidingCounter => AlgorithmKind::SlidingWindow,
            Program::TokenBucket => AlgorithmKind::TokenBucket,
            Program::Gcra => AlgorithmKind::Gcra,
            Program::SlidingLog => AlgorithmKind::SlidingLog,
        }
    }

    pub fn file_name(self) -> &'static str {
        match self {
            Program::FixedWindow => "rate-fixed-window-v2.lua",
            Program::SlidingCounter => "rate-sliding-counter-v2.lua",
            Program::TokenBucket => "rate-token-bucket-v2.lua",
            Program::Gcra => "rate-gcra-v2.lua",
            Program::SlidingLog => "rate-sliding-log-v2.lua",
        }
    }

    /// The production source, exactly as `adapter-redis` embeds it.
    pub fn source(self) -> &'static str {
        match self {
            Program::FixedWindow => include_str!("../../../lua/rate-fixed-window-v2.lua"),
            Program::SlidingCounter => include_str!("../../../lua/rate-sliding-counter-v2.lua"),
            Program::TokenBucket => include_str!("../../../lua/rate-token-bucket-v2.lua"),
            Program::Gcra => include_str!("../../../lua/rate-gcra-v2.lua"),
            Program::SlidingLog => include_str!("../../../lua/rate-sliding-log-v2.lua"),
        }
    }

    /// The algorithm code in the low nibble of the state's tag byte.
    pub fn algorithm_code(self) -> u8 {
        match self {
            Program::FixedWindow => 1,
            Program::SlidingCounter => 2,
            Program::TokenBucket => 3,
            Program::Gcra => 4,
            Program::SlidingLog => 5,
        }
    }

    /// The first byte of a state value of this program in `layout`.
    pub fn tag(self, layout: Layout) -> u8 {
        let wide = (SCHEMA_VERSION << 4) | self.algorithm_code();
        match layout {
            Layout::Compact => COMPACT | wide,
            Layout::Wide => wide,
            Layout::Overdraft => (OVERDRAFT_SCHEMA << 4) | self.algorithm_code(),
        }
    }

    /// Byte widths of (revision, each field) in `layout`; a sliding log's fields are one
    /// entry's (age, cost), repeated.
    pub fn widths(self, layout: Layout) -> (usize, &'static [usize]) {
        match (self, layout) {
            (Program::SlidingCounter, Layout::Overdraft) => (4, &[5, 5, 7]),
            (Program::SlidingLog, Layout::Overdraft) => (4, &[5, 2]),
            (_, Layout::Overdraft) => (4, &[7, 7]),
            (Program::SlidingCounter, Layout::Compact) => (1, &[2, 2]),
            (Program::SlidingCounter, Layout::Wide) => (4, &[5, 5]),
            (Program::SlidingLog, Layout::Compact) => (1, &[3, 1]),
            (Program::SlidingLog, Layout::Wide) => (4, &[5, 2]),
            (_, Layout::Compact) => (1, &[4]),
            (_, Layout::Wide) => (4, &[7]),
        }
    }

    /// The differential-test build: the marked `TIME` block replaced by
    /// [`TEST_TIME_SOURCE`]; nothing else differs.
    ///
    /// # Errors
    /// When the source lacks exactly one well-ordered `@time-source` block.
    pub fn test_variant(self) -> Result<String, String> {
        test_build(self.file_name(), self.source())
    }

    /// The text of the production `@time-source` block, markers included.
    pub fn time_source_block(self) -> Option<&'static str> {
        let src = self.source();
        let b = src.find(BEGIN)?;
        let e = src.find(END)?;
        (e > b).then(|| &src[b..e + END.len()])
    }
}

/// The test build of the program `name` with source `src`: the marked `TIME` block replaced
/// by [`TEST_TIME_SOURCE`].
///
/// # Errors
/// When the source lacks exactly one well-ordered `@time-source` block.
pub fn test_build(name: &str, src: &str) -> Result<String, String> {
    let (Some(b), Some(e)) = (src.find(BEGIN), src.find(END)) else {
        return Err(format!("{name}: no @time-source block"));
    };
    if src.matches(BEGIN).count() != 1 || src.matches(END).count() != 1 || e < b {
        return Err(format!("{name}: malformed @time-source block"));
    }
    Ok(format!(
        "{}{TEST_TIME_SOURCE}{}",
        &src[..b],
        &src[e + END.len()..]
    ))
}

mod arguments;
pub use arguments::*;

/// The multi-limit program, exactly as `adapter-redis` embeds it.
pub const MULTI_SOURCE: &str = include_str!("../../../lua/rate-multi-v2.lua");

/// The batch program, exactly as `adapter-redis` embeds it.
pub const BATCH_SOURCE: &str = include_str!("../../../lua/rate-batch-v2.lua");

/// The settlement program, exactly as `adapter-redis` embeds it.
pub const SETTLE_SOURCE: &str = include_str!("../../../lua/rate-settle-v1.lua");

/// Unsigned little-endian fields of the given byte widths, as the programs' headers lay out
/// `ARGV[1]`.
///
/// # Panics
/// When a value does not fit its width (a test that means to send one builds the bytes).
pub fn pack(fields: &[(u64, usize)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(value, width) in fields {
        assert!(
            width >= 8 || value < 1 << (8 * width),
            "{value} in {width} bytes"
        );
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    }
    out
}

/// The multi-limit program's reply: `{status, replayed, index, row...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiReply {
    pub status: String,
    pub replayed: bool,
    pub index: u64,
    pub rows: Vec<Reply>,
}

impl MultiReply {
    /// Parses strictly: a bulk-string status, replayed 0 or 1, an index, seven-field rows.
    ///
    /// # Errors
    /// A description of the first field that does not fit.
    pub fn parse(value: &Value) -> Result<MultiReply, String> {
        let Value::Array(fields) = value else {
            return Err(format!("reply is not an array: {value:?}"));
        };
        let (Some(Value::BulkString(status)), Some(Value::Int(replayed)), Some(Value::Int(index))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err(format!("malformed header: {value:?}"));
        };
        if !matches!(replayed, 0 | 1) || *index < 0 {
            return Err(format!("malformed header: {value:?}"));
        }
        Ok(MultiReply {
            status: String::from_utf8(status.clone()).map_err(|e| e.to_string())?,
            replayed: *replayed == 1,
            index: *index as u64,
            rows: fields[3..]
                .iter()
                .map(Reply::parse)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// The fields of `ARGV[1]` for `policy` and `cost` as (value, byte width), in the order and
/// widths of `docs/lua-programs.md`.
pub fn argument_fields(policy: &RateLimitPolicy, cost: u64) -> Vec<(u64, usize)> {
    let mut fields = vec![
        (cost, 7),
        (u64::from(policy.revision().get()), 4),
        (policy.max_clock_regression_ms(), 5),
        (policy.cleanup_grace_ms(), 5),
    ];
    match policy.algorithm() {
        Algorithm::FixedWindow(p) => fields.extend([(p.limit(), 7), (p.window_ms(), 5)]),
        Algorithm::SlidingWindow(p) => fields.extend([(p.limit(), 5), (p.window_ms(), 5)]),
        Algorithm::TokenBucket(p) => {
            fields.extend([(p.capacity(), 7), (p.scale(), 5), (p.units_per_ms(), 7)]);
        }
        Algorithm::Gcra(p) => {
            fields.extend([
                (p.burst(), 7),
                (p.interval_units(), 5),
                (p.units_per_ms(), 7),
            ]);
        }
        Algorithm::SlidingLog(p) => fields.extend([(p.limit(), 2), (p.window_ms(), 5)]),
        // The lease programs take their own arguments (see `tests/tests/it/lua_leases.rs`).
        Algorithm::Concurrency(p) => fields.extend([(p.limit(), 7), (p.lease_ttl_ms(), 5)]),
    }
    fields
}

/// The seven reply fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: String,
    pub server_now_ms: u64,
    pub effective_now_ms: u64,
    pub limit: u64,
    pub remaining: u64,
    pub retry_after_ms: u64,
    pub reset_at_ms: u64,
}

impl Reply {
    /// Parses a program's reply strictly: seven fields, a bulk-string status, six
    /// non-negative integers.
    ///
    /// # Errors
    /// A description of the first field that does not fit.
    pub fn parse(value: &Value) -> Result<Reply, String> {
        let Value::Array(fields) = value else {
            return Err(format!("reply is not an array: {value:?}"));
        };
        if fields.len() != 7 {
            return Err(format!("reply has {} fields: {value:?}", fields.len()));
        }
        let status = match &fields[0] {
            Value::BulkString(b) => String::from_utf8(b.clone())
                .map_err(|_| format!("status is not UTF-8: {:?}", fields[0]))?,
            other => return Err(format!("status is not a bulk string: {other:?}")),
        };
        let mut n = [0u64; 6];
        for (slot, field) in n.iter_mut().zip(&fields[1..]) {
            *slot = match field {
                Value::Int(i) if *i >= 0 => *i as u64,
                other => return Err(format!("field is not a non-negative integer: {other:?}")),
            };
        }
        Ok(Reply {
            status,
            server_now_ms: n[0],
            effective_now_ms: n[1],
            limit: n[2],
            remaining: n[3],
            retry_after_ms: n[4],
            reset_at_ms: n[5],
        })
    }

    /// The reply a program must give for a model evaluation.
    pub fn expected<S>(e: &Evaluation<S>) -> Reply {
        Reply {
            status: match e.verdict {
                Verdict::Allowed => "ALLOWED",
                Verdict::Denied => "DENIED",
                Verdict::ClockUnsafe => "CLOCK_UNSAFE",
            }
            .to_string(),
            server_now_ms: e.server_now_ms,
            effective_now_ms: e.effective_now_ms,
            limit: e.limit,
            remaining: e.remaining,
            retry_after_ms: e.retry_after_ms,
            reset_at_ms: e.reset_at_ms,
        }
    }
}

/// Why bytes are not a state value of the v1 programs, or a state does not fit a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    Tag(u8),
    Length(usize),
    DoesNotFit(Layout),
    EntryAfterLast {
        time: u64,
        last_ms: u64,
    },
    /// Leases are a sorted set, not a rate program's value.
    Leases,
    /// The programs keep no overdraft (a reservation's state) yet.
    Overdraft,
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Tag(t) => write!(f, "state tag byte {t:#04x} is no v1 program's"),
            StateError::Length(n) => write!(f, "state value of {n} bytes fits no layout"),
            StateError::DoesNotFit(l) => write!(f, "state values do not fit the {l:?} layout"),
            StateError::EntryAfterLast { time, last_ms } => write!(
                f,
                "sliding-log entry time {time} is after last_ms {last_ms}: not representable"
            ),
            StateError::Leases => write!(f, "leases are a sorted set, not a program's value"),
            StateError::Overdraft => write!(f, "the programs keep no overdraft yet"),
        }
    }
}

impl std::error::Error for StateError {}

/// The program that writes `state`.
pub fn program_of(state: &AlgorithmState) -> Program {
    match state {
        AlgorithmState::FixedWindow(_) => Program::FixedWindow,
        AlgorithmState::SlidingWindow(_) => Program::SlidingCounter,
        AlgorithmState::TokenBucket(_) => Program::TokenBucket,
        AlgorithmState::Gcra(_) => Program::Gcra,
        AlgorithmState::SlidingLog(_) => Program::SlidingLog,
        AlgorithmState::Concurrency(_) => {
            panic!("leases are held by the lease programs, not by a rate program")
        }
    }
}

fn last_ms_of(state: &AlgorithmState) -> u64 {
    match state {
        AlgorithmState::FixedWindow(s) => s.last_ms,
        AlgorithmState::SlidingWindow(s) => s.last_ms,
        AlgorithmState::TokenBucket(s) => s.last_ms,
        AlgorithmState::Gcra(s) => s.last_ms,
        AlgorithmState::SlidingLog(s) => s.last_ms,
        AlgorithmState::Concurrency(s) => s.latest_expiry_ms().unwrap_or(0),
    }
}

/// The field values of `state` after the revision, in stored order, in `layout`.
fn fields(state: &AlgorithmState, layout: Layout) -> Result<Vec<u64>, StateError> {
    if layout == Layout::Overdraft {
        return Ok(match state {
            AlgorithmState::FixedWindow(s) => vec![s.count, s.overdraft],
            AlgorithmState::SlidingWindow(s) => vec![s.previous, s.current, s.overdraft],
            AlgorithmState::TokenBucket(s) => vec![s.tokens, s.overdraft],
            AlgorithmState::Gcra(s) => vec![s.debt, s.overdraft],
            _ => return Err(StateError::DoesNotFit(layout)),
        });
    }
    Ok(match state {
        AlgorithmState::FixedWindow(s) if s.overdraft == 0 => vec![s.count],
        AlgorithmState::SlidingWindow(s) if s.overdraft == 0 => vec![s.previous, s.current],
        AlgorithmState::TokenBucket(s) if s.overdraft == 0 => vec![s.tokens],
        AlgorithmState::Gcra(s) if s.overdraft == 0 => vec![s.debt],
        AlgorithmState::FixedWindow(_)
        | AlgorithmState::SlidingWindow(_)
        | AlgorithmState::TokenBucket(_)
        | AlgorithmState::Gcra(_) => return Err(StateError::Overdraft),
        AlgorithmState::SlidingLog(s) => {
            let mut v = Vec::with_capacity(2 * s.entries.len());
            for &(time, cost) in &s.entries {
                let age = s
                    .last_ms
                    .checked_sub(time)
                    .ok_or(StateError::EntryAfterLast {
                        time,
                        last_ms: s.last_ms,
                    })?;
                v.extend([age, cost]);
            }
            v
        }
        AlgorithmState::Concurrency(_) => return Err(StateError::Leases),
    })
}

fn fits(value: u64, width: usize) -> bool {
    width >= 8 || value < 1 << (8 * width)
}

/// The stored value for `state` of policy revision `revision` in `layout`, byte for byte.
///
/// # Errors
/// [`StateError::DoesNotFit`] when a value is too wide for `layout`;
/// [`StateError::EntryAfterLast`] for a sliding-log entry no layout can hold.
pub fn encode_state_as(
    layout: Layout,
    revision: u32,
    state: &AlgorithmState,
) -> Result<Vec<u8>, StateError> {
    let program = program_of(state);
    let (rev_width, widths) = program.widths(layout);
    let values = fields(state, layout)?;
    let last_ms = last_ms_of(state);
    let mut out = vec![program.tag(layout)];
    let mut put = |value: u64, width: usize| {
        if !fits(value, width) {
            return Err(StateError::DoesNotFit(layout));
        }
        out.extend_from_slice(&value.to_le_bytes()[..width]);
        Ok(())
    };
    put(last_ms, 6)?;
    put(u64::from(revision), rev_width)?;
    for (i, &v) in values.iter().enumerate() {
        put(v, widths[i % widths.len()])?;
    }
    Ok(out)
}

/// The stored value the programs write for `state`: compact whenever it fits.
///
/// # Errors
/// As [`encode_state_as`] for the wide layout.
pub fn encode_state(revision: u32, state: &AlgorithmState) -> Result<Vec<u8>, StateError> {
    encode_state_as(Layout::Compact, revision, state)
        .or_else(|_| encode_state_as(Layout::Wide, revision, state))
        .or_else(|_| encode_state_as(Layout::Overdraft, revision, state))
}

/// The layout of a stored value, by its tag byte.
pub fn layout_of(b: &[u8]) -> Option<Layout> {
    b.first().map(|t| {
        if t & COMPACT != 0 {
            Layout::Compact
        } else if (t >> 4) & 7 == OVERDRAFT_SCHEMA {
            Layout::Overdraft
        } else {
            Layout::Wide
        }
    })
}

/// Decodes a stored value into its revision and state. Checks the layout only; range checks
/// against a policy are the programs' (and the models') business.
///
/// # Errors
/// [`StateError`] naming what does not fit the layout.
pub fn decode_state(b: &[u8]) -> Result<(u32, AlgorithmState), StateError> {
    let tag = *b.first().ok_or(StateError::Length(0))?;
    let layout = layout_of(b).ok_or(StateError::Length(0))?;
    let program = Program::ALL
        .into_iter()
        .find(|p| p.tag(layout) == tag)
        .ok_or(StateError::Tag(tag))?;
    let (rev_width, widths) = program.widths(layout);
    let header = 7 + rev_width;
    let per: usize = widths.iter().sum();
    let body = b
        .len()
        .checked_sub(header)
        .ok_or(StateError::Length(b.len()))?;
    let fixed = program != Program::SlidingLog;
    if (fixed && body != per) || body % per != 0 {
        return Err(StateError::Length(b.len()));
    }
    let get = |at: usize, width: usize| {
        let mut le = [0u8; 8];
        le[..width].copy_from_slice(&b[at..at + width]);
        u64::from_le_bytes(le)
    };
    let last_ms = get(1, 6);
    let revision = u32::try_from(get(7, rev_width)).map_err(|_| StateError::Length(b.len()))?;
    let mut values = Vec::new();
    let mut at = header;
    while at < b.len() {
        for &w in widths {
            values.push(get(at, w));
            at += w;
        }
    }
    // The overdraft layout's last field.
    let overdraft = |at: usize| {
        if layout == Layout::Overdraft {
            values[at]
        } else {
            0
        }
    };
    let state = match program {
        Program::FixedWindow => AlgorithmState::FixedWindow(FixedWindowState {
            last_ms,
            count: values[0],
            overdraft: overdraft(1),
        }),
        Program::SlidingCounter => AlgorithmState::SlidingWindow(SlidingWindowState {
            last_ms,
            previous: values[0],
            current: values[1],
            overdraft: overdraft(2),
        }),
        Program::TokenBucket => AlgorithmState::TokenBucket(TokenBucketState {
            last_ms,
            tokens: values[0],
            overdraft: overdraft(1),
        }),
        Program::Gcra => AlgorithmState::Gcra(GcraState {
            last_ms,
            debt: values[0],
            overdraft: overdraft(1),
        }),
        Program::SlidingLog => AlgorithmState::SlidingLog(SlidingLogState {
            last_ms,
            entries: values
                .chunks(2)
                .map(|e| (last_ms.saturating_sub(e[0]), e[1]))
                .collect(),
        }),
    };
    Ok((revision, state))
}

/// A program loaded into one server, run with `EVALSHA`.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub sha1: String,
}

impl Loaded {
    /// `SCRIPT LOAD`s `source`.
    ///
    /// # Errors
    /// The server's refusal (a compile error names the line).
    pub fn load(con: &mut redis::Connection, source: &str) -> redis::RedisResult<Loaded> {
        let sha1: String = redis::cmd("SCRIPT").arg("LOAD").arg(source).query(con)?;
        Ok(Loaded { sha1 })
    }

    /// The `EVALSHA` command for one key and `args`, for pipelines and transactions.
    pub fn command<A: redis::ToRedisArgs>(&self, key: &str, args: &[A]) -> redis::Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.sha1).arg(1).arg(key);
        for a in args {
            c.arg(a);
        }
        c
    }

    /// The `EVALSHA` command for `keys` and `args` (the multi-limit program).
    pub fn command_keys<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
        &self,
        keys: &[K],
        args: &[A],
    ) -> redis::Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.sha1).arg(keys.len());
        for k in keys {
            c.arg(k);
        }
        for a in args {
            c.arg(a);
        }
        c
    }

    /// Runs the program on `key` and parses the reply.
    ///
    /// # Errors
    /// A Redis error (the programs never raise one on any state) or a malformed reply.
    pub fn run<A: redis::ToRedisArgs>(
        &self,
        con: &mut redis::Connection,
        key: &str,
        args: &[A],
    ) -> Result<Reply, String> {
        let v: Value = self
            .command(key, args)
            .query(con)
            .map_err(|e| format!("EVALSHA failed: {e}"))?;
        Reply::parse(&v)
    }
}

/// Raw bytes at `key` (`None` when absent).
///
/// # Errors
/// The Redis error (WRONGTYPE for a non-string key).
pub fn get_raw(con: &mut redis::Connection, key: &str) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("GET").arg(key).query(con)
}

/// `DUMP` of `key`: the serialized value, type and encoding included (`None` when absent).
///
/// # Errors
/// The Redis error.
pub fn dump(con: &mut redis::Connection, key: &str) -> redis::RedisResult<Option<Vec<u8>>> {
    redis::cmd("DUMP").arg(key).query(con)
}

/// `PTTL` of `key` (-2 absent, -1 no TTL).
///
/// # Errors
/// The Redis error.
pub fn pttl(con: &mut redis::Connection, key: &str) -> redis::RedisResult<i64> {
    redis::cmd("PTTL").arg(key).query(con)
}

/// The server's `TIME` in ms.
///
/// # Errors
/// The Redis error, or a malformed reply.
pub fn server_time_ms(con: &mut redis::Connection) -> redis::RedisResult<u64> {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(con)?;
    Ok(s * 1000 + us / 1000)
}
