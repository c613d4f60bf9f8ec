//! Hardlinks in a tree copy: the second name of an inode becomes a link
//! to the first name's copy, not a second copy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cowlink_sys::Stat;

use crate::ground::error::Error;

/// Source inodes with more than one name, seen so far: where the first
/// name's copy is (relative to the destination root). An entry leaves the
/// table when all its names have been seen, so the table holds only
/// hardlinked files in flight.
#[derive(Default)]
pub(crate) struct LinkTable {
    map: Mutex<HashMap<(u64, u64), Arc<LinkSlot>>>,
}

#[derive(Default)]
struct LinkSlot {
    /// The first copy; the lock also makes later names wait for it.
    first: Mutex<Option<PathBuf>>,
    seen: AtomicU64,
}

/// What became of an entry with several names.
pub(crate) enum Linked {
    /// This name was copied (it is the first, or earlier copies failed).
    Copied,
    /// This name was linked to the copy of an earlier name.
    Linked,
}

impl LinkTable {
    /// Link `name` to the copy of an earlier name of the same inode, or run
    /// `copy` when this is the first name (or every earlier copy failed).
    pub(crate) fn link_or_copy(
        &self,
        st: &Stat,
        rel: PathBuf,
        keep: bool,
        link: impl FnOnce(&Path) -> Result<(), Error>,
        copy: impl FnOnce() -> Result<(), Error>,
    ) -> Result<Linked, Error> {
        let key = (st.st_dev, st.st_ino);
        let slot = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key).or_default().clone()
        };
        let result = {
            let mut first = slot.first.lock().unwrap_or_else(|p| p.into_inner());
            match first.as_deref() {
                Some(to) => link(to).map(|()| Linked::Linked),
                None => copy().map(|()| {
                    *first = Some(rel);
                    Linked::Copied
                }),
            }
        };
        // Every name seen: forget the file (unless symlinks are followed,
        // when more names than its link count can reach it).
        if slot.seen.fetch_add(1, Ordering::Relaxed) + 1 >= st.st_nlink && !keep {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.remove(&key);
        }
        result
    }
}
