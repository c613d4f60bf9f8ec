//! Backups of replaced files (`cp --backup`, `-S`): how they are named.
//! Pure; shared by cp's operands (`cp/apply.rs`) and the entries of a
//! tree copy (`tree/entry.rs`), which rename the old file to the name
//! given here before placing the new one.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::ground::error::{Error, ErrorKind, Operation};

/// How backups of replaced files are named (`--backup=CONTROL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backup {
    /// `NAME` + suffix (`simple`, `never`).
    Simple,
    /// `NAME.~N~` (`numbered`, `t`).
    Numbered,
    /// Numbered if numbered backups exist, else simple (`existing`, `nil`).
    Existing,
}

impl Backup {
    /// GNU's CONTROL words (or a prefix of only one); `None` for
    /// `none`/`off` (no backups).
    pub fn parse(word: &str) -> Result<Option<Backup>, Error> {
        const WORDS: [(&str, Option<Backup>); 8] = [
            ("none", None),
            ("off", None),
            ("simple", Some(Backup::Simple)),
            ("never", Some(Backup::Simple)),
            ("existing", Some(Backup::Existing)),
            ("nil", Some(Backup::Existing)),
            ("numbered", Some(Backup::Numbered)),
            ("t", Some(Backup::Numbered)),
        ];
        if let Some((_, b)) = WORDS.iter().find(|(w, _)| *w == word) {
            return Ok(*b);
        }
        let hits: Vec<_> = WORDS.iter().filter(|(w, _)| w.starts_with(word)).collect();
        match hits.as_slice() {
            [(_, b)] if !word.is_empty() => Ok(*b),
            _ => Err(Error::new(Operation::Copy, ErrorKind::InvalidInput).with_reason(format!(
                "invalid argument '{word}' for 'backup type'\nValid arguments are:\n  - 'none', 'off'\n  - 'simple', 'never'\n  - 'existing', 'nil'\n  - 'numbered', 't'"
            ))),
        }
    }
}

/// The name the backup of `dst` gets: `dst` + `suffix` (simple), or
/// `dst.~N~` with N one above `highest`, the highest existing number
/// (numbered; existing when `highest` > 0).
pub fn backup_name(kind: Backup, dst: &Path, suffix: &OsStr, highest: u64) -> PathBuf {
    let mut n = dst.as_os_str().to_owned();
    match kind {
        Backup::Simple => n.push(suffix),
        Backup::Existing if highest == 0 => n.push(suffix),
        Backup::Existing | Backup::Numbered => n.push(format!(".~{}~", highest + 1)),
    }
    PathBuf::from(n)
}

/// The N of a numbered backup name `file_name` of `base` (`base.~N~`).
pub fn backup_number(base: &OsStr, file_name: &OsStr) -> Option<u64> {
    let rest = file_name.as_bytes().strip_prefix(base.as_bytes())?;
    let digits = rest.strip_prefix(b".~")?.strip_suffix(b"~")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Backups of replaced files in a tree copy: how they are named, and the
/// simple suffix (`~` when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backups {
    /// Simple, numbered, or numbered where numbered backups exist.
    pub kind: Backup,
    /// The simple backup suffix; empty means `~`.
    pub suffix: OsString,
}

impl Backups {
    /// The backup name of `base` in a directory whose names are `names`.
    pub(crate) fn name_in<'n>(
        &self,
        base: &OsStr,
        names: impl Iterator<Item = &'n OsStr>,
    ) -> PathBuf {
        let highest = match self.kind {
            Backup::Simple => 0,
            _ => names
                .filter_map(|n| backup_number(base, n))
                .max()
                .unwrap_or(0),
        };
        let suffix = if self.suffix.is_empty() {
            OsStr::new("~")
        } else {
            &self.suffix
        };
        backup_name(self.kind, Path::new(base), suffix, highest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_names_in_a_directory() {
        let names = ["f", "f.~1~", "f.~7~", "f.~x~", "g.~9~"].map(OsStr::new);
        let b = |kind, suffix: &str| Backups {
            kind,
            suffix: suffix.into(),
        };
        let f = OsStr::new("f");
        assert_eq!(
            b(Backup::Simple, "").name_in(f, names.into_iter()),
            Path::new("f~")
        );
        assert_eq!(
            b(Backup::Simple, ".bak").name_in(f, names.into_iter()),
            Path::new("f.bak")
        );
        assert_eq!(
            b(Backup::Numbered, "").name_in(f, names.into_iter()),
            Path::new("f.~8~")
        );
        assert_eq!(
            b(Backup::Existing, "").name_in(f, names.into_iter()),
            Path::new("f.~8~")
        );
        assert_eq!(
            b(Backup::Existing, "").name_in(OsStr::new("g2"), names.into_iter()),
            Path::new("g2~")
        );
    }
}
