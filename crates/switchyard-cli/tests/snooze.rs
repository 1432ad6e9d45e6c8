//! An exec command that must wait: exit 75 (`EX_TEMPFAIL`) with a `Retry-After` line
//! brings the job back after the wait without counting an attempt; a `Retry-After` line
//! with another failure sets the retry's delay and counts.

mod support;

use std::time::Instant;

use support::{text, Sandbox};

#[test]
fn exit_75_waits_for_retry_after_without_counting_an_attempt() {
    let sb = Sandbox::new();
    sb.publish_lines("api", "call", "{}\n");
    // Rate limited twice (429, retry after 1 s), then through; one attempt allowed.
    let cmd = "echo \"attempt $SWITCHYARD_ATTEMPT $(date +%s%N)\" >> calls.log; \
               n=$(wc -l < calls.log); \
               if [ \"$n\" -le 2 ]; then echo 'Retry-After: 1'; exit 75; fi";
    let started = Instant::now();
    let out = sb.run(&[
        "work",
        "--queue",
        "api",
        "--exec",
        cmd,
        "--drain",
        "--max-attempts",
        "1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let calls = std::fs::read_to_string(sb.path("calls.log")).expect("the command ran");
    let lines: Vec<(&str, u128)> = calls
        .lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            let _ = parts.next()?;
            Some((parts.next()?, parts.next()?.parse().ok()?))
        })
        .collect();
    assert_eq!(
        lines.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        ["1", "1", "1"],
        "a wait counted an attempt: {calls}"
    );
    for pair in lines.windows(2) {
        let gap_ms = (pair[1].1 - pair[0].1) / 1_000_000;
        assert!(
            gap_ms >= 950,
            "came back after {gap_ms} ms, not after Retry-After: 1"
        );
    }
    assert!(sb.dead("api").is_empty(), "the waits dead-lettered the job");
    assert!(started.elapsed().as_secs() >= 2);
}

#[test]
fn retry_after_with_another_failure_delays_the_counted_retry() {
    let sb = Sandbox::new();
    sb.publish_lines("flaky", "call", "{}\n");
    let cmd = "echo \"$SWITCHYARD_ATTEMPT\" >> attempts.log; \
               if [ \"$SWITCHYARD_ATTEMPT\" = 1 ]; then echo 'Retry-After: 500ms'; exit 1; fi";
    let started = Instant::now();
    let out = sb.run(&[
        "work",
        "--queue",
        "flaky",
        "--exec",
        cmd,
        "--drain",
        "--max-attempts",
        "2",
        "--backoff-base",
        "1ms",
        "--backoff-max",
        "1ms",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let attempts = std::fs::read_to_string(sb.path("attempts.log")).expect("the command ran");
    assert_eq!(attempts, "1\n2\n", "the failure counted an attempt");
    assert!(
        started.elapsed().as_millis() >= 500,
        "the retry did not wait for Retry-After"
    );
}
