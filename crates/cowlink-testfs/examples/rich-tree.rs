//! Build the rich fixture tree for manual checks:
//! `cargo run -p cowlink-testfs --example rich-tree -- DIR [DEPTH]`.

fn main() {
    let mut args = std::env::args_os().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: rich-tree DIR [DEPTH]"));
    let deep = args
        .next()
        .map_or(520, |d| d.to_string_lossy().parse().expect("a depth"));
    let files = cowlink_testfs::rich_tree(&dir, deep);
    println!("{}: {files} file names", dir.display());
}
