//! Users and groups named by `USER` and `--chown`, looked up in the image's own
//! `/etc/passwd` and `/etc/group`.

use std::path::Path;

use super::tree::ImageTree;
use crate::image::ID_RANGE;

/// An account of the image: its ids and home.
#[derive(Debug, Clone, PartialEq)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// `USER`'s value (`name`, `uid`, either with `:group`) resolved in the image at `tree`;
/// root when empty. A number with no account is itself, its group the same number.
pub fn user(tree: &ImageTree, spec: &str) -> Result<Account, String> {
    let spec = spec.trim();
    let (name, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (if spec.is_empty() { "0" } else { spec }, None),
    };
    let passwd = read(tree, "/etc/passwd");
    let account = passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 6 && f[0] == name);
    let mut found = match (account, name.parse::<u32>()) {
        (Some(f), _) => Account {
            uid: f[2].parse().map_err(|_| format!("the account of `{name}` in /etc/passwd has no number"))?,
            gid: f[3].parse().map_err(|_| format!("the account of `{name}` in /etc/passwd has no group number"))?,
            home: f[5].to_owned(),
        },
        (None, Ok(uid)) => {
            let by_number =
                passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 6 && f[2] == name);
            match by_number {
                Some(f) => Account { uid, gid: f[3].parse().unwrap_or(uid), home: f[5].to_owned() },
                None => Account { uid, gid: uid, home: if uid == 0 { "/root".into() } else { "/".into() } },
            }
        }
        (None, Err(_)) => return Err(format!("no user `{name}` in the image's /etc/passwd")),
    };
    if let Some(group) = group {
        found.gid = group_id(tree, group)?;
    }
    within_range(found.uid, found.gid)?;
    Ok(found)
}

/// `--chown`'s value: `user[:group]`, names or numbers; without a group, the user's number
/// is the group's too (as Docker does).
pub fn chown(tree: &ImageTree, spec: &str) -> Result<(u32, u32), String> {
    let (name, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid = match name.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => user(tree, name)?.uid,
    };
    let gid = match group {
        Some(group) => group_id(tree, group)?,
        None => uid,
    };
    within_range(uid, gid)?;
    Ok((uid, gid))
}

fn group_id(tree: &ImageTree, group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let groups = read(tree, "/etc/group");
    let found = groups.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 3 && f[0] == group);
    match found {
        Some(f) => f[2].parse().map_err(|_| format!("the group `{group}` in /etc/group has no number")),
        None => Err(format!("no group `{group}` in the image's /etc/group")),
    }
}

fn within_range(uid: u32, gid: u32) -> Result<(), String> {
    if uid >= ID_RANGE || gid >= ID_RANGE {
        return Err(format!("ids from {ID_RANGE} up are beyond what an image may use"));
    }
    Ok(())
}

/// A file of the image, empty when it has none.
fn read(tree: &ImageTree, path: &str) -> String {
    tree.resolve(Path::new(path), true).and_then(|p| std::fs::read_to_string(tree.host(&p))).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_groups_are_found_by_name_or_number() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("etc/group"), "root:x:0:\napp:x:1001:\nstaff:x:50:\n").unwrap();
        let tree = ImageTree::new(dir.path());
        assert_eq!(user(&tree, ""), Ok(Account { uid: 0, gid: 0, home: "/root".into() }));
        assert_eq!(user(&tree, "app"), Ok(Account { uid: 1000, gid: 1001, home: "/home/app".into() }));
        assert_eq!(user(&tree, "1000").map(|a| (a.uid, a.gid)), Ok((1000, 1001)));
        assert_eq!(user(&tree, "app:staff").map(|a| (a.uid, a.gid)), Ok((1000, 50)));
        assert_eq!(user(&tree, "nobody"), Err("no user `nobody` in the image's /etc/passwd".into()));
        assert_eq!(chown(&tree, "app:staff"), Ok((1000, 50)));
        assert_eq!(chown(&tree, "app"), Ok((1000, 1000)), "a user alone: its number is the group's");
        assert_eq!(chown(&tree, "7:8"), Ok((7, 8)));
        assert!(chown(&tree, "app:wheel").unwrap_err().contains("wheel"));
        assert!(chown(&tree, "70000").is_err());
    }
}
