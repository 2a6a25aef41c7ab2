//! The run's page cache: what live requests answered, one JSON file per request in the run
//! folder (`results/<run-id>/web-cache/`), so that every epoch and every model of a run,
//! and the run resumed, see the same pages. Requests for one key wait for each other, so
//! the first answer is the one kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Per key, the lock that requests for it take in turn; shared by a definition's worlds.
#[derive(Debug, Default)]
pub struct KeyLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyLocks {
    fn of(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        // A poisoned lock only means another request panicked; the map is intact.
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_owned()).or_default().clone()
    }
}

#[derive(Debug, Clone)]
pub struct PageCache {
    dir: PathBuf,
    locks: Arc<KeyLocks>,
}

impl PageCache {
    /// A cache in `dir`, made if missing.
    pub fn open(dir: &Path, locks: Arc<KeyLocks>) -> std::io::Result<PageCache> {
        std::fs::create_dir_all(dir)?;
        Ok(PageCache { dir: dir.to_owned(), locks })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{}.json", hex::encode(Sha256::digest(key.as_bytes()))))
    }

    /// The value kept under `key`, or what `make` gives, kept when it is `Ok`. A cache
    /// file that cannot be read is made again.
    pub async fn get_or<T, E, F>(&self, key: &str, make: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        F: Future<Output = Result<T, E>>,
    {
        let lock = self.locks.of(key);
        let _turn = lock.lock().await;
        let path = self.path(key);
        if let Ok(bytes) = tokio::fs::read(&path).await
            && let Ok(entry) = serde_json::from_slice::<Entry<T>>(&bytes)
            && entry.key == key
        {
            return Ok(entry.value);
        }
        let value = make.await?;
        // Best effort: a cache that cannot be written costs a refetch, not the call.
        let _ = self.write(&path, key, &value);
        Ok(value)
    }

    fn write<T: Serialize>(&self, path: &Path, key: &str, value: &T) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&Entry { key: key.to_owned(), value })?;
        let mut staged = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::io::Write::write_all(&mut staged, &bytes)?;
        staged.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[derive(Serialize, serde::Deserialize)]
struct Entry<T> {
    /// The key in full, so that a file is never read for another key.
    key: String,
    value: T,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_value_is_served_again_and_a_failure_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PageCache::open(&dir.path().join("c"), Arc::default()).unwrap();
        let first: Result<u32, ()> = cache.get_or("a", async { Ok(1) }).await;
        let again: Result<u32, ()> = cache.get_or("a", async { Ok(2) }).await;
        assert_eq!((first, again), (Ok(1), Ok(1)));
        // A second cache over the same folder (a resumed run) sees it too.
        let reopened = PageCache::open(&dir.path().join("c"), Arc::default()).unwrap();
        assert_eq!(reopened.get_or::<u32, (), _>("a", async { Ok(3) }).await, Ok(1));
        let failed: Result<u32, &str> = cache.get_or("c", async { Err("down") }).await;
        assert_eq!(failed, Err("down"));
        assert_eq!(cache.get_or::<u32, &str, _>("c", async { Ok(7) }).await, Ok(7));
    }
}
