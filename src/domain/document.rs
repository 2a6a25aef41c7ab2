//! A document as headed sections, read from and written as Markdown: what the writing room
//! keeps, and what the `document:` scorer reads back from any world. Headings are ATX lines
//! (`## Results`) outside code fences; the text before the first heading is the preamble.

use serde::Serialize;

/// One section: its heading (level 1 to 6) and the text under it, up to the next heading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Section {
    pub level: u8,
    pub heading: String,
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Document {
    /// The text before the first heading.
    pub preamble: String,
    pub sections: Vec<Section>,
}

/// One line of an outline: a heading and how many words its section holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutlineEntry {
    pub level: u8,
    pub heading: String,
    pub words: usize,
}

/// Words as people count them: runs of non-whitespace.
pub fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

impl Document {
    /// Reads Markdown: every ATX heading outside a fenced code block starts a section.
    pub fn parse_markdown(text: &str) -> Document {
        let mut doc = Document::default();
        let mut body: Vec<&str> = Vec::new();
        let mut in_fence = false;
        let flush = |doc: &mut Document, body: &mut Vec<&str>| {
            let text = body.join("\n").trim().to_owned();
            body.clear();
            match doc.sections.last_mut() {
                Some(section) => section.text = text,
                None => doc.preamble = text,
            }
        };
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                in_fence = !in_fence;
            }
            match (!in_fence).then(|| heading_of(line)).flatten() {
                Some((level, heading)) => {
                    flush(&mut doc, &mut body);
                    doc.sections.push(Section { level, heading, text: String::new() });
                }
                None => body.push(line),
            }
        }
        flush(&mut doc, &mut body);
        doc
    }

    /// Writes Markdown: the preamble, then each heading and its text, a blank line apart.
    pub fn to_markdown(&self) -> String {
        let mut parts = Vec::new();
        if !self.preamble.trim().is_empty() {
            parts.push(self.preamble.trim().to_owned());
        }
        for s in &self.sections {
            let heading = format!("{} {}", "#".repeat(usize::from(s.level.clamp(1, 6))), s.heading);
            parts.push(heading);
            if !s.text.trim().is_empty() {
                parts.push(s.text.trim().to_owned());
            }
        }
        let mut text = parts.join("\n\n");
        text.push('\n');
        text
    }

    /// The words of the body: the preamble and every section's text, headings not counted.
    pub fn words(&self) -> usize {
        word_count(&self.preamble) + self.sections.iter().map(|s| word_count(&s.text)).sum::<usize>()
    }

    pub fn outline(&self) -> Vec<OutlineEntry> {
        self.sections
            .iter()
            .map(|s| OutlineEntry { level: s.level, heading: s.heading.clone(), words: word_count(&s.text) })
            .collect()
    }

    /// The index of the section headed `heading` (case and surrounding spaces ignored).
    pub fn find(&self, heading: &str) -> Option<usize> {
        let wanted = heading.trim().to_lowercase();
        self.sections.iter().position(|s| s.heading.trim().to_lowercase() == wanted)
    }
}

/// `## Results` → (2, "Results"); not a heading → None. A closing run of `#` is dropped.
fn heading_of(line: &str) -> Option<(u8, String)> {
    // Up to three spaces of indent, as CommonMark allows.
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let level = rest.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let after = &rest[level..];
    if !(after.is_empty() || after.starts_with(' ') || after.starts_with('\t')) {
        return None;
    }
    let text = after.trim();
    // A closing run of `#` after a space is not part of the heading; `C#` keeps its own.
    let stripped = text.trim_end_matches('#');
    let text = if stripped.is_empty() || stripped.ends_with([' ', '\t']) { stripped.trim_end() } else { text };
    Some((level as u8, text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_reads_into_sections_and_back() {
        let text =
            "Intro line.\n\n# Report\n\nOne two three.\n\n## Results ##\nfour five\n\n```\n# not a heading\n```\n";
        let doc = Document::parse_markdown(text);
        assert_eq!(doc.preamble, "Intro line.");
        let headings: Vec<(u8, &str)> = doc.sections.iter().map(|s| (s.level, s.heading.as_str())).collect();
        assert_eq!(headings, [(1, "Report"), (2, "Results")]);
        assert_eq!(doc.sections[1].text, "four five\n\n```\n# not a heading\n```");
        // Preamble 2 + 3 + (2 + 5 in the fence: ``` # not a heading ```).
        assert_eq!(doc.words(), 2 + 3 + 2 + 6);
        let again = Document::parse_markdown(&doc.to_markdown());
        assert_eq!(again, doc);
    }

    #[test]
    fn only_real_headings_count() {
        assert_eq!(heading_of("#hashtag"), None);
        assert_eq!(heading_of("####### seven"), None);
        assert_eq!(heading_of("    # code"), None);
        assert_eq!(heading_of("### Why C#"), Some((3, "Why C#".into())));
        assert_eq!(heading_of("# Done #"), Some((1, "Done".into())));
    }

    #[test]
    fn sections_are_found_by_heading_ignoring_case() {
        let doc = Document::parse_markdown("# A\n## Next Steps\n");
        assert_eq!(doc.find("next steps"), Some(1));
        assert_eq!(doc.find("Later"), None);
    }
}
