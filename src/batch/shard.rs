//! Shards: which episodes `--shard I/N` makes, and where `--shard auto/N` finds I — the
//! index a scheduler gives each process it starts: a Kubernetes Indexed Job's
//! `JOB_COMPLETION_INDEX` or a Slurm job array's `SLURM_ARRAY_TASK_*`.

use super::{EpisodeSpec, episode_id};

/// `2/4`: shard 2 of 4. `auto/4` takes the shard from the scheduler's variables: index 0
/// (the first pod of an Indexed Job, the first task of a Slurm array) is shard 1.
pub fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    shard_of(text, |name| std::env::var(name).ok())
}

/// [`parse_shard`] with the environment given as a lookup, for the tests.
fn shard_of(text: &str, var: impl Fn(&str) -> Option<String>) -> Result<(u64, u64), String> {
    let bad = || {
        format!(
            "a shard is I/N with 1 <= I <= N, like 2/4 (or auto/N in a Kubernetes Indexed Job or a Slurm job array), not `{text}`"
        )
    };
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let n: u64 = n.trim().parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    let i: u64 = if i.trim() == "auto" { auto_index(n, &var)? + 1 } else { i.trim().parse().map_err(|_| bad())? };
    if i == 0 || i > n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The shard's index from 0, from the variables of the scheduler that started the process.
fn auto_index(n: u64, var: &impl Fn(&str) -> Option<String>) -> Result<u64, String> {
    if let Some(index) = var("JOB_COMPLETION_INDEX") {
        let index = number("JOB_COMPLETION_INDEX", &index)?;
        if index >= n {
            return Err(format!(
                "$JOB_COMPLETION_INDEX is {index}, outside --shard auto/{n} (indexes 0 to {}): the Job's completions must be {n}",
                n - 1
            ));
        }
        return Ok(index);
    }
    if let Some(id) = var("SLURM_ARRAY_TASK_ID") {
        return slurm_index(n, &id, var);
    }
    Err(format!(
        "--shard auto/N needs $JOB_COMPLETION_INDEX (set by a Kubernetes Indexed Job) or $SLURM_ARRAY_TASK_ID (set in a Slurm job array: sbatch --array=0-{})",
        n - 1
    ))
}

/// A Slurm array task's index: its id less the array's first id (so `--array=0-3` and
/// `--array=1-4` are both shards 1 to 4), over the step (`--array=0-6:2`). The array must
/// have one task per shard: a task outside it would run no episode, or another's.
fn slurm_index(n: u64, id: &str, var: &impl Fn(&str) -> Option<String>) -> Result<u64, String> {
    let read = |name: &str| var(name).map(|value| number(name, &value)).transpose();
    let id = number("SLURM_ARRAY_TASK_ID", id)?;
    let min = read("SLURM_ARRAY_TASK_MIN")?
        .ok_or("$SLURM_ARRAY_TASK_ID is set but $SLURM_ARRAY_TASK_MIN is not (Slurm sets both in a job array)")?;
    let step = read("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
    if let Some(count) = read("SLURM_ARRAY_TASK_COUNT")?
        && count != n
    {
        return Err(format!(
            "$SLURM_ARRAY_TASK_COUNT is {count}, but --shard auto/{n} makes {n} shards: submit one array task per shard (sbatch --array=0-{})",
            n - 1
        ));
    }
    if id < min || !(id - min).is_multiple_of(step) {
        return Err(format!(
            "$SLURM_ARRAY_TASK_ID is {id}, not a task of the array that $SLURM_ARRAY_TASK_MIN ({min}) and $SLURM_ARRAY_TASK_STEP ({step}) describe"
        ));
    }
    let index = (id - min) / step;
    if index >= n {
        return Err(format!(
            "$SLURM_ARRAY_TASK_ID {id} less $SLURM_ARRAY_TASK_MIN {min} is index {index}, outside --shard auto/{n} (indexes 0 to {}): submit one array task per shard (sbatch --array={min}-{})",
            n - 1,
            min.saturating_add((n - 1).saturating_mul(step))
        ));
    }
    Ok(index)
}

fn number(name: &str, value: &str) -> Result<u64, String> {
    value.trim().parse().map_err(|_| format!("${name} is `{value}`, not a number"))
}

/// Whether an episode falls in shard `(i, n)`: by a hash of its task, model and variant, not of its
/// epoch, so a task's epochs run in one shard, in order, and a memory kept across them
/// (`scope: task`) carries over as in one run; and not by its place in the run, so a shard
/// keeps its episodes when tasks are added.
pub fn in_shard(episode: &EpisodeSpec, shard: Option<(u64, u64)>) -> bool {
    let Some((i, n)) = shard else { return true };
    let task = &episode.suite.tasks[episode.task];
    // Epochs count from 1: "epoch 0" names the task and model, no episode.
    let variant = episode.variant().map(|v| v.name.as_str());
    let key = episode_id(&episode.suite.name, &task.id, &task.digest, episode.model.name(), 0, variant);
    let hex = key.strip_prefix("ep_").unwrap_or(&key);
    let value = u64::from_str_radix(&hex[..hex.len().min(16)], 16).unwrap_or(0);
    value % n == i - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup over these variables only.
    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    /// The variables of a Kubernetes Indexed Job's pod, or none.
    fn job(index: Option<&str>) -> impl Fn(&str) -> Option<String> + '_ {
        move |name| if name == "JOB_COMPLETION_INDEX" { index.map(String::from) } else { None }
    }

    #[test]
    fn a_shard_is_given_or_taken_from_the_job_index() {
        assert_eq!(shard_of("2/4", job(None)), Ok((2, 4)));
        assert_eq!(shard_of("auto/4", job(Some("0"))), Ok((1, 4)), "Kubernetes counts from 0");
        assert_eq!(shard_of("auto/4", job(Some("3"))), Ok((4, 4)));
        assert!(shard_of("auto/4", job(Some("4"))).is_err(), "index 4 is a fifth shard");
        assert!(shard_of("auto/4", job(None)).unwrap_err().contains("JOB_COMPLETION_INDEX"));
        assert!(shard_of("auto/4", job(Some("x"))).unwrap_err().contains("not a number"));
        for bad in ["0/4", "5/4", "2", "a/b", "1/0"] {
            assert!(shard_of(bad, job(None)).is_err(), "{bad}");
        }
    }

    /// The variables `sbatch --array=MIN-MAX` sets in task `id`.
    fn array(id: u64, min: u64, max: u64) -> Vec<(&'static str, String)> {
        vec![
            ("SLURM_ARRAY_TASK_ID", id.to_string()),
            ("SLURM_ARRAY_TASK_MIN", min.to_string()),
            ("SLURM_ARRAY_TASK_MAX", max.to_string()),
            ("SLURM_ARRAY_TASK_STEP", "1".into()),
            ("SLURM_ARRAY_TASK_COUNT", (max - min + 1).to_string()),
        ]
    }

    fn in_array(text: &str, vars: &[(&'static str, String)]) -> Result<(u64, u64), String> {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        shard_of(text, env(&vars))
    }

    #[test]
    fn a_slurm_array_task_is_the_shard_of_its_place_in_the_array() {
        for (first, last) in [(0, 3), (1, 4), (10, 13)] {
            let shards: Vec<_> = (first..=last).map(|id| in_array("auto/4", &array(id, first, last))).collect();
            assert_eq!(shards, [Ok((1, 4)), Ok((2, 4)), Ok((3, 4)), Ok((4, 4))], "--array={first}-{last}");
        }
        // --array=0-6:2 makes tasks 0, 2, 4 and 6.
        let mut stepped = array(4, 0, 6);
        stepped[3].1 = "2".into();
        stepped[4].1 = "4".into();
        assert_eq!(in_array("auto/4", &stepped), Ok((3, 4)));
        // An explicit shard is kept inside an array too.
        assert_eq!(in_array("2/4", &array(0, 0, 3)), Ok((2, 4)));
    }

    #[test]
    fn a_slurm_array_of_another_size_or_a_task_outside_it_is_refused_naming_the_variable() {
        let five = in_array("auto/4", &array(0, 0, 4)).unwrap_err();
        assert!(five.contains("$SLURM_ARRAY_TASK_COUNT is 5") && five.contains("--array=0-3"), "{five}");

        // Without SLURM_ARRAY_TASK_COUNT, the task's own index is checked.
        let mut outside = array(5, 1, 5);
        outside.retain(|(k, _)| *k != "SLURM_ARRAY_TASK_COUNT");
        let outside = in_array("auto/4", &outside).unwrap_err();
        assert!(
            outside.contains("$SLURM_ARRAY_TASK_ID 5 less $SLURM_ARRAY_TASK_MIN 1 is index 4")
                && outside.contains("--array=1-4"),
            "{outside}"
        );

        let below = in_array("auto/4", &[("SLURM_ARRAY_TASK_ID", "0".into()), ("SLURM_ARRAY_TASK_MIN", "1".into())]);
        assert!(below.unwrap_err().contains("$SLURM_ARRAY_TASK_ID is 0, not a task of the array"));

        let no_min = in_array("auto/4", &[("SLURM_ARRAY_TASK_ID", "2".into())]).unwrap_err();
        assert!(no_min.contains("$SLURM_ARRAY_TASK_MIN is not"), "{no_min}");

        let garbled =
            in_array("auto/4", &[("SLURM_ARRAY_TASK_ID", "2".into()), ("SLURM_ARRAY_TASK_MIN", "one".into())]);
        assert!(garbled.unwrap_err().contains("$SLURM_ARRAY_TASK_MIN is `one`, not a number"));

        let neither = shard_of("auto/4", job(None)).unwrap_err();
        assert!(neither.contains("SLURM_ARRAY_TASK_ID") && neither.contains("sbatch --array=0-3"), "{neither}");
    }
}
