//! The paths of a Harbor task's container and where they land in an episode's folder.
//!
//! A Harbor task's scripts name the container's paths (`/app`, `/logs/verifier`, `/tests`);
//! runner runs them in the sandboxed `shell` world, whose working directory stands for the
//! Dockerfile's `WORKDIR`. The scripts' text is rewritten: each container path, where it
//! stands as a whole path (not inside a longer name), becomes the episode's.

/// The folder, inside the working directory, that holds what the container keeps outside
/// it: `logs/verifier` (the reward) and `tests` (the verifier, copied in after the agent).
pub const HARBOR_DIR: &str = ".harbor";

/// Replaces each `from` path in `text` by its `to`, where `from` stands as a whole path:
/// not preceded by a character of a name or path, and followed by `/`, the end, or a
/// character that ends a path. The first mapping that matches at a place wins, so list
/// longer paths first.
pub fn map_paths(text: &str, mappings: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    'scan: while let Some(c) = rest.chars().next() {
        if c == '/' && !previous.is_some_and(is_path_char) {
            for (from, to) in mappings {
                if let Some(after) = rest.strip_prefix(from)
                    && after.chars().next().is_none_or(|n| n == '/' || !is_path_char(n))
                {
                    out.push_str(to);
                    previous = from.chars().last();
                    rest = after;
                    continue 'scan;
                }
            }
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn is_path_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '~' | '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_paths_are_mapped_and_longer_names_are_not() {
        let map = [("/logs", "/w/.harbor/logs"), ("/app", "/w")];
        assert_eq!(
            map_paths("echo 1 > /logs/verifier/reward.txt", &map),
            "echo 1 > /w/.harbor/logs/verifier/reward.txt"
        );
        assert_eq!(map_paths("cd /app && cat '/app/x.txt'", &map), "cd /w && cat '/w/x.txt'");
        assert_eq!(map_paths("/application /usr/app /app2 x/app", &map), "/application /usr/app /app2 x/app");
        assert_eq!(map_paths("\"/app\"", &map), "\"/w\"");
    }
}
