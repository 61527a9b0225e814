//! The floor benchmark (`bench/lua-programs/floor.sh`) still runs: every program answers
//! `ALLOWED` to the arguments it is measured with (the script refuses to measure a program
//! that answers anything else, such as `INVALID` after a change of calling convention), and
//! every program and its floor get a figure. A tiny run (a few thousand calls): the figures
//! themselves mean nothing here.

use std::path::PathBuf;
use std::process::Command;

use acceptance_tests::process::free_ports;

#[test]
fn the_floor_benchmark_measures_every_program_and_its_floor() {
    let _alone = crate::measuring();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lua-programs/floor.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("N", "2000")
        .env("ROUNDS", "1")
        .env("RANGE", "1000")
        .env("CLIENTS", "4")
        .env("PORT", free_ports(1)[0].to_string())
        .output()
        .expect("run floor.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "floor.sh failed:\n{stdout}\n{stderr}");
    for program in [
        "fixed-window",
        "sliding-counter",
        "token-bucket",
        "gcra",
        "sliding-log",
        "multi",
        "charge",
    ] {
        let summary = stdout
            .lines()
            .find(|l| l.starts_with(program) && l.contains("program/floor"))
            .unwrap_or_else(|| panic!("no summary for {program}:\n{stdout}"));
        let ratio: f64 = summary
            .rsplit(' ')
            .next()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no ratio in {summary:?}"));
        assert!(ratio > 0.0, "{summary}");
    }
    assert!(stdout.contains("multi/(3 x token-bucket)"), "{stdout}");
}
