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

/// The CPU time of this process's living descendants so far, every thread of each, read
/// from `/proc/PID/task/TID/schedstat` (nanoseconds): a long-lived worker's share, which
/// `getrusage` counts only once it is reaped.
pub fn descendants_cpu_time() -> Duration {
    let mut total = 0u64;
    let mut pending = children_of(std::process::id());
    while let Some(pid) = pending.pop() {
        for task in tasks_of(pid) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{task}/schedstat")).unwrap_or_default();
            total += stat.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()).unwrap_or(0);
        }
        pending.extend(children_of(pid));
    }
    Duration::from_nanos(total)
}

fn tasks_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks.flatten().filter_map(|task| task.file_name().to_str()?.parse().ok()).collect()
}

fn children_of(pid: u32) -> Vec<u32> {
    tasks_of(pid)
        .into_iter()
        .filter_map(|task| std::fs::read_to_string(format!("/proc/{pid}/task/{task}/children")).ok())
        .flat_map(|children| children.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
        .collect()
}
