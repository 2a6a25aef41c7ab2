//! Secrets (API keys) known to this process, and their removal from everything stored.
//!
//! A key can reach stored text by paths nobody planned: a provider that echoes it in an
//! answer, a command that reads it from runner's own environment, a grader that quotes
//! it. So instead of guarding each path, every value in [`register`] is cut out of every
//! line the log writer, the cassette and the cache write, whatever its path.

use std::borrow::Cow;
use std::sync::RwLock;

use memchr::memmem::Finder;

/// Shorter values are not treated as secrets: redacting them would mangle ordinary text.
pub const MIN_SECRET_LEN: usize = 8;

const REDACTED: &[u8] = b"[REDACTED]";

static SECRETS: RwLock<Vec<Finder<'static>>> = RwLock::new(Vec::new());

/// Remembers a secret value, and its JSON-escaped form when that differs, so that it is
/// cut from what is stored from now on.
pub fn register(value: &str) {
    let value = value.trim();
    if value.len() < MIN_SECRET_LEN {
        return;
    }
    let mut forms = vec![value.to_owned()];
    if let Ok(quoted) = serde_json::to_string(value) {
        let escaped = &quoted[1..quoted.len() - 1];
        if escaped != value {
            forms.push(escaped.to_owned());
        }
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    for form in forms {
        if !secrets.iter().any(|f| f.needle() == form.as_bytes()) {
            secrets.push(Finder::new(form.as_bytes()).into_owned());
        }
    }
}

/// `bytes` with every registered secret replaced by `[REDACTED]`; borrowed when none occurs.
pub fn scrub_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    let secrets = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let mut out: Cow<'_, [u8]> = Cow::Borrowed(bytes);
    for finder in secrets.iter() {
        if finder.find(&out).is_none() {
            continue;
        }
        let mut replaced = Vec::with_capacity(out.len());
        let mut rest: &[u8] = &out;
        while let Some(at) = finder.find(rest) {
            replaced.extend_from_slice(&rest[..at]);
            replaced.extend_from_slice(REDACTED);
            rest = &rest[at + finder.needle().len()..];
        }
        replaced.extend_from_slice(rest);
        out = Cow::Owned(replaced);
    }
    out
}

/// `text` with every registered secret replaced by `[REDACTED]`.
pub fn scrub(text: &str) -> Cow<'_, str> {
    match scrub_bytes(text.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(text),
        // Secrets are whole strings and `[REDACTED]` is ASCII: what is left stays UTF-8.
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// Registers the value of each variable as a secret and takes it out of this process's
/// environment, including the block the kernel shows as `/proc/<pid>/environ` to any
/// process of the same user (a command run by a world could read it there). Call it once
/// the clients that need the keys are built, while no other thread reads the environment.
pub fn withdraw_from_environment<'a>(vars: impl IntoIterator<Item = &'a str>) {
    for var in vars {
        let Some(value) = std::env::var_os(var) else { continue };
        register(&value.to_string_lossy());
        blank_original_environment(var);
        // SAFETY: called before the runtime and the log writer start: no other thread
        // reads or writes the environment now.
        unsafe { std::env::remove_var(var) };
    }
}

/// Overwrites the value of `var` in the process's original environment block with NULs.
/// `remove_var` alone only drops the pointer: the string itself stays where the kernel
/// shows it.
fn blank_original_environment(var: &str) {
    unsafe extern "C" {
        static mut environ: *mut *mut libc::c_char;
    }
    let prefix = format!("{var}=");
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated strings owned by the
    // C library; we only write within the bytes of one string's value, before its NUL.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return;
        }
        while !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if text.starts_with(prefix.as_bytes()) {
                let value = (*entry).add(prefix.len());
                std::ptr::write_bytes(value, 0, text.len() - prefix.len());
            }
            entry = entry.add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_values_are_cut_from_text_and_json() {
        register("sk-unit-test-secret-\"quoted\"");
        register("short");
        let line = r#"{"a":"key sk-unit-test-secret-\"quoted\" twice sk-unit-test-secret-\"quoted\""}"#;
        assert_eq!(scrub(line), r#"{"a":"key [REDACTED] twice [REDACTED]"}"#);
        assert_eq!(scrub("raw sk-unit-test-secret-\"quoted\"."), "raw [REDACTED].");
        assert!(matches!(scrub("short is too short to be a secret"), Cow::Borrowed(_)));
    }
}
