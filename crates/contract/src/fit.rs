//! Fitting a JSON value into a byte budget: long strings are cut, long lists and maps keep
//! their first entries, and every cut says so in the value itself. Sizes are the bytes of
//! the value serialised as compact JSON, which is what a model and the log are sent.

use serde_json::{Map, Value};

/// The fewest bytes a cut string keeps room for; below that it is only its marker.
const SMALLEST_PART: usize = 16;
/// Maps of at most this many keys share the budget among all their keys; larger ones keep
/// their first keys, as lists keep their first items.
const SHARED_KEYS: usize = 32;

/// `value` within `budget` bytes of compact JSON, and whether anything was cut. What is
/// kept is the value's start (a string's first bytes, a list's first items); each cut part
/// carries a marker naming how much was there.
pub fn fit(value: &Value, budget: usize) -> (Value, bool) {
    if size(value) <= budget {
        return (value.clone(), false);
    }
    let fitted = shrink(value, budget);
    if size(&fitted) <= budget {
        return (fitted, true);
    }
    // Markers alone did not fit (a tiny budget, many small parts): the value's text, cut.
    let text = value.to_string();
    (cut_string(&text, budget), true)
}

/// `text` within `budget` bytes of JSON (its quotes and escapes counted), and whether it was
/// cut: its start and the marker [`fit`] puts on a cut string.
pub fn fit_text(text: &str, budget: usize) -> (String, bool) {
    if string_size(text) <= budget {
        return (text.to_owned(), false);
    }
    match cut_string(text, budget) {
        Value::String(cut) => (cut, true),
        other => (other.to_string(), true),
    }
}

/// Bytes of `value` as compact JSON.
pub fn size(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(b) => 4 + usize::from(!b),
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => string_size(s),
        Value::Array(items) => 2 + items.iter().map(size).sum::<usize>() + items.len().saturating_sub(1),
        Value::Object(map) => {
            2 + map.iter().map(|(k, v)| string_size(k) + 1 + size(v)).sum::<usize>() + map.len().saturating_sub(1)
        }
    }
}

fn string_size(s: &str) -> usize {
    2 + s.chars().map(escaped_len).sum::<usize>()
}

fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

fn shrink(value: &Value, budget: usize) -> Value {
    if size(value) <= budget {
        return value.clone();
    }
    match value {
        Value::String(s) => cut_string(s, budget),
        Value::Array(items) => Value::Array(shrink_items(items, budget)),
        Value::Object(map) if map.len() <= SHARED_KEYS => Value::Object(share(map, budget)),
        Value::Object(map) => Value::Object(first_keys(map, budget)),
        // A number or a boolean is never larger than a marker would be.
        other => other.clone(),
    }
}

/// `s` as a string of at most `budget` bytes of JSON: its first characters and a marker.
fn cut_string(s: &str, budget: usize) -> Value {
    let marker = format!("[... cut: showing {{kept}} of {} bytes ...]", s.len());
    // The marker's size with the count it will show (at most as long as the total).
    let room = budget.saturating_sub(string_size(&marker.replace("{kept}", &s.len().to_string())) + 1);
    let mut used = 0;
    let mut end = 0;
    for (at, c) in s.char_indices() {
        used += escaped_len(c);
        if used > room {
            break;
        }
        end = at + c.len_utf8();
    }
    let marker = marker.replace("{kept}", &end.to_string());
    if end < SMALLEST_PART.min(s.len()) {
        return Value::String(marker);
    }
    Value::String(format!("{}\n{marker}", &s[..end]))
}

/// A list's first items while they fit, the next one cut, then a marker of how many more.
fn shrink_items(items: &[Value], budget: usize) -> Vec<Value> {
    let marker = |left: usize| Value::String(format!("[... {left} more items cut ...]"));
    let reserve = size(&marker(items.len())) + 1;
    let mut room = budget.saturating_sub(2 + reserve);
    let mut kept = Vec::new();
    for item in items {
        let comma = usize::from(!kept.is_empty());
        if size(item) + comma <= room {
            room -= size(item) + comma;
            kept.push(item.clone());
            continue;
        }
        // The first item that does not fit is cut, when there is room for a part of it.
        if room > SMALLEST_PART * 4 {
            let part = shrink(item, room - comma);
            if size(&part) + comma <= room {
                kept.push(part);
                kept.push(marker(items.len() - kept.len()));
                return kept;
            }
        }
        break;
    }
    kept.push(marker(items.len() - kept.len()));
    kept
}

/// Every key kept; the budget shared out so that small values stay whole and the large
/// ones split what is left evenly.
fn share(map: &Map<String, Value>, budget: usize) -> Map<String, Value> {
    let overhead: usize = 2 + map.keys().map(|k| string_size(k) + 1).sum::<usize>() + map.len().saturating_sub(1);
    let mut room = budget.saturating_sub(overhead);
    let mut by_size: Vec<(&String, &Value, usize)> = map.iter().map(|(k, v)| (k, v, size(v))).collect();
    by_size.sort_by_key(|(_, _, n)| *n);
    let mut shares = Vec::with_capacity(by_size.len());
    let mut left = by_size.len();
    for (key, value, need) in by_size {
        let fair = room / left.max(1);
        let part = if need <= fair { value.clone() } else { shrink(value, fair) };
        room = room.saturating_sub(size(&part));
        left -= 1;
        shares.push((key.clone(), part));
    }
    // The map's own order, as the tool gave it.
    map.keys().filter_map(|k| shares.iter().position(|(key, _)| key == k).map(|i| shares[i].clone())).collect()
}

/// A large map's first keys while they fit, then a `...` key saying how many more.
fn first_keys(map: &Map<String, Value>, budget: usize) -> Map<String, Value> {
    let marker = |left: usize| Value::String(format!("[... {left} more keys cut ...]"));
    let reserve = string_size("...") + 1 + size(&marker(map.len())) + 1;
    let mut room = budget.saturating_sub(2 + reserve);
    let mut kept = Map::new();
    for (key, value) in map {
        let need = string_size(key) + 1 + size(value) + usize::from(!kept.is_empty());
        if need > room {
            break;
        }
        room -= need;
        kept.insert(key.clone(), value.clone());
    }
    let left = map.len() - kept.len();
    kept.insert("...".into(), marker(left));
    kept
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn compact(value: &Value) -> usize {
        value.to_string().len()
    }

    #[test]
    fn sizes_are_those_of_compact_json() {
        for value in [
            json!(null),
            json!(true),
            json!(false),
            json!(-12.5),
            json!("a\"b\\c\n\u{1}é"),
            json!([1, "two", {"three": [3]}]),
            json!({}),
            json!([]),
        ] {
            assert_eq!(size(&value), compact(&value), "{value}");
        }
    }

    #[test]
    fn a_value_that_fits_is_untouched() {
        let value = json!({"a": [1, 2, 3], "b": "text"});
        assert_eq!(fit(&value, 1000), (value.clone(), false));
    }

    #[test]
    fn a_long_string_keeps_its_start_and_says_how_much() {
        let (cut, was_cut) = fit(&json!("x".repeat(10_000)), 200);
        assert!(was_cut);
        let text = cut.as_str().unwrap();
        assert!(text.starts_with("xxxx"), "{text}");
        assert!(text.ends_with("of 10000 bytes ...]"), "{text}");
        assert!(compact(&cut) <= 200, "{}", compact(&cut));
    }

    #[test]
    fn a_long_list_keeps_its_first_items_and_counts_the_rest() {
        let names: Vec<Value> = (0..100_000).map(|i| json!(format!("file-{i:06}.txt"))).collect();
        let value = json!({"path": ".", "entries": names});
        let (cut, was_cut) = fit(&value, 4096);
        assert!(was_cut);
        assert!(compact(&cut) <= 4096, "{}", compact(&cut));
        let entries = cut["entries"].as_array().unwrap();
        assert_eq!(entries[0], "file-000000.txt");
        let marker = entries.last().unwrap().as_str().unwrap();
        assert!(marker.contains("more items cut"), "{marker}");
        assert_eq!(cut["path"], ".", "small fields stay whole");
    }

    #[test]
    fn a_map_shares_its_budget_and_keeps_small_values_whole() {
        let value = json!({"exit_code": 0, "stdout": "o".repeat(5000), "stderr": "e".repeat(5000)});
        let (cut, _) = fit(&value, 2000);
        assert!(compact(&cut) <= 2000, "{}", compact(&cut));
        assert_eq!(cut["exit_code"], 0);
        let (out, err) = (cut["stdout"].as_str().unwrap().len(), cut["stderr"].as_str().unwrap().len());
        assert!(out > 800 && err > 800, "both streams keep a fair share: {out} {err}");
    }

    #[test]
    fn escapes_count_and_a_tiny_budget_still_fits() {
        let (cut, _) = fit(&json!("\u{1}".repeat(1000)), 100);
        assert!(compact(&cut) <= 100, "{cut}");
        let many: Vec<Value> = (0..1000).map(|i| json!({"k": i})).collect();
        let (cut, _) = fit(&Value::Array(many), 40);
        assert!(compact(&cut) <= 40, "{cut}");
    }
}
