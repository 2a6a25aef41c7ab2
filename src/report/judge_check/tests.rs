use serde_json::json;

use super::*;
use crate::log::writer::write_line;

fn line(out: &mut Vec<u8>, seq: &mut u64, episode_id: Option<&str>, event: &Event) {
    *seq += 1;
    let body = serde_json::to_vec(event).unwrap();
    write_line(out, "\"r\"", *seq, "2026-01-01T00:00:00Z", episode_id, &body).unwrap();
}

fn score(scoring: &str, scorer: &str, passed: bool, agreement: f64, why: &str) -> Event {
    Event::Score {
        scoring_id: scoring.into(),
        scorer: scorer.into(),
        value: if passed { 1.0 } else { 0.0 },
        passed,
        weight: 1.0,
        explanation: why.into(),
        grader: Some(json!({"model": "mock", "samples": 3, "agreement": agreement})),
        check: Default::default(),
    }
}

/// Four episodes (tasks t1..t4) judged pass, pass, fail, fail by `llm_rubric` with three
/// samples (agreements 1, 2/3, 1, 2/3), each with an `includes` verdict (not graded); then a
/// regrade `r1` that turns e3 to pass.
fn log() -> tempfile::NamedTempFile {
    let (mut out, mut seq) = (Vec::new(), 0);
    let verdicts = [
        ("e1", "t1", true, 1.0),
        ("e2", "t2", true, 2.0 / 3.0),
        ("e3", "t3", false, 1.0),
        ("e4", "t4", false, 2.0 / 3.0),
    ];
    for (id, task, passed, agreement) in verdicts {
        let started = Event::EpisodeStarted {
            suite: "s".into(),
            task_id: task.into(),
            task_digest: "d".into(),
            model: "mock".into(),
            epoch: 1,
            environment: "kv".into(),
            toolset: None,
            variant: None,
            sampling: Default::default(),
            digests: None,
            tags: Vec::new(),
            metadata: Default::default(),
        };
        line(&mut out, &mut seq, Some(id), &started);
        let includes = Event::Score {
            scoring_id: "initial".into(),
            scorer: "includes".into(),
            value: 1.0,
            passed: true,
            weight: 1.0,
            explanation: "contains it".into(),
            grader: None,
            check: Default::default(),
        };
        line(&mut out, &mut seq, Some(id), &includes);
        line(
            &mut out,
            &mut seq,
            Some(id),
            &score("initial", "llm_rubric", passed, agreement, &format!("judge on {id}")),
        );
    }
    let regrade = Event::ScoringStarted { scoring_id: "r1".into(), command_line: vec![], grader: None, suites: vec![] };
    line(&mut out, &mut seq, None, &regrade);
    line(&mut out, &mut seq, Some("e3"), &score("r1", "llm_rubric", true, 1.0, "the new judge on e3"));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), out).unwrap();
    file
}

fn labels(text: &str, extension: &str) -> Result<Vec<Label>, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("labels.{extension}"));
    std::fs::write(&path, text).unwrap();
    read_labels(&path).map_err(|e| e.replace(&dir.path().display().to_string(), "DIR"))
}

/// Raters a and b on the four episodes; a label of an episode the run does not have; a
/// label of a scorer that is not graded.
const LABELS: &str = "episode_id,task_id,scorer,verdict,rater,explanation
e1,,llm_rubric,pass,a,
e2,,llm_rubric,fail,a,misses the point
e3,,llm_rubric,fail,a,
e4,,llm_rubric,fail,a,
e1,,llm_rubric,pass,b,
e2,,llm_rubric,pass,b,
e3,,llm_rubric,yes,b,good enough
e4,,llm_rubric,no,b,
ghost,,llm_rubric,pass,a,
,t1,includes,pass,a,
";

#[test]
fn kappa_alpha_and_consistency_against_hand_computed_values() {
    let file = log();
    let labels = labels(LABELS, "csv").unwrap();
    let checked = check(file.path(), &labels, Some("initial")).unwrap();
    let rubric = checked.scorers.iter().find(|c| c.scorer == "llm_rubric").unwrap();
    // Pairs (people, judge): a: (P,P) (F,P) (F,F) (F,F); b: (P,P) (P,P) (P,F) (F,F).
    //   both pass 3, people pass & judge fail 1, people fail & judge pass 1, both fail 3
    //   p_o = 6/8 = 0.75; people pass 4/8, judge pass 4/8: p_e = 0.5*0.5 + 0.5*0.5 = 0.5
    //   kappa = (0.75 - 0.5) / (1 - 0.5) = 0.5
    let c = rubric.confusion;
    assert_eq!((c.both_pass, c.people_pass_judge_fail, c.people_fail_judge_pass, c.both_fail), (3, 1, 1, 3));
    assert_eq!(rubric.accuracy, Some(0.75));
    assert_eq!(rubric.kappa, Some(0.5));
    // Alpha among people: units [P,P] [F,P] [F,P] [F,F]: o_PP = 2, o_FF = 2, o_PF = o_FP = 2,
    //   n_P = n_F = 4, n = 8: alpha = 1 - 7 * 4 / (2 * 4 * 4) = 1 - 28/32 = 0.125.
    assert!((rubric.alpha_people.unwrap() - 0.125).abs() < 1e-12, "{rubric:?}");
    // With the judge as a third rater: [P,P,P] [F,P,P] [F,P,F] [F,F,F], each pair weighted 1/2:
    //   o_PP = 3 + 1 = 4, o_FF = 3 + 1 = 4, o_PF = o_FP = 1 + 1 = 2; n_P = n_F = 6, n = 12:
    //   alpha = 1 - 11 * 4 / (2 * 6 * 6) = 1 - 44/72 = 7/18.
    assert!((rubric.alpha_with_judge.unwrap() - 7.0 / 18.0).abs() < 1e-12, "{rubric:?}");
    assert_eq!((rubric.raters, rubric.episodes, rubric.labelled_episodes), (2, 4, 4));
    // Self-consistency: agreements 1, 2/3, 1, 2/3: mean 5/6, unanimous 2 of 4.
    assert!((rubric.consistency.mean_agreement.unwrap() - 5.0 / 6.0).abs() < 1e-12);
    assert_eq!((rubric.consistency.episodes, rubric.consistency.unanimous), (4, Some(0.5)));
    let disagreed: Vec<(&str, Option<&str>, &str, Option<&str>)> = rubric
        .disagreements
        .iter()
        .map(|d| {
            (d.episode_id.as_str(), d.rater.as_deref(), d.judge_explanation.as_str(), d.people_explanation.as_deref())
        })
        .collect();
    assert_eq!(
        disagreed,
        [
            ("e2", Some("a"), "judge on e2", Some("misses the point")),
            ("e3", Some("b"), "judge on e3", Some("good enough"))
        ]
    );
    assert_eq!(checked.not_in_run.len(), 1);
    assert_eq!((checked.not_in_run[0].line, checked.not_in_run[0].names.as_str()), (10, "episode ghost"));
    assert_eq!(checked.no_verdict.len(), 1, "the `includes` scorer is not graded: {checked:?}");
    assert_eq!(checked.no_verdict[0].line, 11);
    let text = checked.render();
    assert!(text.contains("accuracy 0.750 (6 of 8 pairs), Cohen's kappa 0.500"), "{text}");
    assert!(text.contains("Krippendorff's alpha (nominal, 2 raters): people 0.125, people and judge 0.389"), "{text}");
    assert!(text.contains("line 10: episode ghost `llm_rubric`: not in the run"), "{text}");
    assert_eq!(checked.gate(0.5), Vec::<String>::new());
    assert_eq!(checked.gate(0.6).len(), 1);
}

#[test]
fn the_latest_scoring_counts_unless_another_is_named() {
    let file = log();
    let labels = labels(LABELS, "csv").unwrap();
    let latest = check(file.path(), &labels, None).unwrap();
    let rubric = &latest.scorers[0];
    // The regrade turned e3 to pass: a's (F, P) now disagrees, b's (P, P) agrees.
    let c = rubric.confusion;
    assert_eq!((c.both_pass, c.people_pass_judge_fail, c.people_fail_judge_pass, c.both_fail), (4, 0, 2, 2));
    assert_eq!(
        rubric.disagreements.iter().find(|d| d.episode_id == "e3").unwrap().judge_explanation,
        "the new judge on e3"
    );
    let regraded = check(file.path(), &labels, Some("r1")).unwrap();
    assert_eq!(regraded.scorers[0].episodes, 1, "only e3 was regraded");
    assert_eq!(
        check(file.path(), &labels, Some("r9")).unwrap_err(),
        "the run has no scoring `r9`; its scorings are: initial, r1"
    );
}

#[test]
fn task_labels_cover_every_episode_of_the_task_and_jsonl_reads_as_csv() {
    let file = log();
    let labels = labels(
        "{\"task_id\": \"t1\", \"scorer\": \"llm_rubric\", \"verdict\": true}\n\n{\"task_id\": \"t9\", \"suite\": \"s\", \"scorer\": \"llm_rubric\", \"verdict\": 0}\n",
        "jsonl",
    )
    .unwrap();
    let checked = check(file.path(), &labels, None).unwrap();
    assert_eq!(checked.scorers[0].confusion.both_pass, 1);
    assert_eq!(checked.scorers[0].raters, 1);
    assert_eq!(checked.scorers[0].alpha_people, None, "alpha needs two raters");
    assert_eq!(checked.not_in_run[0].names, "task s/t9");
    assert_eq!(checked.not_in_run[0].line, 3);
}

#[test]
fn a_bad_label_names_its_file_line_and_field() {
    let cases = [
        (
            "episode_id,scorer,verdict\ne1,llm_rubric,maybe\n",
            "csv",
            "DIR/labels.csv:2: field `verdict`: \"maybe\" is not a verdict",
        ),
        ("episode_id,scorer,verdict,grade\n", "csv", "DIR/labels.csv:1: unknown column `grade`"),
        ("scorer,verdict\nllm_rubric,pass\n", "csv", "DIR/labels.csv:2: field `episode_id`: missing"),
        ("episode_id,verdict\ne1,pass\n", "csv", "DIR/labels.csv:2: field `scorer`: missing"),
        (
            "{\"episode_id\": \"e1\", \"scorer\": \"s\", \"verdict\": \"pass\"}\n{\"episode_id\": 3}\n",
            "jsonl",
            "DIR/labels.jsonl:2: field `episode_id`: expected text, found 3",
        ),
        ("{\"episode_id\": \"e1\"\n", "jsonl", "DIR/labels.jsonl:1: not a JSON object"),
        ("a\tb\n", "tsv", "DIR/labels.tsv: a labels file is .csv or .jsonl"),
        ("episode_id,scorer,verdict\n", "csv", "DIR/labels.csv: no labels"),
    ];
    for (text, extension, expected) in cases {
        let error = labels(text, extension).unwrap_err();
        assert!(error.starts_with(expected), "{error}\n  expected: {expected}");
    }
}

#[test]
fn the_score_view_reads_what_the_event_writes() {
    let event = score("r1", "llm_rubric", true, 2.0 / 3.0, "why");
    let view: ScoreView = serde_json::from_value(serde_json::to_value(&event).unwrap()).unwrap();
    assert_eq!(
        (view.scoring_id.as_str(), view.scorer.as_str(), view.passed, view.explanation.as_str()),
        ("r1", "llm_rubric", true, "why")
    );
    let grader = view.grader.unwrap();
    assert_eq!((grader.model.as_deref(), grader.samples, grader.agreement), (Some("mock"), Some(3), Some(2.0 / 3.0)));
}

#[test]
fn a_raters_repeated_label_counts_once_in_every_figure() {
    let file = log();
    // The same person labels t1's episode twice, `fail` both times: one pair, not two.
    let twice = "{\"task_id\": \"t1\", \"scorer\": \"llm_rubric\", \"verdict\": false}\n";
    let labels = labels(&format!("{twice}{twice}"), "jsonl").unwrap();
    let checked = check(file.path(), &labels, None).unwrap();
    let c = checked.scorers[0].confusion;
    assert_eq!(c.both_pass + c.people_pass_judge_fail + c.people_fail_judge_pass + c.both_fail, 1, "{c:?}");
    assert_eq!(checked.scorers[0].disagreements.len() as u64, c.people_fail_judge_pass + c.people_pass_judge_fail);
}

#[test]
fn a_column_named_twice_is_refused() {
    let err = labels("episode_id,scorer,verdict,verdict\ne1,llm_rubric,pass,fail\n", "csv").unwrap_err();
    assert_eq!(err, "DIR/labels.csv:1: column `verdict` appears twice (column 4), each column once");
}

#[test]
fn many_raters_are_counted_in_time_linear_in_their_labels() {
    // 300,000 labels: 75,000 raters on each of four tasks. Pair by pair, Krippendorff's
    // alpha took 75,000² steps per unit; counted by value it takes 75,000.
    let raters = 75_000;
    let mut many = Vec::with_capacity(4 * raters);
    for (task, passed) in [("t1", true), ("t2", true), ("t3", false), ("t4", false)] {
        for r in 0..raters {
            many.push(Label {
                line: many.len() + 2,
                episode_id: None,
                task_id: Some(task.into()),
                suite: None,
                scorer: "llm_rubric".into(),
                passed,
                rater: Some(format!("r{r}")),
                explanation: None,
            });
        }
    }
    let log = log();
    let check = check(log.path(), &many, None).unwrap();
    let c = &check.scorers[0];
    assert_eq!((c.raters, c.labelled_episodes, c.confusion.total()), (raters, 4, 4 * raters as u64));
    assert_eq!(c.alpha_people, Some(1.0), "the people agree on every episode");
    // With the judge (pass, pass, pass under r1, fail): one pair of values differs, in t3's
    // unit of 75,001: o(T,F) = o(F,T) = 1, n(T) = 150,003, n(F) = 150,001.
    let expected = 1.0 - 300_003.0 / (150_003.0 * 150_001.0);
    let alpha = c.alpha_with_judge.unwrap();
    assert!((alpha - expected).abs() < 1e-9, "{alpha} != {expected}");
}
