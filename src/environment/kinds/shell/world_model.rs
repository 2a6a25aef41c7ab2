//! What each agent knows of a world's files: the content (as a digest) of every file it
//! read or wrote, as it was then. A model is a small map, cheap to create; several share
//! one real world, one per actor.
//!
//! The rules, for one actor and one file it knows:
//! - Reading or writing the file records its content as the actor saw it, and forgets any
//!   reminder about it.
//! - Before each model call the agent asks which known files changed since (the digest on
//!   disk differs, or the file is gone). A change is named once: the state the actor was
//!   told about is recorded, so the same change is not named every turn, but a further
//!   change is named again.
//! - Being reminded is not reading: a write or edit of a file whose content on disk is not
//!   the one the actor last saw is refused until it reads the file again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest as _, Sha256};

use crate::contract::Actor;

/// The SHA-256 of a file's content (or, for a file too large to hash, of its size,
/// modification time and inode: see `files.rs`).
pub type Digest = [u8; 32];

pub fn digest_of(bytes: &[u8]) -> Digest {
    Sha256::digest(bytes).into()
}

/// One actor's knowledge of the files, by path relative to the working directory.
#[derive(Debug, Default)]
pub struct WorldModel {
    known: Mutex<BTreeMap<String, Known>>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Known {
    /// The content the actor last read or wrote.
    seen: Digest,
    /// The state on disk it was last reminded of: a content, or gone (`None`).
    reminded: Option<Option<Digest>>,
}

impl WorldModel {
    fn known(&self) -> MutexGuard<'_, BTreeMap<String, Known>> {
        // A panic elsewhere cannot leave the map half-changed: every change is one insert.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The actor read or wrote `path`, whose content was then `digest`.
    pub fn note(&self, path: &str, digest: Digest) {
        self.known().insert(path.to_owned(), Known { seen: digest, reminded: None });
    }

    /// The content the actor last saw of `path`, if it knows the file.
    pub fn seen(&self, path: &str) -> Option<Digest> {
        self.known().get(path).map(|k| k.seen)
    }

    /// Whether a write of `path`, whose content on disk is `now` (`None`: gone), would
    /// overwrite a change the actor has not read. A file it never saw is not stale, nor is
    /// one that is gone (there is nothing left to lose).
    pub fn is_stale(&self, path: &str, now: Option<Digest>) -> bool {
        matches!((self.seen(path), now), (Some(seen), Some(now)) if seen != now)
    }

    /// Every file the actor knows, in order.
    pub fn paths(&self) -> Vec<String> {
        self.known().keys().cloned().collect()
    }

    /// Given the state on disk of known files (`None`: gone or unreadable), the ones that
    /// changed since the actor saw them and that it was not yet reminded of in this state.
    /// They count as reminded from now on.
    pub fn take_changes(&self, now: &[(String, Option<Digest>)]) -> Vec<String> {
        let mut known = self.known();
        let mut changed = Vec::new();
        for (path, state) in now {
            let Some(k) = known.get_mut(path) else { continue };
            if *state != Some(k.seen) && k.reminded != Some(*state) {
                k.reminded = Some(*state);
                changed.push(path.clone());
            }
        }
        changed
    }
}

/// One world model per actor over one real world, made when an actor first touches a file.
#[derive(Debug, Default)]
pub struct WorldModels {
    by_actor: Mutex<HashMap<Actor, Arc<WorldModel>>>,
}

impl WorldModels {
    fn by_actor(&self) -> MutexGuard<'_, HashMap<Actor, Arc<WorldModel>>> {
        self.by_actor.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The model of `actor`, made empty if it has none yet.
    pub fn of(&self, actor: &Actor) -> Arc<WorldModel> {
        self.by_actor().entry(actor.clone()).or_default().clone()
    }

    /// The model of `actor`, if it ever touched a file.
    pub fn get(&self, actor: &Actor) -> Option<Arc<WorldModel>> {
        self.by_actor().get(actor).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(text: &str) -> Digest {
        digest_of(text.as_bytes())
    }

    #[test]
    fn a_change_is_named_once_and_a_further_change_again() {
        let model = WorldModel::default();
        model.note("a", d("1"));
        model.note("b", d("x"));
        assert!(model.take_changes(&[("a".into(), Some(d("1"))), ("b".into(), Some(d("x")))]).is_empty());
        let now = [("a".into(), Some(d("2"))), ("b".into(), Some(d("x")))];
        assert_eq!(model.take_changes(&now), ["a"]);
        assert!(model.take_changes(&now).is_empty(), "the same change was named twice");
        assert_eq!(model.take_changes(&[("a".into(), Some(d("3")))]), ["a"]);
        assert_eq!(model.take_changes(&[("b".into(), None)]), ["b"], "a file that is gone is a change");
    }

    #[test]
    fn a_reminded_file_stays_stale_until_it_is_read_again() {
        let model = WorldModel::default();
        model.note("a", d("1"));
        assert!(!model.is_stale("a", Some(d("1"))));
        assert_eq!(model.take_changes(&[("a".into(), Some(d("2")))]), ["a"]);
        assert!(model.is_stale("a", Some(d("2"))), "a reminder is not a read");
        model.note("a", d("2"));
        assert!(!model.is_stale("a", Some(d("2"))));
        // Reading again forgets the reminder: a change back is named.
        assert_eq!(model.take_changes(&[("a".into(), Some(d("1")))]), ["a"]);
    }

    #[test]
    fn unknown_and_vanished_files_are_not_stale() {
        let model = WorldModel::default();
        assert!(!model.is_stale("new", Some(d("1"))));
        model.note("a", d("1"));
        assert!(!model.is_stale("a", None));
        assert!(model.take_changes(&[("never-seen".into(), None)]).is_empty());
    }

    #[test]
    fn each_actor_has_its_own_model() {
        let models = WorldModels::default();
        models.of(&Actor::Main).note("a", d("1"));
        assert_eq!(models.of(&Actor::Main).seen("a"), Some(d("1")));
        assert!(models.get(&Actor::Subagent(vec![1])).is_none());
        assert_eq!(models.of(&Actor::Subagent(vec![1])).seen("a"), None);
    }
}
