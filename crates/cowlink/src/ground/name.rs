//! Names in output: a path as a person reads it and as a program parses it.
//!
//! A Linux file name is any bytes but `/` and NUL. Two things go wrong
//! when such a name is printed as is:
//!
//! - **On a terminal**, a newline splits one name into two lines, and an
//!   escape sequence (`ESC [31m`, a bidirectional override) changes what the
//!   reader sees. Text output therefore shows every name through
//!   [`shown`] or [`quoted`]: a printable UTF-8 name stays as it is; any
//!   other is written in the shell's ANSI-C quoting, `$'a\nb'`, which a
//!   reader can paste back into bash or zsh to name the same file (GNU `ls`
//!   and `cp` quote the same way on a terminal).
//! - **In JSON**, a string must be Unicode. A name that is not UTF-8 is
//!   written lossily (U+FFFD for each bad byte), so two different names can
//!   print the same. Every path field therefore has a lossless companion:
//!   next to `"path"` comes `"path_bytes"`, the name's exact bytes as an
//!   array of numbers, present only when the name is not UTF-8 (see
//!   [`json`]).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Whether `c` would change what a terminal shows rather than show itself:
/// control characters (C0, DEL, C1) and the bidirectional controls that
/// reorder text ("Trojan source").
fn hides(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The name in ANSI-C quoting: `$'…'` with `\n`, `\t`, `\\`, `\'`,
/// `\xHH` for other control bytes and for bytes that are not UTF-8, and
/// `\uHHHH` for the other hidden characters.
fn ansi_c(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 4);
    out.push_str("$'");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                c if (c as u32) < 0x80 && hides(c) => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if hides(c) => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('\'');
    out
}

/// Whether a name must be escaped to be shown faithfully: not UTF-8, or it
/// holds a hidden character, or it already looks like an escaped name.
fn needs_escape(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.starts_with("$'") || s.chars().any(hides),
        Err(_) => true,
    }
}

/// `p` for text output where it stands alone (a table column, a list):
/// as it is when it is printable UTF-8, else `$'…'`.
pub fn shown(p: &Path) -> Cow<'_, str> {
    let bytes = p.as_os_str().as_encoded_bytes();
    if needs_escape(bytes) {
        Cow::Owned(ansi_c(bytes))
    } else {
        p.to_string_lossy()
    }
}

/// `p` inside a sentence: `'name'`, or `$'…'` when the name must be
/// escaped or holds a `'`.
pub fn quoted(p: &Path) -> String {
    let bytes = p.as_os_str().as_encoded_bytes();
    if needs_escape(bytes) || bytes.contains(&b'\'') {
        ansi_c(bytes)
    } else {
        format!("'{}'", p.to_string_lossy())
    }
}

/// Path fields in JSON: each function here is a field name, used as
///
/// ```text
/// #[serde(flatten, serialize_with = "cowlink::name::json::path")]
/// path: PathBuf,
/// ```
///
/// which writes `"path": "…"` (lossy when the name is not UTF-8) and, only
/// for a name that is not UTF-8, `"path_bytes": [..]` with its exact bytes.
/// A list of paths gets `"<key>_bytes"` as a list of the same length, with
/// `null` for each name that is UTF-8, when any is not. `Option` fields
/// write `null` when absent.
pub mod json {
    use super::*;
    use serde::ser::{SerializeMap, Serializer};

    /// Something that holds paths and can write them as a field pair.
    pub trait Names {
        /// Write `key` (lossy) and, when needed, `bytes_key` (exact).
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error>;
    }

    fn bytes_of(p: &Path) -> Option<&[u8]> {
        p.to_str()
            .is_none()
            .then_some(p.as_os_str().as_encoded_bytes())
    }

    impl Names for Path {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            m.serialize_entry(key, &self.to_string_lossy())?;
            if let Some(b) = bytes_of(self) {
                m.serialize_entry(bytes_key, b)?;
            }
            Ok(())
        }
    }

    impl Names for PathBuf {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            self.as_path().put(key, bytes_key, m)
        }
    }

    impl<T: Names + ?Sized> Names for &T {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            (**self).put(key, bytes_key, m)
        }
    }

    impl<T: AsRef<Path>> Names for Option<T> {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            match self {
                Some(p) => p.as_ref().put(key, bytes_key, m),
                None => m.serialize_entry(key, &()),
            }
        }
    }

    impl<T: AsRef<Path>> Names for [T] {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            let lossy: Vec<Cow<'_, str>> =
                self.iter().map(|p| p.as_ref().to_string_lossy()).collect();
            m.serialize_entry(key, &lossy)?;
            if self.iter().any(|p| p.as_ref().to_str().is_none()) {
                let exact: Vec<Option<&[u8]>> = self.iter().map(|p| bytes_of(p.as_ref())).collect();
                m.serialize_entry(bytes_key, &exact)?;
            }
            Ok(())
        }
    }

    impl<T: AsRef<Path>> Names for Vec<T> {
        fn put<M: SerializeMap>(
            &self,
            key: &str,
            bytes_key: &str,
            m: &mut M,
        ) -> Result<(), M::Error> {
            self.as_slice().put(key, bytes_key, m)
        }
    }

    /// A path read back from its field and `*_bytes` companion: the exact
    /// bytes when present, else the string.
    pub fn read_one(lossy: String, exact: Option<Vec<u8>>) -> PathBuf {
        match exact {
            Some(b) => path_from_bytes(b),
            None => PathBuf::from(lossy),
        }
    }

    /// A path from the exact bytes of a `*_bytes` field: any bytes on Unix.
    /// Elsewhere a name is UTF-16 and its exact bytes were WTF-8, which
    /// only an unchecked conversion takes back: the bytes are read lossily
    /// instead (U+FFFD for a lone surrogate).
    #[cfg(unix)]
    fn path_from_bytes(b: Vec<u8>) -> PathBuf {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(b))
    }

    #[cfg(not(unix))]
    fn path_from_bytes(b: Vec<u8>) -> PathBuf {
        PathBuf::from(String::from_utf8_lossy(&b).into_owned())
    }

    /// A list of paths read back from its field and `*_bytes` companion
    /// (one entry per path, `null` where the string is exact).
    pub fn read_many(lossy: Vec<String>, exact: Option<Vec<Option<Vec<u8>>>>) -> Vec<PathBuf> {
        let mut exact = exact.unwrap_or_default().into_iter();
        lossy
            .into_iter()
            .map(|l| read_one(l, exact.next().flatten()))
            .collect()
    }

    macro_rules! fields {
        ($($key:ident),* $(,)?) => {$(
            #[doc = concat!("The `", stringify!($key), "` field and its `", stringify!($key), "_bytes` companion.")]
            pub fn $key<T: Names + ?Sized, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(None)?;
                v.put(stringify!($key), concat!(stringify!($key), "_bytes"), &mut m)?;
                m.end()
            }
        )*};
    }

    fields!(
        path,
        paths,
        src,
        dst,
        source,
        targets,
        already_shared,
        changed,
        quarantined,
        mount_point,
        dir,
        layers,
        data_files,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn p(b: &[u8]) -> &Path {
        Path::new(OsStr::from_bytes(b))
    }

    #[test]
    fn printable_names_stay_as_they_are() {
        assert_eq!(shown(p(b"dir/caf\xc3\xa9 file.txt")), "dir/café file.txt");
        assert_eq!(quoted(p(b"a b")), "'a b'");
        assert_eq!(quoted(p(b"it's")), r"$'it\'s'");
    }

    #[test]
    fn hidden_characters_and_bad_bytes_are_escaped() {
        assert_eq!(shown(p(b"a\nb")), r"$'a\nb'");
        assert_eq!(shown(p(b"esc\x1b[31mred")), r"$'esc\x1b[31mred'");
        assert_eq!(shown(p(b"bad\xff")), r"$'bad\xff'");
        assert_eq!(shown(p("rtl\u{202e}txt".as_bytes())), r"$'rtl\u202etxt'");
        assert_eq!(shown(p(b"back\\slash\t")), r"$'back\\slash\t'");
        // A name that looks escaped is escaped, so the two never meet.
        assert_eq!(shown(p(b"$'x'")), r"$'$\'x\''");
        // Two names that differ only in their bad bytes print differently.
        assert_ne!(shown(p(b"x\xfe")), shown(p(b"x\xff")));
    }

    #[derive(serde::Serialize)]
    struct Row<'a> {
        #[serde(flatten, serialize_with = "json::path")]
        path: &'a Path,
        #[serde(flatten, serialize_with = "json::targets")]
        targets: Vec<PathBuf>,
        #[serde(flatten, serialize_with = "json::dst")]
        dst: Option<PathBuf>,
    }

    #[test]
    fn json_adds_exact_bytes_only_where_a_name_is_not_utf8() {
        let v = serde_json::to_value(Row {
            path: p(b"ok"),
            targets: vec!["a".into(), "b".into()],
            dst: None,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"path": "ok", "targets": ["a", "b"], "dst": null})
        );

        let v = serde_json::to_value(Row {
            path: p(b"x\xff"),
            targets: vec!["a".into(), p(b"y\xfe").into()],
            dst: Some(p(b"\xc3").into()),
        })
        .unwrap();
        assert_eq!(v["path"], "x\u{fffd}");
        assert_eq!(v["path_bytes"], serde_json::json!([b'x', 0xff]));
        assert_eq!(v["targets_bytes"], serde_json::json!([null, [b'y', 0xfe]]));
        assert_eq!(v["dst_bytes"], serde_json::json!([0xc3]));
    }
}
