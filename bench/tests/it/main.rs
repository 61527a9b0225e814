//! The measurements that run as tests (the event-gate benchmark, the Lua programs' server
//! cost and floor), one module each, in one test binary so that a test build links the
//! dependency tree once. One module: `cargo test -p bench --test it gate_bench::`.

use std::sync::{Mutex, MutexGuard, PoisonError};

mod gate_bench;
mod lua_cost;
mod lua_floor;

/// Held by each measurement for its whole run: they shared no process when each module was a
/// binary of its own, and one measuring beside another would skew both figures.
fn measuring() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}
