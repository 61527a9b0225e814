//! Thread per core (`adapter_redis::placement`): a provider placed on serving runtimes opens
//! at least one connection per runtime, and every call made on a runtime's thread leaves on
//! that runtime's own connection, so no wake-up crosses threads.

use std::collections::BTreeSet;
use std::sync::Arc;

use acceptance_tests::rate::{policy_set, request, subject};
use acceptance_tests::redis_provider::{daily_policy, query, settings};
use acceptance_tests::redis_server::RedisServer;
use adapter_redis::{Placement, RedisProvider};
use shared_contract::{AlgorithmKind, EdgeRateLimitPort, RateLimitOutcome};
use tokio::runtime::{Builder, Handle, Runtime};

/// `n` single-threaded runtimes, each driven by a thread of its own until [`Serving::stop`].
struct Serving {
    handles: Vec<Handle>,
    threads: Vec<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )>,
}

impl Serving {
    fn start(n: usize) -> Self {
        let mut handles = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..n {
            let runtime = single();
            handles.push(runtime.handle().clone());
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let _ = runtime.block_on(stopped);
            });
            threads.push((stop, thread));
        }
        Self { handles, threads }
    }

    fn stop(self) {
        for (stop, thread) in self.threads {
            let _ = stop.send(());
            thread.join().expect("serving thread");
        }
    }
}

fn single() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// The provider's connections (every client but the one asking) and, of those, the ones
/// whose last command was a program call.
fn clients(server: &RedisServer) -> (usize, BTreeSet<String>) {
    let list: String = query(server, redis::cmd("CLIENT").arg("LIST"));
    let others: Vec<&str> = list
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .collect();
    let calling = others
        .iter()
        .filter(|l| l.contains("cmd=evalsha"))
        .filter_map(|l| l.split(' ').find(|f| f.starts_with("addr=")))
        .map(str::to_owned)
        .collect();
    (others.len(), calling)
}

#[test]
fn each_serving_thread_sends_on_a_connection_of_its_own() {
    let server = RedisServer::start();
    let serving = Serving::start(3);
    let main = single();
    let policy = daily_policy("placed", AlgorithmKind::FixedWindow, 1, 1000);
    let mut s = settings(&server);
    s.connections = 1;
    // Single program calls only, so each shows on the connection it left on.
    s.batch_max = 1;
    let provider = Arc::new(
        main.block_on(RedisProvider::connect_on(
            s,
            policy_set(vec![policy.clone()]),
            Placement::new(serving.handles.clone()),
        ))
        .expect("valid settings"),
    );
    let (open, calling) = clients(&server);
    assert_eq!(
        open, 3,
        "one connection per serving runtime, though connections = 1"
    );
    assert!(calling.is_empty(), "{calling:?}");
    for (k, runtime) in serving.handles.iter().enumerate() {
        for i in 0..4u8 {
            let (provider, policy) = (provider.clone(), policy.clone());
            let outcome =
                main.block_on(runtime.spawn(async move {
                    provider.evaluate(request(&policy, subject(i), 1)).await
                }))
                .expect("task");
            assert!(
                matches!(outcome, Ok(RateLimitOutcome::Evaluated(ref d)) if d.allowed),
                "{outcome:?}"
            );
        }
        let (_, calling) = clients(&server);
        assert_eq!(
            calling.len(),
            k + 1,
            "after four calls on each of {} runtime(s), one connection each: {calling:?}",
            k + 1
        );
    }
    drop(provider);
    serving.stop();
}
