//! `storh`: look into and look after a storh directory from the shell.

mod cli;

fn main() {
    std::process::exit(cli::run());
}
