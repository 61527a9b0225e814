//! Guarded child processes and free loopback ports: the two things every harness topology
//! (a single server, a cluster, a Sentinel group) needs.
//!
//! A server started by a test must die with the test, even when the handle is never dropped
//! (a `static`) or the test binary crashes. [`spawn_guarded`] therefore starts the program
//! through a small shell guard: the guard prints the program's pid, then blocks reading its
//! stdin, a pipe held by this process. When that pipe closes (the handle drops, or this
//! process exits for any reason and the kernel closes its descriptors) the guard sends
//! SIGCONT (in case a fault test left it stopped) and SIGKILL to the program and reaps it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The guard: start `"$@"` in the background, print its pid, wait for stdin to close, kill.
/// The program's own output goes to /dev/null; programs started here log to files.
const GUARD_SCRIPT: &str = r#""$@" >/dev/null 2>&1 & pid=$!; echo "$pid"; cat >/dev/null; kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null"#;

/// A program started by [`spawn_guarded`]; dropping it (or [`Guarded::kill`]) kills it.
#[derive(Debug)]
pub struct Guarded {
    pid: u32,
    guard: Child,
    guard_stdin: Option<ChildStdin>,
}

/// Starts `program args...` under the guard described in the module docs.
///
/// # Errors
/// When `sh` cannot be run or the guard prints no pid. A program that starts and then exits
/// at once (a bad argument) is not detected here: callers wait for it to answer, and
/// [`Guarded::is_running`] tells them whether it is still there.
pub fn spawn_guarded<S: AsRef<str>>(program: &str, args: &[S]) -> Result<Guarded, String> {
    let mut guard = Command::new("sh")
        .arg("-c")
        .arg(GUARD_SCRIPT)
        .arg("sh")
        .arg(program)
        .args(args.iter().map(AsRef::as_ref))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run sh to start {program}: {e}"))?;
    let mut first = String::new();
    if let Some(out) = guard.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut first);
    }
    let guard_stdin = guard.stdin.take();
    match first.trim().parse() {
        Ok(pid) => Ok(Guarded {
            pid,
            guard,
            guard_stdin,
        }),
        Err(_) => {
            drop(guard_stdin);
            let _ = guard.wait();
            Err(format!("the guard of {program} printed no pid: {first:?}"))
        }
    }
}

impl Guarded {
    /// The program's pid (not the guard's).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Freezes the program (SIGSTOP): its sockets stay open, nothing answers.
    pub fn pause(&self) {
        signal("-STOP", self.pid);
    }

    /// Thaws a paused program (SIGCONT).
    pub fn resume(&self) {
        signal("-CONT", self.pid);
    }

    /// Whether the program is still running: not exited and not a zombie. The guard reaps
    /// the program only once it is told to stop, so an exited program stays a zombie until
    /// then and `kill -0` alone would still succeed.
    pub fn is_running(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| {
                // The state follows the parenthesised command name, which may hold spaces.
                let (_, rest) = stat.rsplit_once(") ")?;
                rest.chars().next()
            })
            .is_some_and(|state| state != 'Z' && state != 'X')
    }

    /// Kills the program (SIGCONT, SIGKILL) and waits until the guard has reaped it, so the
    /// process is gone when this returns (its listening ports are closed by the kernel).
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        signal("-CONT", self.pid);
        signal("-9", self.pid);
        drop(self.guard_stdin.take());
        let _ = self.guard.wait();
    }
}

/// A harness process serving a known loopback port, as topologies keep their nodes: the
/// port stays known while the process is killed, so the node can be started again on it.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) port: u16,
    /// `None` while the node is killed.
    pub(crate) process: Option<Guarded>,
}

impl Node {
    /// Kills the process, if it runs (see [`Guarded::kill`]).
    pub(crate) fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill();
        }
    }
}

fn signal(signal: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Where [`free_ports`] starts looking: above the well-known service ports.
const PICK_FROM: u16 = 20_000;
/// The kernel's ephemeral range when `/proc` does not say (Linux's default).
const DEFAULT_EPHEMERAL: (u16, u16) = (32_768, 60_999);

/// `n` distinct loopback ports that were free a moment ago.
///
/// A picked port is only reserved while it is being picked: between the pick and the
/// server's bind, someone else may take it. Two things make that rare. Ports come from
/// below the kernel's ephemeral range (`PICK_FROM` up to it), where no outgoing connection
/// takes its local port: the harness's own probes open many, and one landing on a port a
/// cluster was about to bind did fail a test. And a process-wide cursor, started at a
/// random place, hands out each port once, so topologies starting at the same time in one
/// test binary never get the same port. Where that range is too small, ports come from the
/// ephemeral range (`127.0.0.1:0`). Callers still retry a start that failed on a taken port.
///
/// # Panics
/// When no loopback port can be bound at all.
pub fn free_ports(n: usize) -> Vec<u16> {
    static CURSOR: OnceLock<AtomicU32> = OnceLock::new();
    let low = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL.0);
    let span = u32::from(low.saturating_sub(PICK_FROM));
    let mut listeners: Vec<TcpListener> = Vec::with_capacity(n);
    if span >= 1_000 {
        let cursor = CURSOR.get_or_init(|| AtomicU32::new(random_seed() % span));
        for _ in 0..span {
            if listeners.len() == n {
                break;
            }
            let offset = cursor.fetch_add(1, Ordering::Relaxed) % span;
            let port = PICK_FROM + u16::try_from(offset).expect("an offset below the span");
            // In use (a listener, a connection's local end): skip it.
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                listeners.push(l);
            }
        }
    }
    while listeners.len() < n {
        listeners.push(TcpListener::bind("127.0.0.1:0").expect("a loopback port"));
    }
    listeners
        .iter()
        .map(|l| l.local_addr().expect("a bound address").port())
        .collect()
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Differs between test processes started together (pid) and runs (clock).
fn random_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().wrapping_mul(2_654_435_761)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_across_calls_and_below_the_ephemeral_range() {
        let mut ports = free_ports(16);
        ports.extend(free_ports(16));
        let low = ephemeral_low().unwrap_or(DEFAULT_EPHEMERAL.0);
        if low >= PICK_FROM + 1_000 {
            assert!(
                ports.iter().all(|&p| (PICK_FROM..low).contains(&p)),
                "{ports:?}"
            );
        }
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 32);
    }

    #[test]
    fn a_guarded_program_runs_until_killed() {
        let p = spawn_guarded("sleep", &["30"]).expect("sleep starts");
        let pid = p.pid();
        assert!(p.is_running());
        p.kill();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn an_exited_program_is_not_running() {
        let p = spawn_guarded("true", &[] as &[&str]).expect("true starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while p.is_running() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!p.is_running());
    }
}
