//! `cowlink image`: commit a qcow2 overlay into its raw base, convert a
//! qcow2 chain to raw, and show what either would clone, copy and zero.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};
use cowlink::image::{self, CopyReason, ImageOptions, ImageReport, Piece, PieceSource};
use cowlink::name::quoted;
use cowlink::{ErrorKind, Run};
use serde::Serialize;

use crate::out::{errln, outln};
use crate::{human_bytes, human_duration, Exit};

/// Merge and convert qcow2 disk images by cloning clusters, not copying bytes
///
/// qcow2 keeps each data cluster at a cluster-aligned offset of its file,
/// so on XFS or Btrfs every allocated cluster can be cloned straight into
/// a raw image at its guest offset: time grows with the number of
/// clusters, not their bytes, and no data block is written. What cannot be
/// cloned (compressed clusters, subclusters or clusters smaller than the
/// filesystem block, a filesystem that cannot clone, such as ext4) is
/// copied, and the report says how much and why. Zero clusters become
/// holes. The result replaces the destination only when complete: an
/// error or Ctrl-C leaves it exactly as it was, and the new base keeps the
/// old one's owner, mode, extended attributes, ACLs, `+C` and holes. A
/// block-device base (an LVM volume) is written in place, never replaced;
/// --in-place does the same for a file (as qemu-img commit: not atomic).
/// Every image is held with QEMU's own locks while cowlink works: images
/// QEMU has open are refused, and QEMU refuses them meanwhile.
///
/// Names inside images are untrusted: a declared backing format is
/// obeyed, only plain file names are followed (no json:, nbd: or other
/// protocols), and an image qcow2 only by probing may not name files.
///
/// Examples:
///   cowlink image map vm.qcow2                  # what a commit would do
///   cowlink image commit vm.qcow2               # into the raw base its header names
///   cowlink image commit -b base.raw vm.qcow2   # into this base
///   cowlink image convert vm.qcow2 vm.raw       # the whole chain, as one raw image
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand, Debug)]
enum ImageCommand {
    /// Show what a commit would clone, copy, zero and leave
    ///
    /// Also says whether the filesystem clones here.
    #[command(
        after_help = "Examples:\n  cowlink image map vm.qcow2\n  cowlink image map --ranges vm.qcow2"
    )]
    Map(MapArgs),
    /// Merge a qcow2 overlay into its raw base, leaving the overlay as it was
    ///
    /// Like `qemu-img commit`, but the overlay is left as it was.
    #[command(
        after_help = "Examples:\n  cowlink image commit vm.qcow2               # into the base its header names\n  cowlink image commit -b base.raw vm.qcow2   # into this base"
    )]
    Commit(CommitArgs),
    /// Write a qcow2 image and its backing chain as one raw image
    ///
    /// Like `qemu-img convert -O raw`.
    #[command(after_help = "Examples:\n  cowlink image convert vm.qcow2 vm.raw")]
    Convert(ConvertArgs),
}

#[derive(Args, Debug)]
struct MapArgs {
    /// Also list every range (guest offset, length, fate)
    #[arg(long)]
    ranges: bool,
    /// Print JSON: the totals and every range
    #[arg(long)]
    json: bool,
    /// The qcow2 image
    #[arg(value_name = "IMAGE", value_parser = crate::PathArg)]
    image: PathBuf,
}

#[derive(Args, Debug)]
struct CommitArgs {
    /// The raw base to merge into (default: the overlay's backing file)
    #[arg(short = 'b', long = "base", value_name = "BASE", value_parser = crate::PathArg)]
    base: Option<PathBuf>,
    /// Remove the overlay after a successful commit (its contents are then
    /// in the base)
    #[arg(long)]
    remove_overlay: bool,
    /// Write into the base itself instead of replacing it atomically (as
    /// qemu-img commit does: keeps hard links; an error or a crash part-way
    /// leaves the base partly committed, and Ctrl-C is not honoured once
    /// writing began). A block-device base is always written in place
    #[arg(long)]
    in_place: bool,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
    /// The qcow2 overlay
    #[arg(value_name = "OVERLAY", value_parser = crate::PathArg)]
    overlay: PathBuf,
}

#[derive(Args, Debug)]
struct ConvertArgs {
    /// Output format; only raw is written (accepted for qemu-img's habit)
    #[arg(short = 'O', value_name = "FORMAT", default_value = "raw")]
    format: String,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
    /// The qcow2 image (its backing chain is followed)
    #[arg(value_name = "SRC", value_parser = crate::PathArg)]
    src: PathBuf,
    /// The raw image to create (or replace)
    #[arg(value_name = "DST", value_parser = crate::PathArg)]
    dst: PathBuf,
}

/// Run `cowlink image`.
pub fn run(args: ImageArgs) -> Result<Exit> {
    match args.command {
        ImageCommand::Map(a) => map(a),
        ImageCommand::Commit(a) => commit(a),
        ImageCommand::Convert(a) => convert(a),
    }
}

fn reason_words(r: CopyReason) -> &'static str {
    match r {
        CopyReason::Compressed => "compressed clusters",
        CopyReason::Subcluster => "subclusters",
        CopyReason::Unaligned => "clusters smaller than or unaligned to the filesystem block",
        CopyReason::NoClone => "the filesystem cannot clone",
    }
}

fn print_report(r: &ImageReport, verb: &str) {
    if r.start_cloned_bytes > 0 {
        outln!(
            "  start    {} of the old image cloned whole (no data written)",
            human_bytes(r.start_cloned_bytes)
        );
    }
    if r.start_copied_bytes > 0 {
        outln!(
            "  start    {} of the old image's data copied (it could not be cloned; holes kept)",
            human_bytes(r.start_copied_bytes)
        );
    }
    if r.in_place {
        outln!("  written  in place (the base was not replaced)");
    }
    outln!(
        "  {verb:<8} {} in {} ranges (no data written)",
        human_bytes(r.cloned_bytes),
        r.cloned_ranges
    );
    let copied = r.copied_bytes();
    let why: Vec<String> = r
        .copied
        .iter()
        .map(|(reason, n)| format!("{}: {}", reason_words(*reason), human_bytes(*n)))
        .collect();
    if copied > 0 {
        outln!("  copied   {} ({})", human_bytes(copied), why.join("; "));
    } else {
        outln!("  copied   0 B");
    }
    outln!(
        "  zeroed   {} (holes, nothing written)",
        human_bytes(r.zeroed_bytes)
    );
    outln!(
        "  left     {} unallocated (read from below)",
        human_bytes(r.skipped_bytes)
    );
    for d in &r.data_files {
        outln!("  data     read from the external data file {}", quoted(d));
    }
    if let Some(why) = &r.no_clone_reason {
        let what = match r.cloned_bytes {
            0 => "everything allocated was copied",
            _ => "what came from there was copied",
        };
        outln!("  note: no cloning here: {why}; {what}");
    }
}

#[derive(Serialize)]
struct RangeOut {
    guest: u64,
    len: u64,
    fate: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<u64>,
}

fn range_out(p: &Piece) -> RangeOut {
    let (fate, host) = match p.source {
        PieceSource::Data { host } => ("data", Some(host)),
        PieceSource::Compressed { host, .. } => ("compressed", Some(host)),
        PieceSource::Zero => ("zero", None),
        PieceSource::Unallocated => ("unallocated", None),
    };
    RangeOut {
        guest: p.guest,
        len: p.len,
        fate,
        host,
    }
}

/// Report a failure; `what` names what is left as it was.
fn failed(e: &cowlink::Error, what: &str) -> Exit {
    if e.kind() == ErrorKind::Cancelled {
        errln!("cowlink: interrupted; {what} is unchanged and no temporary was left");
        return Exit::Interrupted;
    }
    errln!("cowlink: {e}");
    Exit::Failed
}

fn map(a: MapArgs) -> Result<Exit> {
    let keep = a.json || a.ranges;
    let mut pieces: Vec<Piece> = Vec::new();
    let mut each = |p: &Piece| {
        if keep {
            pieces.push(*p);
        }
    };
    let report = match image::map(&a.image, &mut each) {
        Ok(x) => x,
        Err(e) => return Ok(failed(&e, &quoted(&a.image).to_string())),
    };
    if a.json {
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            report: &'a ImageReport,
            ranges: Vec<RangeOut>,
        }
        let out = Out {
            report: &report,
            ranges: pieces.iter().map(range_out).collect(),
        };
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(Exit::Ok);
    }
    outln!(
        "{}: virtual size {}; a commit would:",
        quoted(&a.image),
        human_bytes(report.size)
    );
    print_report(&report, "clone");
    if a.ranges {
        outln!("{:>18} {:>14}  fate", "guest offset", "length");
        for p in &pieces {
            let r = range_out(p);
            let host = r.host.map(|h| format!(" from {h:#x}")).unwrap_or_default();
            outln!("{:>#18x} {:>14}  {}{host}", r.guest, r.len, r.fate);
        }
    }
    Ok(Exit::Ok)
}

fn commit(a: CommitArgs) -> Result<Exit> {
    let options = ImageOptions {
        base: a.base.clone(),
        in_place: a.in_place,
        run: Run::default().with_cancel(crate::interrupt::token()),
    };
    let start = Instant::now();
    let report = match crate::interrupt::graceful(|| image::commit(&a.overlay, &options)) {
        Ok(r) => r,
        Err(e) => {
            let base = a
                .base
                .as_ref()
                .map_or("the base".into(), |b| quoted(b).to_string());
            return Ok(failed(&e, &base));
        }
    };
    if a.remove_overlay {
        if let Err(e) = std::fs::remove_file(&a.overlay) {
            errln!(
                "cowlink: committed, but cannot remove {}: {e}",
                quoted(&a.overlay)
            );
            return Ok(Exit::Failed);
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "committed {} in {}{}",
            quoted(&a.overlay),
            human_duration(start.elapsed()),
            if a.remove_overlay {
                " (overlay removed)"
            } else {
                ""
            }
        );
        print_report(&report, "cloned");
    }
    Ok(Exit::Ok)
}

fn convert(a: ConvertArgs) -> Result<Exit> {
    if a.format != "raw" {
        errln!(
            "cowlink: only raw images are written (-O raw), not {}",
            a.format
        );
        return Ok(Exit::Fatal);
    }
    let options = ImageOptions {
        base: None,
        in_place: false,
        run: Run::default().with_cancel(crate::interrupt::token()),
    };
    let start = Instant::now();
    let report = match crate::interrupt::graceful(|| image::convert(&a.src, &a.dst, &options)) {
        Ok(r) => r,
        Err(e) => return Ok(failed(&e, &quoted(&a.dst).to_string())),
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "converted {} ({} layers) to {} in {}",
            quoted(&a.src),
            report.layers.len(),
            quoted(&a.dst),
            human_duration(start.elapsed())
        );
        print_report(&report, "cloned");
    }
    Ok(Exit::Ok)
}
