//! The runner's own resources. Shell episodes hold several file descriptors per running
//! command; a run must fit in the process's limit, and a runner that runs out anyway
//! (descriptors, processes, memory) has given nobody's answer: that episode is unscored
//! (`resource_exhausted`), never failed.

use std::io;
use std::sync::OnceLock;

/// Descriptors one running shell tool call may hold at once: a command's stdout, stderr and
/// status pipes, and those open for a moment while it starts.
pub const FDS_PER_CALL: u64 = 8;

/// Descriptors kept free for the rest of the run: the log, the runtime, HTTP connections.
const FDS_RESERVED: u64 = 64;

/// The soft limit of open files the runner started with, which commands get back.
static STARTING_LIMIT: OnceLock<libc::rlimit> = OnceLock::new();

/// Whether an error means that the runner itself ran out of something: open files (of the
/// process or the system), processes, memory.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM))
}

/// The limit of open files that commands should see: the one the runner started with.
pub fn starting_open_files_limit() -> Option<libc::rlimit> {
    STARTING_LIMIT.get().copied()
}

/// Raises the soft limit of open files to the hard limit, and returns how many episodes may
/// run at once so that their commands fit in it: `jobs`, or fewer, with a note on stderr.
/// `per_episode` holds the open files one episode of each environment may hold at once.
pub fn fit_jobs(jobs: usize, per_episode: impl IntoIterator<Item = u64>) -> usize {
    let limit = raise_open_files_limit();
    let per_episode = per_episode.into_iter().max().unwrap_or(0);
    let Some(limit) = limit.filter(|_| per_episode > 0) else { return jobs };
    let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(16);
    let reserved = FDS_RESERVED.min(limit / 4);
    let fit = (limit.saturating_sub(open + reserved) / per_episode).max(1);
    if (jobs as u64) <= fit {
        return jobs;
    }
    let fit = fit as usize;
    eprintln!(
        "note: -j {jobs} lowered to {fit}: a shell episode may hold {per_episode} open files and this process \
         may have {limit} (ulimit -n; raise the hard limit to run more at once)"
    );
    fit
}

/// Sets the soft limit of open files to the hard one; returns the limit now in force.
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        let _ = STARTING_LIMIT.set(limit);
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            // Some systems refuse an unlimited soft limit: keep the old one then.
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    // rlim_t is not u64 on every target.
    #[allow(clippy::unnecessary_cast)]
    Some(limit.rlim_cur as u64)
}
