//! `cowlink extents`: where a file's bytes live, and whether it is a
//! copy-on-write link (and with whom).

use cowlink::name::{quoted, shown};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use cowlink::extents::{self, FileLayout, FileRef, FileSharing};
use cowlink::ErrorKind;
use serde::Serialize;

use crate::out::errln;
use crate::{human_bytes, Exit};

/// Show a file's extents and whether it shares blocks (is a CoW link)
///
/// Lists every extent (FIEMAP, after writing dirty data back): offsets and
/// lengths in bytes and the flags shared, unwritten (preallocated),
/// delalloc, inline, encoded (compressed), last. A summary line per file
/// says whether it is a CoW link, how much is shared, and how fragmented
/// and sparse it is.
///
/// Who shares: given several files, cowlink matches their physical ranges
/// and says which of them share blocks with each other (any FIEMAP
/// filesystem). With --refs on Btrfs (as root), the kernel's back
/// references give every file that points at each extent, inside the set
/// or not, with its paths.
///
/// Examples:
///   cowlink extents big.img
///   cowlink extents big.img copy.img     # do they share blocks?
///   sudo cowlink extents --refs big.img  # Btrfs: every reference, by path
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ExtentsArgs {
    /// Btrfs: list the references to each extent (count and paths); needs
    /// root
    #[arg(long)]
    refs: bool,

    /// Print only the summary line of each file
    #[arg(short, long)]
    summary: bool,

    /// Print JSON: every extent, the totals, and who shares
    #[arg(long)]
    json: bool,

    /// Regular files to inspect
    #[arg(required = true, value_name = "FILE", value_parser = crate::PathArg)]
    files: Vec<PathBuf>,
}

#[derive(Serialize)]
struct FileOut<'a> {
    #[serde(flatten, serialize_with = "cowlink::name::json::path")]
    path: &'a Path,
    cow_link: bool,
    #[serde(flatten)]
    layout: &'a FileLayout,
    /// Btrfs references per extent (with --refs).
    #[serde(skip_serializing_if = "Option::is_none")]
    refs: Option<&'a [Vec<FileRef>]>,
    /// Bytes shared with each other file given.
    shared_with: Vec<SharedWith<'a>>,
}

#[derive(Serialize)]
struct SharedWith<'a> {
    #[serde(flatten, serialize_with = "cowlink::name::json::path")]
    path: &'a Path,
    bytes: u64,
}

/// Run `cowlink extents`.
pub fn run(args: ExtentsArgs) -> Result<Exit> {
    let mut ok: Vec<(PathBuf, FileLayout)> = Vec::new();
    let mut errors = Vec::new();
    for p in &args.files {
        match extents::extents(p) {
            Ok(l) => ok.push((p.clone(), l)),
            Err(e) => errors.push(e),
        }
    }
    // Who shares with whom among the files given.
    let layouts: Vec<FileLayout> = ok.iter().map(|(_, l)| l.clone()).collect();
    let within = extents::shared_within(&layouts);
    let mut refs: Vec<Option<Vec<Vec<FileRef>>>> = vec![None; ok.len()];
    if args.refs {
        for (i, (p, l)) in ok.iter().enumerate() {
            match extents::btrfs_refs(p, l, true) {
                Ok(r) => refs[i] = Some(r),
                // Not Btrfs: the table still shows sharing within the set.
                Err(e) if e.kind() == ErrorKind::NotSupported => {
                    errln!(
                        "cowlink: no reference counts for {}: {}",
                        quoted(p),
                        e.reason()
                    );
                }
                Err(e) => errors.push(e),
            }
        }
    }

    let mut out = crate::out::stdout();
    if args.json {
        let files: Vec<FileOut> = ok
            .iter()
            .enumerate()
            .map(|(i, (p, l))| FileOut {
                path: p,
                cow_link: l.is_cow_link(),
                layout: l,
                refs: refs[i].as_deref(),
                shared_with: shared_with(i, &within[i], &ok),
            })
            .collect();

        crate::out::json(
            &mut out,
            &serde_json::json!({"files": files, "errors": errors}),
        )?;
    } else {
        for (i, (p, l)) in ok.iter().enumerate() {
            if !args.summary {
                table(
                    &mut out,
                    p,
                    l,
                    &within[i],
                    refs[i].as_deref(),
                    ok.len() > 1,
                    i,
                )?;
            }
            writeln!(out, "{}", summary(i, p, l, &within[i], &ok))?;
            if !args.summary && i + 1 < ok.len() {
                writeln!(out)?;
            }
        }
        out.flush()?;
        for e in &errors {
            let hint = match e.kind() {
                ErrorKind::IsDirectory => "; `cowlink du` measures trees",
                _ => "",
            };
            errln!("cowlink: {e}{hint}");
        }
    }
    Ok(if errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// The other files of the set this one shares blocks with, and how many
/// bytes of this file map to each (largest first).
fn shared_with<'a>(
    me: usize,
    within: &FileSharing,
    all: &'a [(PathBuf, FileLayout)],
) -> Vec<SharedWith<'a>> {
    let mut v: Vec<SharedWith> = within
        .per_file(me)
        .into_iter()
        .map(|s| SharedWith {
            path: &all[s.file].0,
            bytes: s.bytes,
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.path.cmp(b.path)));
    v
}

fn table(
    out: &mut impl Write,
    path: &Path,
    l: &FileLayout,
    within: &FileSharing,
    refs: Option<&[Vec<FileRef>]>,
    set: bool,
    me: usize,
) -> std::io::Result<()> {
    writeln!(out, "{}:", shown(path))?;
    // "set": how many of the files given use each extent's blocks.
    let refs_col = refs.is_some() || set;
    write!(
        out,
        "{:>6}  {:>14}  {:>16}  {:>12}",
        "ext", "logical", "physical", "length"
    )?;
    if refs_col {
        write!(out, "  {:>5}", if refs.is_some() { "refs" } else { "set" })?;
    }
    writeln!(out, "  flags")?;
    for (i, e) in l.extents.iter().enumerate() {
        write!(
            out,
            "{:>6}  {:>14}  {:>16}  {:>12}",
            i, e.logical, e.physical, e.length
        )?;
        if let Some(r) = refs {
            write!(out, "  {:>5}", r[i].len())?;
        } else if set {
            // How many files of the set (this one included) use these blocks.
            write!(out, "  {:>5}", within.files_using(me, i))?;
        }
        writeln!(out, "  {}", e.flag_names().join(","))?;
        if let Some(r) = refs {
            for fr in &r[i] {
                if fr.paths.is_empty() {
                    writeln!(
                        out,
                        "{:>8}subvolume {} inode {} at offset {}",
                        "", fr.root, fr.inode, fr.offset
                    )?;
                }
                for p in &fr.paths {
                    writeln!(out, "{:>8}{} at offset {}", "", shown(p), fr.offset)?;
                }
            }
        }
    }
    Ok(())
}

/// "a.img: CoW link: yes, 97% of 391.0 KiB shared, 2 extents, 1 fragment;
/// shares 391.0 KiB with b.img"
fn summary(
    i: usize,
    path: &Path,
    l: &FileLayout,
    within: &FileSharing,
    all: &[(PathBuf, FileLayout)],
) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut s = format!(
        "{}: CoW link: {}, {:.0}% of {} shared, {}, {}",
        shown(path),
        if l.is_cow_link() { "yes" } else { "no" },
        (l.shared_fraction() * 100.0).floor(),
        human_bytes(l.mapped_bytes),
        plural(l.extents.len() as u64, "extent", "extents"),
        plural(l.fragments, "fragment", "fragments"),
    );
    if !l.holes.is_empty() {
        s += &format!(
            ", {} ({})",
            plural(l.holes.len() as u64, "hole", "holes"),
            human_bytes(l.hole_bytes)
        );
    }
    if l.unwritten_bytes > 0 {
        s += &format!(", {} unwritten", human_bytes(l.unwritten_bytes));
    }
    if l.inline_bytes > 0 {
        s += &format!(", {} inline", human_bytes(l.inline_bytes));
    }
    let compressed: u64 = l
        .extents
        .iter()
        .filter(|e| e.is_encoded())
        .map(|e| e.length)
        .sum();
    if compressed > 0 {
        let on_disk: Option<u64> = l
            .extents
            .iter()
            .filter(|e| e.is_encoded())
            .map(|e| e.disk_cost())
            .sum();
        s += &match on_disk {
            Some(d) => format!(
                ", {} compressed to {}",
                human_bytes(compressed),
                human_bytes(d)
            ),
            None => format!(", {} compressed", human_bytes(compressed)),
        };
    }
    let with = shared_with(i, within, all);
    if !with.is_empty() {
        let names: Vec<String> = with
            .iter()
            .take(3)
            .map(|w| format!("{} with {}", human_bytes(w.bytes), shown(w.path)))
            .collect();
        s += &format!("; shares {}", names.join(", "));
        if with.len() > 3 {
            s += &format!(" and {} more", with.len() - 3);
        }
    }
    if l.unknown_disk_bytes > 0 {
        s += &format!(
            "; what its {} of compressed data shares is unknown (their size on disk is read from Btrfs's extent items, which takes root)",
            human_bytes(l.unknown_disk_bytes)
        );
    }
    s
}
