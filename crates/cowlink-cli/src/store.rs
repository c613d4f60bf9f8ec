//! `cowlink store`: a content-addressed store whose files are cloned into
//! many places.

use cowlink::name::{quoted, shown};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use cowlink::store::{CheckoutOptions, Digest, EntryKind, LinkMode, Manifest, Store};
use cowlink::{Progress, Run};
use serde::Serialize;

use crate::out::{count, errln};
use crate::{human_bytes, human_duration, Exit};

/// One line of `store add --json`: the file and what became of it.
#[derive(Serialize)]
struct AddOut<'a> {
    #[serde(flatten, serialize_with = "cowlink::name::json::path")]
    path: &'a Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    added: Option<cowlink::store::Added>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<cowlink::Error>,
}

/// Keep each file once and clone it into many places
///
/// The store holds file contents as read-only objects named by their
/// BLAKE3 digest, and tree manifests (paths, modes, symbolic links, the
/// digest of each file). Adding clones files into the store (instant on
/// XFS, Btrfs and other copy-on-write filesystems, a copy elsewhere) and
/// names each object by the hash of what was stored. Checking out clones
/// the objects into a new directory: instant, no extra space, and writing
/// to a checked-out file never touches the store or other checkouts,
/// unlike the hardlinks build caches and package managers often use.
///
/// Store location: --store DIR, else $COWLINK_STORE, else
/// $XDG_CACHE_HOME/cowlink/store, else ~/.cache/cowlink/store. Keep it on
/// the same filesystem as the trees you add and check out: only then can
/// they clone.
///
/// Any number of processes may add and check out at once; gc waits for
/// adds in progress. Digests and manifests are checked as untrusted input.
///
/// Examples:
///   M=$(cowlink store add-tree target/release)   # prints the manifest digest
///   cowlink store checkout $M /tmp/build-copy    # clone it back, in parallel
///   cowlink store ls                             # stored trees
///   cowlink store verify                         # rehash everything
///   cowlink store gc --keep $M                   # drop everything else
///
/// A remote tier on any S3-compatible object store (AWS S3, MinIO, Ceph,
/// Garage, versitygw): --remote s3://BUCKET/PREFIX or $COWLINK_REMOTE,
/// --endpoint for servers other than AWS, keys from the AWS environment
/// variables or profile files. Each machine downloads an object once and
/// clones it into every workspace.
///   export COWLINK_REMOTE=s3://ci-cache/builds AWS_ENDPOINT_URL=http://127.0.0.1:9000
///   cowlink store push $M                        # upload what the remote lacks
///   cowlink store checkout $M ws1                # on another machine: pull, then clone
///   cowlink store remote ls                      # manifests on the remote
///   cowlink store remote gc --keep $M            # drop the rest remotely
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct StoreArgs {
    /// The store directory (created if missing) [default: $COWLINK_STORE,
    /// else $XDG_CACHE_HOME/cowlink/store, else ~/.cache/cowlink/store]
    #[arg(long, global = true, value_name = "DIR", value_parser = crate::PathArg)]
    store: Option<PathBuf>,

    /// Print JSON on stdout instead of text
    #[arg(long, global = true)]
    json: bool,

    /// Worker threads, at most 64 [default: for checkout, chosen per
    /// destination filesystem (cloning into Btrfs: 1 or one per core,
    /// whichever measures faster while it runs; else one per core); for
    /// everything else, one per core]
    #[arg(short = 'j', long, global = true, value_name = "N", value_parser = crate::threads_arg)]
    threads: Option<usize>,

    #[command(flatten)]
    remote: crate::remote::RemoteArgs,

    #[command(subcommand)]
    command: StoreCommand,
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Add files; print each one's digest
    #[command(
        after_help = "Examples:\n  cowlink store add big.iso vm.img      # prints one digest per file"
    )]
    Add {
        /// Regular files (symbolic links are followed)
        #[arg(required = true, value_name = "FILE", value_parser = crate::PathArg)]
        files: Vec<PathBuf>,
    },
    /// Add a directory tree; print the digest of its manifest
    ///
    /// Files, directories (with modes) and symbolic links (not followed)
    /// are recorded. A tree holding FIFOs, sockets, devices, unreadable
    /// files or names that are not UTF-8 is refused, naming them: a
    /// half-stored tree would check out wrong.
    #[command(after_help = "Examples:\n  M=$(cowlink store add-tree target/release)")]
    AddTree {
        /// The directory
        #[arg(value_name = "DIR", value_parser = crate::PathArg)]
        dir: PathBuf,
    },
    /// Place one object at a new file
    #[command(after_help = "Examples:\n  cowlink store materialize $DIGEST ./big.iso")]
    Materialize {
        /// The object's digest (64 hex digits)
        #[arg(value_name = "DIGEST")]
        digest: String,
        /// The new file (must not exist)
        #[arg(value_name = "DEST", value_parser = crate::PathArg)]
        dest: PathBuf,
        #[command(flatten)]
        link: LinkArg,
    },
    /// Recreate a stored tree in a new or empty directory
    ///
    /// One parallel walk down the tree: each directory is made, then its
    /// files are placed (with their modes; a file an error or Ctrl-C
    /// interrupts is removed, and with --atomic even a crash leaves none
    /// partial) and its symbolic links made, while its subdirectories are
    /// walked on other threads. Nothing is ever written through a symbolic
    /// link or outside DEST; links whose target leaves the tree are
    /// refused unless --allow-external-symlinks.
    #[command(
        after_help = "Examples:\n  cowlink store checkout $M ws1             # clone the tree into ws1\n  cowlink store checkout --atomic $M ws2    # complete or absent even after a crash"
    )]
    Checkout(CheckoutArgs),
    /// List stored trees, or the entries of one
    #[command(
        after_help = "Examples:\n  cowlink store ls            # stored trees\n  cowlink store ls $M         # the entries of one"
    )]
    Ls {
        /// A manifest digest: list its entries
        #[arg(value_name = "MANIFEST")]
        manifest: Option<String>,
    },
    /// Rehash every object and manifest; quarantine what is corrupt
    #[command(after_help = "Examples:\n  cowlink store verify")]
    Verify,
    /// Remove objects no kept manifest uses, and leftover temporaries
    ///
    /// Without --keep every manifest is kept and only loose objects (added
    /// with `add` alone, or left by a failed add-tree) go. With --keep,
    /// manifests not named are removed too.
    #[command(
        after_help = "Examples:\n  cowlink store gc                # loose objects only\n  cowlink store gc --keep $M      # everything but this tree"
    )]
    Gc {
        /// Keep this manifest (repeatable); the others are removed
        #[arg(long, value_name = "MANIFEST")]
        keep: Vec<String>,
    },
    /// Objects, bytes and space saved
    #[command(after_help = "Examples:\n  cowlink store stats --json")]
    Stats,
    /// Upload manifests and the objects they name to the remote
    ///
    /// Only objects the remote lacks are sent, in parallel (--transfers),
    /// large ones in parts; each is hashed as it is read, so a damaged
    /// local object is never sent. A manifest is uploaded only after all
    /// its objects: the remote never names what it lacks. A manifest the
    /// remote already has costs one request. Interrupted (Ctrl-C: exit
    /// 130) or failed, a push is finished by running it again.
    #[command(after_help = "Examples:\n  cowlink store --remote s3://ci-cache/builds push $M")]
    Push {
        /// Manifest digests [default: every manifest of the local store]
        #[arg(value_name = "MANIFEST")]
        manifests: Vec<String>,
    },
    /// Download manifests and the objects the local store lacks
    ///
    /// The remote is untrusted: every object is hashed as it arrives and
    /// kept only if its BLAKE3 digest is its name; a wrong one fails the
    /// pull naming it. Manifests are written last. Objects already here
    /// cost nothing, so a pull of what the store has makes no request.
    #[command(after_help = "Examples:\n  cowlink store --remote s3://ci-cache/builds pull $M")]
    Pull {
        /// Manifest digests
        #[arg(required = true, value_name = "MANIFEST")]
        manifests: Vec<String>,
    },
    /// List or collect the remote
    #[command(
        after_help = "Examples:\n  cowlink store remote ls\n  cowlink store remote gc --keep $M"
    )]
    Remote {
        #[command(subcommand)]
        command: crate::remote::RemoteCommand,
    },
}

/// `--link HOW`, and its old spelling `--mode`: hidden, it still works
/// (with a warning on stderr) for one release.
#[derive(Args, Debug)]
struct LinkArg {
    /// How to place files [default: clone]
    #[arg(long, value_enum, value_name = "HOW", conflicts_with = "mode")]
    link: Option<LinkMode>,
    /// The deprecated spelling of --link
    #[arg(long, value_enum, value_name = "HOW", hide = true)]
    mode: Option<LinkMode>,
}

impl LinkArg {
    /// The mode asked for ([`LinkMode::Clone`] when none was), warning
    /// about the old spelling.
    fn get(&self) -> LinkMode {
        if self.mode.is_some() {
            errln!("cowlink: warning: --mode is deprecated; use --link");
        }
        self.link.or(self.mode).unwrap_or(LinkMode::Clone)
    }
}

/// `cowlink store checkout`'s arguments.
#[derive(Args, Debug)]
struct CheckoutArgs {
    /// A manifest digest from add-tree, or a manifest JSON file
    #[arg(value_name = "MANIFEST")]
    manifest: String,
    /// The destination directory (created; if it exists it must be empty)
    #[arg(value_name = "DEST", value_parser = crate::PathArg)]
    dest: PathBuf,
    #[command(flatten)]
    link: LinkArg,
    /// Also create symbolic links that are absolute or point outside
    /// the tree
    #[arg(long)]
    allow_external_symlinks: bool,
    /// Rehash every object before placing it (default: only objects
    /// that show a sign of change since they were stored: a size that
    /// differs or a modification time that is not the store's mark)
    #[arg(long)]
    verify: bool,
    /// Keep set-user-ID and set-group-ID bits the manifest asks for
    /// (dropped by default: a manifest is untrusted input)
    #[arg(long)]
    keep_setid: bool,
    /// Make every file complete-or-absent even after a crash or
    /// kill -9 (slower: an unnamed file linked into place per file)
    #[arg(long)]
    atomic: bool,
    // With --remote (or COWLINK_REMOTE), what the store lacks is
    // pulled first: see the global remote options.
}

/// The store directory from the flag, the environment or the XDG default.
fn store_dir(flag: Option<PathBuf>) -> Result<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = flag.or_else(|| nonempty("COWLINK_STORE").map(PathBuf::from)) {
        return Ok(d);
    }
    if let Some(c) = nonempty("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(c).join("cowlink/store"));
    }
    let home = nonempty("HOME").ok_or_else(|| {
        anyhow!("no store given: use --store DIR or set COWLINK_STORE (HOME is not set)")
    })?;
    Ok(PathBuf::from(home).join(".cache/cowlink/store"))
}

fn digest(s: &str) -> Result<Digest> {
    s.parse::<Digest>().map_err(|e| anyhow!("{e}"))
}

/// What every subcommand works with: the open store and the global
/// options.
struct Ctx {
    dir: PathBuf,
    store: Store,
    progress: Arc<Progress>,
    json: bool,
    remote: crate::remote::RemoteArgs,
    start: Instant,
}

impl Ctx {
    /// A progress line on stderr (on a terminal, not with --json).
    fn spin(&self) -> crate::progress::Spinner {
        crate::progress::for_run(!self.json, &self.progress)
    }
}

/// A cancelled operation says what state it left and exits 130.
fn interrupted(what: &str) -> Result<Exit> {
    errln!("cowlink: interrupted; {what}");
    Ok(Exit::Interrupted)
}

/// Run `cowlink store`: open the store, then one function per subcommand.
pub fn run(args: StoreArgs) -> Result<Exit> {
    let dir = store_dir(args.store)?;
    let progress = Arc::new(Progress::new());
    let store = Store::open(&dir)?.with_run(
        Run::default()
            .with_threads(args.threads.map_or(0, crate::capped_threads))
            .with_cancel(crate::interrupt::token())
            .with_progress(Arc::clone(&progress)),
    );
    let cx = Ctx {
        dir,
        store,
        progress,
        json: args.json,
        remote: args.remote,
        start: Instant::now(),
    };
    match args.command {
        StoreCommand::Add { files } => add(&cx, &files),
        StoreCommand::AddTree { dir } => add_tree(&cx, &dir),
        StoreCommand::Materialize { digest, dest, link } => {
            materialize(&cx, &digest, &dest, link.get())
        }
        StoreCommand::Checkout(a) => checkout(&cx, a),
        StoreCommand::Ls { manifest: None } => ls_trees(&cx),
        StoreCommand::Ls { manifest: Some(m) } => ls_entries(&cx, &m),
        StoreCommand::Verify => verify(&cx),
        StoreCommand::Gc { keep } => gc(&cx, &keep),
        StoreCommand::Stats => stats(&cx),
        StoreCommand::Push { manifests } => {
            crate::remote::push(&cx.store, &cx.remote, &manifests, cx.json, || cx.spin())
        }
        StoreCommand::Pull { manifests } => {
            crate::remote::pull_args(&cx.store, &cx.remote, &manifests, cx.json, || cx.spin())
        }
        StoreCommand::Remote { command } => crate::remote::remote(&cx.remote, command, cx.json),
    }
}

/// `store add FILE…`: each file's digest.
fn add(cx: &Ctx, files: &[PathBuf]) -> Result<Exit> {
    let (store, json, mut out) = (&cx.store, cx.json, crate::out::stdout());
    let mut failed = false;
    let mut results = Vec::new();
    for f in files {
        match store.add_file(f) {
            Ok(a) => {
                if !json {
                    let how = if a.method == cowlink::Method::Reflink {
                        "cloned"
                    } else {
                        "copied"
                    };
                    let new = if a.new { "new" } else { "already stored" };
                    writeln!(out, "{}  {}  ({how}, {new})", a.digest, shown(f))?;
                }
                results.push(AddOut {
                    path: f,
                    added: Some(a),
                    error: None,
                });
            }
            Err(e) => {
                errln!("cowlink: {e}");
                results.push(AddOut {
                    path: f,
                    added: None,
                    error: Some(e),
                });
                failed = true;
            }
        }
    }
    if json {
        crate::out::json(&mut out, &results)?;
    }
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

/// `store add-tree DIR`: the manifest's digest.
fn add_tree(cx: &Ctx, tree: &Path) -> Result<Exit> {
    let (store, json, mut out, start) = (&cx.store, cx.json, crate::out::stdout(), cx.start);
    let bar = cx.spin();
    let r = crate::interrupt::graceful(|| store.add_tree(tree)).map_err(|e| {
        if e.kind() == cowlink::ErrorKind::NotADirectory && e.src() == Some(tree) {
            let why = format!("{}; use `cowlink store add` for a file", e.reason());
            e.with_reason(why)
        } else {
            e
        }
    });
    bar.finish();
    if crate::interrupt::interrupted() {
        return interrupted(
            "no manifest was written; objects already stored stay until `cowlink store gc`",
        );
    }
    let r = r?;
    if json {
        crate::out::json(&mut out, &r)?;
    } else {
        writeln!(out, "{}", r.digest)?;
        errln!(
            "stored {} ({}; {}, {} cloned, {} copied), {}, {} in {}",
            count(r.files, "file", "files"),
            human_bytes(r.bytes),
            count(r.new_objects, "new object", "new objects"),
            r.cloned,
            r.files - r.cloned,
            count(r.dirs, "directory", "directories"),
            count(r.symlinks, "symbolic link", "symbolic links"),
            human_duration(start.elapsed())
        );
    }
    Ok(Exit::Ok)
}

/// `store materialize DIGEST DEST`: one object at a new file.
fn materialize(cx: &Ctx, d: &str, dest: &Path, link: LinkMode) -> Result<Exit> {
    let (store, json, mut out) = (&cx.store, cx.json, crate::out::stdout());
    let o = store.materialize(&digest(d)?, dest, link)?;
    if json {
        crate::out::json(&mut out, &o)?;
    } else {
        writeln!(
            out,
            "{} {} ({})",
            o.method.describe(),
            quoted(dest),
            human_bytes(o.bytes)
        )?;
    }
    Ok(Exit::Ok)
}

/// `store checkout MANIFEST DEST`: a stored tree, pulled first with a
/// remote.
fn checkout(cx: &Ctx, a: CheckoutArgs) -> Result<Exit> {
    let (store, json, mut out, start) = (&cx.store, cx.json, crate::out::stdout(), cx.start);
    let CheckoutArgs {
        manifest,
        dest,
        link,
        allow_external_symlinks,
        verify,
        keep_setid,
        atomic,
    } = a;
    // With a remote, fetch what is missing first (nothing is
    // requested when the store has it all).
    if cx.remote.url().is_some() {
        let wanted = match manifest.parse::<Digest>() {
            Ok(d) => d,
            Err(_) => {
                return Err(anyhow!(
                    "with --remote the manifest must be a digest (64 hex digits), not '{manifest}'"
                ))
            }
        };
        let pulled = crate::remote::pull(store, &cx.remote, &[wanted], json, true, || cx.spin())?;
        if pulled != Exit::Ok {
            return Ok(pulled);
        }
    }
    let m = load_manifest(store, &manifest)?;
    let opts = CheckoutOptions {
        link: link.get(),
        external_symlinks: allow_external_symlinks,
        verify,
        setid: keep_setid,
        atomic,
    };
    let bar = cx.spin();
    let r = crate::interrupt::graceful(|| store.checkout(&m, &dest, &opts));
    bar.finish();
    let r = r.map_err(|e| {
        if e.kind() == cowlink::ErrorKind::NotSupported
            && opts.link == cowlink::store::LinkMode::Clone
        {
            let why = format!(
                "{}; use --link auto to copy where cloning is not possible",
                e.reason()
            );
            e.with_reason(why)
        } else {
            e
        }
    })?;
    for e in &r.errors {
        errln!("cowlink: {e}{}", link_hint(e, opts.link));
    }
    if r.cancelled {
        return interrupted(&format!(
            "{} placed whole in {}, the rest were not started",
            match r.files {
                1 => "1 file was".to_string(),
                n => format!("{n} files were"),
            },
            quoted(&dest)
        ));
    }
    if json {
        crate::out::json(&mut out, &r)?;
    } else {
        writeln!(
            out,
            "checked out {} ({}): {} cloned, {} copied, {} hardlinked; {}, {}{}{} in {}",
            count(r.files, "file", "files"),
            human_bytes(r.bytes),
            r.cloned,
            r.copied,
            r.hardlinked,
            count(r.dirs, "directory", "directories"),
            count(r.symlinks, "symbolic link", "symbolic links"),
            if r.generations_created > 0 {
                format!(
                    "; {} (reference limit)",
                    count(
                        r.generations_created,
                        "new object generation",
                        "new object generations"
                    )
                )
            } else {
                String::new()
            },
            if r.errors.is_empty() {
                String::new()
            } else {
                format!("; {}", count(r.errors.len() as u64, "error", "errors"))
            },
            human_duration(start.elapsed())
        )?;
    }
    Ok(if r.errors.is_empty() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// `store ls`: the stored trees.
fn ls_trees(cx: &Ctx) -> Result<Exit> {
    let (store, json, mut out, dir) = (&cx.store, cx.json, crate::out::stdout(), &cx.dir);
    let rows = store.list()?;
    if json {
        crate::out::json(&mut out, &rows)?;
    } else if rows.is_empty() {
        errln!(
            "no trees in the store {} (add one with `cowlink store add-tree DIR`)",
            shown(dir)
        );
    } else {
        writeln!(out, "{:<64}  {:>8}  {:>10}", "MANIFEST", "FILES", "SIZE")?;
        for r in &rows {
            match &r.error {
                None => writeln!(
                    out,
                    "{}  {:>8}  {:>10}",
                    r.digest,
                    r.totals.files,
                    human_bytes(r.totals.bytes)
                )?,
                Some(e) => writeln!(out, "{}  unreadable: {e}", r.digest)?,
            }
        }
    }
    Ok(if rows.iter().any(|r| r.error.is_some()) {
        Exit::Failed
    } else {
        Exit::Ok
    })
}

/// `store ls MANIFEST`: one tree's entries.
fn ls_entries(cx: &Ctx, m: &str) -> Result<Exit> {
    let (store, json, mut out) = (&cx.store, cx.json, crate::out::stdout());
    let m = load_manifest(store, m)?;
    if json {
        crate::out::json(&mut out, &m)?;
    } else {
        for e in &m.entries {
            // Names and targets from the manifest (untrusted) go
            // through the one quoting rule: no newline splits a
            // row, no escape sequence reaches the terminal.
            let name = shown(Path::new(&e.path));
            match &e.kind {
                EntryKind::Dir { mode } => {
                    writeln!(out, "d {mode:04o} {:>12} {:64}  {name}/", "", "")?
                }
                EntryKind::File { digest, size, mode } => {
                    writeln!(out, "f {mode:04o} {size:>12} {digest}  {name}")?
                }
                EntryKind::Symlink { target } => writeln!(
                    out,
                    "l {:4} {:>12} {:64}  {name} -> {}",
                    "",
                    "",
                    "",
                    shown(Path::new(target))
                )?,
            }
        }
    }
    Ok(Exit::Ok)
}

/// `store verify`: rehash everything, quarantine what is corrupt.
fn verify(cx: &Ctx) -> Result<Exit> {
    let (store, json, mut out, start) = (&cx.store, cx.json, crate::out::stdout(), cx.start);
    let bar = cx.spin();
    let r = crate::interrupt::graceful(|| store.verify());
    bar.finish();
    if crate::interrupt::interrupted() {
        return interrupted("verify stopped before every object was read");
    }
    let r = r?;
    if json {
        crate::out::json(&mut out, &r)?;
    } else {
        for c in &r.corrupt {
            let to = c.quarantined.as_ref().map_or_else(
                || " (could not be moved)".to_string(),
                |q| format!(", moved to {}", shown(q)),
            );
            errln!("cowlink: corrupt: {}: {}{to}", shown(&c.path), c.problem);
        }
        for (m, o) in &r.missing {
            errln!("cowlink: missing: object {o} (used by manifest {m})");
        }
        writeln!(
            out,
            "checked {} ({}) and {} in {}: {}",
            count(r.objects, "object", "objects"),
            human_bytes(r.bytes),
            count(r.manifests, "manifest", "manifests"),
            human_duration(start.elapsed()),
            if r.is_clean() {
                "all good".to_string()
            } else {
                format!("{} corrupt, {} missing", r.corrupt.len(), r.missing.len())
            }
        )?;
    }
    Ok(if r.is_clean() { Exit::Ok } else { Exit::Failed })
}

/// `store gc [--keep M]…`.
fn gc(cx: &Ctx, keep: &[String]) -> Result<Exit> {
    let (store, json, mut out) = (&cx.store, cx.json, crate::out::stdout());
    let keep = keep.iter().map(|k| digest(k)).collect::<Result<Vec<_>>>()?;
    let r = store.gc((!keep.is_empty()).then_some(keep.as_slice()))?;
    for c in &r.quarantined {
        let to = c.quarantined.as_ref().map_or_else(
            || " (could not be moved)".to_string(),
            |q| format!(", moved to {}", shown(q)),
        );
        errln!("cowlink: corrupt: {}: {}{to}", shown(&c.path), c.problem);
    }
    if json {
        crate::out::json(&mut out, &r)?;
    } else {
        let partials = match r.partials_removed {
            0 => String::new(),
            n => format!(
                ", {} ({})",
                count(n, "stale partial download", "stale partial downloads"),
                human_bytes(r.partial_bytes_removed)
            ),
        };
        writeln!(
            out,
            "kept {}; removed {}, {} ({}), {} leftover temporaries{partials}",
            count(r.manifests_kept, "manifest", "manifests"),
            count(r.manifests_removed, "manifest", "manifests"),
            count(r.objects_removed, "object", "objects"),
            human_bytes(r.bytes_removed),
            r.temporaries_removed
        )?;
    }
    Ok(Exit::Ok)
}

/// `store stats`.
fn stats(cx: &Ctx) -> Result<Exit> {
    let (store, json, mut out, dir) = (&cx.store, cx.json, crate::out::stdout(), &cx.dir);
    let s = store.stats()?;
    if json {
        crate::out::json(&mut out, &s)?;
    } else {
        writeln!(out, "store:        {}", shown(dir))?;
        writeln!(
            out,
            "objects:      {} ({}){}",
            s.objects,
            human_bytes(s.object_bytes),
            if s.generations > 0 {
                format!(" + {} extra generations", s.generations)
            } else {
                String::new()
            }
        )?;
        writeln!(out, "allocated:    {}", human_bytes(s.allocated_bytes))?;
        writeln!(
            out,
            "manifests:    {} listing {} ({})",
            s.manifests,
            count(s.manifest_files, "file", "files"),
            human_bytes(s.manifest_bytes)
        )?;
        writeln!(
            out,
            "saved:        {} (each content stored once)",
            human_bytes(s.bytes_saved)
        )?;
    }
    Ok(Exit::Ok)
}

/// The hint for a checkout error that copying would have avoided: the
/// library says what failed, the command line says which flag helps.
fn link_hint(e: &cowlink::Error, link: LinkMode) -> &'static str {
    match link {
        LinkMode::Clone | LinkMode::Hardlink if e.copy_would_work() => {
            "; use --link auto to copy instead"
        }
        _ => "",
    }
}

/// A manifest named by digest (from the store) or by file (validated the
/// same way: it is untrusted input).
fn load_manifest(store: &Store, arg: &str) -> Result<Manifest> {
    if let Ok(d) = arg.parse::<Digest>() {
        return Ok(store.manifest(&d)?);
    }
    let path = Path::new(arg);
    // Anything at the name (even a dangling link) is read as a file:
    // only a regular file is, never moved nor changed.
    if path.symlink_metadata().is_ok() {
        return Ok(Manifest::read_file(path)?);
    }
    Err(anyhow!(
        "{} is neither a manifest digest (64 hex digits) nor a manifest file",
        quoted(path)
    ))
}
