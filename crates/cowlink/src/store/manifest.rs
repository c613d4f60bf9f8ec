//! Manifests: what a stored tree contains, as versioned JSON.
//!
//! A manifest lists relative paths with their type: files (digest, size,
//! mode), directories (mode) and symbolic links (target). Entries are kept
//! sorted by path and serialized compactly, so the same tree always gives
//! the same bytes and therefore the same digest.
//!
//! Manifests are untrusted input: one read from the store may have been
//! written by anyone who could write there, one passed to
//! [`Store::materialize_tree`](super::Store::materialize_tree) may come
//! from anywhere. [`Manifest::validate`] refuses absolute paths, `.` and
//! `..` components, empty components, NUL bytes, duplicate paths, entries
//! below a file or a symbolic link (which could redirect a write outside
//! the destination), and, unless allowed, symbolic links whose target
//! leaves the tree.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::ground::error::{Error, ErrorKind, Operation, Result};

/// The manifest format version this cowlink writes and reads.
pub const MANIFEST_VERSION: u32 = 1;
/// The value of the `format` field.
pub const MANIFEST_FORMAT: &str = "cowlink-manifest";

/// A BLAKE3 digest: the name of an object in the store.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub(crate) [u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// The 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        crate::ground::hash::hex(&self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

/// Why a string is not a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not a BLAKE3 digest (64 lower-case hex digits)")]
pub struct BadDigest {
    input: String,
}

impl FromStr for Digest {
    type Err = BadDigest;

    /// Exactly 64 lower-case hex digits; nothing else (a digest names a
    /// file in the store, so no other spelling may reach a path).
    fn from_str(s: &str) -> Result<Self, BadDigest> {
        let bad = || BadDigest {
            input: s.chars().take(80).collect(),
        };
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(bad());
        }
        // A manifest holds one digest per file: decode by table, and look
        // for a bad digit once at the end.
        const NIBBLE: [u8; 256] = {
            let mut t = [0xffu8; 256];
            let mut c = 0;
            while c < 10 {
                t[b'0' as usize + c] = c as u8;
                c += 1;
            }
            let mut c = 0;
            while c < 6 {
                t[b'a' as usize + c] = 10 + c as u8;
                c += 1;
            }
            t
        };
        let mut out = [0u8; 32];
        let mut invalid = 0u8;
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            let (hi, lo) = (NIBBLE[pair[0] as usize], NIBBLE[pair[1] as usize]);
            invalid |= hi | lo;
            *o = (hi << 4) | lo;
        }
        if invalid & 0xf0 != 0 {
            return Err(bad());
        }
        Ok(Digest(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Parsed from the borrowed text: no string per digest.
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = Digest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a digest (64 lowercase hex digits)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Digest, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Hex)
    }
}

/// What a manifest entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file whose content is the object `digest`.
    File {
        /// The object.
        digest: Digest,
        /// Its size in bytes.
        size: u64,
        /// Permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
    /// A directory.
    Dir {
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// The link's target, as stored in the link.
        target: String,
    },
}

/// One path of a manifest.
///
/// Written with serde's derive (`path`, then the kind's `type` and
/// fields, flattened: the canonical bytes). Read by hand
/// (`EntryVisitor`): the derived reader of a flattened, tagged enum
/// buffers every entry into a map of owned values first. Reading by hand
/// (and digests by table) took what a checkout of a 46,000-file manifest
/// does before its first file from 68 to 48 ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestEntry {
    /// Relative path with `/` separators, e.g. `bin/tool`.
    pub path: String,
    /// What is at that path.
    #[serde(flatten)]
    pub kind: EntryKind,
}

impl<'de> Deserialize<'de> for ManifestEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EntryVisitor)
    }
}

/// The fields an entry may have; others are skipped, as the derived
/// reader did.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum EntryField {
    Path,
    Type,
    Digest,
    Size,
    Mode,
    Target,
    #[serde(other)]
    Other,
}

/// The kinds an entry's `type` names.
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum KindTag {
    File,
    Dir,
    Symlink,
}

/// Reads one entry's map in one pass, in any field order.
struct EntryVisitor;

impl<'de> serde::de::Visitor<'de> for EntryVisitor {
    type Value = ManifestEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a manifest entry (path, type and the type's fields)")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<ManifestEntry, A::Error> {
        use serde::de::Error as _;
        let (mut path, mut tag, mut digest, mut size, mut mode, mut target) =
            (None, None, None, None, None, None);
        fn once<T, E: serde::de::Error>(
            slot: &mut Option<T>,
            v: T,
            name: &'static str,
        ) -> Result<(), E> {
            match slot.replace(v) {
                Some(_) => Err(E::duplicate_field(name)),
                None => Ok(()),
            }
        }
        while let Some(key) = map.next_key::<EntryField>()? {
            match key {
                EntryField::Path => once(&mut path, map.next_value::<String>()?, "path")?,
                EntryField::Type => once(&mut tag, map.next_value::<KindTag>()?, "type")?,
                EntryField::Digest => once(&mut digest, map.next_value::<Digest>()?, "digest")?,
                EntryField::Size => once(&mut size, map.next_value::<u64>()?, "size")?,
                EntryField::Mode => once(&mut mode, map.next_value::<u32>()?, "mode")?,
                EntryField::Target => once(&mut target, map.next_value::<String>()?, "target")?,
                EntryField::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        let path = path.ok_or_else(|| A::Error::missing_field("path"))?;
        let need = |name: &'static str| A::Error::missing_field(name);
        let kind = match tag.ok_or_else(|| need("type"))? {
            KindTag::File => EntryKind::File {
                digest: digest.ok_or_else(|| need("digest"))?,
                size: size.ok_or_else(|| need("size"))?,
                mode: mode.ok_or_else(|| need("mode"))?,
            },
            KindTag::Dir => EntryKind::Dir {
                mode: mode.ok_or_else(|| need("mode"))?,
            },
            KindTag::Symlink => EntryKind::Symlink {
                target: target.ok_or_else(|| need("target"))?,
            },
        };
        Ok(ManifestEntry { path, kind })
    }
}

/// The contents of a stored tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// Entries sorted by path (parents before children).
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// A manifest of `entries` (sorted here).
    pub fn new(mut entries: Vec<ManifestEntry>) -> Self {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Manifest {
            format: MANIFEST_FORMAT.to_string(),
            version: MANIFEST_VERSION,
            entries,
        }
    }

    /// The canonical bytes (compact JSON, entries sorted), whose BLAKE3 is
    /// the manifest's digest.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain data cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// This manifest's digest: the BLAKE3 of [`to_bytes`](Self::to_bytes),
    /// hashed as they are made (never held whole).
    pub fn digest(&self) -> Digest {
        let mut h = blake3::Hasher::new();
        // Hashing cannot fail, nor can serializing plain data. The buffer
        // hands the hasher large pieces, not each token as written.
        let mut buffered = std::io::BufWriter::with_capacity(1 << 16, &mut h);
        let _ = self.write_to(&mut buffered);
        let _ = std::io::Write::flush(&mut buffered);
        drop(buffered);
        Digest(*h.finalize().as_bytes())
    }

    /// Write the canonical bytes to `out`, as they are made.
    ///
    /// # Errors
    /// `EIO` when `out` fails (a writer that keeps its own errno has it).
    pub(crate) fn write_to(&self, out: &mut impl std::io::Write) -> std::result::Result<(), Errno> {
        serde_json::to_writer(out, self).map_err(|_| Errno::IO)
    }

    /// Parse and [validate](Self::validate) manifest bytes; `origin` names
    /// them in errors (a digest or a file name).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Self> {
        let m = Self::parse(bytes, origin)?;
        m.validate(origin, true)?;
        Ok(m)
    }

    /// [`from_bytes`](Self::from_bytes) of bytes the caller gives up: they
    /// are freed once parsed, before the validation builds its own tables,
    /// so the three are never held at once (for a manifest of 223,547
    /// files, 44 MB of bytes, 41 MB of entries and 22 MB of tables).
    pub fn from_vec(bytes: Vec<u8>, origin: &str) -> Result<Self> {
        let m = Self::parse(&bytes, origin)?;
        drop(bytes);
        m.validate(origin, true)?;
        Ok(m)
    }

    /// Parse, and check the format and version only.
    fn parse(bytes: &[u8], origin: &str) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| invalid(origin, format!("not a cowlink manifest: {e}")))?;
        if m.format != MANIFEST_FORMAT {
            return Err(invalid(
                origin,
                format!("format is '{}', expected '{MANIFEST_FORMAT}'", m.format),
            ));
        }
        if m.version != MANIFEST_VERSION {
            return Err(invalid(
                origin,
                format!(
                    "manifest version {} is not supported (this cowlink reads version {MANIFEST_VERSION})",
                    m.version
                ),
            ));
        }
        Ok(m)
    }

    /// Regular files, with their sizes summed: `(files, bytes)`.
    pub fn file_totals(&self) -> FileTotals {
        let mut t = FileTotals::default();
        for e in &self.entries {
            if let EntryKind::File { size, .. } = e.kind {
                t.files += 1;
                t.bytes += size;
            }
        }
        t
    }

    /// Check that materializing this manifest can only create names below
    /// the destination: every path relative and made of plain components,
    /// no duplicates, nothing below a file or symbolic link, modes within
    /// `0o7777`, and (unless `external_symlinks`) no symbolic link whose
    /// target is absolute or climbs above the tree.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] naming the entry and the rule it breaks.
    pub fn validate(&self, origin: &str, external_symlinks: bool) -> Result<()> {
        // Path → is a directory. A manifest in canonical order (strictly
        // increasing paths, as written) needs no table: a duplicate would
        // be its neighbour, and a path is found by binary search. Over
        // 223,547 files the table (and the ancestors' set, sized for every
        // entry) were 22 MB of a checkout's peak.
        let sorted = self.entries.windows(2).all(|w| w[0].path < w[1].path);
        let mut seen: HashMap<&str, bool> = match sorted {
            true => HashMap::new(),
            false => HashMap::with_capacity(self.entries.len()),
        };
        let symlinks: HashSet<&str> = self
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Symlink { .. }))
            .map(|e| e.path.as_str())
            .collect();
        for e in &self.entries {
            check_path(&e.path)
                .map_err(|why| invalid(origin, format!("entry '{}': {why}", esc(&e.path))))?;
            let is_dir = matches!(e.kind, EntryKind::Dir { .. });
            if !sorted && seen.insert(&e.path, is_dir).is_some() {
                return Err(invalid(
                    origin,
                    format!("entry '{}' appears twice", esc(&e.path)),
                ));
            }
            match &e.kind {
                EntryKind::File { mode, .. } | EntryKind::Dir { mode } if *mode > 0o7777 => {
                    return Err(invalid(
                        origin,
                        format!(
                            "entry '{}': mode {mode:o} has bits beyond 7777",
                            esc(&e.path)
                        ),
                    ));
                }
                EntryKind::Symlink { target } => {
                    if target.is_empty() || target.contains('\0') {
                        return Err(invalid(
                            origin,
                            format!(
                                "symbolic link '{}' has an empty or NUL-containing target",
                                esc(&e.path)
                            ),
                        ));
                    }
                    if !external_symlinks && escapes(&e.path, target, &symlinks) {
                        return Err(invalid(
                            origin,
                            format!(
                                "symbolic link '{}' points outside the tree ('{}'); \
                                 refused unless external symbolic links are allowed",
                                esc(&e.path),
                                esc(target)
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
        // Every ancestor that is listed must be a directory: a file or a
        // symbolic link there would make later entries land elsewhere.
        // Each prefix is looked at once: a walk up stops at the first one
        // already checked (so a 3000-level chain costs its length, not its
        // length squared).
        let is_dir = |p: &str| -> Option<bool> {
            match sorted {
                true => self
                    .entries
                    .binary_search_by(|e| e.path.as_str().cmp(p))
                    .ok()
                    .map(|i| matches!(self.entries[i].kind, EntryKind::Dir { .. })),
                false => seen.get(p).copied(),
            }
        };
        // One per directory above an entry, not per entry.
        let mut checked: HashSet<&str> = HashSet::new();
        for e in &self.entries {
            let mut p = e.path.as_str();
            while let Some(i) = p.rfind('/') {
                p = &p[..i];
                if !checked.insert(p) {
                    break;
                }
                if is_dir(p) == Some(false) {
                    return Err(invalid(
                        origin,
                        format!(
                            "entry '{}' is below '{}', which is not a directory in the manifest",
                            esc(&e.path),
                            esc(p)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Reads a manifest in its canonical form (compact JSON, as
/// [`Manifest::to_bytes`] writes it) as its bytes arrive, so that they
/// are never all held at once: for 223,547 files the bytes are 44 MB,
/// more than the entries parsed from them, and holding both made a
/// checkout's peak. Each entry is parsed once it is complete (an entry cut
/// by the end of a chunk reads as the end of input and is parsed again
/// with the next). Anything else, and any entry that fails to parse,
/// leaves [`Streamed::finish`] with nothing: the caller reads the whole
/// text with [`Manifest::from_vec`] instead, whose errors name the fault.
#[derive(Debug)]
pub(crate) struct Streamed {
    /// Bytes received and not yet consumed (at most an entry and a chunk).
    buf: Vec<u8>,
    stage: Stage,
    entries: Vec<ManifestEntry>,
    /// Still in canonical form.
    ok: bool,
}

/// Where [`Streamed`] is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before the end of `{"format":…,"version":…,"entries":[`.
    Head,
    /// After `[`: an entry or `]`.
    First,
    /// After `,`: an entry.
    Entry,
    /// After an entry: `,` or `]`.
    Next,
    /// After `]`: `}`.
    Tail,
    /// After the final `}`: nothing more.
    End,
}

impl Default for Streamed {
    fn default() -> Self {
        Streamed {
            buf: Vec::new(),
            stage: Stage::Head,
            entries: Vec::new(),
            ok: true,
        }
    }
}

impl Streamed {
    /// The text before the first entry.
    fn head() -> String {
        format!(r#"{{"format":"{MANIFEST_FORMAT}","version":{MANIFEST_VERSION},"entries":["#)
    }

    /// The most bytes held waiting for an entry to end. An entry cut by a
    /// chunk's end is parsed again from its start with the next chunk, so
    /// one huge entry (a symbolic link's target has no limit) would be
    /// parsed over and over; past this the text goes to the general
    /// reader instead.
    const MAX_PENDING: usize = 4 << 20;

    /// Take the next bytes of the text.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.ok {
            return;
        }
        self.buf.extend_from_slice(chunk);
        let mut pos = 0;
        self.ok = self.advance(&mut pos) && self.buf.len() - pos <= Self::MAX_PENDING;
        self.buf.drain(..pos);
        if !self.ok {
            self.buf = Vec::new();
            self.entries = Vec::new();
        }
    }

    /// Consume what can be from `buf[*pos..]`; false when the text is not
    /// in canonical form.
    fn advance(&mut self, pos: &mut usize) -> bool {
        loop {
            let rest = &self.buf[*pos..];
            let next = rest.first().copied();
            self.stage = match (self.stage, next) {
                (Stage::Head, _) => {
                    let head = Self::head();
                    if rest.len() < head.len() {
                        return head.as_bytes().starts_with(rest);
                    }
                    if !rest.starts_with(head.as_bytes()) {
                        return false;
                    }
                    *pos += head.len();
                    Stage::First
                }
                (_, None) => return true,
                (Stage::First, Some(b']')) | (Stage::Next, Some(b']')) => {
                    *pos += 1;
                    Stage::Tail
                }
                (Stage::First | Stage::Entry, Some(b'{')) => {
                    let de = serde_json::Deserializer::from_slice(rest);
                    let mut it = de.into_iter::<ManifestEntry>();
                    match it.next() {
                        Some(Ok(e)) => {
                            self.entries.push(e);
                            *pos += it.byte_offset();
                            Stage::Next
                        }
                        Some(Err(e)) if e.is_eof() => return true,
                        _ => return false,
                    }
                }
                (Stage::Next, Some(b',')) => {
                    *pos += 1;
                    Stage::Entry
                }
                (Stage::Tail, Some(b'}')) => {
                    *pos += 1;
                    Stage::End
                }
                _ => return false,
            };
        }
    }

    /// The manifest, if the whole text was read in canonical form (not
    /// yet [validated](Manifest::validate)).
    pub fn finish(self) -> Option<Manifest> {
        let whole = self.ok && self.stage == Stage::End && self.buf.is_empty();
        whole.then(|| Manifest {
            format: MANIFEST_FORMAT.to_string(),
            version: MANIFEST_VERSION,
            entries: self.entries,
        })
    }
}

fn invalid(origin: &str, why: String) -> Error {
    Error::new(Operation::Manifest, ErrorKind::InvalidInput)
        .with_src(origin)
        .with_reason(format!("invalid manifest: {why}"))
}

/// A path for messages, with control characters escaped.
fn esc(s: &str) -> String {
    s.chars().take(300).flat_map(char::escape_debug).collect()
}

/// The longest path a manifest may hold.
const MAX_PATH: usize = 64 << 10;

/// Whether `path` is a plain relative path: no leading `/`, no empty, `.`
/// or `..` components, no NUL, components within NAME_MAX, at most
/// [`MAX_PATH`] bytes.
fn check_path(path: &str) -> std::result::Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.starts_with('/') {
        return Err("absolute paths are not allowed");
    }
    if path.contains('\0') {
        return Err("NUL byte in path");
    }
    // Deeper than PATH_MAX is fine (every open is relative, in pieces);
    // this only bounds what a hostile manifest can make us walk.
    if path.len() > MAX_PATH {
        return Err("path longer than 64 KiB");
    }
    for c in path.split('/') {
        match c {
            "" => return Err("empty path component ('//' or trailing '/')"),
            "." => return Err("'.' components are not allowed"),
            ".." => return Err("path traversal ('..') is not allowed"),
            c if c.len() > 255 => return Err("a component is longer than NAME_MAX (255 bytes)"),
            _ => {}
        }
    }
    Ok(())
}

/// Whether a symbolic link at `path` with `target` may resolve outside
/// the tree: absolute, more `..` than there are directories above it at
/// some point, or a `..` right after a component that is itself a symbolic
/// link of the manifest (where `..` would climb from the link's target, not
/// from where the link is: refused to stay sound).
fn escapes(path: &str, target: &str, symlinks: &HashSet<&str>) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let mut stack: Vec<&str> = path.split('/').collect();
    stack.pop(); // the link's own name
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if stack.is_empty() || symlinks.contains(stack.join("/").as_str()) {
                    return true;
                }
                stack.pop();
            }
            _ => stack.push(c),
        }
    }
    false
}

/// How many regular files a manifest lists, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FileTotals {
    /// Regular files.
    pub files: u64,
    /// Their sizes summed.
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: EntryKind::File {
                digest: Digest::of(b""),
                size: 0,
                mode: 0o644,
            },
        }
    }

    fn link(path: &str, target: &str) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: EntryKind::Symlink {
                target: target.into(),
            },
        }
    }

    fn dir(path: &str) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind: EntryKind::Dir { mode: 0o755 },
        }
    }

    fn reason(m: &Manifest) -> String {
        m.validate("m", false).unwrap_err().to_string()
    }

    #[test]
    fn entries_read_back_as_written_in_any_field_order() {
        let m = Manifest::new(vec![dir("d"), file("d/f"), link("d/l", "f")]);
        let bytes = m.to_bytes();
        assert_eq!(Manifest::from_bytes(&bytes, "m").unwrap(), m);
        // Field order and unknown fields do not matter to the reader.
        let text = format!(
            r#"{{"format":"{MANIFEST_FORMAT}","version":1,"entries":[
              {{"mode":420,"size":0,"x":[1,{{"y":2}}],"digest":"{}","type":"file","path":"f"}},
              {{"target":"f","type":"symlink","path":"l"}}]}}"#,
            Digest::of(b"").to_hex()
        );
        let read = Manifest::from_bytes(text.as_bytes(), "m").unwrap();
        assert_eq!(read.entries, vec![file("f"), link("l", "f")]);
    }

    #[test]
    fn malformed_entries_are_refused_naming_the_field() {
        let refuse = |entry: &str| {
            let text =
                format!(r#"{{"format":"{MANIFEST_FORMAT}","version":1,"entries":[{entry}]}}"#);
            Manifest::from_bytes(text.as_bytes(), "m")
                .unwrap_err()
                .to_string()
        };
        let d = Digest::of(b"").to_hex();
        let missing = refuse(&format!(
            r#"{{"type":"file","path":"f","digest":"{d}","mode":420}}"#
        ));
        assert!(missing.contains("missing field `size`"), "{missing}");
        let twice = refuse(r#"{"type":"dir","path":"a","path":"b","mode":493}"#);
        assert!(twice.contains("duplicate field `path`"), "{twice}");
        let kind = refuse(r#"{"type":"fifo","path":"p","mode":420}"#);
        assert!(kind.contains("unknown variant `fifo`"), "{kind}");
        let digest = refuse(r#"{"type":"file","path":"f","digest":"AB","size":0,"mode":420}"#);
        assert!(digest.contains("not a cowlink manifest"), "{digest}");
        let no_path = refuse(r#"{"type":"symlink","target":"x"}"#);
        assert!(no_path.contains("missing field `path`"), "{no_path}");
    }

    #[test]
    fn digests_parse_only_canonical_hex() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_hex().parse::<Digest>().unwrap(), d);
        assert!("".parse::<Digest>().is_err());
        assert!(d.to_hex().to_uppercase().parse::<Digest>().is_err());
        assert!(format!("../{}", &d.to_hex()[3..])
            .parse::<Digest>()
            .is_err());
        assert!(format!("{}0", d.to_hex()).parse::<Digest>().is_err());
        // Any one digit out of 0-9a-f, wherever it is, is refused.
        let hex = d.to_hex();
        for at in 0..64 {
            for bad in ["g", "A", "F", "/", ".", " ", ":", "`", "\u{7f}"] {
                let s = format!("{}{bad}{}", &hex[..at], &hex[at + 1..]);
                assert!(s.parse::<Digest>().is_err(), "{s}");
            }
        }
        let accented = format!("{}é", &hex[..62]);
        assert_eq!(accented.len(), 64);
        assert!(accented.parse::<Digest>().is_err());
    }

    #[test]
    fn bytes_are_canonical_and_round_trip() {
        let a = Manifest::new(vec![file("b"), file("a/x"), link("c", "a/x")]);
        let b = Manifest::new(vec![link("c", "a/x"), file("a/x"), file("b")]);
        assert_eq!(a.to_bytes(), b.to_bytes());
        assert_eq!(a.digest(), b.digest());
        let back = Manifest::from_bytes(&a.to_bytes(), "m").unwrap();
        assert_eq!(back, a);
        assert_eq!(Manifest::from_vec(a.to_bytes(), "m").unwrap(), a);
    }

    #[test]
    fn from_vec_refuses_what_from_bytes_refuses() {
        // A bad version (the parse) and a file below a file (validation).
        let v2 = format!(r#"{{"format":"{MANIFEST_FORMAT}","version":2,"entries":[]}}"#);
        let below = Manifest::new(vec![file("f"), file("f/x")]).to_bytes();
        for bytes in [v2.into_bytes(), below] {
            let a = Manifest::from_bytes(&bytes, "m").unwrap_err().to_string();
            let b = Manifest::from_vec(bytes, "m").unwrap_err().to_string();
            assert_eq!(a, b);
            assert!(
                a.contains("version 2") || a.contains("not a directory"),
                "{a}"
            );
        }
    }

    #[test]
    fn hostile_paths_are_refused_with_the_rule() {
        for (p, why) in [
            ("../x", "path traversal"),
            ("a/../../x", "path traversal"),
            ("/etc/passwd", "absolute"),
            ("a//b", "empty path component"),
            ("a/./b", "'.' components"),
            ("a/", "empty path component"),
            ("", "empty path"),
            ("a\0b", "NUL"),
        ] {
            let r = reason(&Manifest::new(vec![file(p)]));
            assert!(r.contains(why), "{p:?}: {r}");
        }
        let r = reason(&Manifest::new(vec![file("a"), file("a")]));
        assert!(r.contains("appears twice"), "{r}");
    }

    #[test]
    fn nothing_may_live_below_a_symlink_or_file() {
        let r = reason(&Manifest::new(vec![link("out", "sub"), file("out/passwd")]));
        assert!(r.contains("not a directory in the manifest"), "{r}");
        let r = reason(&Manifest::new(vec![file("f"), file("f/g")]));
        assert!(r.contains("not a directory"), "{r}");
    }

    #[test]
    fn the_digest_is_of_the_canonical_bytes() {
        let m = Manifest::new(vec![file("a"), link("l", "a")]);
        assert_eq!(m.digest(), Digest::of(&m.to_bytes()));
        let mut written = Vec::new();
        m.write_to(&mut written).unwrap();
        assert_eq!(written, m.to_bytes());
    }

    /// [`Streamed`] fed `bytes` in chunks of `n`.
    fn streamed(bytes: &[u8], n: usize) -> Option<Manifest> {
        let mut s = Streamed::default();
        for c in bytes.chunks(n) {
            s.feed(c);
        }
        s.finish()
    }

    #[test]
    fn a_canonical_manifest_reads_the_same_in_chunks_of_any_size() {
        let m = Manifest::new(vec![
            dir("d"),
            file("d/a \"quoted\" {brace}, [x]"),
            link("d/l", "a},{"),
            file("z"),
        ]);
        let bytes = m.to_bytes();
        for n in 1..=bytes.len() {
            assert_eq!(streamed(&bytes, n).as_ref(), Some(&m), "chunks of {n}");
        }
        let empty = Manifest::new(Vec::new());
        assert_eq!(streamed(&empty.to_bytes(), 3), Some(empty));
    }

    #[test]
    fn a_huge_entry_is_left_to_the_general_reader() {
        // (Checked after each chunk: an entry this much longer cannot end
        // in time.)
        let target = "t".repeat(2 * Streamed::MAX_PENDING);
        let m = Manifest::new(vec![file("a"), link("l", &target)]);
        let bytes = m.to_bytes();
        assert!(streamed(&bytes, 1 << 20).is_none());
        assert!(Manifest::parse(&bytes, "m").unwrap() == m);
        // Under the bound it streams.
        let target = "t".repeat(Streamed::MAX_PENDING - (1 << 20));
        let m = Manifest::new(vec![link("l", &target)]);
        assert!(streamed(&m.to_bytes(), 1 << 20) == Some(m));
    }

    #[test]
    fn anything_but_a_whole_canonical_manifest_streams_to_nothing() {
        let m = Manifest::new(vec![file("a"), file("b")]);
        let bytes = m.to_bytes();
        let pretty = serde_json::to_vec_pretty(&m).unwrap();
        let reordered = br#"{"version":1,"format":"cowlink-manifest","entries":[]}"#;
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(b" ");
        let mut bad_entry = bytes.clone();
        bad_entry.splice(bytes.len() - 3..bytes.len() - 2, *b"x");
        for (what, text) in [
            ("pretty", &pretty[..]),
            ("reordered", &reordered[..]),
            ("truncated", &bytes[..bytes.len() - 1]),
            ("cut in an entry", &bytes[..bytes.len() / 2]),
            ("trailing", &trailing[..]),
            ("bad entry", &bad_entry[..]),
            ("empty", &b""[..]),
        ] {
            assert_eq!(streamed(text, 7), None, "{what}");
            // The general reader still takes what is valid JSON.
            let general = Manifest::parse(text, "m").is_ok();
            assert_eq!(
                general,
                matches!(what, "pretty" | "reordered" | "trailing"),
                "{what}"
            );
        }
    }

    #[test]
    fn the_order_of_entries_does_not_change_what_is_refused() {
        // A manifest in canonical order is checked by binary search, one
        // in any other order with a table: the same rules either way.
        for entries in [
            vec![file("f"), file("f/g")],
            vec![link("out", "sub"), file("out/x")],
            vec![dir("d"), file("d/e/f"), file("d/e")],
        ] {
            let sorted = Manifest::new(entries);
            let mut shuffled = sorted.clone();
            shuffled.entries.reverse();
            for m in [&sorted, &shuffled] {
                let r = reason(m);
                assert!(r.contains("not a directory in the manifest"), "{r}");
            }
        }
        let good = Manifest::new(vec![dir("d"), dir("d/e"), file("d/e/f"), file("d/g")]);
        let mut shuffled = good.clone();
        shuffled.entries.reverse();
        for m in [&good, &shuffled] {
            m.validate("m", false).unwrap();
        }
        let mut twice = good.clone();
        twice.entries.push(file("d/e/f"));
        assert!(reason(&twice).contains("appears twice"));
    }

    #[test]
    fn escaping_symlinks_need_permission() {
        for t in ["/etc", "..", "a/../../b", "../x"] {
            let m = Manifest::new(vec![link("l", t)]);
            assert!(reason(&m).contains("points outside the tree"), "{t}");
            m.validate("m", true).unwrap();
        }
        for (p, t) in [
            ("l", "a/b"),
            ("d/l", "../x"),
            ("d/e/l", "../../y"),
            ("l", "./a/../b"),
        ] {
            Manifest::new(vec![link(p, t)])
                .validate("m", false)
                .unwrap();
        }
        // `s` points at the root, so `s/..` is the root's parent.
        let m = Manifest::new(vec![link("s", "."), link("l", "s/..")]);
        assert!(reason(&m).contains("'l' points outside"), "{}", reason(&m));
    }

    #[test]
    fn versions_and_formats_are_checked() {
        let mut m = Manifest::new(vec![file("a")]);
        m.version = 2;
        let e = Manifest::from_bytes(&m.to_bytes(), "m").unwrap_err();
        assert!(e.to_string().contains("version 2 is not supported"), "{e}");
        let e = Manifest::from_bytes(b"{\"x\":1}", "m").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }
}
