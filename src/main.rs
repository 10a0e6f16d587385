use clap::Parser as _;

use consem::cli::{Cli, Command};
use consem::options::RunOptions;

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => match RunOptions::from_args(args, |name| std::env::var(name).ok()) {
            Ok(options) => consem::run(options),
            Err(message) => {
                consem::report::error(&message);
                consem::exit::USAGE
            }
        },
    };
    std::process::exit(code);
}
