//! `runner judge-check` through the binary, on a mock run graded by a scripted judge: the
//! numbers people read, labels naming nothing in the run, the `--min-kappa` gate, a regrade
//! checked by its scoring id, and bad labels as usage errors.

use serde_json::Value;

use crate::Sandbox;

/// Three tasks graded by `llm_rubric` with three scripted samples each: the judge passes
/// `sky` (unanimous) and `sea` (two of three), and fails `grass` (unanimous).
const SUITE: &str = r#"
suite: judged
environment: kv
grader: {model: mock}
tasks:
  - id: sky
    input: Why is the sky blue?
    scorers:
      - llm_rubric: Mentions scattering.
        samples: 3
        mock: ["Names scattering.\n{\"score\": 1}", "Good.\n{\"score\": 0.9}", "Fine.\n{\"score\": 0.8}"]
    mock: [{text: "Rayleigh scattering."}]
  - id: sea
    input: Why is the sea blue?
    scorers:
      - llm_rubric: Mentions absorption of red light.
        samples: 3
        mock: ["Says absorption.\n{\"score\": 1}", "Vague.\n{\"score\": 0.2}", "Close enough.\n{\"score\": 0.7}"]
    mock: [{text: "It reflects the sky."}]
  - id: grass
    input: Why is grass green?
    scorers:
      - llm_rubric: Mentions chlorophyll.
        samples: 3
        mock: ["No chlorophyll.\n{\"score\": 0}", "Missing.\n{\"score\": 0.1}", "Wrong.\n{\"score\": 0}"]
    mock: [{text: "Chlorophyll reflects green light."}]
"#;

/// People: two raters; `sea` is wrong to them (the judge passed it), `grass` is right to
/// one of them (the judge failed it); one label names a task the run does not have.
const LABELS: &str = "task_id,scorer,verdict,rater,explanation
sky,llm_rubric,pass,ann,
sea,llm_rubric,fail,ann,reflection is not the reason
grass,llm_rubric,pass,ann,chlorophyll is named
sky,llm_rubric,pass,bob,
sea,llm_rubric,fail,bob,
grass,llm_rubric,fail,bob,
moon,llm_rubric,pass,bob,
";

fn judged() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    sb.write("labels.csv", LABELS);
    let run = sb.eval(&["s.yaml"]);
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    sb
}

#[test]
fn judge_check_reports_agreement_with_people_and_gates_on_kappa() {
    let sb = judged();
    let run = sb.run(&["judge-check", "test", "--labels", "labels.csv"]);
    assert_eq!(run.code, 0, "{run:?}");
    // Pairs (people, judge): sky (P,P) x2; sea (F,P) x2; grass (P,F), (F,F).
    //   both pass 2, people fail & judge pass 2, people pass & judge fail 1, both fail 1
    //   p_o = 3/6 = 0.5; people pass 3/6, judge pass 4/6:
    //   p_e = 1/2 * 2/3 + 1/2 * 1/3 = 1/2; kappa = (0.5 - 0.5) / 0.5 = 0
    assert!(run.stdout.contains("accuracy 0.500 (3 of 6 pairs), Cohen's kappa 0.000"), "{run:?}");
    // Alpha among people: [P,P] [F,F] [P,F]: o_PP = 2, o_FF = 2, o_PF = o_FP = 1; n_P = n_F = 3,
    //   n = 6: alpha = 1 - 5 * 2 / (2 * 3 * 3) = 1 - 10/18 = 0.444.
    // With the judge as a third rater: [P,P,P] [F,F,P] [P,F,F], pairs weighted 1/2: o_PP = 3,
    //   o_FF = 1 + 1 = 2, o_PF = o_FP = 1 + 1 = 2; n_P = 5, n_F = 4, n = 9:
    //   alpha = 1 - 8 * 4 / (2 * 5 * 4) = 0.2.
    assert!(
        run.stdout.contains("Krippendorff's alpha (nominal, 2 raters): people 0.444, people and judge 0.200"),
        "{run:?}"
    );
    // Self-consistency: agreements 1, 2/3, 1: mean 0.889, unanimous 2 of 3.
    assert!(run.stdout.contains("3 episode(s) with several samples, mean agreement 0.889, unanimous 66.7%"), "{run:?}");
    assert!(run.stdout.contains("judged/sea  epoch 1: judge pass, people fail (ann)"), "{run:?}");
    assert!(run.stdout.contains("      people: reflection is not the reason"), "{run:?}");
    assert!(run.stdout.contains("line 8: task moon `llm_rubric`: not in the run"), "{run:?}");
    let gated = sb.run(&["judge-check", "test", "--labels", "labels.csv", "--min-kappa", "0.4"]);
    assert_eq!(gated.code, 1, "{gated:?}");
    assert!(
        gated.stderr.contains("gate: `llm_rubric`: the judge's kappa with people is 0.000, below --min-kappa 0.4"),
        "{gated:?}"
    );
    let json = sb.run(&["judge-check", "test", "--labels", "labels.csv", "--json", "--scoring", "initial"]);
    let checked: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(checked["scorers"][0]["confusion"]["people_fail_judge_pass"], 2, "{checked}");
    assert_eq!(checked["not_in_run"][0]["line"], 8);
}

#[test]
fn a_regraded_run_is_checked_under_its_latest_scoring_or_the_one_named() {
    let sb = judged();
    let regrade = sb.run(&["regrade", "results/test"]);
    assert!(regrade.code == 0 || regrade.code == 1, "{regrade:?}");
    let scoring = regrade
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("scoring `"))
        .and_then(|l| l.split('`').next())
        .unwrap()
        .to_owned();
    let latest = sb.run(&["judge-check", "test", "--labels", "labels.csv", "--json"]);
    let named = sb.run(&["judge-check", "test", "--labels", "labels.csv", "--json", "--scoring", &scoring]);
    let latest: Value = serde_json::from_str(&latest.stdout).unwrap();
    let named: Value = serde_json::from_str(&named.stdout).unwrap();
    assert_eq!(latest["scorers"], named["scorers"]);
    let missing = sb.run(&["judge-check", "test", "--labels", "labels.csv", "--scoring", "nope"]);
    assert_eq!(missing.code, 2, "{missing:?}");
    assert!(
        missing.stderr.contains(&format!("the run has no scoring `nope`; its scorings are: initial, {scoring}")),
        "{missing:?}"
    );
}

#[test]
fn bad_labels_are_a_usage_error_naming_file_line_and_field() {
    let sb = judged();
    sb.write("bad.csv", "task_id,scorer,verdict\nsky,llm_rubric,perhaps\n");
    let run = sb.run(&["judge-check", "test", "--labels", "bad.csv"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("error: bad.csv:2: field `verdict`: \"perhaps\" is not a verdict"), "{run:?}");
}
