//! `runner judge-check`: the LLM judge of a run checked against people. A labels file (CSV
//! or JSONL: an episode or a task, a scorer, a person's verdict, optionally the rater and
//! their reason) is matched with the verdicts of the run's graded scorers (those whose
//! `score` carries a `grader`: `llm_rubric`, `model_graded_qa`) under one scoring; per
//! scorer: accuracy and Cohen's kappa against people, Krippendorff's alpha when several
//! people rated, the confusion matrix, the judge's self-consistency across its samples, and
//! the episodes where the judge and people disagree, each with both reasons. Labels that
//! name nothing in the run are listed, never dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::agreement::{Confusion, krippendorff_alpha};
use crate::log::event::{Event, INITIAL_SCORING};
use crate::log::reader::{LineHeader, for_each_line_of};

/// The columns (CSV) or keys (JSONL) a label may have. `score` (a person's score, 0 to 1)
/// and `ts` (when the label was made) are kept by the viewer and checked, not counted.
const FIELDS: [&str; 9] =
    ["episode_id", "task_id", "suite", "scorer", "verdict", "rater", "explanation", "score", "ts"];

/// The labels file of a run, in its folder: where the viewer (`runner view`) appends the
/// labels people set in the page, and what `judge-check RUN` reads without `--labels`.
pub const LABELS_FILE: &str = "labels.jsonl";

/// The `scorer` of a label on an episode as a whole rather than on one judge's verdict: it
/// is counted apart, as no judge is checked by it.
pub const EPISODE_LABEL: &str = "episode";

/// The most disagreements printed per scorer (`--json` has them all).
const SHOWN_DISAGREEMENTS: usize = 20;

/// One person's verdict on one scorer of an episode, or of every episode of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    /// The line of the labels file it came from.
    pub line: usize,
    pub episode_id: Option<String>,
    pub task_id: Option<String>,
    /// With `task_id`: the task's suite, when task ids repeat across suites.
    pub suite: Option<String>,
    pub scorer: String,
    pub passed: bool,
    pub rater: Option<String>,
    pub explanation: Option<String>,
}

impl Label {
    fn names(&self) -> String {
        match (&self.episode_id, &self.task_id, &self.suite) {
            (Some(id), _, _) => format!("episode {id}"),
            (None, Some(task), Some(suite)) => format!("task {suite}/{task}"),
            (None, Some(task), None) => format!("task {task}"),
            (None, None, _) => "nothing".into(),
        }
    }
}

/// A row of a labels file: its line and its fields.
type Row = (usize, BTreeMap<String, Value>);

/// One episode's verdicts on a scorer: the judge's, and each rater's.
struct Unit {
    judge: bool,
    raters: BTreeMap<String, bool>,
}

/// Reads a labels file: `.csv` (a header row naming the columns) or `.jsonl` (one object
/// per line). Every error names the file, the line and the field.
pub fn read_labels(path: &Path) -> Result<Vec<Label>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("failed to read {shown}: {e}"))?;
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let rows: Vec<Row> = match extension.as_str() {
        "csv" => csv_rows(&text).map_err(|e| format!("{shown}:{e}"))?,
        "jsonl" | "ndjson" => jsonl_rows(&text).map_err(|e| format!("{shown}:{e}"))?,
        _ => return Err(format!("{shown}: a labels file is .csv or .jsonl, not {extension:?}")),
    };
    let labels: Vec<Label> = rows
        .into_iter()
        .map(|(line, row)| label(line, row).map_err(|e| format!("{shown}:{line}: {e}")))
        .collect::<Result<_, _>>()?;
    if labels.is_empty() {
        return Err(format!("{shown}: no labels"));
    }
    Ok(labels)
}

fn csv_rows(text: &str) -> Result<Vec<Row>, String> {
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|e| format!("1: {e}"))?.clone();
    if let Some(unknown) = headers.iter().find(|h| !FIELDS.contains(h)) {
        return Err(format!("1: unknown column `{unknown}`, expected: {}", FIELDS.join(", ")));
    }
    // Two columns of one name: which one a row's value came from would be a guess.
    if let Some((i, twice)) = headers.iter().enumerate().find(|(i, h)| headers.iter().take(*i).any(|seen| seen == *h)) {
        return Err(format!("1: column `{twice}` appears twice (column {}), each column once", i + 1));
    }
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            format!("{line}: {e}")
        })?;
        let line = record.position().map_or(0, |p| p.line() as usize);
        let row = headers
            .iter()
            .zip(record.iter())
            .filter(|(_, v)| !v.is_empty())
            .map(|(h, v)| (h.to_owned(), Value::String(v.to_owned())))
            .collect();
        rows.push((line, row));
    }
    Ok(rows)
}

fn jsonl_rows(text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let row: BTreeMap<String, Value> =
            serde_json::from_str(line).map_err(|e| format!("{line_no}: not a JSON object: {e}"))?;
        if let Some(unknown) = row.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(format!("{line_no}: unknown field `{unknown}`, expected: {}", FIELDS.join(", ")));
        }
        rows.push((line_no, row.into_iter().filter(|(_, v)| !v.is_null()).collect()));
    }
    Ok(rows)
}

fn label(line: usize, mut row: BTreeMap<String, Value>) -> Result<Label, String> {
    let mut text = |field: &str| -> Result<Option<String>, String> {
        match row.remove(field) {
            None => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
            Some(Value::Number(n)) if field == "rater" => Ok(Some(n.to_string())),
            Some(other) => Err(format!("field `{field}`: expected text, found {other}")),
        }
    };
    let episode_id = text("episode_id")?;
    let task_id = text("task_id")?;
    let suite = text("suite")?;
    let scorer = text("scorer")?.ok_or("field `scorer`: missing (the scorer the verdict is about, e.g. llm_rubric)")?;
    let rater = text("rater")?;
    let explanation = text("explanation")?;
    text("ts")?;
    match row.remove("score") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_f64().is_some_and(|s| (0.0..=1.0).contains(&s)) => {}
        Some(other) => return Err(format!("field `score`: expected a number from 0 to 1, found {other}")),
    }
    if episode_id.is_none() && task_id.is_none() {
        return Err("field `episode_id`: missing; give an `episode_id` or a `task_id`".into());
    }
    if episode_id.is_some() && task_id.is_some() {
        return Err("field `task_id`: give an `episode_id` or a `task_id`, not both".into());
    }
    let passed = match row.remove("verdict") {
        None => return Err("field `verdict`: missing (pass or fail)".into()),
        Some(v) => verdict(&v).ok_or_else(|| {
            format!("field `verdict`: {v} is not a verdict: pass or fail (also passed/failed, true/false, yes/no, 1/0)")
        })?,
    };
    Ok(Label { line, episode_id, task_id, suite, scorer, passed, rater, explanation })
}

fn verdict(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::Number(n) if n.as_f64() == Some(1.0) => Some(true),
        Value::Number(n) if n.as_f64() == Some(0.0) => Some(false),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "pass" | "passed" | "true" | "yes" | "1" => Some(true),
            "fail" | "failed" | "false" | "no" | "0" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// One graded scorer's verdict on an episode, as its `score` event logged it.
#[derive(Debug, Clone)]
struct JudgeScore {
    scoring: usize,
    scorer: String,
    passed: bool,
    samples: u32,
    agreement: Option<f64>,
    judge: Option<Arc<str>>,
    /// Kept only for the episodes a label names.
    explanation: Option<String>,
}

/// The fields of a `score` event the check reads, tested against the event.
#[derive(Debug, Deserialize)]
struct ScoreView {
    #[serde(default = "initial")]
    scoring_id: String,
    scorer: String,
    passed: bool,
    #[serde(default)]
    explanation: String,
    #[serde(default)]
    grader: Option<GraderView>,
}

fn initial() -> String {
    INITIAL_SCORING.to_owned()
}

/// What a grader's provenance says of its samples (`scoring/checks/graded.rs` writes it).
#[derive(Debug, Deserialize)]
struct GraderView {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    samples: Option<u32>,
    #[serde(default)]
    agreement: Option<f64>,
}

/// An episode's latest attempt, as the fold keeps it.
struct Judged {
    suite: Arc<str>,
    task_id: Arc<str>,
    epoch: u32,
    scores: Vec<JudgeScore>,
}

/// The judge and people disagree on an episode.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    pub episode_id: String,
    pub suite: String,
    pub task_id: String,
    pub epoch: u32,
    pub judge_passed: bool,
    pub judge_explanation: String,
    pub people_passed: bool,
    pub rater: Option<String>,
    pub people_explanation: Option<String>,
}

/// How often the judge's samples agreed with their majority.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Consistency {
    /// Episodes graded with two samples or more.
    pub episodes: u64,
    /// The mean share of samples on the majority side.
    pub mean_agreement: Option<f64>,
    /// The share of those episodes whose samples all agreed.
    pub unanimous: Option<f64>,
}

/// One graded scorer checked against people.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScorerCheck {
    pub scorer: String,
    /// The judge models that graded it.
    pub judges: Vec<String>,
    /// Episodes it gave a verdict on.
    pub episodes: u64,
    /// Episodes with at least one label.
    pub labelled_episodes: u64,
    /// Pairs (a person's verdict, the judge's) counted.
    pub confusion: Confusion,
    pub accuracy: Option<f64>,
    pub kappa: Option<f64>,
    /// The people who rated it.
    pub raters: usize,
    /// Krippendorff's alpha (nominal) among people alone, and with the judge as one more
    /// rater: only with two raters or more.
    pub alpha_people: Option<f64>,
    pub alpha_with_judge: Option<f64>,
    pub consistency: Consistency,
    pub disagreements: Vec<Disagreement>,
}

/// A label that could not be used, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Unmatched {
    pub line: usize,
    pub names: String,
    pub scorer: String,
    pub why: String,
}

/// The whole check.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JudgeCheck {
    pub scoring: String,
    pub labels: usize,
    /// Labels on episodes as a whole (scorer `episode`): no judge's verdict to check.
    pub episode_labels: usize,
    pub scorers: Vec<ScorerCheck>,
    /// Labels naming an episode or task the run does not have.
    pub not_in_run: Vec<Unmatched>,
    /// Labels naming an episode the scorer gave no verdict on (unscored, another scorer).
    pub no_verdict: Vec<Unmatched>,
}

/// Checks the judge of the run whose log is `events` against `labels`, under `scoring`
/// (by default each episode's latest scoring). A scoring id the run does not have is an
/// error that names the ones it has.
pub fn check(events: &Path, labels: &[Label], scoring: Option<&str>) -> Result<JudgeCheck, String> {
    let (scorings, mut episodes) = read_verdicts(events, labels)?;
    let wanted = match scoring {
        None => None,
        Some(id) => match scorings.iter().rposition(|s| s == id) {
            Some(at) => Some(at),
            None => {
                return Err(format!("the run has no scoring `{id}`; its scorings are: {}", scorings.join(", ")));
            }
        },
    };
    keep_scoring(&mut episodes, wanted);
    let by_task = episodes_by_task(&episodes);
    let (mut checks, judges) = scorer_checks(&episodes);
    let mut result =
        JudgeCheck { scoring: scoring.unwrap_or("latest").to_owned(), labels: labels.len(), ..JudgeCheck::default() };
    let (units, raters) = match_labels(labels, (&episodes, &by_task), &mut checks, &mut result)?;
    finish_checks(&mut checks, judges, units, raters);
    result.scorers = checks.into_values().collect();
    Ok(result)
}

/// The run's scorings in order (the first the initial one), and each episode's graders'
/// verdicts under all of them; the explanations kept only for the episodes a label names.
fn read_verdicts(events: &Path, labels: &[Label]) -> Result<(Vec<String>, HashMap<String, Judged>), String> {
    let labelled_ids: HashSet<&str> = labels.iter().filter_map(|l| l.episode_id.as_deref()).collect();
    let labelled_tasks: HashSet<&str> = labels.iter().filter_map(|l| l.task_id.as_deref()).collect();
    let mut scorings: Vec<String> = vec![INITIAL_SCORING.to_owned()];
    let mut episodes: HashMap<String, Judged> = HashMap::new();
    let mut names: HashSet<Arc<str>> = HashSet::new();
    let mut intern = |name: String| -> Arc<str> {
        if let Some(n) = names.get(name.as_str()) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(n.clone());
        n
    };
    let kinds = ["episode_started", "scoring_started", "score"];
    for_each_line_of(events, Some(&kinds), |kind, text, _| {
        let head: LineHeader = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if kind == "score" {
            // The view, not the event: a grader's score holds every raw output of its samples.
            let Ok(ScoreView { scoring_id, scorer, passed, explanation, grader: Some(grader) }) =
                serde_json::from_str::<ScoreView>(text)
            else {
                return Ok(());
            };
            let Some(id) = head.episode_id else { return Ok(()) };
            let Some(judged) = episodes.get_mut(&id) else { return Ok(()) };
            let at = scorings.iter().rposition(|s| *s == scoring_id).unwrap_or(0);
            let labelled = labelled_ids.contains(id.as_str()) || labelled_tasks.contains(&*judged.task_id);
            judged.scores.push(JudgeScore {
                scoring: at,
                scorer,
                passed,
                samples: grader.samples.unwrap_or(1),
                agreement: grader.agreement,
                judge: grader.model.map(&mut intern),
                explanation: labelled.then_some(explanation),
            });
            return Ok(());
        }
        let Ok(event) = serde_json::from_str::<Event>(text) else { return Ok(()) };
        match event {
            Event::ScoringStarted { scoring_id, .. } => scorings.push(scoring_id),
            Event::EpisodeStarted { suite, task_id, epoch, .. } => {
                if let Some(id) = head.episode_id {
                    // A later attempt replaces the earlier one.
                    let judged = Judged { suite: intern(suite), task_id: intern(task_id), epoch, scores: Vec::new() };
                    episodes.insert(id, judged);
                }
            }
            _ => {}
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok((scorings, episodes))
}

/// Keeps each episode's verdicts under scoring `wanted` (or its latest), the second and
/// later scorers of one name told apart as `name#2`, `name#3`.
fn keep_scoring(episodes: &mut HashMap<String, Judged>, wanted: Option<usize>) {
    for judged in episodes.values_mut() {
        let at = wanted.or_else(|| judged.scores.iter().map(|s| s.scoring).max());
        judged.scores.retain(|s| Some(s.scoring) == at);
        let mut seen: HashMap<String, u32> = HashMap::new();
        for s in &mut judged.scores {
            let n = seen.entry(s.scorer.clone()).or_default();
            *n += 1;
            if *n > 1 {
                s.scorer = format!("{}#{n}", s.scorer);
            }
        }
    }
}

/// A task's episodes by task id, then suite: a label finds its own at once, however many
/// tasks the run has.
fn episodes_by_task(episodes: &HashMap<String, Judged>) -> HashMap<&str, BTreeMap<&str, Vec<&str>>> {
    let mut by_task: HashMap<&str, BTreeMap<&str, Vec<&str>>> = HashMap::new();
    for (id, judged) in episodes {
        by_task.entry(&*judged.task_id).or_default().entry(&*judged.suite).or_default().push(id);
    }
    for ids in by_task.values_mut().flat_map(BTreeMap::values_mut) {
        ids.sort_unstable();
    }

    by_task
}

/// A check per scorer with a verdict, counting its episodes and its samples' agreement;
/// and the judges each scorer was played by.
fn scorer_checks(
    episodes: &HashMap<String, Judged>,
) -> (BTreeMap<String, ScorerCheck>, BTreeMap<String, BTreeSet<String>>) {
    let mut checks: BTreeMap<String, ScorerCheck> = BTreeMap::new();
    let mut judges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for judged in episodes.values() {
        for s in &judged.scores {
            let c = checks
                .entry(s.scorer.clone())
                .or_insert_with(|| ScorerCheck { scorer: s.scorer.clone(), ..ScorerCheck::default() });
            c.episodes += 1;
            if let Some(judge) = &s.judge {
                judges.entry(s.scorer.clone()).or_default().insert(judge.to_string());
            }
            if s.samples >= 2
                && let Some(agreement) = s.agreement
            {
                let k = &mut c.consistency;
                k.episodes += 1;
                k.mean_agreement = Some(k.mean_agreement.unwrap_or(0.0) + agreement);
                k.unanimous = Some(k.unanimous.unwrap_or(0.0) + if agreement >= 1.0 { 1.0 } else { 0.0 });
            }
        }
    }
    (checks, judges)
}

/// What labels are matched to: each scorer's episodes, and each episode's raters.
type Units = BTreeMap<String, BTreeMap<String, Unit>>;

/// Matches each label to the episodes it names and their scorer's verdict, counting each
/// rater's first verdict on an episode against the judge's; a label with no episode or no
/// verdict is listed. Each scorer's units and raters.
#[allow(clippy::type_complexity)]
fn match_labels(
    labels: &[Label],
    (episodes, by_task): (&HashMap<String, Judged>, &HashMap<&str, BTreeMap<&str, Vec<&str>>>),
    checks: &mut BTreeMap<String, ScorerCheck>,
    result: &mut JudgeCheck,
) -> Result<(Units, BTreeMap<String, BTreeSet<String>>), String> {
    // Per scorer, per episode: each rater's verdict (the first label of a rater counts).
    let mut units: BTreeMap<String, BTreeMap<String, Unit>> = BTreeMap::new();
    let mut raters: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for label in labels {
        if label.scorer == EPISODE_LABEL {
            result.episode_labels += 1;
            continue;
        }
        let targets: Vec<&str> = match (&label.episode_id, &label.task_id) {
            (Some(id), _) => episodes.get_key_value(id.as_str()).map(|(k, _)| vec![k.as_str()]).unwrap_or_default(),
            (None, Some(task)) => by_task
                .get(task.as_str())
                .into_iter()
                .flatten()
                .filter(|(suite, _)| label.suite.as_deref().is_none_or(|s| s == **suite))
                .flat_map(|(_, ids)| ids.iter().copied())
                .collect(),
            (None, None) => Vec::new(),
        };
        let unmatched =
            |why: String| Unmatched { line: label.line, names: label.names(), scorer: label.scorer.clone(), why };
        if targets.is_empty() {
            result.not_in_run.push(unmatched("not in the run".into()));
            continue;
        }
        let rater = label.rater.clone().unwrap_or_else(|| "rater".into());
        for id in targets {
            let judged = &episodes[id];
            let Some(score) = judged.scores.iter().find(|s| s.scorer == label.scorer) else {
                result
                    .no_verdict
                    .push(unmatched(format!("{id} has no verdict of `{}` under this scoring", label.scorer)));
                continue;
            };
            let c = checks.get_mut(&label.scorer).ok_or("a scorer with a verdict has a check")?;
            let unit = units
                .entry(label.scorer.clone())
                .or_default()
                .entry(id.to_owned())
                .or_insert_with(|| Unit { judge: score.passed, raters: BTreeMap::new() });
            // The first label of a rater for an episode counts, in every figure alike.
            if unit.raters.contains_key(&rater) {
                continue;
            }
            unit.raters.insert(rater.clone(), label.passed);
            c.confusion.add(label.passed, score.passed);
            raters.entry(label.scorer.clone()).or_default().insert(rater.clone());
            if label.passed != score.passed {
                c.disagreements.push(Disagreement {
                    episode_id: id.to_owned(),
                    suite: judged.suite.to_string(),
                    task_id: judged.task_id.to_string(),
                    epoch: judged.epoch,
                    judge_passed: score.passed,
                    judge_explanation: score.explanation.clone().unwrap_or_default(),
                    people_passed: label.passed,
                    rater: label.rater.clone(),
                    people_explanation: label.explanation.clone(),
                });
            }
        }
    }
    Ok((units, raters))
}

/// Each check's figures once every label is counted: accuracy, kappa, raters, the
/// agreement among people with and without the judge, the samples' consistency, and its
/// disagreements in order.
fn finish_checks(
    checks: &mut BTreeMap<String, ScorerCheck>,
    mut judges: BTreeMap<String, BTreeSet<String>>,
    mut units: Units,
    raters: BTreeMap<String, BTreeSet<String>>,
) {
    for (scorer, c) in checks.iter_mut() {
        c.judges = judges.remove(scorer).map(|j| j.into_iter().collect()).unwrap_or_default();
        c.accuracy = c.confusion.accuracy();
        c.kappa = c.confusion.kappa();
        c.raters = raters.get(scorer).map_or(0, BTreeSet::len);
        let scorer_units = units.remove(scorer).unwrap_or_default();
        c.labelled_episodes = scorer_units.len() as u64;
        if c.raters >= 2 {
            let people: Vec<Vec<bool>> = scorer_units.values().map(|u| u.raters.values().copied().collect()).collect();
            let with_judge: Vec<Vec<bool>> =
                scorer_units.values().map(|u| u.raters.values().copied().chain([u.judge]).collect()).collect();
            c.alpha_people = krippendorff_alpha(&people);
            c.alpha_with_judge = krippendorff_alpha(&with_judge);
        }
        let k = &mut c.consistency;
        if k.episodes > 0 {
            let n = k.episodes as f64;
            k.mean_agreement = k.mean_agreement.map(|s| s / n);
            k.unanimous = k.unanimous.map(|s| s / n);
        }
        c.disagreements.sort_by(|a, b| {
            (&a.suite, &a.task_id, a.epoch, &a.episode_id).cmp(&(&b.suite, &b.task_id, b.epoch, &b.episode_id))
        });
    }
}

impl JudgeCheck {
    /// `--min-kappa`: a line for each labelled scorer whose kappa is below `min` or
    /// undefined, and one when no scorer has labels at all.
    pub fn gate(&self, min: f64) -> Vec<String> {
        let labelled: Vec<&ScorerCheck> = self.scorers.iter().filter(|c| c.confusion.total() > 0).collect();
        if labelled.is_empty() {
            return vec![format!(
                "gate: no label matched a verdict of the judge, so its kappa cannot reach --min-kappa {min}"
            )];
        }
        labelled
            .iter()
            .filter_map(|c| match c.kappa {
                Some(kappa) if kappa >= min => None,
                Some(kappa) => Some(format!("gate: `{}`: the judge's kappa with people is {kappa:.3}, below --min-kappa {min}", c.scorer)),
                None => Some(format!(
                    "gate: `{}`: the judge's kappa with people is undefined (one verdict only on both sides), so it cannot reach --min-kappa {min}",
                    c.scorer
                )),
            })
            .collect()
    }

    /// What the command prints.
    pub fn render(&self) -> String {
        let mut t = format!("judge-check: {} label(s), scoring {}\n", self.labels, self.scoring);
        if self.episode_labels > 0 {
            t += &format!(
                "{} label(s) on whole episodes (scorer `{EPISODE_LABEL}`): no judge's verdict to check them against\n",
                self.episode_labels
            );
        }
        if self.scorers.is_empty() {
            t += "the run has no verdicts of a graded scorer (llm_rubric, model_graded_qa)\n";
        }
        let number = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.3}"));
        for c in &self.scorers {
            let judges = if c.judges.is_empty() { "unknown".to_owned() } else { c.judges.join(", ") };
            t += &format!(
                "\n{}  (judge: {judges}; {} episode(s) graded, {} labelled)\n",
                c.scorer, c.episodes, c.labelled_episodes
            );
            let n = c.confusion.total();
            if n == 0 {
                t += "  no labels for this scorer\n";
            } else {
                t += &format!(
                    "  against people: accuracy {} ({} of {n} pairs), Cohen's kappa {}\n",
                    number(c.accuracy),
                    c.confusion.agreed(),
                    number(c.kappa)
                );
                if c.raters >= 2 {
                    t += &format!(
                        "  Krippendorff's alpha (nominal, {} raters): people {}, people and judge {}\n",
                        c.raters,
                        number(c.alpha_people),
                        number(c.alpha_with_judge)
                    );
                }
                let m = &c.confusion;
                t += "                 judge pass  judge fail\n";
                t += &format!("    people pass  {:>10}  {:>10}\n", m.both_pass, m.people_pass_judge_fail);
                t += &format!("    people fail  {:>10}  {:>10}\n", m.people_fail_judge_pass, m.both_fail);
            }
            let k = &c.consistency;
            if k.episodes == 0 {
                t += "  self-consistency: one sample per verdict (set `samples:` on the scorer to measure it)\n";
            } else {
                t += &format!(
                    "  self-consistency: {} episode(s) with several samples, mean agreement {}, unanimous {}\n",
                    k.episodes,
                    number(k.mean_agreement),
                    k.unanimous.map_or("n/a".to_owned(), |u| format!("{:.1}%", u * 100.0))
                );
            }
            if !c.disagreements.is_empty() {
                t += &format!("  disagreements ({}):\n", c.disagreements.len());
            }
            let verdict = |p: bool| if p { "pass" } else { "fail" };
            for d in c.disagreements.iter().take(SHOWN_DISAGREEMENTS) {
                let rater = d.rater.as_ref().map_or(String::new(), |r| format!(" ({r})"));
                t += &format!(
                    "    {}  {}/{}  epoch {}: judge {}, people {}{rater}\n      judge: {}\n      people: {}\n",
                    d.episode_id,
                    d.suite,
                    d.task_id,
                    d.epoch,
                    verdict(d.judge_passed),
                    verdict(d.people_passed),
                    one_line(&d.judge_explanation, 300),
                    d.people_explanation.as_deref().map_or("(no reason given)".to_owned(), |e| one_line(e, 300)),
                );
            }
            if c.disagreements.len() > SHOWN_DISAGREEMENTS {
                t += &format!(
                    "    … and {} more (--json lists them all)\n",
                    c.disagreements.len() - SHOWN_DISAGREEMENTS
                );
            }
        }
        for (what, list) in
            [("naming nothing in the run", &self.not_in_run), ("without a verdict of their scorer", &self.no_verdict)]
        {
            if list.is_empty() {
                continue;
            }
            t += &format!("\nlabels {what} ({}):\n", list.len());
            for u in list {
                t += &format!("  line {}: {} `{}`: {}\n", u.line, u.names, u.scorer, u.why);
            }
        }
        t
    }
}

/// `text` on one line, at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line,
    }
}

#[cfg(test)]
mod tests;
