//! The command line, in three stages: `flags` (what was typed), `resolve` (what it names,
//! opened and checked once), `commands` (one function per command). Every failure is a
//! [`CliError`], printed and turned into an exit code in one place, [`main`].

mod commands;
pub mod flags;

mod resolve;

use std::fmt::Display;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use flags::{Command, CommandLine};

/// Distinct exit codes, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every gate passed.
    Passed = 0,
    /// A suite's `pass_threshold` or `--fail-under` was not met.
    GateFailed = 1,
    /// Bad arguments or a bad suite, environment or dataset file.
    Usage = 2,
    /// More episodes went unscored than `--max-unscored` allows.
    TooManyUnscored = 3,
    /// Episodes ran, but their results could not be written or read back (disk full,
    /// permissions).
    ResultsFailed = 4,
    /// Incomplete: a run-wide budget stopped scheduling before every planned episode ran
    /// (`--resume` with a larger budget runs the rest).
    Incomplete = 5,
    /// Stopped by Ctrl-C or SIGTERM.
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// Why a command failed, and the exit code that says so. Each message is printed as an
/// `error:` line; a suite file may have several.
#[derive(Debug, thiserror::Error)]
#[error("{}", .messages.join("\n"))]
pub struct CliError {
    pub exit: Exit,
    pub messages: Vec<String>,
    /// Printed after the errors, as a `note:` line.
    pub note: Option<String>,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Display) -> Self {
        CliError { exit, messages: vec![message.to_string()], note: None }
    }

    /// A mistake in the arguments or the files they name.
    pub fn usage(message: impl Display) -> Self {
        CliError::new(Exit::Usage, message)
    }

    /// Results that could not be written or read back.
    pub fn results(message: impl Display) -> Self {
        CliError::new(Exit::ResultsFailed, message)
    }

    pub fn each<M: Display>(exit: Exit, messages: impl IntoIterator<Item = M>) -> Self {
        CliError { exit, messages: messages.into_iter().map(|m| m.to_string()).collect(), note: None }
    }

    pub fn with_note(mut self, note: impl Display) -> Self {
        self.note = Some(note.to_string());
        self
    }
}

/// Parses the command line, runs the command, and returns its exit code.
pub fn main() -> ExitCode {
    exit_code(run(CommandLine::parse().command)).into()
}

fn run(command: Command) -> Result<Exit, CliError> {
    match command {
        Command::Validate { paths, build } => commands::validate(&paths, build),
        Command::Tools { environment, sandbox } => commands::tools(&environment, sandbox),
        Command::Eval(args) => commands::eval(*args),
        Command::Regrade(args) => commands::regrade(args),
        Command::Report(args) => commands::report(args),
        Command::Compare(args) => commands::compare(args),
        Command::Merge(args) => commands::merge(args),
        Command::Export(args) => commands::export(args),
        Command::Search(args) => commands::search(args),
        Command::JudgeCheck(args) => commands::judge_check(args),
        Command::Plan(args) => commands::plan(args),
        Command::Images(args) => commands::images(args),
        Command::Serve(args) => commands::serve(*args),
        Command::View(args) => commands::view(args),
    }
}

/// `print!` for what the commands print on stdout, which ends quietly when the reader went
/// away (`runner report RUN | head`): nothing more is printed, and the command carries on
/// (its files are still written) and keeps its exit code.
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::print_out(format_args!($($arg)*)) };
}

/// `println!` for what the commands print on stdout; see [`out!`].
macro_rules! outln {
    ($($arg:tt)*) => { $crate::cli::print_out(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

/// Writes `text` to stdout, unless a write already failed. A reader that went away is no
/// failure of the command; any other failure is said once on stderr.
pub(crate) fn print_out(text: std::fmt::Arguments) {
    static GONE: AtomicBool = AtomicBool::new(false);
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        GONE.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("warning: failed to print to stdout: {e}");
        }
    }
}

/// The one place a failure is printed and mapped to its exit code.
fn exit_code(result: Result<Exit, CliError>) -> Exit {
    match result {
        Ok(exit) => exit,
        Err(e) => {
            for message in &e.messages {
                eprintln!("error: {message}");
            }
            if let Some(note) = &e.note {
                eprintln!("note: {note}");
            }
            e.exit
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_gives_its_own_exit_code_and_a_success_its_verdict() {
        assert_eq!(exit_code(Ok(Exit::GateFailed)), Exit::GateFailed);
        assert_eq!(exit_code(Err(CliError::usage("bad flag"))), Exit::Usage);
        assert_eq!(exit_code(Err(CliError::results("disk full"))), Exit::ResultsFailed);
        let many = CliError::each(Exit::Usage, ["a.yaml:1:1: bad", "b.yaml:2:1: bad"]).with_note("see --suite");
        assert_eq!(many.to_string(), "a.yaml:1:1: bad\nb.yaml:2:1: bad");
        assert_eq!(exit_code(Err(many)), Exit::Usage);
    }
}
