use clap::{CommandFactory as _, Parser as _};

use consem::cli::{Cli, Command};
use consem::options::RunOptions;

fn main() {
    let cli = Cli::parse();
    let env = |name: &str| std::env::var(name).ok();
    let code = match cli.command {
        Command::Run(args) => {
            // Errors in the options already speak the chosen format.
            consem::report::set_format(args.log_format);
            match RunOptions::from_args(args, env) {
                Ok(options) => consem::run(options),
                Err(message) => {
                    consem::report::error(&message);
                    consem::exit::USAGE
                }
            }
        }
        Command::Status(args) => consem::admin::status(args, env),
        Command::Release(args) => consem::admin::release(args, env),
        Command::Reset(args) => consem::admin::reset(args, env),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "consem", &mut std::io::stdout());
            0
        }
    };
    std::process::exit(code);
}
