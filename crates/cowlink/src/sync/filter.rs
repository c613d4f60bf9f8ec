//! Exclusions (`--exclude`, `--exclude-from`): gitignore's syntax, from
//! the `ignore` crate. Patterns match paths relative to the source root
//! (which is also the destination root): `*.o` anywhere, `/build` only at
//! the top, `cache/` directories only, `!keep.o` re-includes, `**` spans
//! directories. An excluded directory is not entered.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::ground::error::{Error, ErrorKind, Operation};

/// A compiled set of exclusions.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    set: Option<Gitignore>,
}

impl Filter {
    /// Compile `patterns` (one gitignore line each; blank lines and `#`
    /// comments are ignored).
    pub(crate) fn new(patterns: &[String]) -> Result<Filter, Error> {
        if patterns.is_empty() {
            return Ok(Filter { set: None });
        }
        let mut b = GitignoreBuilder::new("");
        for p in patterns {
            b.add_line(None, p).map_err(|e| {
                Error::new(Operation::Sync, ErrorKind::InvalidInput)
                    .with_reason(format!("bad exclude pattern {p:?}: {e}"))
            })?;
        }
        let set = b.build().map_err(|e| {
            Error::new(Operation::Sync, ErrorKind::InvalidInput)
                .with_reason(format!("bad exclude patterns: {e}"))
        })?;
        Ok(Filter { set: Some(set) })
    }

    /// Whether the entry `rel` (relative to the root) is excluded.
    pub(crate) fn excluded(&self, rel: &Path, is_dir: bool) -> bool {
        self.set
            .as_ref()
            .is_some_and(|s| s.matched(rel, is_dir).is_ignore())
    }
}

/// The patterns in the text of an `--exclude-from` file: one per line,
/// blank lines and `#` comments skipped by the matcher.
pub fn patterns_from(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn f(p: &[&str]) -> Filter {
        Filter::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn gitignore_rules_apply_to_relative_paths() {
        let x = f(&["*.o", "/build", "cache/", "!keep.o", "a/**/z"]);
        assert!(x.excluded(Path::new("m.o"), false));
        assert!(x.excluded(Path::new("sub/deep/m.o"), false));
        assert!(!x.excluded(Path::new("keep.o"), false));
        assert!(x.excluded(Path::new("build"), true));
        assert!(!x.excluded(Path::new("sub/build"), true), "anchored");
        assert!(x.excluded(Path::new("sub/cache"), true));
        assert!(!x.excluded(Path::new("sub/cache"), false), "dirs only");
        assert!(x.excluded(Path::new("a/b/c/z"), false));
        assert!(!x.excluded(Path::new("m.c"), false));
        let none = f(&[]);
        assert!(!none.excluded(Path::new("m.o"), false));
    }

    #[test]
    fn names_that_are_not_utf8_match() {
        let x = f(&["*.o"]);
        let name = Path::new(OsStr::from_bytes(b"caf\xe9.o"));
        assert!(x.excluded(name, false));
    }

    #[test]
    fn exclude_files_skip_comments_and_blanks() {
        let p = patterns_from("# comment\n\n*.tmp\r\n");
        let x = Filter::new(&p).unwrap();
        assert!(x.excluded(Path::new("a.tmp"), false));
        assert!(!x.excluded(Path::new("# comment"), false));
    }
}
