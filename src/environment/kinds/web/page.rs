//! Pages as a model reads them: HTML turned into Markdown (`htmd`), a page's title, CSS
//! selections (`scraper`), and the cut at the output cap with a visible marker. Pure
//! functions: no I/O here.
//!
//! A document is cut at [`MAX_DEPTH`] levels of nesting before anything else reads it: the
//! Markdown converter recurses once per level, so a page of a hundred thousand nested
//! `<div>`s would overflow the stack of the whole process.

use scraper::{Html, Selector};

/// How deep elements may nest; what lies deeper is replaced by [`DEPTH_MARKER`]. Browsers
/// stop nesting at 512 levels; real pages stay far below this.
pub const MAX_DEPTH: usize = 200;
/// What stands in a page for the elements nested deeper than [`MAX_DEPTH`].
pub const DEPTH_MARKER: &str = "(... elements nested deeper than 200 levels: cut ...)";

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
                let body = bounded(&body).unwrap_or(body);
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

/// `html` with the tags of elements nested deeper than [`MAX_DEPTH`] left out (their text
/// stays) and [`DEPTH_MARKER`] where each such run begins; `None` when nothing is that deep.
///
/// One linear pass over the text, before any parser sees it: the HTML parser checks the
/// whole stack of open elements at each new one, so a page a hundred thousand levels deep
/// takes it hours. The nesting is counted as the parser would see it closely enough that
/// ordinary pages (unclosed `<p>` and `<li>`, stray end tags) are never cut; what slips
/// past this count is bounded by the reading thread's stack and deadline
/// ([`super::read_page`]).
pub fn bounded(html: &str) -> Option<String> {
    let mut open: Vec<String> = Vec::new();
    // The elements left out, innermost last, so that their end tags are left out too.
    let mut dropped: Vec<String> = Vec::new();
    let mut out = String::new();
    let (mut copied, mut at) = (0, 0);
    while let Some(found) = html[at..].find('<') {
        let start = at + found;
        let (end, tag) = scan_tag(html, start);
        at = end.max(start + 1);
        match tag {
            Tag::Start { name, self_closing } => {
                if self_closing || VOID.contains(&name.as_str()) {
                    if !dropped.is_empty() {
                        out.push_str(&html[copied..start]);
                        copied = at;
                    }
                    continue;
                }
                if open.last().is_some_and(|top| closes(top, &name)) {
                    open.pop();
                }
                if open.len() < MAX_DEPTH && dropped.is_empty() {
                    if RAW.contains(&name.as_str()) {
                        at = raw_text_end(html, at, &name);
                    } else {
                        open.push(name);
                    }
                    continue;
                }
                out.push_str(&html[copied..start]);
                if dropped.is_empty() {
                    out.push_str(DEPTH_MARKER);
                }
                copied = at;
                dropped.push(name);
            }
            Tag::End { name } => {
                if dropped.last() == Some(&name) {
                    dropped.pop();
                    out.push_str(&html[copied..start]);
                    copied = at;
                } else if let Some(i) = closed_by(&open, &name) {
                    open.truncate(i);
                }
            }
            Tag::Other => {}
        }
    }
    if out.is_empty() {
        return None;
    }
    out.push_str(&html[copied..]);
    Some(out)
}

enum Tag {
    Start {
        name: String,
        self_closing: bool,
    },
    End {
        name: String,
    },
    /// A comment, a doctype, or a `<` that starts no tag.
    Other,
}

/// The tag that starts at `start` (a `<`), and where it ends.
fn scan_tag(html: &str, start: usize) -> (usize, Tag) {
    let rest = &html[start..];
    let bytes = rest.as_bytes();
    let to_gt = |from: usize| rest[from.min(rest.len())..].find('>').map_or(html.len(), |i| start + from + i + 1);
    if rest.starts_with("<!--") {
        // `<!-->` and `<!--->` end at once, as the parser has it.
        for short in ["<!-->", "<!--->"] {
            if rest.starts_with(short) {
                return (start + short.len(), Tag::Other);
            }
        }
        let end = ["-->", "--!>"].iter().filter_map(|e| rest[4..].find(e).map(|i| 4 + i + e.len())).min();
        return (end.map_or(html.len(), |e| start + e), Tag::Other);
    }
    let closing = bytes.get(1) == Some(&b'/');
    let name_at = 1 + usize::from(closing);
    if !bytes.get(name_at).is_some_and(u8::is_ascii_alphabetic) {
        // `<!doctype>`, `<?…>` and `</ …>` run to the next `>`; a lone `<` is text.
        let tag_like = matches!(bytes.get(1), Some(b'!' | b'?')) || closing;
        return if tag_like { (to_gt(1), Tag::Other) } else { (start + 1, Tag::Other) };
    }
    let name_end = bytes[name_at..]
        .iter()
        .position(|b| b.is_ascii_whitespace() || *b == b'/' || *b == b'>')
        .map_or(bytes.len(), |i| name_at + i);
    let name = rest[name_at..name_end].to_ascii_lowercase();
    // Attributes: a quoted value may hold `>`.
    let mut i = name_end;
    let mut after_equals = false;
    while i < bytes.len() {
        match bytes[i] {
            b'>' => {
                let self_closing = !closing && bytes[i - 1] == b'/';
                let tag = if closing { Tag::End { name } } else { Tag::Start { name, self_closing } };
                return (start + i + 1, tag);
            }
            quote @ (b'"' | b'\'') if after_equals => {
                i = bytes[i + 1..].iter().position(|b| *b == quote).map_or(bytes.len(), |j| i + 1 + j);
                after_equals = false;
            }
            b'=' => after_equals = true,
            b if b.is_ascii_whitespace() => {}
            _ => after_equals = false,
        }
        i += 1;
    }
    (html.len(), Tag::Other)
}

/// Where the text of a `<script>` (or another raw-text element) opened before `from` ends.
fn raw_text_end(html: &str, from: usize, name: &str) -> usize {
    let closing = format!("</{name}");
    let lowered = html[from..].to_ascii_lowercase();
    lowered.find(&closing).map_or(html.len(), |i| from + i)
}

/// Whether a new `name` element closes the open `top` first, as unclosed `<p>`, `<li>` and
/// table cells are closed.
fn closes(top: &str, name: &str) -> bool {
    match top {
        "p" => BLOCKS.contains(&name),
        "li" => name == "li",
        "dt" | "dd" => matches!(name, "dt" | "dd"),
        "td" | "th" => matches!(name, "td" | "th" | "tr"),
        "tr" => name == "tr",
        "option" => matches!(name, "option" | "optgroup"),
        _ => false,
    }
}

/// How many of `open` stay open after the end tag `name`: its element is closed when it is
/// the innermost, or a block a few levels up with no table or template between.
fn closed_by(open: &[String], name: &str) -> Option<usize> {
    if open.last().is_some_and(|top| top == name) {
        return Some(open.len() - 1);
    }
    if !BLOCKS.contains(&name) && !matches!(name, "li" | "dt" | "dd") {
        return None;
    }
    for (i, element) in open.iter().enumerate().rev().take(8) {
        if element == name {
            return Some(i);
        }
        // A table's end tag closes the cell it is in; other ends stop at a table or a cell.
        let cell = matches!(element.as_str(), "td" | "th" | "caption");
        if SCOPES.contains(&element.as_str()) && !(name == "table" && cell) {
            return None;
        }
    }
    None
}

/// Elements that have no end tag.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "param",
    "keygen", "basefont", "bgsound", "frame",
];
/// Elements whose text holds no tags.
const RAW: &[&str] = &["script", "style", "textarea", "title", "xmp", "iframe", "noembed", "noframes", "plaintext"];
/// Blocks: each closes an open `<p>`, and its end tag closes what was left open inside it.
const BLOCKS: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "center",
    "details",
    "dialog",
    "dir",
    "div",
    "dl",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "main",
    "menu",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "ul",
];
/// Elements an end tag does not reach past.
const SCOPES: &[&str] =
    &["table", "td", "th", "caption", "template", "object", "applet", "marquee", "html", "svg", "math"];

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
    fn a_document_nested_deeper_than_the_bound_is_cut_with_a_marker() {
        let depth = 100_000;
        let deep = format!("<title>Deep</title><p>Top.</p>{}bottom{}", "<div>".repeat(depth), "</div>".repeat(depth));
        let page = Page::of("u", deep, Format::Html, None);
        assert_eq!(page.title, "Deep");
        assert!(page.text.contains("Top.") && page.text.contains(DEPTH_MARKER), "{}", page.text);
        assert!(page.text.contains("bottom"), "the text deeper down stays");
        let html = page.html.unwrap_or_default();
        assert!(html.len() < 3000, "{} bytes kept", html.len());
        assert_eq!(select(&html, "div").unwrap().len(), MAX_DEPTH);
        // Unclosed paragraphs, list items and cells, and stray end tags, are not nesting.
        let sloppy = "<div><p>a<p>b<ul><li>c<li>d</ul><span></div><table><tr><td>e<td>f</table></span>".repeat(500);
        assert_eq!(bounded(&sloppy), None);
        // A shallow page is left as it came, attributes and all.
        assert_eq!(bounded(PAGE), None);
        let attributes = format!("<a href=\"x?a=1&amp;b=&quot;2\">link</a>{}", "<b>".repeat(MAX_DEPTH + 1));
        let cut = bounded(&attributes).unwrap();
        let document = Html::parse_document(&cut);
        let link = document.select(&Selector::parse("a").unwrap()).next().unwrap();
        assert_eq!(link.value().attr("href"), Some("x?a=1&b=\"2"), "{cut}");
        assert!(cut.contains(DEPTH_MARKER), "{cut}");
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
