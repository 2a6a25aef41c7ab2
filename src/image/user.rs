//! An image's users and groups, as its own `/etc/passwd` and `/etc/group` say: what
//! `USER` and `--chown` name, for a build's steps and for an episode's processes.

use super::ID_RANGE;

/// An account of the image: its ids and home.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// An image's account files, as text (empty when it has none).
pub struct Accounts {
    pub passwd: String,
    pub group: String,
}

impl Accounts {
    /// `USER`'s value (`name` or `uid`, either with `:group`); root when empty. A number
    /// with no account is itself, its group the same number.
    pub fn user(&self, spec: &str) -> Result<Account, String> {
        let spec = spec.trim();
        let (name, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (if spec.is_empty() { "0" } else { spec }, None),
        };
        let entries = || self.passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).filter(|f| f.len() >= 6);
        let mut found = match (entries().find(|f| f[0] == name), name.parse::<u32>()) {
            (Some(f), _) => Account {
                uid: f[2].parse().map_err(|_| format!("the account of `{name}` in /etc/passwd has no number"))?,
                gid: f[3].parse().map_err(|_| format!("the account of `{name}` in /etc/passwd has no group number"))?,
                home: f[5].to_owned(),
            },
            (None, Ok(uid)) => match entries().find(|f| f[2] == name) {
                Some(f) => Account { uid, gid: f[3].parse().unwrap_or(uid), home: f[5].to_owned() },
                None => Account { uid, gid: uid, home: if uid == 0 { "/root".into() } else { "/".into() } },
            },
            (None, Err(_)) => return Err(format!("no user `{name}` in the image's /etc/passwd")),
        };
        if let Some(group) = group {
            found.gid = self.group_id(group)?;
        }
        within_range(found.uid, found.gid)?;
        Ok(found)
    }

    /// A group's number: a number, or a name in `/etc/group`.
    pub fn group_id(&self, group: &str) -> Result<u32, String> {
        if let Ok(gid) = group.parse::<u32>() {
            return Ok(gid);
        }
        let found =
            self.group.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 3 && f[0] == group);
        match found {
            Some(f) => f[2].parse().map_err(|_| format!("the group `{group}` in /etc/group has no number")),
            None => Err(format!("no group `{group}` in the image's /etc/group")),
        }
    }
}

/// Refuses ids an image's files cannot have ([`ID_RANGE`]).
pub fn within_range(uid: u32, gid: u32) -> Result<(), String> {
    if uid >= ID_RANGE || gid >= ID_RANGE {
        return Err(format!("ids from {ID_RANGE} up are beyond what an image may use"));
    }
    Ok(())
}
