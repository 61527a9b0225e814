//! The rate-limit Lua programs: one manifest per program (its [`Script`], version, algorithm,
//! key type), the exact source embedded at compile time, and the arguments each policy sends.
//!
//! Programs run with `EVALSHA` of the SHA1 computed once from the embedded source; on
//! `NOSCRIPT` the provider sends `EVAL` of that same source (which also caches it again) and
//! goes back to `EVALSHA`. The calling convention (KEYS, ARGV order, the seven-field reply)
//! is `docs/lua-programs.md`; [`arguments`] is its Rust side.

use shared_contract::{Algorithm, AlgorithmKind, RateLimitPolicy};

use crate::commands;
use crate::script::{Script, embedded};

/// The Redis type of a program's state key (what `TYPE key` answers once state exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// A string (`GET`/`SET`).
    String,
    /// A hash.
    Hash,
}

impl KeyType {
    /// The name `TYPE` answers: `"string"` or `"hash"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::String => "string",
            KeyType::Hash => "hash",
        }
    }
}

/// One rate-limit program: the embedded [`Script`] and what the provider knows about its
/// state.
#[derive(Debug)]
pub struct Program {
    /// The program itself: `lua/<name>`, its SHA1 and the commands it calls.
    pub script: Script,
    /// The version in the name: of the calling convention (the state's own schema version is
    /// in its tag byte; v1 and v2 read and write the same state).
    pub version: u32,
    /// The algorithm the program decides.
    pub algorithm: AlgorithmKind,
    /// The type of its state key.
    pub key_type: KeyType,
}

macro_rules! program {
    ($file:literal, $kind:expr, $key_type:expr) => {
        Program {
            // Every rate-limit program reads the clock, reads its key and writes it back.
            script: embedded!($file, &[&commands::TIME, &commands::GET, &commands::SET]),
            version: 2,
            algorithm: $kind,
            key_type: $key_type,
        }
    };
}

/// Every rate-limit program of this build, one per rate algorithm.
pub static PROGRAMS: [Program; 5] = [
    program!(
        "rate-fixed-window-v2.lua",
        AlgorithmKind::FixedWindow,
        KeyType::String
    ),
    program!(
        "rate-sliding-counter-v2.lua",
        AlgorithmKind::SlidingWindow,
        KeyType::String
    ),
    program!(
        "rate-token-bucket-v2.lua",
        AlgorithmKind::TokenBucket,
        KeyType::String
    ),
    program!("rate-gcra-v2.lua", AlgorithmKind::Gcra, KeyType::String),
    program!(
        "rate-sliding-log-v2.lua",
        AlgorithmKind::SlidingLog,
        KeyType::String
    ),
];

/// The multi-limit program: 1..=8 members of any algorithms decided as one, with an
/// optional evaluation id (calling convention: `docs/lua-programs.md`). Its member functions
/// are the single programs' bodies (a test regenerates them from [`PROGRAMS`]), so it reads
/// and writes exactly their state encodings.
pub static MULTI: Script = embedded!(
    "rate-multi-v2.lua",
    &[&commands::TIME, &commands::GET, &commands::SET]
);

/// The batch program: 1..=64 independent decisions of any algorithms in one call, in order
/// at one `TIME` reading (calling convention: `docs/lua-programs.md`). Its member functions
/// are the multi program's, generated the same way.
pub static BATCH: Script = embedded!(
    "rate-batch-v2.lua",
    &[&commands::TIME, &commands::GET, &commands::SET]
);

/// The settlement program: 1..=8 checks and settlements (a hold settled with its actual cost,
/// past the limit if need be) of any algorithms but the sliding log's, in one call (calling
/// convention: `docs/lua-programs.md`). Its check functions are the multi program's members;
/// its settlement functions read and write the same state encodings, the overdraft's too.
pub static SETTLE: Script = embedded!(
    "rate-settle-v1.lua",
    &[&commands::TIME, &commands::GET, &commands::SET]
);

/// The most members one batch call takes (the program's header holds 1..=64).
pub const BATCH_MAX: usize = 64;

/// Every program's script, as a provider preloads them and the ACL check covers them.
pub(crate) fn scripts() -> Vec<&'static Script> {
    PROGRAMS
        .iter()
        .map(|p| &p.script)
        .chain([&MULTI, &BATCH, &SETTLE])
        .collect()
}

/// The code of an algorithm in the multi program's arguments (also the low bits of its state
/// tag); 0 for none.
pub fn algorithm_code(kind: AlgorithmKind) -> u64 {
    match kind {
        AlgorithmKind::FixedWindow => 1,
        AlgorithmKind::SlidingWindow => 2,
        AlgorithmKind::TokenBucket => 3,
        AlgorithmKind::Gcra => 4,
        AlgorithmKind::SlidingLog => 5,
        // An algorithm this build has no program for: the multi program refuses code 0
        // (`INVALID`, reported `Incompatible(program)`), so it is never guessed at.
        _ => 0,
    }
}

/// The program of an algorithm.
pub fn program(kind: AlgorithmKind) -> &'static Program {
    // `PROGRAMS` has one entry per `AlgorithmKind::RATE`; the test below keeps it so. A
    // concurrency policy is never evaluated (refused before a program is chosen).
    PROGRAMS
        .iter()
        .find(|p| p.algorithm == kind)
        .unwrap_or(&PROGRAMS[0])
}

/// The byte width of the cost, the first packed field.
pub const COST_WIDTH: usize = 7;

/// The packed fields after the cost, as (value, byte width), in the order of the program's
/// header: revision, max clock regression, cleanup grace, then the algorithm's derived
/// parameters.
fn fields(policy: &RateLimitPolicy) -> Vec<(u64, usize)> {
    let mut fields = vec![
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
        // Lease programs take their own arguments (`leases`); a concurrency policy is never
        // evaluated (the contract refuses it first), so no rate program sees these.
        Algorithm::Concurrency(p) => fields.extend([(p.limit(), 4), (p.lease_ttl_ms(), 4)]),
    }
    fields
}

/// `ARGV[1]` of `policy` without its leading cost: the packed fields after the cost
/// (unsigned little-endian, the widths of the program's header). Prepend the cost with
/// [`pack_cost`]. A value wider than its field (which a validated policy never holds: its
/// bounds are the widths) makes the string empty, which the program refuses as `INVALID`
/// rather than read a truncated value.
pub fn arguments(policy: &RateLimitPolicy) -> Vec<u8> {
    pack(&fields(policy))
}

/// `fields` packed, or nothing when a value does not fit its width.
fn pack(fields: &[(u64, usize)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40);
    for &(value, width) in fields {
        if width < 8 && value >> (8 * width) != 0 {
            return Vec::new();
        }
        out.extend_from_slice(&value.to_le_bytes()[..width]);
    }
    out
}

/// `ARGV[1]` of the multi program: the member count (1 byte) and the replay window (4 bytes),
/// packed like the members' arguments. A count or window beyond its width (which the
/// provider never sends: at most 8 members, a window of at most a day) makes it empty, which
/// the program refuses as `INVALID`.
pub fn multi_header(members: usize, replay_window_ms: u64) -> Vec<u8> {
    pack(&[(members as u64, 1), (replay_window_ms, 4)])
}

/// The hold a settlement member's arguments end with: its estimate (7 bytes) and the
/// effective time it was charged at (6 bytes). `None` for a value beyond its width (which no
/// hold has: estimates are costs below 2^53, the models' clock ends below 2^48); the caller
/// then sends no hold, which the program refuses as `INVALID`.
pub fn settle_hold(estimate: u64, at_ms: u64) -> Option<[u8; 13]> {
    if estimate >> 56 != 0 || at_ms >> 48 != 0 {
        return None;
    }
    let mut out = [0; 13];
    out[..7].copy_from_slice(&estimate.to_le_bytes()[..7]);
    out[7..].copy_from_slice(&at_ms.to_le_bytes()[..6]);
    Some(out)
}

/// The cost as the first packed field of `ARGV[1]`. A cost is at most the policy's limit
/// (< 2^53), so it always fits.
pub fn pack_cost(cost: u64) -> [u8; COST_WIDTH] {
    let mut out = [0; COST_WIDTH];
    out.copy_from_slice(&cost.to_le_bytes()[..COST_WIDTH]);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shared_contract::{AlgorithmSpec, RateLimitPolicy};

    use super::*;

    #[test]
    fn every_algorithm_has_exactly_one_program() {
        for kind in AlgorithmKind::RATE {
            let n = PROGRAMS.iter().filter(|p| p.algorithm == kind).count();
            assert_eq!(n, 1, "{kind}");
            assert_eq!(program(kind).algorithm, kind);
        }
    }

    #[test]
    fn manifests_match_the_files() {
        for p in &PROGRAMS {
            let s = &p.script;
            assert!(s.name.starts_with("rate-") && s.name.ends_with("-v2.lua"));
            assert_eq!(p.version, 2);
            assert_eq!(s.sha1().len(), 40);
            assert!(s.sha1().bytes().all(|b| b.is_ascii_hexdigit()));
            // One TIME call, inside the marked block.
            assert_eq!(
                s.source.matches("redis.call('TIME')").count(),
                1,
                "{}",
                s.name
            );
            assert!(s.reads_time(), "{}", s.name);
            assert!(s.test_variant().is_ok(), "{}", s.name);
            // The header block documents the state's Redis type; the manifest must agree.
            let declared = format!("-- State: one {}", p.key_type.as_str());
            assert!(s.source.contains(&declared), "{}: {declared:?}", s.name);
            assert!(
                s.source.starts_with(&format!("-- {}", s.name)),
                "{}",
                s.name
            );
        }
    }

    #[test]
    fn every_manifest_declares_exactly_the_commands_its_source_calls() {
        for p in &PROGRAMS {
            crate::script::tests::assert_declares_its_calls(&p.script);
        }
    }

    /// The member functions of the multi program, generated from the single programs: each
    /// body after its time block, indented, as `local function member_<code>(A, now, RAW)`,
    /// where `A` is the member's packed arguments (the line reading them from `ARGV[1]`
    /// dropped), `RAW` is the key's value as `redis.pcall('GET', key)` answers it (the driver
    /// reads it), the key count check dropped (the driver checks its keys), and the one
    /// `SET ... PX` (or the `@write` block around it, which keeps the expiry when its TTL is
    /// false) and the allow after it becoming an allow that hands back the value and TTL to
    /// write. Then `M`, the functions by the algorithm code as ARGV spells it.
    fn multi_members() -> Result<String, String> {
        const SET: &str = "redis.call('SET', KEYS[1], value, 'PX', ";
        const KEYS: &str = "#KEYS ~= 1 or ";
        const INLINE: &str = "-- Everything is inline: the chunk runs once per call, so every \
                              helper function would be a\n-- new closure per call.\n";
        const ARG: &str = "local A = ARGV[1]\n";
        let mut kinds = AlgorithmKind::RATE;
        kinds.sort_by_key(|k| algorithm_code(*k));
        let mut out = String::new();
        for kind in kinds {
            let s = &program(kind).script;
            let (_, body) = s
                .source
                .split_once("-- @time-source end\n")
                .ok_or_else(|| format!("{}: no time block", s.name))?;
            let body = body
                .trim_start_matches('\n')
                .replacen(INLINE, "", 1)
                .replacen(STATE_BEGIN, "", 1)
                .replacen(STATE_END, "", 1);
            for (what, n) in [(SET, 1), (GET, 1), (KEYS, 1), (ARG, 1)] {
                if body.matches(what).count() != n {
                    return Err(format!("{}: {what:?} not exactly once", s.name));
                }
            }
            let body = body
                .replacen(GET, "local raw = RAW", 1)
                .replacen(KEYS, "", 1)
                .replacen(ARG, "", 1);
            let code = algorithm_code(kind);
            out.push_str(&format!(
                "-- @member {kind} begin: generated from {}\nlocal function member_{code}(A, now, \
                 RAW)\n",
                s.name
            ));
            let mut lines = body.lines();
            while let Some(line) = lines.next() {
                let write = match line.split_once(WRITE_BEGIN) {
                    // A write block: `SET ... PX ttl`, or `SET ... KEEPTTL` when `ttl` is
                    // false; the member hands back `ttl` either way.
                    Some((indent, "")) => {
                        let block: Vec<&str> = lines
                            .by_ref()
                            .take_while(|l| l.trim() != WRITE_END)
                            .collect();
                        let ttl = block
                            .iter()
                            .find_map(|l| l.split_once(SET))
                            .map(|(_, rest)| rest);
                        Some((indent, ttl))
                    }
                    _ => line
                        .split_once(SET)
                        .map(|(indent, rest)| (indent, Some(rest))),
                };
                let line = match write {
                    Some((indent, ttl)) => {
                        // The TTL as the program formats it for the call; a member hands
                        // back the number, which its driver formats.
                        let ttl = ttl
                            .and_then(|rest| rest.strip_suffix(')'))
                            .map(|t| {
                                t.strip_prefix("string.format('%d', ")
                                    .and_then(|t| t.strip_suffix(')'))
                                    .unwrap_or(t)
                            })
                            .ok_or_else(|| format!("{}: state write not on one line", s.name))?;
                        let allow = lines
                            .next()
                            .map(str::trim_start)
                            .filter(|l| l.starts_with("return { 'ALLOWED'"))
                            .ok_or_else(|| format!("{}: no allow after the write", s.name))?;
                        format!("{indent}{allow}, value, {ttl}")
                    }
                    None => line.to_owned(),
                };
                if line.is_empty() {
                    out.push('\n');
                } else {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            out.push_str(&format!("end\n-- @member {kind} end\n"));
        }
        let table: Vec<String> = kinds
            .iter()
            .map(|k| format!("['{0}'] = member_{0}", algorithm_code(*k)))
            .collect();
        out.push_str(&format!("local M = {{ {} }}\n", table.join(", ")));
        Ok(out)
    }

    /// The batch program's members: `multi_members()` with two changes, each sparing every
    /// batched decision work its single program needs once per call anyway:
    /// - a member's arguments are unpacked once per distinct string and format in a call
    ///   (the statement `local <names> = struct.unpack('<format>', A)` reads `parsed`, the
    ///   call's table of unpacked arguments, which members of one policy and cost share);
    /// - a row is handed back as seven values, not a table (`return { <row> }` becomes
    ///   `return <row>`), so the driver packs it without building a table first.
    ///
    /// Measured with callgrind in `bench/lua-programs/callgrind.py` (batch table).
    fn batch_members(members: &str) -> Result<String, String> {
        const UNPACK: &str = "struct.unpack('";
        const OF_A: &str = "', A)";
        let mut out = String::from(
            "-- The call's unpacked member arguments, by format and argument string: members \
             of one\n-- policy and cost share theirs.\nlocal parsed = {}\n",
        );
        let mut rest = members;
        let mut unpacks = 0;
        while let Some(at) = rest.find(UNPACK) {
            let after = &rest[at + UNPACK.len()..];
            let format = after
                .find(OF_A)
                .map(|end| &after[..end])
                .filter(|f| !f.contains(['\'', '\n']));
            let Some(format) = format else {
                // Another unpack (of the state, or at an offset): left as it is.
                let (done, next) = rest.split_at(at + UNPACK.len());
                out.push_str(done);
                rest = next;
                continue;
            };
            // The statement starts at the last `local` line before the call.
            let head = &rest[..at];
            let line = head.rfind("\n").map_or(0, |i| i + 1);
            let start = head[..line.saturating_sub(1)]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let (start, statement) = if head[line..].trim_start().starts_with("local ") {
                (line, &head[line..])
            } else if head[start..].trim_start().starts_with("local ") {
                (start, &head[start..])
            } else {
                return Err(format!(
                    "struct.unpack('{format}', A) is not a local statement"
                ));
            };
            let indent = &statement[..statement.len() - statement.trim_start().len()];
            let names = statement
                .trim()
                .strip_prefix("local ")
                .and_then(|s| s.strip_suffix('='))
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
                .ok_or_else(|| format!("struct.unpack('{format}', A): no names assigned"))?;
            let values: Vec<String> = (1..=names.split(',').count())
                .map(|i| format!("p[{i}]"))
                .collect();
            let values = values.join(", ");
            // Wrapped as the programs wrap a long statement.
            let assign = if indent.len() + names.len() + values.len() + 9 > 100 {
                format!("{indent}local {names} =\n{indent}  {values}")
            } else {
                format!("{indent}local {names} = {values}")
            };
            out.push_str(&rest[..start]);
            out.push_str(&format!(
                "{indent}local q = parsed['{format}']\n{indent}if not q then\n{indent}  q = {{}}\n\
                 {indent}  parsed['{format}'] = q\n{indent}end\n{indent}local p = q[A]\n\
                 {indent}if not p then\n{indent}  p = {{ struct.unpack('{format}', A) }}\n\
                 {indent}  q[A] = p\n{indent}end\n{assign}"
            ));
            rest = &after[format.len() + OF_A.len()..];
            unpacks += 1;
        }
        out.push_str(rest);
        if unpacks != AlgorithmKind::RATE.len() {
            return Err(format!(
                "{unpacks} argument unpacks, not one per member ({})",
                AlgorithmKind::RATE.len()
            ));
        }
        // Rows as values.
        let mut rows = String::with_capacity(out.len());
        for line in out.lines() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            match trimmed.strip_prefix("return { ") {
                Some(row) => {
                    let (fields, tail) = row
                        .rsplit_once(" }")
                        .ok_or_else(|| format!("a row not on one line: {line:?}"))?;
                    let handed = tail.is_empty()
                        || tail
                            .strip_prefix(", value, ")
                            .is_some_and(|t| t.chars().all(|c| c.is_alphanumeric() || c == '_'));
                    if !handed || fields.contains(['{', '}']) {
                        return Err(format!("a row of an unexpected shape: {line:?}"));
                    }
                    rows.push_str(&format!("{indent}return {fields}{tail}\n"));
                }
                None => {
                    rows.push_str(line);
                    rows.push('\n');
                }
            }
        }
        Ok(rows)
    }

    const GET: &str = "local raw = redis.pcall('GET', KEYS[1])";
    const WRITE_BEGIN: &str = "-- @write begin";
    const WRITE_END: &str = "-- @write end";
    const STATE_BEGIN: &str = "-- @state begin\n";
    const STATE_END: &str = "-- @state end\n";

    /// `source` with each settlement function's state reading (decoding the stored layouts,
    /// then the clock rule) replaced by the single program's, between its
    /// `-- @state <kind> begin` and `end` lines: the single program's `@state` section,
    /// indented, reading `RAW` as the members do.
    fn with_settle_states(source: &str) -> Result<String, String> {
        let mut out = source.to_owned();
        for kind in AlgorithmKind::RATE
            .into_iter()
            .filter(|k| k.takes_reservations())
        {
            let s = &program(kind).script;
            let (_, rest) = s
                .source
                .split_once(STATE_BEGIN)
                .ok_or_else(|| format!("{}: no state section", s.name))?;
            let (section, _) = rest
                .split_once(STATE_END)
                .ok_or_else(|| format!("{}: state section not ended", s.name))?;
            if section.matches(GET).count() != 1 {
                return Err(format!("{}: {GET:?} not exactly once", s.name));
            }
            let section = section.replacen(GET, "local raw = RAW", 1);
            let begin = format!("  -- @state {kind} begin: generated from {}\n", s.name);
            let end = format!("  -- @state {kind} end\n");
            let (head, rest) = out
                .split_once(&begin)
                .ok_or_else(|| format!("no {begin:?} in the settlement program"))?;
            let (_, tail) = rest
                .split_once(&end)
                .ok_or_else(|| format!("no {end:?} in the settlement program"))?;
            let indented: String = section
                .lines()
                .map(|l| {
                    if l.is_empty() {
                        "\n".to_owned()
                    } else {
                        format!("  {l}\n")
                    }
                })
                .collect();
            out = format!("{head}{begin}{indented}{end}{tail}");
        }
        Ok(out)
    }

    /// Holds the generated sections of `lua/rate-multi-v2.lua`, `lua/rate-batch-v2.lua` and
    /// `lua/rate-settle-v1.lua` (its members, and its settlement functions' state reading) to
    /// the single programs. With `RL_WRITE_MULTI_LUA=1` it rewrites the sections instead
    /// (after a single program changed).
    #[test]
    fn multi_and_batch_program_members_are_the_single_programs() {
        const BEGIN: &str = "-- @generated begin\n";
        const END: &str = "-- @generated end\n";
        let members = multi_members().expect("single programs of the expected shape");
        let batched = batch_members(&members).expect("members of the expected shape");
        for script in [&MULTI, &BATCH, &SETTLE] {
            let source = script.source;
            let (head, rest) = source.split_once(BEGIN).expect("generated begin marker");
            let (_, tail) = rest.split_once(END).expect("generated end marker");
            let members = if script.name == BATCH.name {
                &batched
            } else {
                &members
            };
            let mut want = format!("{head}{BEGIN}{members}{END}{tail}");
            if script.name == SETTLE.name {
                want = with_settle_states(&want).expect("settlement functions with markers");
            }
            if std::env::var_os("RL_WRITE_MULTI_LUA").is_some() {
                let path = format!("{}/lua/{}", env!("CARGO_MANIFEST_DIR"), script.name);
                std::fs::write(path, &want).expect("writable lua/");
                continue;
            }
            assert!(
                source == want,
                "lua/{} is not generated from the single programs; rerun this test with \
                 RL_WRITE_MULTI_LUA=1",
                script.name
            );
        }
    }

    #[test]
    fn multi_batch_and_settle_programs_are_preloaded_and_declare_their_calls() {
        for script in [&MULTI, &BATCH, &SETTLE] {
            assert!(scripts().iter().any(|s| s.name == script.name));
            crate::script::tests::assert_declares_its_calls(script);
            assert_eq!(script.source.matches("redis.call('TIME')").count(), 1);
            assert!(script.test_variant().is_ok());
            assert!(script.source.starts_with(&format!("-- {}", script.name)));
        }
        // The header's bound is the constant the provider batches up to.
        let bound = format!("n < 1 or n > {BATCH_MAX} ");
        assert!(BATCH.source.contains(&bound), "{bound}");
    }

    #[test]
    fn test_variant_differs_only_in_the_time_block() {
        let p = &program(AlgorithmKind::TokenBucket).script;
        let t = p.test_variant().expect("a time block");
        assert!(!t.contains("redis.call('TIME')"));
        assert!(t.contains("local now = tonumber(ARGV[#ARGV])"));
        let (head, _) = p
            .source
            .split_once("-- @time-source begin")
            .expect("marker");
        assert!(t.starts_with(head));
    }

    fn policy(algorithm: AlgorithmSpec, max_cost: u64) -> RateLimitPolicy {
        RateLimitPolicy::with_algorithm("api", algorithm)
            .revision(7)
            .max_cost(max_cost)
            .build()
            .expect("valid policy")
    }

    /// Reads `arguments` back by the widths of the program headers.
    fn unpacked(bytes: &[u8], widths: &[usize]) -> Vec<u64> {
        assert_eq!(bytes.len(), widths.iter().sum::<usize>());
        let mut at = 0;
        widths
            .iter()
            .map(|w| {
                let mut b = [0u8; 8];
                b[..*w].copy_from_slice(&bytes[at..at + w]);
                at += w;
                u64::from_le_bytes(b)
            })
            .collect()
    }

    #[test]
    fn arguments_follow_the_documented_order_and_widths() {
        let tb = policy(
            AlgorithmSpec::TokenBucket {
                capacity: 100,
                refill_amount: 10,
                refill_interval: Duration::from_secs(1),
            },
            10,
        );
        // scale = 1000 / gcd(10, 1000) = 100, units_per_ms = 10 / 10 = 1.
        let got = unpacked(&arguments(&tb), &[4, 5, 5, 7, 5, 7]);
        assert_eq!(got, vec![7, 2000, 60_000, 100, 100, 1]);
        let gcra = policy(
            AlgorithmSpec::Gcra {
                limit: 100,
                period: Duration::from_secs(60),
                burst: 20,
            },
            5,
        );
        // g = gcd(100, 60000) = 100: units_per_ms = 1, interval_units = 600.
        let got = unpacked(&arguments(&gcra), &[4, 5, 5, 7, 5, 7]);
        assert_eq!(got, vec![7, 2000, 60_000, 20, 600, 1]);
        let fw = policy(
            AlgorithmSpec::FixedWindow {
                limit: 5,
                window: Duration::from_millis(1500),
            },
            5,
        );
        let got = unpacked(&arguments(&fw), &[4, 5, 5, 7, 5]);
        assert_eq!(got, vec![7, 2000, 60_000, 5, 1500]);
        assert_eq!(pack_cost(3), [3, 0, 0, 0, 0, 0, 0]);
    }

    /// The widths of `fields` are the formats the program headers document, so the two
    /// cannot drift apart: each header's format string is read back here.
    #[test]
    fn widths_are_the_headers_formats() {
        for p in &PROGRAMS {
            let s = p.script.source;
            let (_, rest) = s.split_once("format '<").expect("a packed format");
            let (format, _) = rest.split_once('\'').expect("a closed format");
            let widths: Vec<usize> = format
                .split('I')
                .filter(|w| !w.is_empty())
                .map(|w| w.parse().expect("a width"))
                .collect();
            let spec = match p.algorithm {
                AlgorithmKind::TokenBucket => AlgorithmSpec::TokenBucket {
                    capacity: 10,
                    refill_amount: 1,
                    refill_interval: Duration::from_secs(1),
                },
                AlgorithmKind::Gcra => AlgorithmSpec::Gcra {
                    limit: 10,
                    period: Duration::from_secs(1),
                    burst: 10,
                },
                AlgorithmKind::FixedWindow => AlgorithmSpec::FixedWindow {
                    limit: 10,
                    window: Duration::from_secs(1),
                },
                AlgorithmKind::SlidingWindow => AlgorithmSpec::SlidingWindow {
                    limit: 10,
                    window: Duration::from_secs(1),
                },
                _ => AlgorithmSpec::SlidingLog {
                    limit: 10,
                    window: Duration::from_secs(1),
                },
            };
            let ours: Vec<usize> = std::iter::once(COST_WIDTH)
                .chain(fields(&policy(spec, 1)).into_iter().map(|(_, w)| w))
                .collect();
            assert_eq!(ours, widths, "{}", p.script.name);
            // The header's length check is the sum of the widths.
            let len = format!("#A ~= {}", widths.iter().sum::<usize>());
            assert!(s.contains(&len), "{}: {len}", p.script.name);
        }
    }

    #[test]
    fn a_value_wider_than_its_field_empties_the_arguments() {
        // No validated policy holds one; the program refuses an empty string as INVALID.
        assert_eq!(
            pack(&[((1 << 40) - 1, 5), (1, 2)]),
            [255, 255, 255, 255, 255, 1, 0]
        );
        assert!(pack(&[(1, 2), (1 << 40, 5)]).is_empty());
    }
}
