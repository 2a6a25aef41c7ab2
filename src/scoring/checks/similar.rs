//! `similar`, `not_similar`: the cosine similarity of the embeddings of the answer and of a
//! text, as promptfoo's `similar` assertion computes it. `similar` passes at or above the
//! threshold with the similarity as its score; `not_similar` passes below it, scoring
//! `1 − similarity`. An embedding model that cannot be reached leaves the episode unscored.

use super::{Answer, CheckResult, Scene};
use crate::model::embedding::cosine;
use crate::scoring::{Graders, ScoringFault};

pub(crate) struct Asked<'a> {
    pub expected: &'a str,
    pub threshold: f64,
    pub embedding: &'a str,
    pub embedding_url: Option<&'a str>,
    pub negate: bool,
}

pub(crate) async fn check(
    scene: &Scene<'_>,
    answer: &Answer<'_>,
    asked: &Asked<'_>,
    graders: &Graders,
) -> Result<CheckResult, ScoringFault> {
    let Some(text) = answer.text() else { return Ok(answer.missing()) };
    let expected = match scene.render(asked.expected) {
        Ok(e) => e,
        Err(failed) => return Ok(failed),
    };
    let embedder = graders.embedder(asked.embedding, asked.embedding_url).map_err(ScoringFault::grader)?;
    let vectors = embedder.embed(&[text, &expected]).await.map_err(ScoringFault::grader)?;
    let Some(similarity) = cosine(&vectors[0], &vectors[1]) else {
        let message = format!(
            "{}: the embeddings cannot be compared (lengths {} and {}, or a zero vector)",
            embedder.name,
            vectors[0].len(),
            vectors[1].len()
        );
        return Err(ScoringFault::grader(message));
    };
    let similar = similarity >= asked.threshold;
    let passed = similar != asked.negate;
    let score = if asked.negate { 1.0 - similarity } else { similarity };
    let relation = if similar { "at or above" } else { "below" };
    let explanation = format!(
        "{} is {similarity:.4} similar to {expected:?} ({}), {relation} the threshold {}",
        answer.subject(text),
        embedder.name,
        asked.threshold
    );
    Ok(CheckResult::valued(passed, score.clamp(0.0, 1.0), explanation))
}
