//! The writing room end to end: the example suite, the outline in every observation, and
//! document scorers that fail when the document falls short.

use std::path::Path;

use crate::{Sandbox, of_type, tool_observations};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_writing_suite_passes_and_its_observations_carry_the_outline_and_cursor() {
    let sb = Sandbox::new();
    let suite = repo().join("tasks/writing.yaml");
    let run = sb
        .command()
        .current_dir(repo())
        .args(["eval", &suite.display().to_string(), "--model", "mock", "--run-id", "test", "--out"])
        .arg(sb.path().join("results"))
        .output()
        .unwrap();
    let run = crate::Run::from(run);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 3);
    assert!(finished.iter().all(|f| f["outcome"]["passed"] == true), "{finished:?}");

    let observations = tool_observations(&events);
    // The title-case rule and the section word limit each refused one write, naming the rule.
    let errors: Vec<&str> = observations.iter().filter_map(|o| o["error"]["message"].as_str()).collect();
    assert!(errors.iter().any(|m| m.contains("(style.title_case)")), "{errors:?}");
    assert!(errors.iter().any(|m| m.contains("over the limit of 60 words per section")), "{errors:?}");
    // After the last write of q3, the outline is the report in its final order.
    let outlines: Vec<Vec<&str>> = observations
        .iter()
        .filter(|o| o["info"]["cursor"]["document"] == "q3")
        .map(|o| o["info"]["outline"].as_array().unwrap().iter().map(|e| e["heading"].as_str().unwrap()).collect())
        .collect();
    assert_eq!(outlines.last().unwrap(), &["Q3 Report", "Summary", "Revenue", "Next Steps"]);
    let scores = of_type(&events, "score");
    let document =
        scores.iter().find(|s| s["scorer"] == "document" && s["explanation"].as_str().unwrap().contains("q3.md"));
    assert!(document.is_some_and(|s| s["passed"] == true), "{scores:?}");
}

const SHORT_REPORT: &str = r#"
suite: short
environment: writing_room
limits: {max_steps: 4}
pass_threshold: 1
scorers:
  - document: doc:r
    sections: [Summary, Risks]
    min_words: 5
  - includes: Risks
    from: r.md
tasks:
  - id: a
    input: write it
    mock:
      - tool_calls:
          - {name: open_doc, arguments: {doc_id: r}}
          - {name: write_section, arguments: {doc_id: r, heading: Summary, text: "Too short."}}
      - text: done
"#;

#[test]
fn document_scorers_fail_a_document_that_falls_short_and_say_why() {
    let sb = Sandbox::new();
    sb.write("tasks/short.yaml", SHORT_REPORT);
    let run = sb.eval(&["tasks/short.yaml"]);
    assert_eq!(run.code, 1, "{run:?}");
    let events = sb.events();
    let scores = of_type(&events, "score");
    let explanations: Vec<(&str, bool)> =
        scores.iter().map(|s| (s["explanation"].as_str().unwrap(), s["passed"].as_bool().unwrap())).collect();
    assert_eq!(
        explanations,
        [
            ("`doc:r`: no section `Risks`; 2 words, under 5", false),
            ("`r.md` was not exported (exports: none; a document's current text is `doc:ID`)", false)
        ]
    );
}
