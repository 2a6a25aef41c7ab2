fn main() -> std::process::ExitCode {
    // Like other command-line tools, end quietly when the reader of our output goes away
    // (`runner report RUN | head`) instead of failing to print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    runner::cli::main()
}
