//! Manifests: what a stored tree contains, as versioned JSON.
//!
//! A manifest lists relative paths with their type: files (digest, size,
//! mode), directories (mode) and symbolic links (target). Entries are kept
//! sorted by path and serialized compactly, so the same tree always gives
//! the same bytes and therefore the same digest.
//!
//! Manifests are untrusted input: one read from the store may have been
//! written by anyone who could write there, one passed to
//! [`Store::checkout`](super::Store::checkout) may come
//! from anywhere. [`Manifest::validate`] refuses absolute paths, `.` and
//! `..` components, empty components, NUL bytes, duplicate paths, entries
//! below a file or a symbolic link (which could redirect a write outside
//! the destination), one digest listed with two sizes, and, unless
//! allowed, symbolic links whose resolution leaves the tree: each target
//! is resolved in the manifest's own tree the way the kernel would
//! resolve it once checked out (`paths.rs`). Every check is linear in the
//! manifest's bytes.
//!
//! A manifest named by its digest (stored, pushed, pulled) is only ever
//! its canonical bytes ([`Manifest::from_canonical_bytes`]): the digest is
//! of those bytes, and nothing is written again in another form under
//! it. A manifest file given by a person may be in any JSON layout.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::ground::error::{Error, ErrorKind, Operation, Result};

use super::paths::{LinkVerdict, NodeKind, PathTree, TreeError};

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

    /// [`from_bytes`](Self::from_bytes) of bytes that must be in the one
    /// canonical form ([`to_bytes`](Self::to_bytes) of what they parse
    /// to): what is named by its digest (a stored or fetched manifest)
    /// is only ever the canonical bytes, so a manifest is never written
    /// again under another form (and digest) than the one it was named by.
    ///
    /// # Errors
    /// `InvalidInput` as [`from_bytes`](Self::from_bytes), and for valid
    /// bytes in another form (spaces, other field order, unknown fields,
    /// entries out of order, other string escapes).
    pub fn from_canonical_bytes(bytes: &[u8], origin: &str) -> Result<Self> {
        let m = Self::from_bytes(bytes, origin)?;
        m.require_canonical(Digest::of(bytes), origin)?;
        Ok(m)
    }

    /// Refuse when `digest` (of the bytes `self` was read from) is not
    /// the digest of this manifest's canonical bytes.
    pub(crate) fn require_canonical(&self, digest: Digest, origin: &str) -> Result<()> {
        let sorted = self.entries.windows(2).all(|w| w[0].path < w[1].path);
        if !sorted || self.digest() != digest {
            return Err(invalid(
                origin,
                "the bytes are not in canonical form (compact JSON, fields and entries in \
                 cowlink's order, as `add-tree` writes them): a manifest is stored and \
                 exchanged only in that form, under the digest of those bytes"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// Read and [validate](Self::validate) the manifest file at `path`
    /// (one a person names: a symbolic link to it is followed). Only a
    /// regular file is read: a FIFO, a device (`/dev/zero` would never
    /// end) or a directory is refused with
    /// [`ErrorKind::NotRegularFile`] (`IsDirectory`) before a byte is
    /// read, and the file is left as it is. Opened `O_NONBLOCK |
    /// O_NOCTTY`, so opening a FIFO cannot hang either.
    ///
    /// # Errors
    /// As above; the open's own errors (`NotFound`, `PermissionDenied`);
    /// `InvalidInput` for an invalid manifest.
    pub fn read_file(path: &std::path::Path) -> Result<Self> {
        use rustix::fs::{Mode, OFlags};
        let err = |e: Errno| Error::from_errno(Operation::Manifest, e).with_src(path);
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let st = cowlink_sys::fstat(&fd).map_err(err)?;
        let fd = super::layout::regular(fd).map_err(|e| match e {
            super::layout::NOT_REGULAR => {
                Error::new(Operation::Manifest, ErrorKind::NotRegularFile)
                    .with_src(path)
                    .with_reason(format!(
                        "{}, not a regular file: a manifest is read only from a regular file",
                        crate::prim::files::file_type_name(st.st_mode)
                    ))
            }
            e => err(e),
        })?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes)
            .map_err(|e| Error::from_io(Operation::Manifest, &e).with_src(path))?;
        Self::from_vec(bytes, &path.to_string_lossy())
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
    /// `0o7777`, one size per digest, and (unless `external_symlinks`)
    /// every symbolic link resolving inside the tree (see
    /// [`link_verdicts`](Self::link_verdicts)).
    ///
    /// Every check takes time linear in the manifest's bytes.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] naming the entry and the rule it breaks.
    pub fn validate(&self, origin: &str, external_symlinks: bool) -> Result<()> {
        self.checked_tree(origin, external_symlinks).map(drop)
    }

    /// The verdict on each symbolic link of the manifest (path and
    /// verdict, in path order of the tree): its target resolved in the
    /// manifest's own tree of directories and links, as the kernel would
    /// resolve it once checked out (links followed wherever they appear,
    /// `..` climbing from where the walk is, at most [`MAX_LINKS`](super::MAX_LINKS)
    /// links). [`validate`](Self::validate) refuses a manifest with any
    /// verdict but [`LinkVerdict::Inside`] unless external links are
    /// allowed.
    ///
    /// # Errors
    /// `InvalidInput` when the paths themselves are invalid (see
    /// [`validate`](Self::validate)).
    pub fn link_verdicts(&self, origin: &str) -> Result<Vec<(&str, LinkVerdict)>> {
        let tree = self.checked_tree(origin, true)?;
        Ok(self
            .resolve(&tree)
            .into_iter()
            .map(|(node, v)| (tree.nodes[node as usize].path, v))
            .collect())
    }

    fn resolve<'m>(&'m self, tree: &PathTree<'m>) -> Vec<(u32, LinkVerdict)> {
        tree.resolve_links(|entry| match &self.entries[entry as usize].kind {
            EntryKind::Symlink { target } => target.as_str(),
            _ => "",
        })
    }

    /// [`validate`](Self::validate), giving the tree of paths it built.
    pub(crate) fn checked_tree(
        &self,
        origin: &str,
        external_symlinks: bool,
    ) -> Result<PathTree<'_>> {
        let mut sizes: HashMap<Digest, (u64, usize)> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            check_path(&e.path)
                .map_err(|why| invalid(origin, format!("entry '{}': {why}", esc(&e.path))))?;
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
                EntryKind::File { digest, size, .. } => {
                    if let Some(&(other, j)) = sizes.get(digest) {
                        if other != *size {
                            return Err(invalid(
                                origin,
                                format!(
                                    "object {digest} is listed with two sizes: {other} bytes \
                                     for '{}' and {size} for '{}'",
                                    esc(&self.entries[j].path),
                                    esc(&e.path)
                                ),
                            ));
                        }
                    } else {
                        sizes.insert(*digest, (*size, i));
                    }
                }
                EntryKind::Symlink { target } if target.is_empty() || target.contains('\0') => {
                    return Err(invalid(
                        origin,
                        format!(
                            "symbolic link '{}' has an empty or NUL-containing target",
                            esc(&e.path)
                        ),
                    ));
                }
                // No kernel stores a longer target (symlink(2) takes at
                // most PATH_MAX bytes with the NUL): refused here, before
                // anything is written, as a component over NAME_MAX is.
                EntryKind::Symlink { target } if target.len() > MAX_TARGET => {
                    return Err(invalid(
                        origin,
                        format!(
                            "symbolic link '{}' has a target of {} bytes, longer than \
                             PATH_MAX allows ({MAX_TARGET} bytes)",
                            esc(&e.path),
                            target.len()
                        ),
                    ));
                }
                _ => {}
            }
        }
        drop(sizes);
        let kinds = self.entries.iter().map(|e| {
            let kind = match e.kind {
                EntryKind::File { .. } => NodeKind::File,
                EntryKind::Dir { .. } => NodeKind::Dir,
                EntryKind::Symlink { .. } => NodeKind::Link,
            };
            (e.path.as_str(), kind)
        });
        let tree = PathTree::build(kinds).map_err(|e| match e {
            TreeError::Twice(i) => invalid(
                origin,
                format!("entry '{}' appears twice", esc(&self.entries[i].path)),
            ),
            TreeError::Below(i, j) => invalid(
                origin,
                format!(
                    "entry '{}' is below '{}', which is not a directory in the manifest",
                    esc(&self.entries[i].path),
                    esc(&self.entries[j].path)
                ),
            ),
        })?;
        if !external_symlinks {
            for (node, verdict) in self.resolve(&tree) {
                let e = &self.entries[tree.nodes[node as usize].entry as usize];
                let EntryKind::Symlink { target } = &e.kind else {
                    continue;
                };
                let why = match verdict {
                    LinkVerdict::Inside => continue,
                    LinkVerdict::Outside => "points outside the tree",
                    LinkVerdict::TooManyLinks => {
                        "cannot be resolved: it follows more than 40 symbolic links (a loop?)"
                    }
                };
                return Err(invalid(
                    origin,
                    format!(
                        "symbolic link '{}' {why} ('{}'); \
                         refused unless external symbolic links are allowed",
                        esc(&e.path),
                        esc(target)
                    ),
                ));
            }
        }
        Ok(tree)
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
    /// An entry written again, to compare with its bytes.
    scratch: Vec<u8>,
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
            scratch: Vec::new(),
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
    /// one huge entry (hostile text need not keep to the 64 KiB path and
    /// 4 KiB target limits the validation applies later) would be parsed
    /// over and over; past this the text goes to the general reader
    /// instead.
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
                            // Canonical means: exactly the bytes this entry
                            // is written as, and after the one before it.
                            let raw = &rest[..it.byte_offset()];
                            self.scratch.clear();
                            if serde_json::to_writer(&mut self.scratch, &e).is_err()
                                || self.scratch != raw
                                || self.entries.last().is_some_and(|l| l.path >= e.path)
                            {
                                return false;
                            }
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

/// The longest symbolic link target any Linux filesystem stores
/// (PATH_MAX less its NUL); some store less (XFS: 1024 bytes).
const MAX_TARGET: usize = 4095;

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
    use crate::store::MAX_LINKS;

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

    /// A small deterministic generator (xorshift64*): the same cases on
    /// every run, no dependency.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random manifest of directories, files and links over the names
    /// a, b, c (paths up to 3 deep; targets of up to 6 components from
    /// a, b, c, `.`, `..`, now and then absolute).
    pub(crate) fn random_manifest(rng: &mut Rng) -> Manifest {
        let names = ["a", "b", "c"];
        let mut entries = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..rng.below(10) + 1 {
            let depth = rng.below(3) + 1;
            let path: Vec<&str> = (0..depth).map(|_| names[rng.below(3) as usize]).collect();
            let path = path.join("/");
            if !seen.insert(path.clone()) {
                continue;
            }
            entries.push(match rng.below(4) {
                0 => dir(&path),
                1 => file(&path),
                _ => {
                    let mut t: Vec<&str> = (0..rng.below(6) + 1)
                        .map(|_| ["a", "b", "c", ".", "..", ".."][rng.below(6) as usize])
                        .collect();
                    if rng.below(20) == 0 {
                        t.insert(0, "");
                    }
                    link(&path, &t.join("/"))
                }
            });
        }
        Manifest::new(entries)
    }

    /// The kernel's way, step by step: a stack of components, a link's
    /// target spliced in where the link is named, at most 40 links.
    pub(crate) fn naive_verdict(m: &Manifest, link_path: &str) -> LinkVerdict {
        let kinds: HashMap<&str, &EntryKind> = m
            .entries
            .iter()
            .map(|e| (e.path.as_str(), &e.kind))
            .collect();
        let target_of = |p: &str| match kinds.get(p) {
            Some(EntryKind::Symlink { target }) => Some(target.clone()),
            _ => None,
        };
        let mut cur: Vec<String> = link_path.split('/').map(String::from).collect();
        cur.pop();
        let first = target_of(link_path).expect("a link");
        let mut followed = 1;
        let mut todo: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        if first.starts_with('/') {
            return LinkVerdict::Outside;
        }
        todo.extend(first.split('/').map(String::from));
        while let Some(c) = todo.pop_front() {
            match c.as_str() {
                "" | "." => {}
                ".." => {
                    if cur.pop().is_none() {
                        return LinkVerdict::Outside;
                    }
                }
                name => {
                    let mut p = cur.join("/");
                    if !p.is_empty() {
                        p.push('/');
                    }
                    p.push_str(name);
                    match target_of(&p) {
                        Some(t) => {
                            followed += 1;
                            if followed > MAX_LINKS {
                                return LinkVerdict::TooManyLinks;
                            }
                            if t.starts_with('/') {
                                return LinkVerdict::Outside;
                            }
                            for c in t.split('/').rev() {
                                todo.push_front(c.to_string());
                            }
                        }
                        None => cur.push(name.to_string()),
                    }
                }
            }
        }
        LinkVerdict::Inside
    }

    #[test]
    fn link_verdicts_match_the_kernels_way_on_random_trees() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut inside, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let m = random_manifest(&mut rng);
            let Ok(verdicts) = m.link_verdicts("m") else {
                continue;
            };
            for (path, v) in verdicts {
                let naive = naive_verdict(&m, path);
                // A chain that both loops and escapes may be named
                // either way; whether it is refused may not differ.
                assert_eq!(
                    v == LinkVerdict::Inside,
                    naive == LinkVerdict::Inside,
                    "{path}: {v:?} vs {naive:?} in {:?}",
                    m.entries
                );
                if v == LinkVerdict::Inside {
                    inside += 1;
                } else {
                    refused += 1;
                }
            }
        }
        assert!(
            inside > 1000 && refused > 1000,
            "{inside} inside, {refused} refused"
        );
    }

    #[test]
    fn the_reported_escapes_are_refused() {
        // `s -> .` then `s/s/..`: the `..` follows `s`, a link to the
        // root, so it climbs above the destination.
        for entries in [
            vec![link("s", "."), link("l", "s/s/..")],
            vec![dir("d"), link("d/s", ".."), link("l", "d/s/d/s/..")],
            vec![dir("a"), link("a/up", ".."), link("x", "a/up/a/up/a/up/..")],
            // Through a chain of links.
            vec![
                link("p", "q"),
                link("q", "r"),
                link("r", ".."),
                link("l", "p"),
            ],
            vec![link("loop", "loop"), link("l", "loop/..")],
        ] {
            let m = Manifest::new(entries);
            let r = reason(&m);
            assert!(
                r.contains("points outside") || r.contains("more than 40"),
                "{r}"
            );
            m.validate("m", true).unwrap();
        }
        // 41 links are one too many; 40 are fine.
        let chain = |n: usize| {
            let mut e: Vec<ManifestEntry> = (0..n - 1)
                .map(|i| link(&format!("l{i:02}"), &format!("l{:02}", i + 1)))
                .collect();
            e.push(link(&format!("l{:02}", n - 1), "f"));
            e.push(file("f"));
            Manifest::new(e)
        };
        chain(40).validate("m", false).unwrap();
        assert!(
            reason(&chain(41)).contains("more than 40"),
            "{}",
            reason(&chain(41))
        );
    }

    #[test]
    fn deep_and_long_inputs_validate_in_one_pass() {
        // The worst cases of the quadratic checks this replaced: each is
        // checked for its verdict only (the benchmark measures time).
        let deep = "a/".repeat(30_000) + "f";
        Manifest::new(vec![file(&deep)])
            .validate("m", false)
            .unwrap();
        // A target is at most PATH_MAX bytes, whatever it holds.
        let long = "a/".repeat(200_000) + &"../".repeat(200_000) + "f";
        assert!(reason(&Manifest::new(vec![link("l", &long)])).contains("longer than PATH_MAX"));
        let climb = "a/".repeat(800) + &"../".repeat(800) + "f";
        Manifest::new(vec![link("l", &climb)])
            .validate("m", false)
            .unwrap();
        let climb_out = "a/".repeat(800) + &"../".repeat(801) + "f";
        assert!(reason(&Manifest::new(vec![link("l", &climb_out)])).contains("points outside"));
        // Many links through one long one.
        let mut e = vec![dir("d"), link("d/big", &"./".repeat(2047))];
        e.extend((0..20_000).map(|i| link(&format!("l{i}"), "d/big/big/big")));
        Manifest::new(e).validate("m", false).unwrap();
    }

    #[test]
    fn one_digest_with_two_sizes_is_refused() {
        let sized = |p: &str, size| ManifestEntry {
            path: p.into(),
            kind: EntryKind::File {
                digest: Digest::of(b"x"),
                size,
                mode: 0o644,
            },
        };
        let m = Manifest::new(vec![sized("a", 1), sized("b", 1), sized("c", 2)]);
        let r = reason(&m);
        assert!(
            r.contains("listed with two sizes: 1 bytes for 'a' and 2 for 'c'"),
            "{r}"
        );
        assert!(m.validate("m", true).is_err(), "whatever the link rule");
        Manifest::new(vec![sized("a", 1), sized("b", 1)])
            .validate("m", false)
            .unwrap();
    }

    #[test]
    fn only_canonical_bytes_are_canonical() {
        let m = Manifest::new(vec![dir("d"), file("d/f"), link("l", "d/f")]);
        let bytes = m.to_bytes();
        assert_eq!(Manifest::from_canonical_bytes(&bytes, "m").unwrap(), m);
        assert!(streamed(&bytes, 5).is_some());
        let text = String::from_utf8(bytes.clone()).unwrap();
        let d = Digest::of(b"").to_hex();
        for other in [
            serde_json::to_string_pretty(&m).unwrap(),
            text.replace(',', ", "),
            // Fields in another order; an unknown field; another escape.
            text.replace(
                r#"{"path":"d","type":"dir","mode":493}"#,
                r#"{"type":"dir","path":"d","mode":493}"#,
            ),
            text.replace(
                r#""type":"dir","mode":493}"#,
                r#""type":"dir","mode":493,"x":1}"#,
            ),
            text.replace(r#""path":"d/f""#, r#""path":"d\/f""#),
            // Entries out of order.
            format!(
                r#"{{"format":"{MANIFEST_FORMAT}","version":1,"entries":[{{"path":"b","type":"file","digest":"{d}","size":0,"mode":420}},{{"path":"a","type":"file","digest":"{d}","size":0,"mode":420}}]}}"#
            ),
        ] {
            assert_ne!(other.as_bytes(), &bytes[..]);
            assert!(streamed(other.as_bytes(), 7).is_none(), "{other}");
            let e = Manifest::from_canonical_bytes(other.as_bytes(), "m").unwrap_err();
            assert!(e.to_string().contains("canonical form"), "{other}: {e}");
            // Still a manifest to the general reader (a file on a command
            // line is not named by its digest).
            Manifest::from_bytes(other.as_bytes(), "m").unwrap();
        }
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
