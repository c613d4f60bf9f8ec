//! The block-level update (`cowlink::delta`) from the command line, for
//! bench/delta (the `cowlink` command reaches it through `cowlink sync`).
//!
//! Usage:
//!   delta SRC DST [--old OLD] [--record FILE] [--save-record FILE]
//!       Make DST's new version from SRC: a clone of OLD (default: DST
//!       itself) with the blocks that differ from SRC rewritten, given
//!       SRC's mode and times, renamed over DST. `--record` reads OLD's
//!       block-hash record (used only when current); `--save-record`
//!       writes the new version's. Prints the report as JSON.
//!   delta --record-of FILE OUT
//!       Write FILE's block-hash record (4 KiB blocks) to OUT.
//!   delta --exclusive PATH
//!       Print the bytes of PATH no other file shares (FIEMAP).

use std::fs::{File, FileTimes, Permissions};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;

use cowlink::delta::{prepare, BlockRecord, DeltaOptions, Target};

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("delta: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn run(args: Vec<String>) -> Res {
    match args.first().map(String::as_str) {
        Some("--exclusive") if args.len() == 2 => {
            let l = cowlink::extents::extents(&args[1])?;
            println!("{}", l.mapped_bytes - l.shared_bytes);
            Ok(())
        }
        Some("--record-of") if args.len() == 3 => {
            let f = File::open(&args[1])?;
            let r = BlockRecord::of_file(f.as_fd(), 4096)?;
            std::fs::write(&args[2], r.to_bytes())?;
            Ok(())
        }
        Some(_) if args.len() >= 2 => update(&args),
        _ => Err(
            "usage: delta SRC DST [--old OLD] [--record FILE] [--save-record FILE] \
                  | --record-of FILE OUT | --exclusive PATH"
                .into(),
        ),
    }
}

fn update(args: &[String]) -> Res {
    let (src_path, dst_path) = (Path::new(&args[0]), Path::new(&args[1]));
    let (mut old_path, mut record_in, mut record_out) = (dst_path, None, None);
    let mut rest = args[2..].iter();
    while let Some(a) = rest.next() {
        let v = rest.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--old" => old_path = Path::new(v),
            "--record" => record_in = Some(BlockRecord::from_bytes(&std::fs::read(v)?)?),
            "--save-record" => record_out = Some(v),
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let src = File::open(src_path)?;
    let old = File::open(old_path)?;
    let parent = match dst_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = File::open(parent)?;
    let name = dst_path.file_name().ok_or("DST has no file name")?;
    let target = Target {
        dir: dir.as_fd(),
        name: Path::new(name),
        shown: dst_path,
    };
    let opts = DeltaOptions {
        record: record_in.as_ref(),
        ..Default::default()
    };
    let pending = prepare(src.as_fd(), src_path, old.as_fd(), target, &opts)?;
    // Mode and times of the source, as `cp -p` (times last).
    let md = src.metadata()?;
    let new = File::from(pending.fd().try_clone_to_owned()?);
    new.set_permissions(Permissions::from_mode(md.mode() & 0o7777))?;
    new.set_times(
        FileTimes::new()
            .set_accessed(md.accessed()?)
            .set_modified(md.modified()?),
    )?;
    drop(new);
    let (report, record) = pending.commit()?;
    if let Some(out) = record_out {
        std::fs::write(out, record.to_bytes())?;
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
