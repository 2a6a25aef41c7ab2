//! The `runner` binary: the command line in [`runner::cli`].

/// The system's allocator, but for large over-aligned blocks (see [`runner::allocator`]).
#[global_allocator]
static ALLOCATOR: runner::allocator::Allocator = runner::allocator::Allocator;

fn main() -> std::process::ExitCode {
    // SIGPIPE stays ignored, as Rust's runtime leaves it: a write to a child that is gone
    // (an interpreter that ended, a server whose stream broke) is then an error of that
    // child's world, not the end of the run. Children get the default back before they
    // start; the command line's own output ends quietly when its reader goes away
    // (`runner report RUN | head`), see `cli::print_out`.
    runner::cli::main()
}
