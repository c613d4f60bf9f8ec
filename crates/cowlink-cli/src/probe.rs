//! `cowlink probe`: can these paths clone, and what can their filesystems do?

use cowlink::name::{quoted, shown};
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use comfy_table::{presets, ContentArrangement, Table};
use cowlink::probe::{self, Answer, FsFacts};

use crate::out::outln;
use crate::Exit;

/// Tell whether paths can clone, and what their filesystems can do
///
/// Every answer comes from a real trial: two unnamed scratch files in the
/// directory, cloned (and deduplicated) into each other, then gone.
///
/// Examples:
///   cowlink probe .                   # what this directory's filesystem can do
///   cowlink probe vm.img /mnt/backup  # can vm.img be cloned there? (exit 0 yes, 1 no)
///   cowlink probe --tree /            # every mount, and which ones clone
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ProbeArgs {
    /// List every mount at or under the path (from /proc/self/mountinfo)
    #[arg(long, conflicts_with = "dest")]
    tree: bool,

    /// Print the answer as JSON
    #[arg(long)]
    json: bool,

    /// The path to probe (a file or directory)
    #[arg(value_parser = crate::PathArg)]
    path: PathBuf,

    /// A destination: answer whether PATH can be cloned there
    #[arg(value_parser = crate::PathArg)]
    dest: Option<PathBuf>,
}

/// Run `cowlink probe`.
pub fn run(args: ProbeArgs) -> Result<Exit> {
    if args.tree {
        let mounts = probe::tree(&args.path)?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&mounts)?);
        } else {
            let mut t = table(&["MOUNT", "TYPE", "RO", "REFLINK", "DEDUPE", "BLOCK", "WHY"]);
            for m in &mounts {
                t.add_row(vec![
                    shown(&m.mount_point).to_string(),
                    m.fstype.clone(),
                    if m.read_only { "ro" } else { "" }.to_string(),
                    m.facts.reflink.word().to_string(),
                    m.facts.dedupe.word().to_string(),
                    m.facts
                        .block_size
                        .map(|b| b.to_string())
                        .unwrap_or_default(),
                    m.facts.reflink.reason().unwrap_or("").to_string(),
                ]);
            }
            outln!("{}", t.trim_fmt());
        }
        return Ok(Exit::Ok);
    }
    match &args.dest {
        None => {
            let facts = probe::filesystem(&args.path)?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&facts)?);
            } else {
                let mut t = table(&["", ""]);
                facts_rows(&mut t, &facts);
                outln!("{}", t.trim_fmt());
            }
            Ok(Exit::Ok)
        }
        Some(dest) => {
            let s = probe::between(&args.path, dest)?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let mut t = table(&["", "SOURCE", "DESTINATION"]);
                let side = |f: &FsFacts| {
                    vec![
                        shown(&f.path).to_string(),
                        format!(
                            "{}{}",
                            f.kind,
                            f.magic.map(|m| format!(" ({m:#x})")).unwrap_or_default()
                        ),
                        f.block_size
                            .map(|b| format!("{b} bytes"))
                            .unwrap_or_default(),
                        describe(&f.reflink),
                        describe(&f.dedupe),
                        f.clone_limit.to_string(),
                    ]
                };
                let (a, b) = (side(&s.src), side(&s.dst));
                let labels = [
                    "directory",
                    "filesystem",
                    "block size",
                    "reflink",
                    "dedupe",
                    "clone limit",
                ];
                for (i, label) in labels.iter().enumerate() {
                    t.add_row(vec![label.to_string(), a[i].clone(), b[i].clone()]);
                }
                outln!("{}", t.trim_fmt());
                outln!(
                    "same filesystem: {}\nclone {} -> {}: {}",
                    if s.same_filesystem { "yes" } else { "no" },
                    quoted(&args.path),
                    quoted(dest),
                    describe(&s.reflink)
                );
            }
            Ok(if s.reflink.is_yes() {
                Exit::Ok
            } else {
                Exit::Failed
            })
        }
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic);
    if header.iter().any(|h| !h.is_empty()) {
        t.set_header(header.to_vec());
    }
    t
}

fn describe(a: &Answer) -> String {
    match a.reason() {
        None => a.word().to_string(),
        Some(r) => format!("{} — {r}", a.word()),
    }
}

fn facts_rows(t: &mut Table, f: &FsFacts) {
    let rows = [
        ("directory", shown(&f.path).to_string()),
        (
            "filesystem",
            format!(
                "{}{}",
                f.kind,
                f.magic
                    .map(|m| format!(" (magic {m:#x})"))
                    .unwrap_or_default()
            ),
        ),
        (
            "block size",
            f.block_size
                .map(|b| format!("{b} bytes"))
                .unwrap_or_default(),
        ),
        ("reflink", describe(&f.reflink)),
        ("dedupe", describe(&f.dedupe)),
        ("clone limit", f.clone_limit.to_string()),
    ];
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
}
