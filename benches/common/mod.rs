//! What the benches share.

use std::time::Duration;

/// The process's CPU time (user and system, every thread) so far; child processes are not
/// counted.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct it is given and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let of = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    of(usage.ru_utime) + of(usage.ru_stime)
}
