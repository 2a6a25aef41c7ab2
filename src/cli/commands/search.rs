//! `runner search`.

use std::path::Path;

use crate::batch;
use crate::cli::flags::SearchArgs;
use crate::cli::{CliError, Exit, out, outln};

/// `runner search`: the best matches of a query over runs, through each run's index (built
/// or built again first when the log changed).
pub fn search(args: SearchArgs) -> Result<Exit, CliError> {
    use crate::log::search::{Filters, SearchError};
    let mut words = args.runs_and_query;
    let query = words.pop().unwrap_or_default();
    if query.trim().is_empty() {
        return Err(CliError::usage("the query is empty: give RUN... then the words to find"));
    }
    if args.limit == 0 {
        return Err(CliError::usage("--limit must be at least 1"));
    }
    let mut dirs = Vec::new();
    for run in &words {
        dirs.push(batch::resume::find_logged_run(Path::new(run), Path::new("results")).map_err(CliError::usage)?);
    }
    let filters = Filters {
        suite: args.suite,
        task: args.task,
        model: args.model,
        outcome: args.outcome,
        actor: args.actor,
        kind: args.kind,
        not_task: None,
    };
    let found = crate::report::search::search(&dirs, &query, &filters, args.limit).map_err(|e| match e {
        SearchError::Query { .. } => CliError::usage(e),
        SearchError::Log(_) | SearchError::Index { .. } | SearchError::Stopped => CliError::results(e),
    })?;
    for note in &found.notes {
        eprintln!("{note}");
    }
    if args.json {
        outln!("{}", crate::report::search::to_json(&query, &found.hits));
    } else {
        out!("{}", crate::report::search::render(&found.hits, dirs.len() > 1));
    }
    Ok(Exit::Passed)
}
