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

/// The most lines an `--exclude-from` file may hold. Every pattern is
/// matched against every name synced, so a list far longer than any real
/// one (a wrong file, a runaway generator) would make the matcher itself
/// the cost of the sync; it is refused instead.
pub const EXCLUDE_LINES_MAX: usize = 100_000;

/// The longest `--exclude-from` line, in bytes: a path's longest
/// (`PATH_MAX`). A longer pattern matches no name a sync can meet, and
/// the matcher's memory grows with a pattern's length (tens of times
/// it), so one runaway line is refused before it is compiled.
pub const EXCLUDE_LINE_MAX: usize = 4096;

/// The patterns of an `--exclude-from` file, from its bytes (`file`
/// names it in messages): one per line, a `\r` before the `\n` dropped;
/// blank lines and `#` comments are skipped by the matcher.
///
/// # Errors
/// `InvalidInput`, naming `file` and the line number: a line that is not
/// UTF-8 (patterns are text; read lossily it would match other names, or
/// none, without a word: the bytes of a name that is not UTF-8 are
/// matched by `?` or `*`), a pattern the matcher refuses, a line longer
/// than [`EXCLUDE_LINE_MAX`] bytes, or more than [`EXCLUDE_LINES_MAX`]
/// lines.
pub fn patterns_from(bytes: &[u8], file: &Path) -> Result<Vec<String>, Error> {
    let bad = |n: usize, why: String| {
        Error::new(Operation::Sync, ErrorKind::InvalidInput)
            .with_src(file)
            .with_reason(format!("line {n} of the exclude file {why}"))
    };
    let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if text.is_empty() {
        return Ok(Vec::new());
    }
    // Each line is checked by the matcher's own parser, so a bad one is
    // named with its line here, not later without one.
    let mut check = GitignoreBuilder::new("");
    let mut out = Vec::new();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let n = i + 1;
        if n > EXCLUDE_LINES_MAX {
            return Err(Error::new(Operation::Sync, ErrorKind::InvalidInput)
                .with_src(file)
                .with_reason(format!(
                    "the exclude file has more than {EXCLUDE_LINES_MAX} lines: not a list of patterns"
                )));
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > EXCLUDE_LINE_MAX {
            return Err(bad(
                n,
                format!(
                    "is longer than {EXCLUDE_LINE_MAX} bytes ({} bytes), longer than any \
                     path: not a pattern",
                    line.len()
                ),
            ));
        }
        let line = std::str::from_utf8(line).map_err(|e| {
            bad(
                n,
                format!(
                    "is not UTF-8 (an invalid byte at column {}): patterns are text; match the \
                     bytes of a name that is not UTF-8 with '?' or '*'",
                    e.valid_up_to() + 1
                ),
            )
        })?;
        check
            .add_line(None, line)
            .map_err(|e| bad(n, format!("is not a valid pattern ({line:?}): {e}")))?;
        out.push(line.to_string());
    }
    Ok(out)
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
        let p = patterns_from(b"# comment\n\n*.tmp\r\n", Path::new("list")).unwrap();
        let x = Filter::new(&p).unwrap();
        assert!(x.excluded(Path::new("a.tmp"), false));
        assert!(!x.excluded(Path::new("# comment"), false));
        assert!(patterns_from(b"", Path::new("list")).unwrap().is_empty());
        assert_eq!(patterns_from(b"a", Path::new("l")).unwrap(), ["a"]);
    }

    /// A line that is not UTF-8 is refused with the file and its line
    /// number: read lossily, `caf\xe9.o` became `caf\u{fffd}.o`, which
    /// excludes no name at all (and `*\xff*` would become `*\u{fffd}*`).
    #[test]
    fn a_line_that_is_not_utf8_is_refused_with_its_number() {
        let e = patterns_from(b"# ok\n*.o\ncaf\xe9.o\n", Path::new("ex.list")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        let m = e.to_string();
        assert!(
            m.contains("ex.list") && m.contains("line 3 ") && m.contains("not UTF-8"),
            "{m}"
        );
        // What the message advises matches the name.
        let x = f(&["caf?.o"]);
        assert!(x.excluded(Path::new(OsStr::from_bytes(b"caf\xe9.o")), false));
        // A pattern the matcher refuses is named with its line too.
        let e = patterns_from(b"*.o\n\n[z-a]\n", Path::new("ex.list")).unwrap_err();
        assert!(e.to_string().contains("line 3 "), "{e}");
    }

    #[test]
    fn the_number_of_lines_is_bounded() {
        let ok = "x\n".repeat(EXCLUDE_LINES_MAX);
        assert_eq!(
            patterns_from(ok.as_bytes(), Path::new("l")).unwrap().len(),
            EXCLUDE_LINES_MAX
        );
        let over = "x\n".repeat(EXCLUDE_LINES_MAX + 1);
        let e = patterns_from(over.as_bytes(), Path::new("l")).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }
}
