//! Paths dedupe leaves alone: `--exclude` patterns.
//!
//! Two kinds of pattern, as `.gitignore` and rsync spell them, so a user's
//! habit carries over:
//! - without a `/` (`*.tmp`, `.git`, `node_modules`): matched against
//!   every name, at any depth;
//! - with a `/` (`build/out`, `/cache`, `logs/**/*.gz`): matched against
//!   the path relative to the root given (a leading `/` anchors nothing
//!   more, it is only dropped). `*` and `?` stay within one name, `**`
//!   crosses directories.
//!
//! A matched directory is excluded with everything below it: the walk does
//! not open it, and the watcher drops its events. An excluded file is
//! never a source nor a target. The root itself is never excluded. Globs
//! are compiled once by `globset` (the glob engine of ripgrep), whose
//! matching is linear in the path's length whatever the patterns.

use std::path::{Component, Path};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// Compiled `--exclude` patterns (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct Exclude {
    /// Patterns without a `/`: matched against each name.
    names: Option<GlobSet>,
    /// Patterns with a `/`: matched against the path below the root.
    paths: Option<GlobSet>,
    /// The patterns as given.
    patterns: Vec<String>,
}

impl Exclude {
    /// Compile `patterns`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] naming the first pattern that is not a
    /// valid glob (an unclosed `[` or `{`), or that is empty.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Exclude> {
        let mut names = GlobSetBuilder::new();
        let mut paths = GlobSetBuilder::new();
        let (mut n, mut p) = (0, 0);
        for pat in patterns {
            let pat = pat.as_ref();
            let bad = |why: &str| {
                Error::new(Operation::Dedupe, ErrorKind::InvalidInput)
                    .with_reason(format!("exclude pattern {pat:?}: {why}"))
            };
            let body = pat.trim_end_matches('/');
            let anchored = body.contains('/');
            let body = body.trim_start_matches('/');
            if body.is_empty() {
                return Err(bad("empty"));
            }
            let glob = GlobBuilder::new(body)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| bad(&e.kind().to_string()))?;
            if anchored {
                paths.add(glob);
                p += 1;
            } else {
                names.add(glob);
                n += 1;
            }
        }
        let build = |b: GlobSetBuilder, count: usize| -> Result<Option<GlobSet>> {
            if count == 0 {
                return Ok(None);
            }
            b.build().map(Some).map_err(|e| {
                Error::new(Operation::Dedupe, ErrorKind::InvalidInput)
                    .with_reason(format!("exclude patterns: {e}"))
            })
        };
        Ok(Exclude {
            names: build(names, n)?,
            paths: build(paths, p)?,
            patterns: patterns.iter().map(|s| s.as_ref().to_string()).collect(),
        })
    }

    /// Whether there are no patterns.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns as given.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether the entry at `relative` (a path below a root) is excluded
    /// by itself: its own name or its own path matches. Its parent
    /// directories are not looked at (the walk never opened an excluded
    /// one); [`Exclude::excludes`] checks them too.
    pub fn excludes_entry(&self, relative: &Path) -> bool {
        if let (Some(names), Some(name)) = (&self.names, relative.file_name()) {
            if names.is_match(name) {
                return true;
            }
        }
        self.paths.as_ref().is_some_and(|p| p.is_match(relative))
    }

    /// Whether `relative` (a path below a root), or any directory on the
    /// way to it, is excluded. An empty path (the root) never is.
    pub fn excludes(&self, relative: &Path) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut prefix = std::path::PathBuf::new();
        for c in relative.components() {
            match c {
                Component::Normal(name) => prefix.push(name),
                // A relative path from the watcher or the walk has only
                // names; anything else is skipped rather than matched.
                _ => continue,
            }
            if self.excludes_entry(&prefix) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_at_any_depth_paths_from_the_root() {
        let x = Exclude::new(&["*.tmp", ".git", "build/out", "/cache/", "logs/**/*.gz"]).unwrap();
        assert!(x.excludes(Path::new("a.tmp")));
        assert!(x.excludes(Path::new("deep/er/a.tmp")));
        assert!(!x.excludes(Path::new("a.tmpx")));
        assert!(x.excludes(Path::new(".git/objects/ab/cd")));
        assert!(x.excludes(Path::new("src/.git/HEAD")));
        assert!(x.excludes(Path::new("build/out/lib.so")));
        assert!(!x.excludes(Path::new("src/build/out/lib.so")));
        assert!(x.excludes(Path::new("cache/x")));
        assert!(!x.excludes(Path::new("src/cache/x")));
        assert!(x.excludes(Path::new("logs/a/b/c.gz")));
        assert!(!x.excludes(Path::new("logs/a/b/c.txt")));
        assert!(!x.excludes(Path::new("")));
        // `*` stays within a name.
        let star = Exclude::new(&["a/*"]).unwrap();
        assert!(star.excludes_entry(Path::new("a/b")));
        assert!(!star.excludes_entry(Path::new("a/b/c")));
        assert!(star.excludes(Path::new("a/b/c")));
    }

    #[test]
    fn bad_patterns_are_refused_by_name() {
        let e = Exclude::new(&["ok", "[unclosed"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("[unclosed"), "{e}");
        assert_eq!(
            Exclude::new(&["/"]).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert!(Exclude::new::<&str>(&[]).unwrap().is_empty());
    }
}
