//! `docs/reference/eventctl.md`: every eventctl command and option, written
//! from the same clap definitions as the man pages. The test below fails
//! while the page and the CLI differ; `EVENTD_BLESS=1 cargo test --locked
//! -p eventd-gen` writes the page again.

use clap::{Arg, Command};
use std::fmt::Write;

/// The page for `cmd` (eventctl's root command), in Markdown.
pub fn reference(mut cmd: Command) -> String {
    // Building fills in each subcommand's full name ("eventctl export
    // status") and its usage line.
    cmd.build();
    let mut page = String::new();
    page.push_str(
        "# eventctl: every command and option\n\
         \n\
         Generated from eventctl's clap definitions (`src/bin/eventctl/cli.rs`)\n\
         by `packaging/gen`, the program that also writes the man pages and the\n\
         shell completions; do not edit it by hand. After a change to the CLI,\n\
         write it again with\n\
         `EVENTD_BLESS=1 cargo test --locked -p eventd-gen`; without\n\
         `EVENTD_BLESS` that test fails while this page and the CLI differ.\n\
         Every command also takes `-h` (a summary) and `--help` (all of it),\n\
         and `--data-dir` and `--config` go before or after any command.\n",
    );
    section(&mut page, &cmd, true);
    page
}

fn section(page: &mut String, cmd: &Command, root: bool) {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let _ = write!(page, "\n## `{name}`\n\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = write!(page, "{}\n\n", paragraphs(&about.to_string()));
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let _ = writeln!(page, "Usage: `{usage}`");
    let args: Vec<&Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .filter(|a| root || !a.is_global_set())
        .collect();
    if !args.is_empty() {
        page.push('\n');
    }
    for arg in args {
        item(page, arg);
    }
    let subs: Vec<&Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        page.push_str("\nCommands:\n\n");
        for sub in &subs {
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let _ = writeln!(
                page,
                "- `{}`: {}",
                sub.get_name(),
                paragraphs(&about).replace("\n\n", " ")
            );
        }
    }
    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        let _ = write!(page, "\n```text\n{}\n```\n", after.to_string().trim_end());
    }
    for sub in subs {
        section(page, sub, false);
    }
}

/// One option or positional argument, as a list item.
fn item(page: &mut String, arg: &Arg) {
    let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
    let name = form(arg, takes_value);
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| paragraphs(&h.to_string()))
        .unwrap_or_default();
    let notes = notes(arg, takes_value);
    let help = help.replace("\n\n", "\n\n  ");
    if help.is_empty() {
        let _ = writeln!(page, "- `{name}`{notes}");
    } else {
        let _ = writeln!(page, "- `{name}`{notes}: {help}");
    }
}

/// How an argument is written: `-s, --long <VALUE>`, or `<VALUE>...`.
fn form(arg: &Arg, takes_value: bool) -> String {
    let values = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    let mut name = if arg.is_positional() {
        values.clone()
    } else {
        let mut forms = Vec::new();
        if let Some(s) = arg.get_short() {
            forms.push(format!("-{s}"));
        }
        if let Some(l) = arg.get_long() {
            forms.push(format!("--{l}"));
        }
        let mut name = forms.join(", ");
        if takes_value {
            name = format!("{name} {values}");
        }
        name
    };
    if arg.is_positional() && arg.get_num_args().is_some_and(|n| n.max_values() > 1) {
        name.push_str("...");
    }
    name
}

/// What else an argument's item says: required, its default, its
/// environment variable, its possible values (` [..; ..]`, or nothing).
fn notes(arg: &Arg, takes_value: bool) -> String {
    let mut notes = Vec::new();
    if arg.is_required_set() {
        notes.push("required".to_string());
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if takes_value && !defaults.is_empty() {
        notes.push(format!("default `{}`", defaults.join(",")));
    }
    if let Some(env) = arg.get_env() {
        notes.push(format!("env `{}`", env.to_string_lossy()));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|p| !p.is_hide_set())
        .map(|p| match p.get_help() {
            Some(h) => format!("`{}` ({})", p.get_name(), paragraphs(&h.to_string())),
            None => format!("`{}`", p.get_name()),
        })
        .collect();
    if takes_value && !possible.is_empty() {
        notes.push(format!("one of {}", possible.join(", ")));
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!(" [{}]", notes.join("; "))
    }
}

/// Help text with each paragraph on one line and paragraphs apart, its
/// `<` and `>` outside code spans escaped (Markdown would take `<N>` for
/// HTML).
fn paragraphs(text: &str) -> String {
    let joined = text
        .trim()
        .split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n");
    let mut out = String::with_capacity(joined.len());
    let mut code = false;
    for c in joined.chars() {
        match c {
            '`' => code = !code,
            '<' | '>' if !code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::eventctl_cli::Args;
    use clap::CommandFactory;
    use std::path::Path;

    #[test]
    fn the_eventctl_reference_matches_the_cli() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference/eventctl.md");
        let want = super::reference(Args::command());
        if std::env::var_os("EVENTD_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/reference/eventctl.md differs from eventctl's CLI; write it again with \
             `EVENTD_BLESS=1 cargo test --locked -p eventd-gen`"
        );
        // The page names every command, so a test of the renderer too.
        for sub in [
            "query", "emit", "stats", "shards", "config", "export", "run",
        ] {
            assert!(have.contains(&format!("## `eventctl {sub}`")), "{sub}");
        }
    }
}
