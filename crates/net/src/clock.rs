//! A clock that every process on one host reads alike, so a sender can stamp when a message may
//! be delivered and the receiving process can honour it (the link emulator needs this).

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for all processes of a host, never set back.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn monotonic_and_in_step_with_std() {
        let a = super::now_ns();
        let t = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = super::now_ns();
        let std_ns = t.elapsed().as_nanos() as u64;
        assert!(b > a);
        // Both clocks measured the same sleep; allow scheduling slack either way.
        assert!(
            (b - a).abs_diff(std_ns) < 5_000_000,
            "{} vs {std_ns}",
            b - a
        );
    }
}
