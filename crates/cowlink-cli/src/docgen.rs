//! `cowlink completions SHELL` and `cowlink man`: shell completions and
//! man pages generated from the clap definitions, so the help, the
//! completions and the pages cannot disagree. scripts/package writes them
//! into the packages with `cowlink man --dir` and `cowlink completions`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Command};
use clap_complete::Shell;
use clap_mangen::roff::{roman, Roff};

use crate::Exit;

/// Print the completion script of a shell
///
/// Examples:
///   cowlink completions bash > ~/.local/share/bash-completion/completions/cowlink
///   cowlink completions zsh > ~/.zfunc/_cowlink     # with fpath+=(~/.zfunc) in ~/.zshrc
///   cowlink completions fish > ~/.config/fish/completions/cowlink.fish
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    shell: Shell,
}

/// Print a man page, or write every page to a directory
///
/// One page per command: cowlink(1), cowlink-cp(1), cowlink-store(1),
/// cowlink-store-add(1) and so on, rendered from the same definitions as
/// --help.
///
/// Examples:
///   cowlink man | man -l -                  # read cowlink(1) without installing it
///   cowlink man store checkout | man -l -   # the page of `cowlink store checkout`
///   cowlink man --dir /usr/local/share/man/man1
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ManArgs {
    /// Write every page to this directory as NAME.1 (created if missing)
    /// and list the files written, instead of printing one page
    #[arg(long, value_name = "DIR", value_parser = crate::PathArg, conflicts_with = "command")]
    dir: Option<PathBuf>,
    /// The command whose page to print, e.g. `store add` [default: cowlink]
    #[arg(value_name = "COMMAND")]
    command: Vec<String>,
}

/// Run `cowlink completions`.
pub fn completions(args: CompletionsArgs, mut cmd: Command) -> Result<Exit> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "cowlink", &mut out);
    out.flush()?;
    Ok(Exit::Ok)
}

/// Run `cowlink man`.
pub fn man(args: ManArgs, cmd: Command) -> Result<Exit> {
    let mut root = cmd.disable_help_subcommand(true);
    root.build();
    if let Some(dir) = args.dir {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut written = Vec::new();
        for (page, parent) in pages(&root) {
            let path = dir.join(format!("{}.1", page_name(&page)));
            let mut buf = Vec::new();
            render(&page, parent.as_deref(), &mut buf)?;
            std::fs::write(&path, buf)
                .with_context(|| format!("cannot write {}", path.display()))?;
            written.push(path);
        }
        let mut out = std::io::stdout().lock();
        for p in written {
            writeln!(out, "{}", p.display())?;
        }
        out.flush()?;
        return Ok(Exit::Ok);
    }
    let mut page = root;
    let mut parent = None;
    for (i, name) in args.command.iter().enumerate() {
        page = match page.find_subcommand(name) {
            Some(c) => {
                parent = Some(page_name(&page));
                c.clone()
            }
            None => bail!(
                "no command `cowlink {}`; see `cowlink --help`",
                args.command[..=i].join(" ")
            ),
        };
    }
    let mut out = std::io::stdout().lock();
    render(&page, parent.as_deref(), &mut out)?;
    out.flush()?;
    Ok(Exit::Ok)
}

/// Every command that gets a page, with its parent's page name: the root
/// and all visible subcommands, depth first.
pub fn pages(root: &Command) -> Vec<(Command, Option<String>)> {
    fn walk(c: &Command, parent: Option<String>, out: &mut Vec<(Command, Option<String>)>) {
        out.push((c.clone(), parent));
        for s in c.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(s, Some(page_name(c)), out);
        }
    }
    let mut out = Vec::new();
    walk(root, None, &mut out);
    out
}

/// The page's name: `cowlink-store-add` for `cowlink store add`.
fn page_name(cmd: &Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

/// Splits help text at its "Examples:" line into the description and the
/// example lines.
pub fn split_examples(text: &str) -> (&str, Option<&str>) {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "Examples:" {
            return (&text[..at], Some(&text[at + line.len()..]));
        }
        at += line.len();
    }
    (text, None)
}

/// Renders one page: clap_mangen's sections, with the description and the
/// examples laid out here. clap_mangen fills every line of a help text
/// into one paragraph, which runs example lines and lists together; here
/// indented lines are kept as written (`.nf`), and the examples get a
/// section of their own.
fn render(cmd: &Command, parent: Option<&str>, w: &mut dyn Write) -> Result<()> {
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    let long = cmd
        .get_long_about()
        .or_else(|| cmd.get_about())
        .map(|s| s.to_string())
        .unwrap_or_default();
    let (desc, mut examples) = split_examples(&long);
    let after = cmd
        .get_after_long_help()
        .or_else(|| cmd.get_after_help())
        .map(|s| s.to_string());
    let after_split = after.as_deref().map(split_examples);
    let mut roff = Roff::new();
    roff.control("SH", ["DESCRIPTION"]);
    text_block(&mut roff, desc);
    if let Some((before, ex)) = after_split {
        if examples.is_none() {
            examples = ex;
        }
        if !before.trim().is_empty() {
            roff.control("PP", []);
            text_block(&mut roff, before);
        }
    }
    roff.to_writer(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    let mut roff = Roff::new();
    if let Some(ex) = examples {
        roff.control("SH", ["EXAMPLES"]);
        roff.control("nf", []);
        for line in ex.lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
    }
    let parent = parent.map(str::to_string);
    let children: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(page_name)
        .collect();
    let see: Vec<String> = parent.into_iter().chain(children).collect();
    if !see.is_empty() {
        roff.control("SH", ["SEE ALSO"]);
        let refs: Vec<String> = see.iter().map(|n| format!("{n}(1)")).collect();
        roff.text([roman(refs.join(", "))]);
    }
    roff.to_writer(w)?;
    man.render_version_section(w)?;
    Ok(())
}

/// Prose is filled; a blank line starts a paragraph; indented lines
/// (examples, lists, tables) are kept as written.
fn text_block(roff: &mut Roff, text: &str) {
    let mut verbatim = false;
    for line in text.lines() {
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if line.trim().is_empty() {
            if verbatim {
                roff.control("fi", []);
                verbatim = false;
            }
            roff.control("PP", []);
            continue;
        }
        if indented != verbatim {
            roff.control(if indented { "nf" } else { "fi" }, []);
            verbatim = indented;
        }
        roff.text([roman(line)]);
    }
    if verbatim {
        roff.control("fi", []);
    }
}
