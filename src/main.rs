use clap::{CommandFactory as _, FromArgMatches as _};

use consem::cli::{Cli, Command};
use consem::options::{GivenOptions, RunOptions};

fn main() {
    let (cli, given) = match parse() {
        Ok(parsed) => parsed,
        Err(error) => std::process::exit(usage_error(error)),
    };
    let env = environment_variable;
    let code = match cli.command {
        Command::Run(args) => {
            // Errors in the options already speak the chosen format.
            consem::report::set_format(args.log_format);
            match RunOptions::from_args(args, &given, env) {
                Ok(options) => consem::run(options).finish(),
                Err(error) => {
                    consem::report::error(&error.to_string());
                    consem::exit::USAGE
                }
            }
        }
        Command::Status(args) => {
            consem::die_of_a_closed_pipe();
            consem::admin::status(args, &given, env)
        }
        Command::Release(args) => consem::admin::release(args, &given, env),
        Command::Reset(args) => consem::admin::reset(args, &given, env),
        Command::Completions { shell } => {
            consem::die_of_a_closed_pipe();
            clap_complete::generate(shell, &mut Cli::command(), "consem", &mut std::io::stdout());
            0
        }
    };
    std::process::exit(code);
}

/// The command line, and which options it gives (which the store chosen
/// may refuse), as `Cli::try_parse` reads it.
fn parse() -> Result<(Cli, GivenOptions), clap::Error> {
    let mut matches = Cli::command().try_get_matches()?;
    let given = matches
        .subcommand()
        .map(|(_, matches)| GivenOptions::of(matches))
        .unwrap_or_default();
    let cli = Cli::from_arg_matches_mut(&mut matches)
        .map_err(|error| error.format(&mut Cli::command()))?;
    Ok((cli, given))
}

/// A variable consem reads. One that is set but not UTF-8 is refused, never
/// taken as unset: a token file's path that cannot be read as text must not
/// mean "no token".
fn environment_variable(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) => Some(value),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            consem::report::error(&format!(
                "{name} is not valid UTF-8, which consem cannot use: set it to a UTF-8 value (or pass the matching option), or unset it"
            ));
            std::process::exit(consem::exit::USAGE)
        }
    }
}

/// clap could not read the command line: help and version go out as clap
/// prints them; an error is one line, in the log format asked for.
fn usage_error(error: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        error.exit();
    }
    // args_os: an argument that is not UTF-8 may be why we are here.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let json = args.iter().any(|a| a == "--log-format=json")
        || args
            .windows(2)
            .any(|w| w[0] == "--log-format" && w[1] == "json");
    if json {
        consem::report::set_format(consem::report::LogFormat::Json);
    }
    consem::report::error(&consem::cli::describe_error(&error));
    consem::exit::USAGE
}
