//! The command catalogue: every Redis command the programs and the providers send, as ACL
//! rules name it, with a probe of the real call's shape for the start-up ACL check.
//!
//! Program manifests list the commands their source calls from here (a test holds each
//! manifest to its source), the providers list what they send themselves, and the ACL check
//! asks the server about exactly those.

/// One Redis command a program or the provider sends, as ACL rules name it, and how to ask
/// whether it is permitted.
#[derive(Debug)]
pub struct Command {
    /// The ACL name: `SET`, `XINFO|STREAM` (container and subcommand).
    pub name: &'static str,
    /// The probe: the command with dummy arguments of the real call's shape, `$key` where the
    /// real call has a key, so that Redis checks the key where the command's key specs say.
    probe: &'static str,
}

/// Placeholder of the probe key in [`Command::probe`].
const KEY: &str = "$key";

impl Command {
    /// Whether the command takes a key (so the user's key pattern matters too).
    pub fn takes_key(&self) -> bool {
        self.probe.split_whitespace().any(|w| w == KEY)
    }

    /// The ACL rule that grants it: `+set`, `+xinfo|stream`.
    pub fn grant(&self) -> String {
        format!("+{}", self.name.to_ascii_lowercase())
    }

    /// The probe's arguments, `key` where the real call has its key.
    pub fn probe_args<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> {
        self.probe
            .split_whitespace()
            .map(move |w| if w == KEY { key } else { w })
    }
}

macro_rules! commands {
    ($($(#[$doc:meta])* $id:ident = $name:literal, $probe:literal;)*) => {
        $($(#[$doc])* pub static $id: Command = Command { name: $name, probe: $probe };)*
        /// Every command this build knows how to probe.
        pub static ALL: &[&Command] = &[$(&$id),*];
    };
}

commands! {
    /// The server clock: the time source of every program that decides.
    TIME = "TIME", "TIME";
    /// Read by every rate-limit program and every gate program.
    GET = "GET", "GET $key";
    /// As the rate-limit programs write: with a TTL.
    SET = "SET", "SET $key v PX 1";
    /// The gate programs that submit and publish.
    INCR = "INCR", "INCR $key";
    /// The gate programs that submit and publish.
    HGET = "HGET", "HGET $key f";
    /// The gate programs that submit, publish, sweep and take a snapshot.
    HMGET = "HMGET", "HMGET $key f";
    /// The gate programs that submit, publish and sweep.
    HSET = "HSET", "HSET $key f v";
    /// The gate programs that submit and sweep.
    HDEL = "HDEL", "HDEL $key f";
    /// The gate program that submits.
    HLEN = "HLEN", "HLEN $key";
    /// The gate programs that submit and publish, and the lease acquire.
    ZADD = "ZADD", "ZADD $key 1 m";
    /// The gate programs that submit, publish and sweep, and the lease release.
    ZREM = "ZREM", "ZREM $key m";
    /// The gate programs that publish and take a snapshot, and the lease acquire.
    ZRANGE = "ZRANGE", "ZRANGE $key 0 0 WITHSCORES";
    /// The gate programs that submit, publish and sweep.
    ZRANGEBYSCORE = "ZRANGEBYSCORE", "ZRANGEBYSCORE $key -inf 1 LIMIT 0 1";
    /// The lease programs: expired leases dropped.
    ZREMRANGEBYSCORE = "ZREMRANGEBYSCORE", "ZREMRANGEBYSCORE $key -inf 1";
    /// The lease programs: a lease's token looked up.
    ZSCORE = "ZSCORE", "ZSCORE $key m";
    /// The lease acquire: the leases held counted.
    ZCARD = "ZCARD", "ZCARD $key";
    /// The leases key lives until its latest lease expires.
    PEXPIRE = "PEXPIRE", "PEXPIRE $key 1";
    /// As the gate programs append: trimmed, explicit id.
    XADD = "XADD", "XADD $key MAXLEN ~ 1 1-0 f v";
    /// The gate updates program: the entries after a reader's position.
    XRANGE = "XRANGE", "XRANGE $key 1-0 + COUNT 1";
    /// The gate programs that submit and publish: the stream's latest entry.
    XREVRANGE = "XREVRANGE", "XREVRANGE $key + - COUNT 1";
    /// The gate updates program: whether entries were trimmed below a reader's position.
    XINFO_STREAM = "XINFO|STREAM", "XINFO STREAM $key";
    /// The gate updates program: whether the stream exists.
    EXISTS = "EXISTS", "EXISTS $key";
    /// Every program call; the key is declared, so the key pattern applies.
    EVALSHA = "EVALSHA", "EVALSHA 0000000000000000000000000000000000000000 1 $key";
    /// The `NOSCRIPT` fallback (and this check).
    EVAL = "EVAL", "EVAL return 1 $key";
    /// `readiness()`.
    PING = "PING", "PING";
    /// The cluster slot map.
    CLUSTER_SLOTS = "CLUSTER|SLOTS", "CLUSTER SLOTS";
    /// `min_replicas_ack`.
    WAIT = "WAIT", "WAIT 1 1";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Longest probe the check program accepts (the bound of its `ARGV` count field).
    const MAX_PROBE_ARGS: usize = 32;

    #[test]
    fn every_probe_names_its_command_and_fits_the_program() {
        for c in ALL {
            let words: Vec<&str> = c.probe_args("k").collect();
            let name: Vec<&str> = c.name.split('|').collect();
            assert_eq!(&words[..name.len()], name.as_slice(), "{}", c.name);
            assert!(words.len() <= MAX_PROBE_ARGS, "{}", c.name);
            assert!(
                c.probe.matches(KEY).count() <= 1,
                "{}: one probe key at most",
                c.name
            );
            assert_eq!(c.name, c.name.to_ascii_uppercase());
        }
        assert!(SET.takes_key() && EVALSHA.takes_key() && XINFO_STREAM.takes_key());
        assert!(!TIME.takes_key() && !PING.takes_key());
        assert_eq!(XINFO_STREAM.grant(), "+xinfo|stream");
    }
}
