//! `cowlink cp`: clone files (and, with -r, directory trees) like cp.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use cowlink::tree::{copy_tree, TreeEvent, TreeOptions};
use cowlink::{
    clone_file, CloneOptions, Error, ErrorKind, Method, Outcome, Overwrite, Preserve, Reflink,
};
use serde::Serialize;

use crate::{human_bytes, human_duration, Exit};

/// Clone files where the filesystem can share blocks, copy where it cannot.
///
/// `cowlink cp SRC DEST` clones SRC to the file DEST (or into DEST if it is
/// a directory); `cowlink cp SRC... DIR` clones each SRC into DIR. The copy
/// is atomic: DEST appears complete, with its metadata, or not at all.
///
/// Examples:
///   cowlink cp -v big.img copy.img          # says "cloned" or "copied"
///   cowlink cp --reflink=always a b         # clone or fail, never copy
///   cowlink cp -a build/ staging/           # a tree, with all metadata
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CpArgs {
    /// When to share blocks: auto = clone, else the fastest correct copy;
    /// always = clone or fail (bare --reflink means this); never = always a
    /// physical copy
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value = "auto",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always"
    )]
    reflink: ReflinkArg,

    /// Replace existing destination files (atomically; other hardlinks of a
    /// replaced file keep their content)
    #[arg(short = 'f', long, conflicts_with = "no_clobber")]
    force: bool,

    /// Skip existing destination files silently (default: report an error)
    #[arg(short = 'n', long)]
    no_clobber: bool,

    /// Same as --preserve=mode,ownership,timestamps
    #[arg(short = 'p')]
    preserve_default: bool,

    /// Preserve these attributes beyond the permission bits (which are always
    /// kept, less the umask): mode, ownership, timestamps, xattr, all
    #[arg(
        long,
        value_enum,
        value_name = "ATTR,...",
        value_delimiter = ',',
        num_args = 0..,
        require_equals = true,
        default_missing_value = "mode,ownership,timestamps"
    )]
    preserve: Vec<PreserveArg>,

    /// Copy directories recursively (symbolic links inside are copied as links)
    #[arg(short = 'r', short_alias = 'R', long)]
    recursive: bool,

    /// Archive: -r with --preserve=all
    #[arg(short = 'a', long)]
    archive: bool,

    /// Copy all SRC arguments into DIR
    #[arg(short = 't', long, value_name = "DIR")]
    target_directory: Option<PathBuf>,

    /// Treat DEST as a file name, never as a directory to copy into
    #[arg(short = 'T', long, conflicts_with = "target_directory")]
    no_target_directory: bool,

    /// Print one line per file: cloned or copied, size and time
    #[arg(short, long)]
    verbose: bool,

    /// Print the outcome of every file and a summary as JSON on stdout
    #[arg(long)]
    json: bool,

    /// SRC... DEST, or SRC... with -t DIR
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ReflinkArg {
    Auto,
    Always,
    Never,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PreserveArg {
    Mode,
    Ownership,
    Timestamps,
    Xattr,
    All,
}

/// One line of `--json` output.
#[derive(Serialize, Debug)]
struct Record {
    src: PathBuf,
    dst: PathBuf,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<Method>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    micros: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorRecord>,
}

#[derive(Serialize, Debug)]
struct ErrorRecord {
    kind: ErrorKind,
    message: String,
    errno: Option<i32>,
}

#[derive(Serialize, Debug, Default)]
struct Summary {
    files: u64,
    dirs: u64,
    symlinks: u64,
    bytes: u64,
    cloned: u64,
    copied: u64,
    skipped: u64,
    failed: u64,
}

struct Run {
    options: CloneOptions,
    verbose: bool,
    json: bool,
    skip_existing: bool,
    recursive: bool,
    records: Vec<Record>,
    summary: Summary,
}

impl Run {
    fn done(&mut self, src: &Path, dst: &Path, o: Outcome, elapsed: Option<std::time::Duration>) {
        self.summary.files += 1;
        self.summary.bytes += o.bytes;
        if o.method == Method::Reflink {
            self.summary.cloned += 1;
        } else {
            self.summary.copied += 1;
        }
        if self.verbose {
            let took = elapsed
                .map(|d| format!(" in {}", human_duration(d)))
                .unwrap_or_default();
            println!(
                "'{}' -> '{}': {}, {}{took}",
                src.display(),
                dst.display(),
                o.method.describe(),
                human_bytes(o.bytes),
            );
        }
        if self.json {
            self.records.push(Record {
                src: src.into(),
                dst: dst.into(),
                status: "ok",
                method: Some(o.method),
                bytes: Some(o.bytes),
                micros: elapsed.map(|d| d.as_micros() as u64),
                error: None,
            });
        }
    }

    fn failed(&mut self, src: &Path, dst: &Path, e: &Error) {
        if self.options.overwrite == Overwrite::Refuse
            && e.kind() == ErrorKind::AlreadyExists
            && self.skip_existing
        {
            self.summary.skipped += 1;
            if self.verbose {
                println!(
                    "'{}' -> '{}': skipped, destination exists",
                    src.display(),
                    dst.display()
                );
            }
            if self.json {
                self.records.push(Record {
                    src: src.into(),
                    dst: dst.into(),
                    status: "skipped",
                    method: None,
                    bytes: None,
                    micros: None,
                    error: None,
                });
            }
            return;
        }
        self.summary.failed += 1;
        eprintln!("cowlink: {e}{}", self.hint(e));
        if self.json {
            self.records.push(Record {
                src: src.into(),
                dst: dst.into(),
                status: "failed",
                method: None,
                bytes: None,
                micros: None,
                error: Some(ErrorRecord {
                    kind: e.kind(),
                    message: e.to_string(),
                    errno: e.raw_os_error(),
                }),
            });
        }
    }

    fn hint(&self, e: &Error) -> &'static str {
        match (self.options.reflink, e.kind()) {
            (Reflink::Always, ErrorKind::CrossDevice | ErrorKind::NotSupported) => {
                "; use --reflink=auto to copy"
            }
            (_, ErrorKind::IsDirectory)
                if e.src().is_some() && e.dst().is_some() && !self.recursive =>
            {
                "; use -r to copy directories"
            }
            _ => "",
        }
    }
}

/// Run `cowlink cp`.
pub fn run(args: CpArgs) -> Result<Exit> {
    let mut preserve = if args.archive {
        Preserve::ALL
    } else {
        Preserve::NONE
    };
    if args.preserve_default {
        preserve = Preserve {
            xattrs: preserve.xattrs,
            ..Preserve::P
        };
    }
    for p in &args.preserve {
        match p {
            PreserveArg::Mode => preserve.mode = true,
            PreserveArg::Ownership => preserve.ownership = true,
            PreserveArg::Timestamps => preserve.timestamps = true,
            PreserveArg::Xattr => preserve.xattrs = true,
            PreserveArg::All => preserve = Preserve::ALL,
        }
    }
    let options = CloneOptions {
        reflink: match args.reflink {
            ReflinkArg::Auto => Reflink::Auto,
            ReflinkArg::Always => Reflink::Always,
            ReflinkArg::Never => Reflink::Never,
        },
        overwrite: if args.force {
            Overwrite::Replace
        } else {
            Overwrite::Refuse
        },
        preserve,
    };
    let recursive = args.recursive || args.archive;
    let jobs = plan(&args)?;
    let mut run = Run {
        options,
        verbose: args.verbose,
        json: args.json,
        records: Vec::new(),
        summary: Summary::default(),
        skip_existing: args.no_clobber,
        recursive,
    };
    for (src, dst) in jobs {
        copy_one(&mut run, &src, &dst);
    }
    if args.json {
        let doc = serde_json::json!({ "results": run.records, "summary": run.summary });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    Ok(if run.summary.failed > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

/// Resolve the command line into (source, destination file) pairs, with
/// cp's rules: a destination that is a directory receives the sources.
fn plan(args: &CpArgs) -> Result<Vec<(PathBuf, PathBuf)>> {
    let (sources, target): (&[PathBuf], Option<&Path>) = match &args.target_directory {
        Some(dir) => (&args.paths, Some(dir)),
        None => {
            if args.paths.len() < 2 {
                bail!(
                    "missing destination file operand after '{}'\nUsage: cowlink cp [OPTIONS] SRC... DEST (see --help)",
                    args.paths[0].display()
                );
            }
            let (last, rest) = args.paths.split_last().expect("two or more paths");
            if args.no_target_directory {
                if rest.len() > 1 {
                    bail!(
                        "with -T there must be exactly one source (got {})",
                        rest.len()
                    );
                }
                return Ok(vec![(rest[0].clone(), last.clone())]);
            }
            if rest.len() == 1 && !last.is_dir() {
                if last.as_os_str().to_string_lossy().ends_with('/') {
                    bail!("target '{}' is not a directory", last.display());
                }
                return Ok(vec![(rest[0].clone(), last.clone())]);
            }
            (rest, Some(last.as_path()))
        }
    };
    let dir = target.expect("target set above");
    if !dir.is_dir() {
        bail!(
            "target '{}' is not a directory{}",
            dir.display(),
            if dir.exists() {
                ""
            } else {
                " (it does not exist)"
            }
        );
    }
    sources
        .iter()
        .map(|src| {
            let name = src.file_name().ok_or_else(|| {
                anyhow::anyhow!("cannot copy '{}': it has no file name", src.display())
            })?;
            Ok((src.clone(), dir.join(name)))
        })
        .collect()
}

fn copy_one(run: &mut Run, src: &Path, dst: &Path) {
    let is_dir = std::fs::symlink_metadata(src)
        .map(|m| m.is_dir())
        .unwrap_or(false)
        || (!run.recursive && src.is_dir());
    if is_dir && run.recursive {
        let options = TreeOptions { file: run.options };
        let result = copy_tree(src, dst, &options, &mut |ev| match ev {
            TreeEvent::File { src, dst, outcome } => run.done(src, dst, outcome, None),
            TreeEvent::Dir { .. } => run.summary.dirs += 1,
            TreeEvent::Symlink { src, dst } => {
                run.summary.symlinks += 1;
                if run.verbose {
                    println!("'{}' -> '{}': symbolic link", src.display(), dst.display());
                }
            }
            TreeEvent::Failed(e) => {
                let (s, d) = (
                    e.src().unwrap_or(src).to_path_buf(),
                    e.dst().unwrap_or(dst).to_path_buf(),
                );
                run.failed(&s, &d, e);
            }
        });
        if let Err(e) = result {
            run.failed(src, dst, &e);
        }
        return;
    }
    if is_dir {
        let e = Error::new(cowlink::Operation::Clone, ErrorKind::IsDirectory)
            .with_src(src)
            .with_dst(dst)
            .with_reason("source is a directory (omitted)");
        run.failed(src, dst, &e);
        return;
    }
    let t = Instant::now();
    match clone_file(src, dst, &run.options) {
        Ok(o) => run.done(src, dst, o, Some(t.elapsed())),
        Err(e) => run.failed(src, dst, &e),
    }
}
