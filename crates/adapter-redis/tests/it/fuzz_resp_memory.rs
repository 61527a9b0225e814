//! What the RESP2 parser reserves for frames that announce huge lengths, measured as the
//! growth of the process's peak virtual size (`VmPeak`, Linux): the workspace forbids
//! `unsafe`, so no counting allocator can be installed, but an allocation of many megabytes
//! is mapped on its own and shows there even while its pages are untouched. The test measures
//! in a process of its own (it runs itself again, alone), so that no other test of this binary
//! moves the peak meanwhile.

use adapter_redis::fuzzing::parse_resp;

/// The process's peak virtual size in KiB.
#[cfg(target_os = "linux")]
fn vm_peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmPeak line")
}

/// Set in the process that measures: this binary again, running only the one test.
#[cfg(target_os = "linux")]
const ALONE: &str = "FUZZ_RESP_MEMORY_ALONE";

/// Runs the test `name` of this binary alone in a child process and fails with its output if
/// it fails (or if no test of that name ran).
#[cfg(target_os = "linux")]
fn run_alone(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([name, "--exact", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .expect("ran this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} alone: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(target_os = "linux")]
#[test]
fn nested_arrays_announcing_2_pow_40_reserve_in_proportion_to_the_input_only() {
    if std::env::var_os(ALONE).is_none() {
        run_alone(
            "fuzz_resp_memory::nested_arrays_announcing_2_pow_40_reserve_in_proportion_to_the_input_only",
        );
        return;
    }
    // Sixteen levels each announcing 2^40 elements, then a bulk string that never ends: no
    // level completes, so every level's reservation is alive at once. Regression: each level
    // reserved room for a third of the remaining bytes' worth of values, 16 * ~1.4 M values
    // (over 1 GiB) for 4 MiB of input.
    let mut frame = "*1099511627776\r\n".repeat(16).into_bytes();
    frame.extend_from_slice(b"$1099511627776\r\n");
    frame.resize(frame.len() + (4 << 20), b'x');
    let before = vm_peak_kib();
    assert_eq!(parse_resp(&frame), Ok(None));
    let grown_mib = (vm_peak_kib() - before) >> 10;
    assert!(
        grown_mib < 128,
        "parsing {} bytes raised the peak virtual size by {grown_mib} MiB",
        frame.len()
    );
}
