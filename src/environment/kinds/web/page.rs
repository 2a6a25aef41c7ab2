//! Pages as a model reads them: HTML turned into Markdown (`htmd`), a page's title, CSS
//! selections (`scraper`), and the cut at the output cap with a visible marker. Pure
//! functions: no I/O here.

use scraper::{Html, Selector};

/// A page's body as it was stored or served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Html,
    /// Markdown or plain text: shown as it is.
    Text,
}

/// A page ready for the tools: its address, title, the text the model reads, and the
/// HTML that selectors run on (none for a text page).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub url: String,
    pub title: String,
    pub text: String,
    pub html: Option<String>,
}

impl Page {
    /// A page from a body of `format`; `title` when the body names none.
    pub fn of(url: &str, body: String, format: Format, title: Option<String>) -> Page {
        match format {
            Format::Html => {
                let title = title.or_else(|| title_of_html(&body)).unwrap_or_else(|| url.to_owned());
                Page { url: url.to_owned(), title, text: html_to_markdown(&body), html: Some(body) }
            }
            Format::Text => {
                let title = title.or_else(|| title_of_text(&body)).unwrap_or_else(|| url.to_owned());
                Page { url: url.to_owned(), title, text: body, html: None }
            }
        }
    }
}

/// The `<title>` of a document, or its first `<h1>`, whitespace collapsed.
pub fn title_of_html(html: &str) -> Option<String> {
    let document = Html::parse_document(html);
    ["title", "h1"].iter().find_map(|tag| {
        let selector = Selector::parse(tag).ok()?;
        let element = document.select(&selector).next()?;
        let title = collapse(&element.text().collect::<String>());
        (!title.is_empty()).then_some(title)
    })
}

/// The first Markdown heading of a text, or its first non-empty line.
pub fn title_of_text(text: &str) -> Option<String> {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let title = first.trim_start_matches('#').trim();
    (!title.is_empty()).then(|| title.chars().take(200).collect())
}

/// Readable Markdown for an HTML document; scripts, styles and the head are dropped.
pub fn html_to_markdown(html: &str) -> String {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec!["head", "script", "style", "noscript", "template", "iframe", "svg"])
        .build();
    match converter.convert(html) {
        Ok(markdown) => markdown.trim().to_owned(),
        // htmd's errors are I/O errors of its own buffers; the text is still worth reading.
        Err(_) => {
            let document = Html::parse_document(html);
            collapse(&document.root_element().text().collect::<Vec<_>>().join(" "))
        }
    }
}

/// The text of every element of `html` that `selector` matches, in document order.
pub fn select(html: &str, selector: &str) -> Result<Vec<String>, String> {
    let parsed = Selector::parse(selector).map_err(|e| format!("`{selector}` is not a valid CSS selector: {e}"))?;
    let document = Html::parse_document(html);
    Ok(document.select(&parsed).map(|e| collapse(&e.text().collect::<Vec<_>>().join(" "))).collect())
}

/// Runs of whitespace as one space, trimmed.
pub fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to at most `cap` bytes (on a character boundary) with a visible marker
/// saying how much was kept; `true` when something was cut.
pub fn cut(text: &str, cap: usize) -> (String, bool) {
    if text.len() <= cap {
        return (text.to_owned(), false);
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let marker = format!("\n[... content truncated: showing {end} of {} bytes ...]", text.len());
    (format!("{}{marker}", &text[..end]), true)
}

/// About `width` bytes of `text` around the first place a word of `query` occurs (its
/// start when none does), whitespace collapsed.
pub fn snippet(text: &str, query: &str, width: usize) -> String {
    // ASCII lowering keeps byte offsets, so a position found in it is one in `text`.
    let lowered = text.to_ascii_lowercase();
    let at = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .filter_map(|w| lowered.find(&w.to_ascii_lowercase()))
        .min()
        .unwrap_or(0);
    let mut start = at.saturating_sub(width / 4);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + width).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut shown = collapse(&text[start..end]);
    if start > 0 {
        shown.insert_str(0, "… ");
    }
    if end < text.len() {
        shown.push_str(" …");
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "<html><head><title> The  Fox </title><style>p{}</style></head>\
        <body><h1>Foxes</h1><p class=\"lead\">A <b>quick</b> fox.</p><script>var x = 1;</script>\
        <ul><li>one</li><li>two</li></ul></body></html>";

    #[test]
    fn html_becomes_markdown_without_scripts_or_styles() {
        let page = Page::of("https://x/fox", PAGE.into(), Format::Html, None);
        assert_eq!(page.title, "The Fox");
        assert!(page.text.contains("# Foxes"), "{}", page.text);
        assert!(page.text.contains("A **quick** fox."), "{}", page.text);
        assert!(!page.text.contains("var x"), "{}", page.text);
        assert!(!page.text.contains("p{}"), "{}", page.text);
    }

    #[test]
    fn selectors_pick_elements_and_a_bad_one_is_named() {
        assert_eq!(select(PAGE, "li").unwrap(), ["one", "two"]);
        assert_eq!(select(PAGE, "p.lead").unwrap(), ["A quick fox."]);
        assert!(select(PAGE, "table").unwrap().is_empty());
        assert!(select(PAGE, "p[").unwrap_err().contains("`p[`"));
    }

    #[test]
    fn a_text_page_is_titled_by_its_first_heading() {
        let page = Page::of("u", "\n# Otters\nThey swim.".into(), Format::Text, None);
        assert_eq!(page.title, "Otters");
        assert!(page.html.is_none());
    }

    #[test]
    fn the_cut_keeps_whole_characters_and_says_how_much() {
        assert_eq!(cut("short", 10), ("short".to_string(), false));
        // "é" is two bytes: a cap of 2 inside "aé" falls in it, so one byte is kept.
        let (text, cut_off) = cut("aéz", 2);
        assert!(cut_off);
        assert_eq!(text, "a\n[... content truncated: showing 1 of 4 bytes ...]");
    }

    #[test]
    fn a_snippet_shows_the_first_query_word() {
        let text = format!("{} otters hold hands while sleeping {}", "x ".repeat(100), "y ".repeat(100));
        let s = snippet(&text, "Otters", 60);
        assert!(s.contains("otters hold hands"), "{s}");
        assert!(s.starts_with("… ") && s.ends_with(" …"), "{s}");
    }
}
