//! Users and groups named by `USER` and `--chown`, looked up in the image's own
//! `/etc/passwd` and `/etc/group`.

use std::path::Path;

use super::tree::ImageTree;

pub use crate::image::user::Account;
use crate::image::user::{Accounts, within_range};

/// The image's account files at `tree`.
fn accounts(tree: &ImageTree) -> Accounts {
    Accounts { passwd: read(tree, "/etc/passwd"), group: read(tree, "/etc/group") }
}

/// `USER`'s value (`name`, `uid`, either with `:group`) resolved in the image at `tree`;
/// root when empty. A number with no account is itself, its group the same number.
pub fn user(tree: &ImageTree, spec: &str) -> Result<Account, String> {
    accounts(tree).user(spec)
}

/// `--chown`'s value: `user[:group]`, names or numbers; without a group, the user's number
/// is the group's too (as Docker does).
pub fn chown(tree: &ImageTree, spec: &str) -> Result<(u32, u32), String> {
    let (name, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let accounts = accounts(tree);
    let uid = match name.parse::<u32>() {
        Ok(uid) => uid,
        Err(_) => accounts.user(name)?.uid,
    };
    let gid = match group {
        Some(group) => accounts.group_id(group)?,
        None => uid,
    };
    within_range(uid, gid)?;
    Ok((uid, gid))
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
