//! A fixed corpus of pages, read once and indexed with BM25 (tantivy, in memory), so that
//! searching and fetching are offline and the same in every episode. The index is
//! read-only after it is built; the episodes of a run share it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument};

use super::page::{Format, Page, snippet};

/// The memory tantivy's one indexing thread may fill before it writes a segment.
const WRITER_BUDGET_BYTES: usize = 64 * 1024 * 1024;
/// Title words count this much more than body words.
const TITLE_BOOST: f32 = 2.0;
const SNIPPET_BYTES: usize = 240;

/// A mistake in a corpus: the file, and its line for a JSONL corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl CorpusError {
    fn whole(file: &Path, message: impl Into<String>) -> Self {
        CorpusError { file: file.to_owned(), line: None, message: message.into() }
    }
}

/// One search result.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusHit {
    pub url: String,
    pub title: String,
    pub snippet: String,
    pub score: f32,
}

pub struct Corpus {
    pages: Vec<Page>,
    by_url: HashMap<String, usize>,
    reader: IndexReader,
    parser: QueryParser,
    id: Field,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus").field("pages", &self.pages.len()).finish_non_exhaustive()
    }
}

/// A line of a JSONL corpus.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    url: String,
    title: Option<String>,
    text: Option<String>,
    html: Option<String>,
}

impl Corpus {
    /// Reads a corpus: a JSONL file of `{url, title, text}` (or `html` instead of `text`),
    /// or a folder whose `.html`, `.htm`, `.md`, `.markdown` and `.txt` files are served at
    /// `base_url` + their path inside it.
    pub fn load(path: &Path, base_url: &str) -> Result<Corpus, CorpusError> {
        let pages = if path.is_dir() { read_folder(path, base_url)? } else { read_jsonl(path)? };
        if pages.is_empty() {
            return Err(CorpusError::whole(path, "the corpus holds no pages"));
        }
        let mut seen = HashMap::new();
        for page in &pages {
            if seen.insert(page.url.as_str(), ()).is_some() {
                return Err(CorpusError::whole(path, format!("two pages have the url `{}`", page.url)));
            }
        }
        Corpus::build(pages).map_err(|e| CorpusError::whole(path, e))
    }

    /// Indexes `pages` (title and text) in memory.
    pub fn build(pages: Vec<Page>) -> Result<Corpus, String> {
        let mut schema = Schema::builder();
        let id = schema.add_u64_field("id", STORED);
        let stemmed = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default().set_tokenizer("en_stem").set_index_option(IndexRecordOption::WithFreqs),
        );
        let title = schema.add_text_field("title", stemmed.clone());
        let body = schema.add_text_field("body", stemmed);
        let index = Index::create_in_ram(schema.build());
        let failed = |what: &str, e: tantivy::TantivyError| format!("failed to {what} the search index: {e}");
        // One thread: document ids follow the corpus order, so equal scores rank the same
        // way in every run.
        let mut writer: IndexWriter =
            index.writer_with_num_threads(1, WRITER_BUDGET_BYTES).map_err(|e| failed("open", e))?;
        for (i, page) in pages.iter().enumerate() {
            let mut doc = TantivyDocument::default();
            doc.add_u64(id, i as u64);
            doc.add_text(title, &page.title);
            doc.add_text(body, &page.text);
            writer.add_document(doc).map_err(|e| failed("fill", e))?;
        }
        writer.commit().map_err(|e| failed("write", e))?;
        writer.wait_merging_threads().map_err(|e| failed("finish", e))?;
        let reader =
            index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into().map_err(|e| failed("read", e))?;
        let mut parser = QueryParser::for_index(&index, vec![title, body]);
        parser.set_field_boost(title, TITLE_BOOST);
        let by_url = pages.iter().enumerate().map(|(i, p)| (p.url.clone(), i)).collect();
        Ok(Corpus { pages, by_url, reader, parser, id })
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The page at `url` (a `#fragment` ignored).
    pub fn page(&self, url: &str) -> Option<&Page> {
        let url = url.split('#').next().unwrap_or(url);
        self.by_url.get(url).map(|&i| &self.pages[i])
    }

    /// The best `limit` pages for `query` by BM25, best first. The query is read leniently:
    /// words, `"phrases"`, `+required` and `-excluded` words; a syntax slip is dropped, not an error.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<CorpusHit>, String> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (parsed, _ignored) = self.parser.parse_query_lenient(query);
        let searcher = self.reader.searcher();
        let top = searcher
            .search(&parsed, &TopDocs::with_limit(limit).order_by_score())
            .map_err(|e| format!("the search failed: {e}"))?;
        let mut hits = Vec::with_capacity(top.len());
        for (score, address) in top {
            let doc: TantivyDocument = searcher.doc(address).map_err(|e| format!("the search failed: {e}"))?;
            let Some(page) = doc.get_first(self.id).and_then(|v| v.as_u64()).and_then(|i| self.pages.get(i as usize))
            else {
                continue;
            };
            hits.push(CorpusHit {
                url: page.url.clone(),
                title: page.title.clone(),
                snippet: snippet(&page.text, query, SNIPPET_BYTES),
                score,
            });
        }
        Ok(hits)
    }
}

fn read_jsonl(path: &Path) -> Result<Vec<Page>, CorpusError> {
    let text = std::fs::read_to_string(path).map_err(|e| CorpusError::whole(path, format!("failed to read: {e}")))?;
    let mut pages = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let at = |message: String| CorpusError { file: path.to_owned(), line: Some(i + 1), message };
        let line: Line =
            serde_json::from_str(raw).map_err(|e| at(format!("not a page ({{url, title, text}}): {e}")))?;
        if line.url.trim().is_empty() {
            return Err(at("`url` is empty".into()));
        }
        let (body, format) = match (line.text, line.html) {
            (Some(text), None) => (text, Format::Text),
            (None, Some(html)) => (html, Format::Html),
            _ => return Err(at("give a page's body as exactly one of `text` or `html`".into())),
        };
        pages.push(Page::of(&line.url, body, format, line.title));
    }
    Ok(pages)
}

fn read_folder(root: &Path, base_url: &str) -> Result<Vec<Page>, CorpusError> {
    let mut files = Vec::new();
    let mut folders = vec![root.to_owned()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|e| CorpusError::whole(&folder, format!("failed to read the folder: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| CorpusError::whole(&folder, format!("failed to read the folder: {e}")))?;
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                folders.push(path);
            } else if format_of(&path).is_some() {
                files.push(path);
            }
        }
    }
    // Sorted, so that pages (and equal scores) come in the same order on every machine.
    files.sort();
    let base = if base_url.ends_with('/') { base_url.to_owned() } else { format!("{base_url}/") };
    let mut pages = Vec::with_capacity(files.len());
    for file in files {
        let body = std::fs::read_to_string(&file)
            .map_err(|e| CorpusError::whole(&file, format!("failed to read as UTF-8 text: {e}")))?;
        let relative = file.strip_prefix(root).unwrap_or(&file);
        let parts: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let url = format!("{base}{}", parts.join("/"));
        let format = format_of(&file).unwrap_or(Format::Text);
        pages.push(Page::of(&url, body, format, None));
    }
    Ok(pages)
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "html" | "htm" => Some(Format::Html),
        "md" | "markdown" | "txt" => Some(Format::Text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page(url: &str, title: &str, text: &str) -> Page {
        Page::of(url, text.into(), Format::Text, Some(title.into()))
    }

    fn corpus() -> Corpus {
        Corpus::build(vec![
            text_page("u/bread", "Baking bread", "Knead the dough, let the yeast work, bake at 220 degrees."),
            text_page(
                "u/sourdough",
                "Sourdough starters",
                "A sourdough starter is flour and water fermented by wild yeast. Feed the starter daily; \
                 a starter that doubles in six hours is ready to bake with.",
            ),
            text_page("u/beer", "Brewing beer", "Brewer's yeast ferments the wort into beer over two weeks."),
            text_page("u/knots", "Sailing knots", "The bowline makes a fixed loop at the end of a rope."),
        ])
        .unwrap()
    }

    #[test]
    fn bm25_ranks_the_page_that_is_about_the_words_first() {
        let corpus = corpus();
        // "starter" occurs only in the sourdough page (three times, and in its title), so
        // it outranks the other yeast pages, which match on "yeast" alone.
        let hits = corpus.search("yeast starter", 10).unwrap();
        let urls: Vec<&str> = hits.iter().map(|h| h.url.as_str()).collect();
        assert_eq!(urls[0], "u/sourdough", "{hits:?}");
        // Three pages mention yeast; the knots page mentions neither word.
        assert_eq!(urls.len(), 3, "{hits:?}");
        assert!(!urls.contains(&"u/knots"));
        assert!(hits[0].snippet.to_lowercase().contains("starter"), "{hits:?}");
    }

    #[test]
    fn stems_match_other_forms_of_a_word() {
        // "fermented" and "ferments" both stem to "ferment"; bread never ferments here.
        let hits = corpus().search("fermenting", 10).unwrap();
        let mut urls: Vec<&str> = hits.iter().map(|h| h.url.as_str()).collect();
        urls.sort();
        assert_eq!(urls, ["u/beer", "u/sourdough"]);
    }

    #[test]
    fn the_limit_cuts_the_list_and_a_miss_is_empty() {
        let corpus = corpus();
        assert_eq!(corpus.search("yeast", 1).unwrap().len(), 1);
        assert!(corpus.search("zeppelin", 5).unwrap().is_empty());
        // A syntax slip is read leniently rather than refused.
        assert!(corpus.search("bowline AND (", 5).unwrap().iter().any(|h| h.url == "u/knots"));
    }

    #[test]
    fn a_page_is_found_by_its_url_without_the_fragment() {
        let corpus = corpus();
        assert_eq!(corpus.page("u/knots#bowline").map(|p| p.title.as_str()), Some("Sailing knots"));
        assert!(corpus.page("u/nothing").is_none());
    }

    #[test]
    fn a_jsonl_corpus_names_the_line_of_a_bad_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(
            &path,
            "{\"url\": \"a\", \"title\": \"A\", \"text\": \"x\"}\n\n{\"url\": \"b\", \"title\": \"B\"}\n",
        )
        .unwrap();
        let err = Corpus::load(&path, "").unwrap_err();
        assert_eq!(err.line, Some(3), "{err:?}");
        assert!(err.message.contains("exactly one of `text` or `html`"), "{err:?}");
    }

    #[test]
    fn a_folder_corpus_serves_its_files_under_the_base_url() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("guides")).unwrap();
        std::fs::write(dir.path().join("guides/otters.html"), "<title>Otters</title><p>They hold hands.</p>").unwrap();
        std::fs::write(dir.path().join("notes.md"), "# Notes\nNothing.").unwrap();
        std::fs::write(dir.path().join("image.png"), [0u8, 1, 2]).unwrap();
        let corpus = Corpus::load(dir.path(), "https://docs.test").unwrap();
        assert_eq!(corpus.len(), 2, "the PNG is not a page");
        let otters = corpus.page("https://docs.test/guides/otters.html").unwrap();
        assert_eq!(otters.title, "Otters");
        assert_eq!(otters.text, "They hold hands.");
        assert!(corpus.page("https://docs.test/notes.md").is_some());
    }
}
