//! Server cost and memory of the Lua programs: a measurement, not a check, so it runs only
//! with `RL_MEASURE=1` (a few minutes, about 1 GB of Redis memory at the default sizes).
//!
//! On a private redis-server, the yardstick (a plain token bucket in a 3-field
//! hash: TIME, HMGET, HSET, PEXPIRE) holds `RL_MEASURE_KEYS` (default 1,000,000) keys in
//! db 0 for the whole run. Then for each program, in db 1:
//! 1. populate the same number of keys of the adapter's shape (`rl:{AbCd}` + 16 hex digits)
//!    with pipelined `EVALSHA` (through `redis-cli --pipe`, so the client is never the
//!    bottleneck), reporting the `used_memory` delta per key and the value size;
//! 2. alternate `RL_MEASURE_ROUNDS` (default 5) rounds of `RL_MEASURE_CALLS` (default
//!    100,000) calls on random existing keys between the program and the plain script,
//!    reporting per call the minimum and median over rounds of `INFO commandstats`
//!    `usec_per_call` of `evalsha`, and the server main thread's CPU time
//!    (`/proc/<pid>/task/<pid>/schedstat`, which counts only time on a CPU, so it is less
//!    disturbed by other processes than the wall-clock `usec_per_call`);
//! 3. the same for a cost that every program denies.
//!
//! A second measurement sets the multi-limit program against single calls: one call of it
//! deciding three limits (token bucket, fixed window, GCRA) per decision against three calls
//! of the single programs, on `RL_MEASURE_MULTI_KEYS` (default 100,000) decisions' keys,
//! allowing and denying, by the same two figures summed over the three single calls.
//!
//! Run: `RL_MEASURE=1 cargo test -p bench --test it lua_cost:: -- --nocapture` (one of them:
//! append its test name, e.g. `lua_cost::multi_program`)

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use acceptance_tests::lua::{Loaded, MULTI_SOURCE, Program, arguments, multi_arguments};
use acceptance_tests::redis_server::RedisServer;
use shared_contract::{FailurePolicy, PolicyId, PolicyRevision, PolicySpec, RateLimitPolicy};

/// The yardstick the programs are measured against (the goal: the token-bucket program costs
/// the server at most 0.75 of it): a plain token bucket in a hash, four `redis.call`s (its keys
/// live two hours, so none expires during the run).
const PLAIN_TOKEN_BUCKET: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'last_ms', 'revision')
local tokens = tonumber(s[1]) or capacity
local last = tonumber(s[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - last) * per_ms)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'last_ms', now, 'revision', 1)
redis.call('PEXPIRE', KEYS[1], 7200000)
return { allowed, tokens }
";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A key of the adapter's shape: prefix, 4-character hash tag, 16 hex digits of digest.
fn key(i: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let h = splitmix(i);
    let tag: String = (0..4)
        .map(|k| ALPHABET[((h >> (k * 6)) % 62) as usize] as char)
        .collect();
    format!("rl:{{{tag}}}{:016x}", splitmix(h))
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 100 per hour (bucket of 100, GCRA burst 100, window limit 100): slow enough that cost
/// 100 stays denied on every key already holding cost 1 for the whole run.
fn policy(program: Program) -> RateLimitPolicy {
    let algorithm = bench::spec_admitting(program.kind(), 100, Duration::from_secs(3600))
        .expect("every program's algorithm");
    RateLimitPolicy::new(PolicySpec {
        id: PolicyId::new("measure").expect("a valid id"),
        revision: PolicyRevision::new(1).expect("a valid revision"),
        algorithm,
        max_cost: 100,
        // Two hours: no key expires during the run (an expired key would turn later calls
        // into first touches and the memory figures into underestimates).
        cleanup_grace: Duration::from_secs(7200),
        max_clock_regression: Duration::from_secs(2),
        failure_policy: FailurePolicy::FailClosed,
    })
    .expect("a valid policy")
}

fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(con).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(str::to_string))
        .unwrap_or_default()
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .trim()
        .parse()
        .expect("used_memory")
}

/// (calls, usec per call) of `evalsha` since the last `CONFIG RESETSTAT`.
fn evalsha_cost(con: &mut redis::Connection) -> (u64, f64) {
    let line = info_field(con, "commandstats", "cmdstat_evalsha");
    let get = |name: &str| -> f64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let calls = get("calls");
    (calls as u64, get("usec") / calls.max(1.0))
}

/// Nanoseconds the server's main thread has spent on a CPU.
fn server_cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Sends `EVALSHA sha 1 key(i) args...` for every `i` through `redis-cli --pipe`.
fn pipe(port: u16, db: u8, sha: &str, keys: impl Iterator<Item = u64>, args: &[Vec<u8>]) {
    pipe_keys(port, db, sha, keys.map(|i| vec![key(i)]), args);
}

/// Sends `EVALSHA sha <n> keys... args...` for every key list through `redis-cli --pipe`.
fn pipe_keys(
    port: u16,
    db: u8,
    sha: &str,
    calls: impl Iterator<Item = Vec<String>>,
    args: &[Vec<u8>],
) {
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "-n", &db.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli (Debian package redis-tools) on PATH");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut buf = Vec::with_capacity(1 << 20);
    for keys in calls {
        let n = keys.len().to_string();
        let mut cmd: Vec<&[u8]> = vec![b"EVALSHA", sha.as_bytes(), n.as_bytes()];
        cmd.extend(keys.iter().map(|k| k.as_bytes()));
        cmd.extend(args.iter().map(Vec::as_slice));
        resp(&mut buf, &cmd);
        if buf.len() > 1 << 20 {
            stdin.write_all(&buf).expect("write to redis-cli");
            buf.clear();
        }
    }
    stdin.write_all(&buf).expect("write to redis-cli");
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("redis-cli output");
    let status = child.wait().expect("redis-cli exit");
    assert!(
        status.success() && out.contains("errors: 0"),
        "redis-cli --pipe: {out}"
    );
}

#[derive(Default)]
struct Samples {
    usec: Vec<f64>,
    cpu_us: Vec<f64>,
}

impl Samples {
    fn stats(v: &[f64]) -> (f64, f64) {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (
            s.first().copied().unwrap_or(0.0),
            s.get(s.len() / 2).copied().unwrap_or(0.0),
        )
    }
}

struct Target<'a> {
    db: u8,
    sha: &'a str,
    args: &'a [Vec<u8>],
    /// The members of each call: `None` for the one key `key(i)`, else `member_key(i, j)`
    /// for each `j`.
    members: Option<&'a [u64]>,
}

/// Member `j`'s key of decision `i`: `key(i)` (so the same hash tag) and one digit more.
fn member_key(i: u64, j: u64) -> String {
    format!("{}{j}", key(i))
}

/// One round of `calls` random-key calls: (usec_per_call, CPU us per call).
fn round(
    con: &mut redis::Connection,
    port: u16,
    pid: u32,
    keys: u64,
    calls: u64,
    seed: u64,
    t: &Target<'_>,
) -> (f64, f64) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(con)
        .expect("RESETSTAT");
    let cpu = server_cpu_ns(pid);
    let mut rng = seed;
    let members = t.members;
    let random = (0..calls).map(move |_| {
        rng = splitmix(rng);
        let i = rng % keys;
        match members {
            None => vec![key(i)],
            Some(js) => js.iter().map(|&j| member_key(i, j)).collect(),
        }
    });
    pipe_keys(port, t.db, t.sha, random, t.args);
    let cpu_us = (server_cpu_ns(pid) - cpu) as f64 / 1000.0 / calls as f64;
    let (n, usec) = evalsha_cost(con);
    assert_eq!(n, calls, "every call counted");
    (usec, cpu_us)
}

#[test]
fn lua_program_server_cost_and_memory() {
    let _alone = crate::measuring();
    if std::env::var("RL_MEASURE").as_deref() != Ok("1") {
        eprintln!("lua_cost: set RL_MEASURE=1 to measure");
        return;
    }
    let keys = env_u64("RL_MEASURE_KEYS", 1_000_000);
    let calls = env_u64("RL_MEASURE_CALLS", 100_000);
    let rounds = env_u64("RL_MEASURE_ROUNDS", 5);
    let server = RedisServer::start();
    let (port, pid) = (server.port(), server.pid().expect("a private server"));
    let mut con = server.connection();
    let version = info_field(&mut con, "server", "redis_version");
    let allocator = info_field(&mut con, "memory", "mem_allocator");

    let plain = Loaded::load(&mut con, PLAIN_TOKEN_BUCKET).expect("compiles");
    let plain_args = |cost: &str| vec![b"100".to_vec(), b"0.1".to_vec(), cost.as_bytes().to_vec()];
    let (plain_allow, plain_deny) = (plain_args("1"), plain_args("1000"));
    let base = used_memory(&mut con);
    pipe(port, 0, &plain.sha1, 0..keys, &plain_allow);
    let plain_bytes = (used_memory(&mut con) - base) as f64 / keys as f64;
    let plain_value = "3-field hash".to_string();

    let mut table = vec![format!(
        "| plain token bucket (hash; TIME, HMGET, HSET, PEXPIRE) | {plain_bytes:.1} | {plain_value} | (yardstick) | | 1.00 | | | | 1.00 | |"
    )];
    let mut ratios = Vec::new();
    for program in Program::ALL {
        let p = policy(program);
        let (allow, deny) = (arguments(&p, 1), arguments(&p, 100));
        let script = Loaded::load(&mut con, program.source()).expect("compiles");
        let _: () = redis::cmd("SELECT").arg(1).query(&mut con).expect("SELECT");
        let _: () = redis::cmd("FLUSHDB")
            .arg("SYNC")
            .query(&mut con)
            .expect("FLUSHDB");
        let base = used_memory(&mut con);
        let t = Instant::now();
        pipe(port, 1, &script.sha1, 0..keys, &allow);
        let bytes = (used_memory(&mut con) - base) as f64 / keys as f64;
        let dbsize: u64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
        assert_eq!(dbsize, keys, "{}: every key stored", program.file_name());
        let value: usize = redis::cmd("STRLEN")
            .arg(key(0))
            .query(&mut con)
            .expect("STRLEN");
        let _: () = redis::cmd("SELECT").arg(0).query(&mut con).expect("SELECT");
        eprintln!(
            "{}: populated {keys} keys in {:?}",
            program.file_name(),
            t.elapsed()
        );
        let mut cells = Vec::new();
        for (mine, theirs) in [(&allow, &plain_allow), (&deny, &plain_deny)] {
            let (mut a, mut b) = (Samples::default(), Samples::default());
            for r in 0..rounds {
                for (target, samples) in [
                    (
                        Target {
                            db: 1,
                            sha: &script.sha1,
                            args: mine,
                            members: None,
                        },
                        &mut a,
                    ),
                    (
                        Target {
                            db: 0,
                            sha: &plain.sha1,
                            args: theirs,
                            members: None,
                        },
                        &mut b,
                    ),
                ] {
                    let (usec, cpu) = round(&mut con, port, pid, keys, calls, r + 1, &target);
                    samples.usec.push(usec);
                    samples.cpu_us.push(cpu);
                }
            }
            let (a_min, a_med) = Samples::stats(&a.usec);
            let (b_min, b_med) = Samples::stats(&b.usec);
            let (ac_min, _) = Samples::stats(&a.cpu_us);
            let (bc_min, _) = Samples::stats(&b.cpu_us);
            cells.push(format!(
                "{a_min:.2} / {a_med:.2} | {b_min:.2} / {b_med:.2} | {:.2} | {ac_min:.2} vs {bc_min:.2}",
                a_min / b_min
            ));
            ratios.push((program.file_name(), a_min / b_min, ac_min / bc_min));
        }
        table.push(format!(
            "| {} | {bytes:.1} | {value} | {} | {} |",
            program.file_name(),
            cells[0],
            cells[1]
        ));
    }
    println!(
        "\nRedis {version}, {allocator}, {keys} keys per program (plain script's keys present \
         throughout), {rounds} alternating rounds of {calls} calls\n"
    );
    println!(
        "| program | bytes/key | value bytes | allow us/call min / median | plain us/call min / median | allow ratio | allow CPU us/call (min) vs plain | deny us/call min / median | plain us/call min / median | deny ratio | deny CPU us/call (min) vs plain |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in &table {
        println!("{row}");
    }
    println!("\nratio of minimum usec_per_call and of minimum CPU per call (program / plain):");
    for (name, usec, cpu) in ratios {
        println!("{name}: {usec:.2} (usec_per_call), {cpu:.2} (CPU)");
    }
}

/// Server cost per decision of three limits: one multi-program call against three single
/// calls.
#[test]
fn multi_program_server_cost_against_single_calls() {
    let _alone = crate::measuring();
    if std::env::var("RL_MEASURE").as_deref() != Ok("1") {
        eprintln!("lua_cost: set RL_MEASURE=1 to measure");
        return;
    }
    let keys = env_u64("RL_MEASURE_MULTI_KEYS", 100_000);
    let calls = env_u64("RL_MEASURE_CALLS", 100_000);
    let rounds = env_u64("RL_MEASURE_ROUNDS", 5);
    let server = RedisServer::start();
    let (port, pid) = (server.port(), server.pid().expect("a private server"));
    let mut con = server.connection();
    let version = info_field(&mut con, "server", "redis_version");
    let programs = [Program::TokenBucket, Program::FixedWindow, Program::Gcra];
    let policies = programs.map(policy);
    let singles = programs.map(|p| Loaded::load(&mut con, p.source()).expect("compiles"));
    let multi = Loaded::load(&mut con, MULTI_SOURCE).expect("compiles");
    let members = [0u64, 1, 2];
    let multi_args = |cost| {
        let call: Vec<_> = policies.iter().map(|p| (p, cost)).collect();
        multi_arguments(&call, 0)
    };
    // Every key holds state of cost 1 (the multi program writes the single programs' state).
    let all = (0..keys).map(|i| members.iter().map(|&j| member_key(i, j)).collect());
    pipe_keys(port, 1, &multi.sha1, all, &multi_args(1));
    let dbsize: u64 = redis::cmd("SELECT")
        .arg(1)
        .query::<()>(&mut con)
        .and_then(|()| redis::cmd("DBSIZE").query(&mut con))
        .expect("DBSIZE");
    assert_eq!(dbsize, 3 * keys, "every member key stored");
    println!(
        "\nRedis {version}, {keys} decisions of 3 keys, {rounds} alternating rounds of {calls} calls\n"
    );
    println!(
        "| decision | multi us/call min | 3 singles us sum min | ratio | multi CPU us min | 3 singles CPU us sum min | CPU ratio |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (label, cost) in [("allow", 1u64), ("deny", 100)] {
        let m_args = multi_args(cost);
        let s_args: Vec<Vec<Vec<u8>>> = policies.iter().map(|p| arguments(p, cost)).collect();
        let (mut m, mut s) = (Samples::default(), Samples::default());
        for r in 0..rounds {
            let t = Target {
                db: 1,
                sha: &multi.sha1,
                args: &m_args,
                members: Some(&members),
            };
            let (usec, cpu) = round(&mut con, port, pid, keys, calls, r + 1, &t);
            m.usec.push(usec);
            m.cpu_us.push(cpu);
            let (mut usec, mut cpu) = (0.0, 0.0);
            for (j, single) in singles.iter().enumerate() {
                let t = Target {
                    db: 1,
                    sha: &single.sha1,
                    args: &s_args[j],
                    members: Some(&members[j..=j]),
                };
                let (u, c) = round(&mut con, port, pid, keys, calls, r + 1, &t);
                usec += u;
                cpu += c;
            }
            s.usec.push(usec);
            s.cpu_us.push(cpu);
        }
        let (m_min, _) = Samples::stats(&m.usec);
        let (s_min, _) = Samples::stats(&s.usec);
        let (mc_min, _) = Samples::stats(&m.cpu_us);
        let (sc_min, _) = Samples::stats(&s.cpu_us);
        println!(
            "| {label} | {m_min:.2} | {s_min:.2} | {:.2} | {mc_min:.2} | {sc_min:.2} | {:.2} |",
            m_min / s_min,
            mc_min / sc_min
        );
    }
}
